"""Repeated ROW_IDs: a MIMIC-III row whose ROW_ID was read before in its table is used once.

ROW_ID is unique within every MIMIC-III table, so a second row with the same (table, ROW_ID) is a
repeat: a file concatenated twice, a row exported again, with or without changes. No worker can
hold a table's ROW_IDs (CHARTEVENTS has 330 M) and a big table is read in parts by several workers,
so repeats are found where events meet anyway: the bagging stage reads every event of one admission
at once, each with its table, ROW_ID, file and line (``chunks``' origin). There the first row by
file (the release's files in the job's order), then by line, is kept and the others are dropped
before bagging, so the record is the one the release without the repeats gives. A row of a big
table the job split into parts is named by the release's file and its line there
(``mimic.table_parts.part_lines``): parts are dealt blocks round-robin, so their order is not the file's.

How a repeat is counted. The manifest counts rows, and one row may feed several admissions of its
patient; a row is a repeat (``duplicate_row_id``) when it is dropped from the FIRST admission it
feeds (the lowest HADM_ID among its subject's cohort admissions triggered after it). Stage A,
which cannot see repeats, had counted it ``used``; the bagging stage moves it (``used`` - 1,
``duplicate_row_id`` + 1), so ``kept = used + not_in_cohort + at_or_after_trigger + duplicate_row_id``
still balances, and writes its dead letter once. Any other (admission, repeat) pair dropped is
counted as ``bagging/duplicate_row_id``: a row changed in its time that reaches an admission its
first copy does not reach is used there and dropped where both meet.

Not found, by design: repeats that reach no admission (outside the cohort, at or after every
trigger: counted there as any row is, and never used), and a repeat that shares no admission with
its first copy (another subject, or a time past all the triggers the first copy precedes). Finding
those would take a shuffle of every row by ROW_ID. The unit census counts rows as stage A reads
them, repeats included (it is summed before any admission is seen).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from ehr_pipeline.contract import layout
from ehr_pipeline.job.chunks import EventChunk, concat_chunks, pack_chunk, unpack_origin
from ehr_pipeline.mimic.events import DUPLICATE_ROW_ID
from ehr_pipeline.reader import DeadLetter


@dataclasses.dataclass(frozen=True)
class Repeat:
    """One event dropped from an admission: its row repeats the ROW_ID of an earlier row of its table."""

    table: str
    file: str  # the release's file (for a part of a split table: the file it was cut from)
    line: int  # the physical line the row starts on
    row_id: int
    kept_file: str  # where the row it repeats, the one used, was read
    kept_line: int
    first: bool  # dropped from the first admission its row feeds: the row is counted (and dead-lettered) here

    def dead_letter(self) -> DeadLetter:
        """The reader's DeadLetter of the repeated row (its raw text is not carried through the spill: empty)."""
        where = f"line {self.kept_line:,}" + ("" if self.kept_file == self.file else f" of {self.kept_file}")
        return DeadLetter(self.file, self.line, "", DUPLICATE_ROW_ID,
                          f"ROW_ID {self.row_id} of {self.table} was read before, at {where}; this row is not used")


class RepeatFinder:
    """Drops the events of an admission whose (table, ROW_ID) an earlier row also brings to it.

    ``files``: the release's (table, file) inputs in the job's order, as chunks' origins index them;
    ``subjects``, ``hadm_ids``, ``triggers`` (s): the cohort, to find the first admission a row feeds.
    """

    def __init__(self, files: Sequence[tuple[str, str]], subjects: np.ndarray, hadm_ids: np.ndarray,
                 triggers: np.ndarray):
        self._files = [(str(t), str(p)) for t, p in files]
        tables = sorted({t for t, _ in self._files})
        self._table_of = np.asarray([tables.index(t) for t, _ in self._files], dtype=np.int64)
        order = np.lexsort((np.asarray(hadm_ids), np.asarray(subjects)))
        self._subjects = np.asarray(subjects, dtype=np.int64)[order]
        self._hadm = np.asarray(hadm_ids, dtype=np.int64)[order]
        self._triggers = np.asarray(triggers, dtype=np.int64)[order]

    def first_admission(self, subject: int, times: np.ndarray) -> np.ndarray:
        """Per event time (s): the lowest HADM_ID of the subject's cohort admissions triggered after it (-1: none)."""
        lo, hi = np.searchsorted(self._subjects, [subject, subject + 1])
        hadm, trig = self._hadm[lo:hi], self._triggers[lo:hi]  # sorted by HADM_ID
        feeds = np.asarray(times, dtype=np.int64)[:, None] < trig[None, :]
        return np.where(feeds.any(axis=1), hadm[np.argmax(feeds, axis=1)], -1)

    def drop(self, hadm: int, subject: int, chunks: list[EventChunk]) -> tuple[list[EventChunk], list[Repeat]]:
        """An admission's chunks without its repeated rows' events, and those repeats; the chunks as given without any."""
        origins = [unpack_origin(c) for c in chunks]
        if not chunks or all(o is None for o in origins):
            return chunks, []
        if any(o is None for o in origins):
            raise ValueError(f"admission {hadm}: event chunks with and without their rows' origin")
        file_index = np.concatenate([np.full(len(rows), f, dtype=np.int64) for f, rows, _ in origins])
        row_ids = np.concatenate([rows for _, rows, _ in origins])
        lines = np.concatenate([lines for _, _, lines in origins])
        table = self._table_of[file_index]
        order = np.lexsort((lines, file_index, row_ids, table))  # each (table, ROW_ID), its first row first
        same = (table[order][1:] == table[order][:-1]) & (row_ids[order][1:] == row_ids[order][:-1])
        if not same.any():
            return chunks, []
        starts = np.concatenate([[True], ~same])
        keeper = np.empty(order.size, dtype=np.int64)
        keeper[order] = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
        repeat = np.zeros(order.size, dtype=bool)
        repeat[order[1:][same]] = True
        times, codes, values, units = concat_chunks(chunks)
        at = np.flatnonzero(repeat)
        first = self.first_admission(subject, times[at]) == hadm
        found = [Repeat(table=self._files[file_index[i]][0], file=self._files[file_index[i]][1], line=int(lines[i]),
                        row_id=int(row_ids[i]), kept_file=self._files[file_index[keeper[i]]][1],
                        kept_line=int(lines[keeper[i]]), first=bool(f)) for i, f in zip(at.tolist(), first.tolist())]
        keep = ~repeat
        return [pack_chunk(times[keep], codes[keep], values[keep], units[keep])], found


# ----------------------------------------------------------------------------- to-meds' rows

# Columns a to-meds worker adds to its spilled MEDS rows (removed before a shard is written): the row's
# file (an index into the release's files), ROW_ID and line. All rows of one subject meet in one sorted
# range of one shard (``to_meds.bucket_ranges``), so repeats are dropped there: every repeat of the
# same subject, whether it reaches an admission or not (to-meds writes every event).
ORIGIN_FIELDS = (pa.field("_origin_file", pa.int32()), pa.field("_origin_row_id", pa.int64()),
                 pa.field("_origin_line", pa.int64()))
_ORIGIN_NAMES = [f.name for f in ORIGIN_FIELDS]


def with_origin(rows: pa.Table, file_index: int, row_ids: np.ndarray, lines: np.ndarray) -> pa.Table:
    """MEDS rows (one per event, in the events' order) with their rows' origin columns appended."""
    columns = [pa.array(np.full(rows.num_rows, file_index, np.int32)), pa.array(row_ids, pa.int64()),
               pa.array(lines, pa.int64())]
    for field, column in zip(ORIGIN_FIELDS, columns):
        rows = rows.append_column(field, column)
    return rows


def drop_meds_repeats(tables: list[pa.Table], files: Sequence[tuple[str, str]],
                      ) -> tuple[list[pa.Table], list[tuple[int, Repeat]]]:
    """One subject range's MEDS row tables without their repeated rows (and without origin columns),
    and the repeats as (subject_id, Repeat); tables without origin columns (the task rows) pass as they are."""
    plain = [t for t in tables if _ORIGIN_NAMES[0] not in t.schema.names]
    rowed = [t for t in tables if _ORIGIN_NAMES[0] in t.schema.names]
    if not rowed:
        return tables, []
    rows = pa.concat_tables(rowed).combine_chunks()
    file_index, row_ids, lines = (rows.column(n).to_numpy().astype(np.int64) for n in _ORIGIN_NAMES)
    table_names = [t for t, _ in files]
    tables_sorted = sorted(set(table_names))
    table = np.asarray([tables_sorted.index(t) for t in table_names], dtype=np.int64)[file_index]
    order = np.lexsort((lines, file_index, row_ids, table))
    same = (table[order][1:] == table[order][:-1]) & (row_ids[order][1:] == row_ids[order][:-1])
    data = rows.drop_columns(_ORIGIN_NAMES)
    if not same.any():
        return plain + [data], []
    starts = np.concatenate([[True], ~same])
    keeper = np.empty(order.size, dtype=np.int64)
    keeper[order] = order[np.flatnonzero(starts)][np.cumsum(starts) - 1]
    repeat = np.zeros(order.size, dtype=bool)
    repeat[order[1:][same]] = True
    subjects = rows.column("subject_id").to_numpy()
    found = [(int(subjects[i]), Repeat(table=files[file_index[i]][0], file=files[file_index[i]][1],
                                       line=int(lines[i]), row_id=int(row_ids[i]),
                                       kept_file=files[file_index[keeper[i]]][1], kept_line=int(lines[keeper[i]]),
                                       first=True))
             for i in np.flatnonzero(repeat).tolist()]
    return plain + [data.filter(pa.array(~repeat))], found


def repeat_counts(found: list[tuple[int, Repeat]]) -> dict[str, int]:
    """to-meds' counts of repeats: each moves its row from ``extract/kept`` and ``written`` to ``extract/duplicate_row_id``."""
    counts: dict[str, int] = {}
    for _, r in found:
        for name, n in ((f"events/{r.table}/extract/kept", -1), (f"events/{r.table}/written", -1),
                        (f"events/{r.table}/extract/{DUPLICATE_ROW_ID}", 1)):
            counts[name] = counts.get(name, 0) + n
    return counts


def repeat_lines(found: list[tuple[int, Repeat]]) -> dict[str, bytes]:
    """Per table, the JSONL of its repeats' dead letters, by subject, file and line (an order whatever the ranges)."""
    by_table: dict[str, list[tuple[int, DeadLetter]]] = {}
    for subject, r in found:
        by_table.setdefault(r.table, []).append((subject, r.dead_letter()))
    return {table: "".join(d.to_json() + "\n" for _, d in sorted(letters, key=lambda sd: (sd[0], *sd[1].sort_key())))
            .encode("utf-8") for table, letters in sorted(by_table.items())}


REPEATS_DIR = "repeats"  # in the spill folder: to-meds' runs of repeats, <TABLE>/<split>-<shard>.jsonl


def repeat_run(spill_dir: str, table: str, split: str, shard: int) -> str:
    """The spill file of one shard's repeats of one table (to-meds)."""
    return layout.join(spill_dir, REPEATS_DIR, table, f"{split}-{shard:05d}.jsonl")


def concat_repeat_runs(spill_dir: str, out_dir: str) -> dict[str, int]:
    """to-meds' runs of repeats -> dead_letter/<TABLE>.duplicate_row_id.jsonl in shard order; returns lines per table."""
    found = FileSystems.match([layout.join(spill_dir, REPEATS_DIR, "*", "*.jsonl")])[0].metadata_list
    by_table: dict[str, list[str]] = {}
    for m in found:
        by_table.setdefault(m.path.rstrip("/").split("/")[-2], []).append(m.path)
    lines = {}
    for table, paths in sorted(by_table.items()):
        n = 0
        with layout.created_atomically(layout.join(out_dir, layout.DEAD_LETTER_DIR,
                                                   f"{table}.{DUPLICATE_ROW_ID}.jsonl")) as out:
            for path in sorted(paths):
                with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as run:
                    while block := run.read(1 << 20):
                        n += block.count(b"\n")
                        out.write(block)
        lines[table] = n
    return lines
