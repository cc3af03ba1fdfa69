"""The job's sinks: the dead-letter files, the grouping of record runs by shard, ``DeadValue``.

Dead letters are written whole and sorted (by file and line, or by admission and time), so a rerun
on the same input gives byte-identical files on any runner; the TFRecord shards are written by
``spill_merge.MergeShards`` from the sorted runs grouped here.
``DeadValue`` is the dead letter of a value set aside for its unit: the reader's ``DeadLetter``
names a row of a file, which no longer exists after the shuffle.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable

import apache_beam as beam

from ehr_pipeline.contract import SPLIT_NAMES, layout
from ehr_pipeline.job.items import DEAD, KV, Select, count
from ehr_pipeline.reader import DeadLetter

# Values not used because of their unit (units.NOT_USED: not convertible, ambiguous, a placeholder,
# an implausible conversion): one dead-letter file, each line with its reason.
DEAD_VALUES = "values_not_convertible"



@dataclasses.dataclass(frozen=True)
class DeadValue:
    """One value set aside because its unit does not convert to its code's canonical unit (units.Harmoniser).

    The row itself was fine and its event still counts as an occurrence; only the number is not
    used. The job writes these after the shuffle, where a row's file and line are gone, so the
    record names the admission, the code and the time instead.
    """

    subject_id: int
    hadm_id: int  # the cohort admission the event would have fed
    time: int  # when the value became known, seconds since 1970
    code: str  # 'source:code'
    value: float  # as recorded
    unit: str  # as recorded
    canonical_unit: str  # the code's canonical unit
    detail: str  # why the two do not convert
    reason: str  # why it was set aside: a value of units.NOT_USED

    def to_json(self) -> str:
        """The dead value as one line of JSON (no trailing newline)."""
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False, allow_nan=False)

    def sort_key(self) -> tuple:
        """Order in the dead-letter file: by admission, time, code, then the rest."""
        return (self.hadm_id, self.time, self.code, self.unit, self.value)


def write_dead_letter_file(out_dir: str, name: str, letters: Iterable[DeadLetter | DeadValue]) -> int:
    """Writes OUT_DIR/dead_letter/NAME.jsonl whole, sorted (stable bytes across runs); returns the count."""
    ordered = sorted(letters, key=lambda d: d.sort_key())
    body = "".join(d.to_json() + "\n" for d in ordered).encode("utf-8")
    layout.write_bytes(layout.join(out_dir, layout.DEAD_LETTER_DIR, f"{name}.jsonl"), body)
    return len(ordered)


def write_dead_letter_files(out_dir: str, dead: Iterable[tuple[str, DeadLetter | DeadValue]]) -> None:
    """(file name, dead letter) pairs set aside by the job's driver -> one file per name."""
    by_name: dict[str, list[DeadLetter | DeadValue]] = {}
    for name, letter in dead:
        by_name.setdefault(name, []).append(letter)
    for name, letters in by_name.items():
        write_dead_letter_file(out_dir, name, letters)


def group_by_every_shard(items, config_dict: dict):
    """((split, shard), value) items -> ((split, shard), values) for every shard of every split, an empty one too."""
    empty = [((split, shard), None) for split in SPLIT_NAMES for shard in range(config_dict["num_shards"][split])]
    return (
        (items, items.pipeline | "AllShards" >> beam.Create(empty).with_output_types(KV))
        | "JoinShards" >> beam.Flatten()
        | "GroupByShard" >> beam.GroupByKey()
    )


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class WriteDeadLetterFile(beam.DoFn):
    """(file name, dead letters) -> dead_letter/<name>.jsonl, sorted."""

    def __init__(self, out_dir: str):
        self._out = out_dir

    def process(self, element):
        table, letters = element
        yield count(f"dead_letters_written/{table}", write_dead_letter_file(self._out, table, letters))


class WriteDeadLetters(beam.PTransform):
    """Dead letters of any number of tagged PCollections -> one JSONL file per table (or kind of value)."""

    def __init__(self, out_dir: str):
        super().__init__()
        self._out = out_dir

    def expand(self, tagged_pcolls):
        return (
            [pc | f"Dead{i}" >> Select(DEAD) for i, pc in enumerate(tagged_pcolls)]
            | "DeadLetters" >> beam.Flatten()
            | "GroupDeadLetters" >> beam.GroupByKey()
            | "WriteDeadLetters" >> beam.ParDo(WriteDeadLetterFile(self._out))
        )
