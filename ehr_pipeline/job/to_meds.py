"""`ehr-pipeline to-meds`: a MIMIC-III v1.4 release (or a synthetic one) -> a MEDS 0.4 dataset, as a Beam job.

What the dataset holds, and the pure functions that make its rows and files, are in
``ehr_pipeline.meds.from_mimic``; this module runs them: the driver reads ADMISSIONS and
PATIENTS and writes the task rows and metadata, the workers convert the event tables block by
block (``ConvertEvents``), and every shard is written whole and sorted (``WriteMedsData``), so
reruns give the same bytes. Every row read is counted, as written or dropped by reason.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from ehr_pipeline.contract import PipelineConfig, layout, output_folder
from ehr_pipeline.job import manifest as manifest_mod
from ehr_pipeline.job import dedup, spill
from ehr_pipeline.job.run import (log_temp_bytes, pipeline_options, release_lab_loinc, split_inputs,
                                  with_local_workers, work_bytes)
from ehr_pipeline.job.sinks import WriteDeadLetters, write_dead_letter_files
from ehr_pipeline.job.sources import open_event_table
from ehr_pipeline.job.spill_source import SlotFiles
from ehr_pipeline.job.items import COUNTS, DEAD, FATAL, KV, OneList, Select, Tagged, count, select
from ehr_pipeline.meds.from_mimic import (
    MANIFEST,
    MEDS_SPLITS,
    by_bucket,
    conversion_manifest,
    event_rows,
    from_ipc,
    subject_buckets,
    subject_cuts,
    task_rows,
    to_ipc,
    write_code_metadata,
    write_dataset_metadata,
    write_subject_splits,
    write_sorted_shard,
)
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.mimic import events as ev
from ehr_pipeline.reader import ReaderError, check_header, locate_table, locate_table_files, read_table

log = logging.getLogger(__name__)

RUN = "run"  # ((split, shard), (bucket, frame file of MEDS rows as Arrow IPC))
CODES = "codes"  # kind: a code seen in the data
MEDS_RUNS_DIR = "meds"


def _run_folder(key: tuple[str, int, int]) -> str:
    split, shard, bucket = key
    return f"{split}-{shard:05d}-b{bucket:05d}"


def spill_rows(writer: spill.FrameWriter, rows, config, bounds) -> None:
    """Appends MEDS rows to the frame files of their (split, shard, bucket)."""
    for key, part in by_bucket(rows, config, bounds):
        writer.write(key, key[2], to_ipc(part))


def run_references(writer: spill.FrameWriter) -> list[tuple[str, tuple]]:
    """Closes a writer; its files as RUN items ((split, shard), (bucket, path))."""
    return [(RUN, ((split, shard), (bucket, path))) for (split, shard, bucket), path in sorted(writer.close().items())]


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class ConvertTable(beam.DoFn):
    """(table, file) -> RUN references of its MEDS rows spilled by shard bucket, codes, counts, dead letters."""

    def __init__(self, discharges, config_dict: dict, spill_dir: str, bounds: dict, block_size_bytes: int,
                 files: list[tuple[str, str]] | None = None):
        self._discharges, self._config_dict = discharges, config_dict
        self._spill, self._bounds, self._block = spill_dir, bounds, block_size_bytes
        # Rows carry their origin, by which the shard writer drops repeated ROW_IDs (dedup).
        self._file_index = {tuple(f): i for i, f in enumerate(files)} if files is not None else None

    def setup(self):
        self._config = PipelineConfig.model_validate(self._config_dict)

    def process(self, element):
        table, path = element
        writer = spill.FrameWriter(layout.join(self._spill, MEDS_RUNS_DIR), _run_folder)
        try:
            yield from self._convert(table, path, writer)
        except ReaderError as e:
            yield FATAL, str(e)
        yield from run_references(writer)

    def _convert(self, table: str, path: str, writer: spill.FrameWriter):
        dead: list = []
        reader, blocks, index = open_event_table(table, path, self._file_index, dead.append, self._block)
        for batch in blocks:
            events, extract_counts = ev.extract(table, batch, self._discharges)
            rows = event_rows(events)
            if index is not None:
                rows = dedup.with_origin(rows, index, *(events.column(c) for c in ev.ORIGIN_COLUMNS))
            spill_rows(writer, rows, self._config, self._bounds)
            for code in pc.unique(rows.column("code")).to_pylist():
                yield CODES, (code, None)
            for reason, n in extract_counts.items():
                yield COUNTS, count(f"events/{table}/extract/{reason}", n)
            yield COUNTS, count(f"events/{table}/written", rows.num_rows)
            for letter in dead:
                yield DEAD, (table, letter)
            dead.clear()
        for letter in dead:
            yield DEAD, (table, letter)
        stats = reader.stats
        yield COUNTS, count(f"rows/{table}/read", stats.rows_read)
        yield COUNTS, count(f"rows/{table}/parsed", stats.rows_parsed)
        for reason, n in stats.dead_lettered.items():
            yield COUNTS, count(f"rows/{table}/dead_letter/{reason}", n)


def spilled_tables(paths: list[str]) -> Iterator[pa.Table]:
    """The MEDS row tables of a bucket's frame files, one frame at a time."""
    for path in paths:
        for _, blob in spill.read_frames(path):
            yield from_ipc(blob)


def bucket_ranges(paths: list[str], limit: int) -> Iterator[list[pa.Table]]:
    """A bucket's row tables, one subject range of at most `limit` rows at a time, counted from the rows spilled.

    The buckets were cut from an estimate of the rows per subject, which a release's row width can
    miss; a bucket that fits is read once, a bigger one is counted by subject and read again per range.
    """
    held: list[pa.Table] | None = []
    rows, ids, counts = 0, [], []
    for table in spilled_tables(paths):
        sid, n = np.unique(table.column("subject_id").to_numpy(), return_counts=True)
        ids.append(sid)
        counts.append(n)
        rows += table.num_rows
        if held is not None:
            held.append(table)
            if rows > limit:
                held = None  # counted from here on, read again range by range
    if held is not None:
        yield held
        return
    subjects, where = np.unique(np.concatenate(ids), return_inverse=True)
    per_subject = np.bincount(where, weights=np.concatenate(counts)).astype(np.int64)
    cuts = subject_cuts(subjects, per_subject, limit).tolist()
    log.info("a bucket of %d MEDS rows (over %d) is sorted in %d ranges", rows, limit, len(cuts) + 1)
    for low, high in zip([None, *cuts], [*cuts, None]):
        yield [t.filter(_in_range(t.column("subject_id"), low, high)) for t in spilled_tables(paths)]


def _in_range(column, low: int | None, high: int | None):
    inside = pc.greater_equal(column, low) if low is not None else pc.is_valid(column)
    return inside if high is None else pc.and_(inside, pc.less(column, high))


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class WriteMedsShard(beam.DoFn):
    """((split, shard), [(bucket, run) or None]) -> data/<split>/<shard>.parquet, sorted range by range, atomically."""

    def __init__(self, out_dir: str, bucket_rows: int, files: list[tuple[str, str]] | None = None,
                 spill_dir: str | None = None):
        self._out, self._limit, self._files, self._spill = out_dir, bucket_rows, files, spill_dir

    def process(self, element):
        (split, shard), refs = element
        runs: dict[int, list[str]] = defaultdict(list)
        for bucket, path in sorted(r for r in refs if r is not None):
            runs[bucket].append(path)
        ranges = (part for b in sorted(runs) for part in bucket_ranges(runs[b], self._limit))
        repeats: dict[str, int] = defaultdict(int)
        if self._files is not None:
            ranges = self._without_repeats(ranges, split, shard, repeats)
        path = layout.join(self._out, "data", split, f"{shard}.parquet")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with layout.created_atomically(path) as f:
            n = write_sorted_shard(ranges, f)
        yield count(f"files/{split}/rows_written", n)
        yield from (count(name, n) for name, n in sorted(repeats.items()) if n)

    def _without_repeats(self, ranges, split: str, shard: int, counts: dict[str, int]):
        """The ranges without repeated ROW_IDs (a subject's rows all lie in one range); their dead letters
        appended to this shard's runs (dedup.concat_repeat_runs makes the files), their counts added."""
        runs: dict[str, object] = {}
        try:
            for tables in ranges:
                tables, found = dedup.drop_meds_repeats(tables, self._files)
                for name, n in dedup.repeat_counts(found).items():
                    counts[name] += n
                for table, body in dedup.repeat_lines(found).items():
                    if table not in runs:
                        runs[table] = FileSystems.create(dedup.repeat_run(self._spill, table, split, shard))
                    runs[table].write(body)
                yield tables
        finally:
            for f in runs.values():
                f.close()


class ConvertEvents(beam.PTransform):
    """Event-table files, grouped onto the workers by size -> tagged RUN references, codes, counts, dead letters."""

    def __init__(self, slots: list[tuple[int, list]], discharges, config_dict: dict, spill_dir: str, bounds: dict,
                 block_size_bytes: int, files: list[tuple[str, str]] | None = None):
        super().__init__()
        self._slots = slots
        self._convert = ConvertTable(discharges, config_dict, spill_dir, bounds, block_size_bytes, files)

    def expand(self, p):
        return p | "EventFiles" >> SlotFiles(self._slots) | "Convert" >> beam.ParDo(self._convert)


class WriteMedsData(beam.PTransform):
    """RUN references (of the events and of the driver's task rows) -> one parquet file per (split, shard)."""

    def __init__(self, out_dir: str, task_refs: list, shards: list[tuple[str, int]], bucket_rows: int,
                 files: list[tuple[str, str]] | None = None, spill_dir: str | None = None):
        super().__init__()
        self._out, self._task, self._shards, self._limit = out_dir, task_refs, shards, bucket_rows
        self._files, self._spill = files, spill_dir

    def expand(self, items):
        p = items.pipeline
        return (
            (items | "Runs" >> Select(RUN), p | "TaskRuns" >> beam.Create(self._task).with_output_types(KV),
             p | "AllShards" >> beam.Create([(s, None) for s in self._shards]).with_output_types(KV))
            | "JoinRuns" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteMedsShard(self._out, self._limit, self._files, self._spill))
        )


def run_to_meds(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None = None,
                resources: spill.SpillOptions | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Converts a MIMIC-III release to a MEDS dataset in out_dir; returns the conversion manifest.

    ``resources``: workers (default: the machine's cores, one for a small input), the temporary folder
    and the sizes that bound memory (spill.SpillOptions; a shard is sorted about ``bucket_rows`` rows at
    a time). out_dir is written whole or not at all (output_folder.staged): an earlier dataset there is
    replaced only with ``overwrite``, and no shard of it survives beside the new ones.
    """
    started = time.time()
    mimic_dir, out_dir = layout.absolute(mimic_dir), layout.absolute(out_dir)  # as run_job, for every runner
    with output_folder.staged(out_dir, kind=output_folder.MEDS_DATASET, command="ehr-pipeline to-meds",
                              overwrite=overwrite, inputs=[mimic_dir]) as staging:
        return _to_meds(mimic_dir, staging, config, beam_args, resources, started)


def _to_meds(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None,
             resources: spill.SpillOptions | None, started: float) -> dict[str, Any]:
    """run_to_meds' work, written into out_dir (the staging folder)."""
    inputs = [(t, str(p)) for t in ev.TABLE_SOURCE for p in locate_table_files(mimic_dir, t)]
    for table, path in inputs:
        check_header(path, table)
    dead_driver: list = []
    tables, stats = {}, {}
    for name, columns in (("ADMISSIONS", cohort_mod.ADMISSION_COLUMNS + ("ADMISSION_LOCATION", "DISCHARGE_LOCATION")),
                          ("PATIENTS", cohort_mod.PATIENT_COLUMNS + ("DOD",))):
        tables[name], stats[name] = read_table(locate_table(mimic_dir, name), name, columns=columns,
                                               on_dead_letter=lambda d, n=name: dead_driver.append((n, d)))
    coh = cohort_mod.build_cohort(tables["ADMISSIONS"], tables["PATIENTS"],
                                  trigger_offset_seconds=config.trigger_offset_seconds,
                                  min_age_years=config.min_age_years)
    task, task_counts = task_rows(tables["ADMISSIONS"], tables["PATIENTS"])
    cfg = config.to_dict()
    shards = [(MEDS_SPLITS[s], k) for s in MEDS_SPLITS for k in range(cfg["num_shards"][s])]
    tmp = os.path.join(out_dir, layout.TMP_DIR)
    os.makedirs(tmp, exist_ok=True)
    resources = resources or spill.SpillOptions()
    workers = resources.worker_count(sum(work_bytes(item) for item in inputs))
    with spill.spill_run(out_dir, resources.temp_dir, inputs, resources.split_threshold_bytes) as spill_dir:
        graph = _spill_road(inputs, tables, task, coh.discharges, spill_dir, resources, workers, config)
        _run_pipeline(out_dir, tmp, shards, graph, resources.bucket_rows, with_local_workers(beam_args or [], workers))
        dedup.concat_repeat_runs(spill_dir, out_dir)
        log_temp_bytes(spill_dir, ("parts", MEDS_RUNS_DIR))

    found_errors = layout.read_json(os.path.join(tmp, "errors.json"))
    if found_errors:
        raise ReaderError(found_errors[0])
    counts_found = dict(layout.read_json(os.path.join(tmp, "counts.json")))
    data_codes = {c for c, _ in layout.read_json(os.path.join(tmp, "codes.json"))}
    data_codes |= set(task.column("code").to_pylist())
    write_code_metadata(out_dir, mimic_dir, sorted(data_codes), release_lab_loinc(mimic_dir, dead_driver))
    write_subject_splits(out_dir, tables, config)
    write_dataset_metadata(out_dir, mimic_dir)
    write_dead_letter_files(out_dir, dead_driver)
    manifest = conversion_manifest(counts_found, task_counts, stats, sorted({t for t, _ in inputs}), mimic_dir,
                                   manifest_mod.group)
    shutil.rmtree(tmp, ignore_errors=True)  # MEDS readers glob the dataset folder: leave only MEDS in it
    manifest["seconds"] = round(time.time() - started, 3)
    layout.write_json(os.path.join(out_dir, MANIFEST), manifest)
    return manifest


def _spill_road(inputs, tables: dict, task, discharges, spill_dir: str, resources: spill.SpillOptions, workers: int,
                config) -> tuple:
    """(ConvertEvents, the task rows' RUN references, the release's files, the spill folder): disk checked, big
    inputs split, buckets drawn."""
    release_files = list(inputs)  # what rows are named and ordered by (a part names its file's lines)
    inputs = split_inputs(inputs, spill_dir, resources.split_threshold_bytes)
    subjects = tables["PATIENTS"].column("SUBJECT_ID").to_numpy()
    bounds = subject_buckets(subjects, config, subjects_per_bucket(inputs, subjects.size, resources.bucket_rows))
    spill.ensure_open_files(sum(len(b) + 1 for b in bounds.values()), "pass a larger --bucket-rows")
    writer = spill.FrameWriter(layout.join(spill_dir, MEDS_RUNS_DIR), _run_folder)
    spill_rows(writer, task, config, bounds)
    task_refs = [ref for _, ref in run_references(writer)]
    slots = spill.lpt_slots(sorted(inputs), workers, work_bytes)
    log.info("%d input files, %d shard buckets, %d workers; temporary files in %s", len(inputs),
             sum(len(b) + 1 for b in bounds.values()), workers, spill_dir)
    return (ConvertEvents(slots, discharges, config.to_dict(), spill_dir, bounds, resources.block_size_bytes,
                          release_files), task_refs, release_files, spill_dir)


# CSV text bytes per event row: ~100 in MIMIC-III's CHARTEVENTS (~33 GB, 330M rows) and in the
# synthetic releases (99 measured at 8,000 patients).
TEXT_BYTES_PER_ROW = 100


def subjects_per_bucket(inputs: list[tuple[str, str]], subjects: int, bucket_rows: int) -> int:
    """Subjects whose rows make about `bucket_rows` MEDS rows, from the inputs' expected text size."""
    rows = sum(work_bytes(item) for item in inputs) / TEXT_BYTES_PER_ROW
    return max(1, int(bucket_rows * max(subjects, 1) / max(rows, 1.0)))


def _run_pipeline(out_dir: str, tmp: str, shards: list, graph: tuple, bucket_rows: int, beam_args: list[str]) -> None:
    """Converts, writes the shards and the driver's files of counts, codes and errors."""
    convert, task_refs, *repeats = graph

    def to_file(name):
        def write(items):
            layout.write_json(os.path.join(tmp, name), sorted(items))
            return name
        return write

    p = beam.Pipeline(options=pipeline_options(beam_args))
    items = p | "ConvertEvents" >> convert
    written = items | "WriteMedsData" >> WriteMedsData(out_dir, task_refs, shards, bucket_rows, *repeats)
    dead = (items,) | "WriteDeadLetters" >> WriteDeadLetters(out_dir)
    counts = ((items | "Counts" >> Select(COUNTS), written, dead) | "AllCounts" >> beam.Flatten()
              | "Sum" >> beam.CombinePerKey(sum) | "CountsList" >> OneList()
              | "WriteCounts" >> beam.Map(to_file("counts.json")))
    codes = (items | "Codes" >> Select(CODES) | "DistinctCodes" >> beam.CombinePerKey(lambda _: None)
             | "CodeList" >> OneList() | "WriteCodes" >> beam.Map(to_file("codes.json")))
    errors = (items | "Fatal" >> beam.FlatMap(select(FATAL)) | "ErrorList" >> OneList()
              | "WriteErrors" >> beam.Map(to_file("errors.json")))
    _ = (counts, codes, errors) | "Finish" >> beam.Flatten()
    p.run().wait_until_finish()

