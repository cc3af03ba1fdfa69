"""`ehr-pipeline to-meds`: a MIMIC-III v1.4 release (or a synthetic one) -> a MEDS 0.4 dataset, as a Beam job.

What the dataset holds, and the pure functions that make its rows and files, are in
``ehr_pipeline.meds.from_mimic``; this module runs them: the driver reads ADMISSIONS and
PATIENTS and writes the task rows and metadata, the workers convert the event tables block by
block (``ConvertEvents``), and every shard is written whole and sorted (``WriteMedsData``), so
reruns give the same bytes. Every row read is counted, as written or dropped by reason.
"""
from __future__ import annotations

import os
import shutil
import time
from typing import Any

import apache_beam as beam
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ehr_pipeline.contract import PipelineConfig, layout
from ehr_pipeline.job import manifest as manifest_mod
from ehr_pipeline.job.run import pipeline_options, release_lab_loinc
from ehr_pipeline.job.sinks import WriteDeadLetters, write_dead_letter_files
from ehr_pipeline.job.transforms import COUNTS, DEAD, FATAL, KV, Select, Tagged, count, select
from ehr_pipeline.meds.from_mimic import (
    MANIFEST,
    MEDS_SPLITS,
    by_shard,
    conversion_manifest,
    event_rows,
    from_ipc,
    sorted_rows,
    task_rows,
    write_code_metadata,
    write_dataset_metadata,
    write_subject_splits,
)
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.mimic import events as ev
from ehr_pipeline.reader import ReaderError, TableReader, check_header, locate_table, locate_table_files, read_table

ROWS = "rows"  # kind: ((split, shard), Arrow IPC bytes of MEDS rows)
CODES = "codes"  # kind: a code seen in the data


@beam.typehints.with_input_types(tuple[str, str])
@beam.typehints.with_output_types(Tagged)
class ConvertTable(beam.DoFn):
    """(table, file) -> MEDS rows by shard, the codes they use, counts and dead letters (every row once)."""

    def __init__(self, discharges, config_dict: dict, block_size_bytes: int = 4 << 20):
        self._discharges = discharges
        self._config_dict = config_dict
        self._block = block_size_bytes

    def setup(self):
        self._config = PipelineConfig.model_validate(self._config_dict)

    def process(self, element):
        table, path = element
        dead: list = []
        try:
            reader = TableReader(path, table, columns=ev.EXTRACTORS[table][1], on_dead_letter=dead.append,
                                 block_size_bytes=self._block)
            for batch in reader:
                events, extract_counts = ev.extract(table, batch, self._discharges)
                rows = event_rows(events)
                for key_blob in by_shard(rows, self._config):
                    yield ROWS, key_blob
                for code in pc.unique(rows.column("code")).to_pylist():
                    yield CODES, (code, None)
                for reason, n in extract_counts.items():
                    yield COUNTS, count(f"events/{table}/extract/{reason}", n)
                yield COUNTS, count(f"events/{table}/written", rows.num_rows)
                for letter in dead:
                    yield DEAD, (table, letter)
                dead.clear()
        except ReaderError as e:
            yield FATAL, str(e)
            return
        for letter in dead:
            yield DEAD, (table, letter)
        stats = reader.stats
        yield COUNTS, count(f"rows/{table}/read", stats.rows_read)
        yield COUNTS, count(f"rows/{table}/parsed", stats.rows_parsed)
        for reason, n in stats.dead_lettered.items():
            yield COUNTS, count(f"rows/{table}/dead_letter/{reason}", n)


@beam.typehints.with_input_types(KV)
@beam.typehints.with_output_types(tuple[str, int])
class WriteMedsShard(beam.DoFn):
    """((split, shard), IPC blobs) -> data/<split>/<shard>.parquet, sorted, written atomically."""

    def __init__(self, out_dir: str):
        self._out = out_dir

    def process(self, element):
        (split, shard), blobs = element
        table = sorted_rows([from_ipc(b) for b in blobs if b is not None])
        folder = os.path.join(self._out, "data", split)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"{shard}.parquet")
        with layout.created_atomically(path) as f:
            pq.write_table(table, f)
        yield count(f"files/{split}/rows_written", table.num_rows)


class ConvertEvents(beam.PTransform):
    """Event-table files -> tagged MEDS rows by shard, codes, counts, dead letters."""

    def __init__(self, inputs: list[tuple[str, str]], discharges, config_dict: dict):
        super().__init__()
        self._inputs, self._discharges, self._config = sorted(inputs), discharges, config_dict

    def expand(self, p):
        return (
            p
            | "EventFiles" >> beam.Create(self._inputs)
            | "SpreadFiles" >> beam.Reshuffle()
            | "Convert" >> beam.ParDo(ConvertTable(self._discharges, self._config))
        )


class WriteMedsData(beam.PTransform):
    """Tagged rows (events and the driver's task rows) -> one parquet file per (split, shard)."""

    def __init__(self, out_dir: str, task_blobs: list, shards: list[tuple[str, int]]):
        super().__init__()
        self._out, self._task, self._shards = out_dir, task_blobs, shards

    def expand(self, items):
        p = items.pipeline
        return (
            (items | "Rows" >> Select(ROWS), p | "TaskRows" >> beam.Create(self._task).with_output_types(KV),
             p | "AllShards" >> beam.Create([(s, None) for s in self._shards]).with_output_types(KV))
            | "JoinRows" >> beam.Flatten()
            | "GroupByShard" >> beam.GroupByKey()
            | "WriteShards" >> beam.ParDo(WriteMedsShard(self._out))
        )


def run_to_meds(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None = None) -> dict[str, Any]:
    """Converts a MIMIC-III release to a MEDS dataset in out_dir; returns the conversion manifest."""
    started = time.time()
    mimic_dir, out_dir = layout.absolute(mimic_dir), layout.absolute(out_dir)  # as run_job, for every runner
    os.makedirs(out_dir, exist_ok=True)
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

    def to_file(name):
        def write(items):
            layout.write_json(os.path.join(tmp, name), sorted(items))
            return name
        return write

    p = beam.Pipeline(options=pipeline_options(beam_args or []))
    items = p | "ConvertEvents" >> ConvertEvents(inputs, coh.discharges, cfg)
    written = items | "WriteMedsData" >> WriteMedsData(out_dir, by_shard(task, config), shards)
    dead = (items,) | "WriteDeadLetters" >> WriteDeadLetters(out_dir)
    counts = ((items | "Counts" >> Select(COUNTS), written, dead) | "AllCounts" >> beam.Flatten()
              | "Sum" >> beam.CombinePerKey(sum) | "CountsList" >> beam.combiners.ToList()
              | "WriteCounts" >> beam.Map(to_file("counts.json")))
    codes = (items | "Codes" >> Select(CODES) | "DistinctCodes" >> beam.CombinePerKey(lambda _: None)
             | "CodeList" >> beam.combiners.ToList() | "WriteCodes" >> beam.Map(to_file("codes.json")))
    errors = (items | "Fatal" >> beam.FlatMap(select(FATAL)) | "ErrorList" >> beam.combiners.ToList()
              | "WriteErrors" >> beam.Map(to_file("errors.json")))
    _ = (counts, codes, errors) | "Finish" >> beam.Flatten()
    p.run().wait_until_finish()

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
