"""The spilling jobs' stage D (``MergeShards``): each shard's record runs into its TFRecord file, the dead values into theirs.

    MergeShards   one element per shard (``sinks.group_by_every_shard``: an empty shard too); its
                  runs concatenated in bucket order through ``tfrecord.write_records``, or merged by
                  key after the MEDS job's hashed buckets (``merge=True``) (``MergeShard``); each
                  dead-letter file's runs likewise into one file (``ConcatDeadRuns``).

A worker holds one bucket's run (or one frame of each run when merging), whatever the release's size.
"""
from __future__ import annotations

import heapq
import json
import operator

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from ehr_pipeline.contract import layout, spec, tfrecord
from ehr_pipeline.job import spill
from ehr_pipeline.job.items import KV, Select, count
from ehr_pipeline.job.sinks import DeadValue, group_by_every_shard
from ehr_pipeline.job.spill import DEAD_RUN, RUN


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class MergeShard(beam.DoFn):
    """((split, shard), [(bucket, run) or None]) -> the shard's TFRecord file, records in example-key order.

    Buckets that are key ranges (``merge=False``) concatenate in bucket order; buckets of hashed
    keys are merged by key, one frame of each run in memory at a time.
    """

    def __init__(self, out_dir: str, config_dict: dict, merge: bool = False):
        self._out, self._config_dict, self._merge = out_dir, config_dict, merge

    def process(self, element):
        (split, shard), refs = element
        runs = sorted(r for r in refs if r is not None)
        n_shards = self._config_dict["num_shards"][split]
        records = _merged(runs) if self._merge else _in_order(runs)
        with layout.created_atomically(layout.join(self._out, spec.shard_file_name(split, shard, n_shards))) as f:
            n = tfrecord.write_records(f, records)
        yield count(f"files/{split}/records_written", n)


def _in_order(runs: list[tuple[int, str]]):
    """The records of runs in bucket order, checked to rise by HADM_ID (a wrong bound fails loudly)."""
    last = None
    for _, path in runs:
        for hadm, record in spill.read_frames(path):
            if last is not None and hadm <= last:
                raise RuntimeError(f"{path}: record runs out of HADM_ID order at {hadm} after {last}")
            last = hadm
            yield record


def _merged(runs: list[tuple[int, str]]):
    """The records of runs each sorted by key, merged by key (ties in bucket order)."""
    streams = [spill.stream_frames(path) for _, path in runs]
    for _, record in heapq.merge(*streams, key=operator.itemgetter(0)):
        yield record


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class ConcatDeadRuns(beam.DoFn):
    """(dead-letter file name, [(bucket, run, lines)]) -> dead_letter/<name>.jsonl, in DeadValue order.

    Runs of key-range buckets concatenate in bucket order; runs of hashed buckets are merged line by
    line on DeadValue.sort_key.
    """

    def __init__(self, out_dir: str, merge: bool = False):
        self._out, self._merge = out_dir, merge

    def process(self, element):
        name, runs = element
        runs = sorted(runs)
        n = sum(lines for _, _, lines in runs)
        with layout.created_atomically(layout.join(self._out, layout.DEAD_LETTER_DIR, f"{name}.jsonl")) as f:
            if self._merge:
                streams = [_jsonl_lines(path) for _, path, _ in runs]
                for line in heapq.merge(*streams, key=lambda line: DeadValue(**json.loads(line)).sort_key()):
                    f.write(line)
            else:
                for _, path, _ in runs:
                    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as run:
                        while block := run.read(1 << 20):
                            f.write(block)
        yield count(f"dead_letters_written/{name}", n)


def _jsonl_lines(path: str):
    """The lines (bytes, newline kept) of a dead-value run, read as they are needed."""
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as run:
        yield from run


class MergeShards(beam.PTransform):
    """RUN and DEAD_RUN references -> every shard file of every split (an empty one too) and the dead values."""

    def __init__(self, out_dir: str, config_dict: dict, merge: bool = False):
        super().__init__()
        self._out, self._config, self._merge = out_dir, config_dict, merge

    def expand(self, bagged):
        shards = (group_by_every_shard(bagged | "Runs" >> Select(RUN), self._config)
                  | "MergeShards" >> beam.ParDo(MergeShard(self._out, self._config, self._merge)))
        dead = (
            bagged
            | "DeadRuns" >> Select(DEAD_RUN)
            | "GroupDeadRuns" >> beam.GroupByKey()
            | "ConcatDeadRuns" >> beam.ParDo(ConcatDeadRuns(self._out, self._merge))
        )
        return (shards, dead) | "Written" >> beam.Flatten()
