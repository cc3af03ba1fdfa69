"""The MIMIC-III job's stages around its spill folder (``spill``): read and spill, bag a bucket, merge a shard.

    SpillSource   stage A: one element per input file or part, files grouped onto the workers by
                  size; reads, extracts and cuts to the cohort exactly as ``ReadMimicTable`` does,
                  and appends each admission's packed chunks to its bucket's frame file. Only
                  (bucket, file) references leave it, beside the unit census, counts and dead rows.
    BagBuckets    stage C: one element per bucket; reads the bucket's cohort rows and frames,
                  drops the events of a row whose ROW_ID an earlier row of its table brings to the
                  same admission (``dedup``), and runs ``BagExample`` (so ``encode_admission``: the
                  same bytes) on each admission in HADM_ID order; records go to one sorted run per
                  (split, shard), the values set aside for their unit to one sorted dead-value run,
                  the repeated rows to one dead-letter run per table.
    MergeShards   stage D: one element per shard; its runs concatenated in bucket order through
                  ``tfrecord.write_records``; the dead-value runs likewise into one file.

No event, record or dead value crosses a GroupByKey: a worker holds one file's blocks (A), one
bucket (C) or one bucket's run (D), whatever the release's size.
"""
from __future__ import annotations

import heapq
import json
import operator
import uuid
from collections import defaultdict

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from ehr_pipeline.contract import layout, spec, tfrecord
from ehr_pipeline.job import spill, vocab
from ehr_pipeline.job.bag import BagExample
from ehr_pipeline.job.dedup import RepeatFinder
from ehr_pipeline.mimic.events import DUPLICATE_ROW_ID
from ehr_pipeline.job.sinks import DEAD_VALUES, DeadValue, group_by_every_shard
from ehr_pipeline.job.sources import ReadMimicTable
from ehr_pipeline.job.items import COUNTS, DEAD, EVENTS, FATAL, KV, RECORDS, STATS, Select, Tagged, count
from ehr_pipeline.reader import DeadLetter, ReaderError

# The spilling stages' own kinds of items (beside ``items``' kinds):
SPILL = "spill"  # (bucket, frame file of events)
BUCKET = "bucket"  # (bucket, [frame files or None]): stage C's element
PLAN = "plan"  # the unit plan, joined to every bucket
RUN = "run"  # ((split, shard), (bucket, frame file of records))
DEAD_RUN = "dead_run"  # (dead-letter file name, (bucket, JSONL run, lines))

EVENTS_DIR, RUNS_DIR, DEAD_DIR = "events", "runs", "dead"


def repeats_file_name(table: str) -> str:
    """The dead-letter file (without .jsonl) of a table's repeated ROW_IDs: dead_letter/<TABLE>.duplicate_row_id.jsonl."""
    return f"{table}.{DUPLICATE_ROW_ID}"


def bucket_folder(bucket: int) -> str:
    """A bucket's folder name among the frame files."""
    return f"b{bucket:05d}"


def _run_folder(split_shard: tuple[str, int]) -> str:
    return f"{split_shard[0]}-{split_shard[1]:05d}"


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class SpillTable(ReadMimicTable):
    """(table, file) -> ReadMimicTable's items, its events appended to bucket frame files: SPILL references."""

    def __init__(self, cohort_index, discharges, block_size_bytes: int, spill_dir: str, bounds: np.ndarray,
                 files: list[tuple[str, str]] | None = None):
        super().__init__(cohort_index, discharges, block_size_bytes, files)
        self._spill, self._bounds = spill_dir, bounds

    def process(self, element):
        table, path = element
        writer = spill.FrameWriter(layout.join(self._spill, EVENTS_DIR), bucket_folder)
        try:
            for kind, payload in self.read_items(table, path):
                if kind == EVENTS:
                    hadm, chunk = payload
                    writer.write(spill.bucket_of(self._bounds, hadm), hadm, chunk)
                else:
                    yield kind, payload
        except ReaderError as e:
            yield FATAL, str(e)  # the driver's one-line error, as ReadMimicTable's
        for bucket, frames in sorted(writer.close().items()):
            yield SPILL, (bucket, frames)


class SlotFiles(beam.PTransform):
    """(slot, files) groups -> the files, each group on one worker.

    The local runner hands key k of a grouped stage to worker k mod workers, so files grouped by
    size (spill.lpt_slots) are spread by size rather than at random.
    """

    def __init__(self, slots: list[tuple[int, list]]):
        super().__init__()
        self._slots = slots

    def expand(self, p):
        return (
            p
            | "Slots" >> beam.Create(self._slots).with_output_types(KV)
            | "GroupSlots" >> beam.GroupByKey()
            | "SlotFiles" >> beam.FlatMap(lambda kv: [f for group in kv[1] for f in group])
        )


class SpillSource(beam.PTransform):
    """MIMIC-III event files -> tagged items: one BUCKET per bucket (its frame files), census, counts, dead rows.

    ``slots`` groups of files of similar size, one key each: the local runner gives key k to
    worker k mod workers, so the files are spread by size rather than at random.
    """

    def __init__(self, slots: list[tuple[int, list]], cohort_index, discharges, spill_dir: str, bounds: np.ndarray,
                 block_size_bytes: int, files: list[tuple[str, str]] | None = None):
        super().__init__()
        self._slots, self._cohort, self._discharges = slots, cohort_index, discharges
        self._spill, self._bounds, self._block, self._files = spill_dir, bounds, block_size_bytes, files

    def expand(self, p):
        read = (
            p
            | "EventFiles" >> SlotFiles(self._slots)
            | "SpillTables" >> beam.ParDo(SpillTable(self._cohort, self._discharges, self._block, self._spill,
                                                     self._bounds, self._files))
        )
        return bucket_items(read, len(self._bounds) + 1)


def bucket_items(read, buckets: int):
    """Stage A's items with its SPILL references grouped into one BUCKET item per bucket (an empty one too)."""
    every = [(bucket, None) for bucket in range(buckets)]
    grouped = (
        (read | "SpillRefs" >> Select(SPILL), read.pipeline | "AllBuckets" >> beam.Create(every).with_output_types(KV))
        | "JoinBuckets" >> beam.Flatten()
        | "GroupByBucket" >> beam.GroupByKey()
        | "TagBuckets" >> beam.Map(lambda kv: (BUCKET, kv)).with_output_types(Tagged)
    )
    others = read | "NotRefs" >> beam.Filter(lambda item: item[0] != SPILL).with_output_types(Tagged)
    return (grouped, others) | "SourceItems" >> beam.Flatten()


@beam.typehints.with_input_types(tuple)  # ((bucket, frame files), the unit plan)
@beam.typehints.with_output_types(Tagged)
class BagBucket(beam.DoFn):
    """((bucket, frame files), unit plan) -> RUN and DEAD_RUN references, and BagExample's counts and statistics.

    ``repeats`` (the MIMIC-III road): drops repeated ROW_IDs from each admission before bagging, counted.
    """

    def __init__(self, config_dict: dict, spill_dir: str, cohort_file: str, cohort_ranges: list[tuple[int, int]],
                 repeats: RepeatFinder | None = None):
        self._config_dict, self._spill = config_dict, spill_dir
        self._cohort_file, self._ranges, self._repeats = cohort_file, cohort_ranges, repeats

    def setup(self):
        self._bag = BagExample(self._config_dict)
        self._bag.setup()

    def process(self, element):
        (bucket, refs), plan = element
        runs = spill.FrameWriter(layout.join(self._spill, RUNS_DIR), _run_folder)
        dead = []
        # Summed per bucket, not yielded per example: a runner without combiner lifting (Dask's)
        # would otherwise hold millions of them in its shuffle. Exact sums: the same totals.
        tallies: dict[str, int] = defaultdict(int)
        stats: dict[str, tuple] = {}
        repeated: dict[str, list[tuple[int, DeadLetter]]] = defaultdict(list)
        for key, items in self.examples(bucket, sorted(r for r in refs if r is not None)):
            if self._repeats is not None:
                items = self._without_repeats(key, items, tallies, repeated)
            for kind, payload in self._bag.process((key, items), plan):
                if kind == RECORDS:
                    split_shard, (key, record) = payload
                    runs.write(split_shard, key, record)
                elif kind == DEAD and payload[0] == DEAD_VALUES:
                    dead.append(payload[1])
                elif kind == COUNTS:
                    tallies[payload[0]] += payload[1]
                elif kind == STATS:
                    code, st = payload
                    stats[code] = vocab.add_exact(stats.get(code, vocab.EXACT_ZERO), st)
                else:
                    yield kind, payload
        yield from ((COUNTS, item) for item in sorted(tallies.items()))
        yield from ((STATS, item) for item in sorted(stats.items()))
        if dead:
            yield DEAD_RUN, (DEAD_VALUES, self._write_dead_run(bucket, dead))
        for table, letters in sorted(repeated.items()):
            # By admission first, as buckets are: the runs in bucket order are one order whatever the buckets.
            yield DEAD_RUN, (repeats_file_name(table), self._write_dead_run(
                bucket, letters, key=lambda hd: (hd[0], *hd[1].sort_key()), letter=lambda hd: hd[1]))
        for split_shard, path in sorted(runs.close().items()):
            yield RUN, (split_shard, (bucket, path))

    def _without_repeats(self, hadm: int, items: list, tallies: dict[str, int],
                         repeated: dict[str, list[tuple[int, DeadLetter]]]) -> list:
        """An admission's [cohort row, chunks] without its repeated rows; each counted, a row's first one dead-lettered.

        The counts move a repeated row from stage A's ``used`` to ``duplicate_row_id`` (``dedup``).
        """
        row, chunks = items[0], items[1:]
        if not isinstance(row, dict) or not chunks:
            return items  # events without a cohort row: BagExample counts them as orphans
        chunks, found = self._repeats.drop(hadm, row["SUBJECT_ID"], chunks)
        for r in found:
            if r.first:
                for name, n in ((f"events/{r.table}/cohort/used", -1),
                                (f"events/{r.table}/cohort/{DUPLICATE_ROW_ID}", 1)):
                    tallies[name] += count(name, n)[1]
                repeated[r.table].append((hadm, r.dead_letter()))
            else:
                tallies[f"bagging/{DUPLICATE_ROW_ID}"] += count(f"bagging/{DUPLICATE_ROW_ID}", 1)[1]
        return [row, *chunks]

    def examples(self, bucket: int, frame_files: list[str]):
        """(HADM_ID, [cohort row, event chunks]) of a bucket's admissions in HADM_ID order.

        Events of an admission without a cohort row (stage A spills none) come last, without a
        row: BagExample counts them as orphans.
        """
        rows = spill.read_cohort_rows(self._cohort_file, *self._ranges[bucket])
        chunks: dict[int, list[bytes]] = defaultdict(list)
        for frames in frame_files:  # chunk order is irrelevant: bagging orders
            for hadm, chunk in spill.read_frames(frames):
                chunks[hadm].append(chunk)
        for hadm in sorted(rows):
            yield hadm, [rows[hadm]] + chunks.pop(hadm, [])
        yield from sorted(chunks.items())

    def _write_dead_run(self, bucket: int, dead: list, key=lambda d: d.sort_key(),
                        letter=lambda d: d) -> tuple[int, str, int]:
        """One bucket's dead values (or ``letter`` of each item) as a JSONL run sorted by ``key``: (bucket, path, lines).

        DeadValue.sort_key starts with the HADM_ID and buckets are HADM_ID ranges: the runs in
        bucket order are the file ``sinks.write_dead_letter_file`` writes from all of them. The dead
        letters of repeated rows sort by the admission they were dropped from, then file and line.
        """
        dead = [letter(d) for d in sorted(dead, key=key)]
        path = layout.join(self._spill, DEAD_DIR, f"{bucket_folder(bucket)}-{uuid.uuid4().hex}.jsonl")
        with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            f.write("".join(d.to_json() + "\n" for d in dead).encode("utf-8"))
        return bucket, path, len(dead)


class BagBuckets(beam.PTransform):
    """Source items -> RUN and DEAD_RUN references, counts and code statistics, each bucket bagged under the unit plan.

    ``bag_bucket`` is the stage's DoFn: BagBucket (admissions of a HADM_ID range, their rows in the
    cohort file) or a subclass that reads its examples otherwise (``meds_stages.BagMedsBucket``).
    The plan joins each of the ``buckets`` by key rather than as a side input: Beam's DaskRunner
    computes a side input again inside every task that reads it, which re-ran the whole source
    (stage A's spill written twice, the cluster's memory held twice).
    """

    def __init__(self, bag_bucket: BagBucket, plan, buckets: int):
        super().__init__()
        self._bag_bucket, self._plan, self._buckets = bag_bucket, plan, buckets

    def expand(self, items):
        refs = items | "Buckets" >> Select(BUCKET) | "KeyRefs" >> beam.MapTuple(
            lambda bucket, frames: (bucket, (BUCKET, frames))).with_output_types(KV)
        plans = self._plan | "PlanPerBucket" >> beam.FlatMap(
            lambda plan, n: [(bucket, (PLAN, plan)) for bucket in range(n)], self._buckets).with_output_types(KV)
        return (
            (refs, plans)
            | "BucketsAndPlan" >> beam.Flatten()
            | "JoinPlan" >> beam.GroupByKey()
            | "WithPlan" >> beam.Map(with_plan).with_output_types(tuple)
            | "BagBucket" >> beam.ParDo(self._bag_bucket)
        )


def with_plan(element) -> tuple[tuple[int, list], dict]:
    """(bucket, [(BUCKET, frame files), (PLAN, plan)]) -> ((bucket, frame files), plan): one of each per bucket."""
    bucket, parts = element
    found = defaultdict(list)
    for kind, value in parts:
        found[kind].append(value)
    if len(found[BUCKET]) != 1 or len(found[PLAN]) != 1:
        raise RuntimeError(f"bucket {bucket}: {len(found[BUCKET])} file lists and {len(found[PLAN])} unit plans, "
                           "expected one of each")
    return (bucket, found[BUCKET][0]), found[PLAN][0]


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
