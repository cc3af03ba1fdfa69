"""The spilling jobs' stage C (``BagBuckets``): bag a bucket of admissions at a time under the unit plan.

    BagBuckets    one element per bucket (stage A's BUCKET item, ``spill_source.bucket_items``),
                  the unit plan joined to it by key (``with_plan``); ``BagBucket`` reads the
                  bucket's cohort rows and frames, drops the events of a row whose ROW_ID an earlier
                  row of its table brings to the same admission (``dedup``), and runs ``BagExample``
                  (so ``encode_admission``: the same bytes) on each admission in HADM_ID order;
                  records go to one sorted run per (split, shard), the values set aside for their
                  unit to one sorted dead-value run, the repeated rows to one dead-letter run per
                  table. The MEDS job's ``meds_stages.BagMedsBucket`` reads its examples otherwise.

Only RUN and DEAD_RUN references leave it, for stage D (``spill_merge``): a worker holds one bucket,
whatever the release's size.
"""
from __future__ import annotations

import uuid
from collections import defaultdict

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from ehr_pipeline.contract import layout
from ehr_pipeline.job import spill, vocab
from ehr_pipeline.job.bag import BagExample
from ehr_pipeline.job.dedup import RepeatFinder
from ehr_pipeline.job.items import COUNTS, DEAD, KV, RECORDS, STATS, Select, Tagged, count
from ehr_pipeline.job.sinks import DEAD_VALUES
from ehr_pipeline.job.spill import BUCKET, DEAD_DIR, DEAD_RUN, PLAN, RUN, RUNS_DIR, bucket_folder
from ehr_pipeline.mimic.events import DUPLICATE_ROW_ID
from ehr_pipeline.reader import DeadLetter


def repeats_file_name(table: str) -> str:
    """The dead-letter file (without .jsonl) of a table's repeated ROW_IDs: dead_letter/<TABLE>.duplicate_row_id.jsonl."""
    return f"{table}.{DUPLICATE_ROW_ID}"


def _run_folder(split_shard: tuple[str, int]) -> str:
    return f"{split_shard[0]}-{split_shard[1]:05d}"


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
