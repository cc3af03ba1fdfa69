"""The Beam job: a source (MIMIC-III CSVs or a MEDS dataset) -> one bagged SequenceExample per example.

The graph, as ``_run_pipeline`` builds it from the composite transforms of ``sources``, ``bag``,
``sinks`` and the stages ``spill_source``, ``spill_bag``, ``spill_merge`` (their shared items and
counters: ``items``):

  SpillSource | MedsSource     -> tagged items: a bucket's spill files (events of a HADM_ID range, or
                                  whole examples of a key hash); unit census, counts, dead rows
  UnitPlan                     -> the canonical unit of each code (joined to each bucket by key)
  BagBuckets                   -> (split, shard) records as sorted runs on disk, code statistics
  MergeShards                  -> TFRecord shards (sorted by key: byte-identical reruns), dead values
  WriteDeadLetters, SumCounts, code statistics -> files the driver reads back into the manifest

The MIMIC-III job builds the cohort on the driver (ADMISSIONS + PATIENTS, ~60k admissions in the
full release); each worker parses whole blocks of a CSV file with pyarrow, drops events of patients
outside the cohort and at or after their trigger, and spills the rest to disk by admission range
(``spill``): its memory does not grow with the release (docs/pipeline.md, "Bounded memory"). Big
gzip tables are first split into parts (``mimic.table_parts``) so every worker reads a share. The MEDS
source reads one data file per worker, subject by subject, computes the task there (docs/meds.md)
and spills whole examples by key (``meds_stages``): the same bounded memory.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from ehr_pipeline import meds
from ehr_pipeline.contract import layout, output_folder, spec
from ehr_pipeline.fhir import codes as fhir_codes
from ehr_pipeline.job import spill, temp_disk
from ehr_pipeline.job import manifest as manifest_mod
from ehr_pipeline.job import vocab
from ehr_pipeline.job.bag import SumCodeStats, UnitPlan
from ehr_pipeline.job.dedup import RepeatFinder
from ehr_pipeline.job.items import COUNTS, FATAL, STATS, Select, SumCounts, ToJsonFile, select
from ehr_pipeline.job.meds_stages import BagMedsBucket, MedsSource, meds_bucket_count
from ehr_pipeline.job.sinks import WriteDeadLetters, write_dead_letter_files
from ehr_pipeline.job.spill_bag import BagBucket, BagBuckets
from ehr_pipeline.job.spill_merge import MergeShards
from ehr_pipeline.job.spill_source import SpillSource
from ehr_pipeline.meds import labels as meds_labels
from ehr_pipeline.meds import source as meds_source
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.mimic import events as ev
from ehr_pipeline.mimic import table_parts
from ehr_pipeline.reader import ReaderError, check_header, locate_table, locate_table_files, read_table

log = logging.getLogger(__name__)

COHORT_TABLES = ("ADMISSIONS", "PATIENTS")
RUN_INFO = "run_info.json"
DEFAULT_RUNNER = "FnApiRunner"  # in-process and local: nothing to download (see README)
DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
LOCAL_RUNNERS = (DEFAULT_RUNNER, "DirectRunner")


def pipeline_options(beam_args: list[str]):
    """Beam options from command-line style args, defaulting to the local FnApiRunner."""
    beam_args = list(beam_args)
    if any("DaskRunner" in a for a in beam_args):
        # Beam knows the Dask runner only by its full name, and parses --dask_* flags only
        # once its options class has been imported; imported here, as the dask extra is optional.
        from apache_beam.runners.dask import dask_runner

        beam_args = [f"--runner={DASK_RUNNER}" if a in ("--runner=DaskRunner",) else a for a in beam_args]
        del dask_runner
    options = PipelineOptions(beam_args)
    if not options.view_as(StandardOptions).runner:
        options.view_as(StandardOptions).runner = DEFAULT_RUNNER
    return options


def with_local_workers(beam_args: list[str], workers: int) -> list[str]:
    """beam_args with the local runner set to `workers` processes; other runners' args unchanged (logged)."""
    runner = PipelineOptions(beam_args).view_as(StandardOptions).runner or DEFAULT_RUNNER
    if runner not in LOCAL_RUNNERS:
        log.info("workers=%d ignored: the %s runner places its own workers", workers, runner)
        return list(beam_args)
    if any(a.startswith("--direct_num_workers") for a in beam_args):
        log.info("workers=%d ignored: --direct_num_workers is given", workers)
        return list(beam_args)
    if workers <= 1:
        return list(beam_args)
    mode = [] if any(a.startswith("--direct_running_mode") for a in beam_args) else [
        "--direct_running_mode=multi_processing"]
    return [*beam_args, f"--direct_num_workers={workers}", *mode]


def run_job(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None = None,
            reference_units: dict[str, str] | None = None,
            reference_medians: dict[str, float] | None = None,
            resources: spill.SpillOptions | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Runs the job on a MIMIC-III release and writes the manifest; returns the manifest dict.

    Local mimic_dir / out_dir may be relative: they are made absolute against this process's working
    directory before the pipeline is built, whatever the runner (the manifest records the absolute path).
    out_dir is written whole or not at all (output_folder.staged): a folder holding an earlier run's
    output is replaced only with ``overwrite``, anything else that is not empty is refused.

    ``reference_units`` ('source:code' -> unit, a model's units.json "canonical") makes values
    of those codes convert to the model's units instead of this release's most common ones;
    ``reference_medians`` (its "medians") are what the plausibility bound judges their
    conversions against (docs/units.md). ``resources``: workers (default: the machine's cores, one for
    a small input), the temporary folder and the sizes that bound memory (spill.SpillOptions).
    """
    started = time.time()
    # Before anything reaches a runner: a worker resolves a relative path against its own working
    # directory (a Dask worker's is where it was started), so it would read or write elsewhere.
    mimic_dir, out_dir = layout.absolute(mimic_dir), layout.absolute(out_dir)
    log.info("input %s, output %s", mimic_dir, out_dir)
    with output_folder.staged(out_dir, kind=output_folder.DATA_FOLDER, command="ehr-pipeline run",
                              overwrite=overwrite, inputs=[mimic_dir]) as staging:
        manifest = _mimic_job(mimic_dir, staging, config, beam_args, (reference_units, reference_medians),
                              resources or spill.SpillOptions())
        _write_run_info(staging, started, beam_args, resources)
    return manifest


def _write_run_info(out_dir: str, started: float, beam_args: list[str] | None,
                    resources: spill.SpillOptions | None) -> None:
    """run_info.json: what the manifest leaves out to stay byte-identical (seconds, Beam args, workers); _tmp gone."""
    layout.write_json(layout.join(out_dir, RUN_INFO), {
        "seconds": round(time.time() - started, 3), "beam_args": list(beam_args or []),
        "workers": resources.workers if resources else None})
    # The driver's intermediate files (counts, statistics, the unit plan) are in the manifest now.
    if not output_folder.is_url(out_dir):
        shutil.rmtree(os.path.join(out_dir, layout.TMP_DIR), ignore_errors=True)


def _mimic_job(mimic_dir: str, out_dir: str, config, beam_args: list[str] | None,
               reference: tuple[dict | None, dict | None], resources: spill.SpillOptions) -> dict[str, Any]:
    """run_job's work, written into out_dir (the staging folder)."""
    started = time.time()
    reference_units, reference_medians = reference
    # Locate every table first: a missing required table fails before any work is done.
    enabled = set(config.sources)
    event_inputs = []
    for table, source in ev.TABLE_SOURCE.items():
        if source in enabled:
            event_inputs.extend((table, str(path)) for path in locate_table_files(mimic_dir, table))
    for table, path in event_inputs:  # empty files and missing columns fail before any work
        check_header(path, table)

    dead_driver: list = []
    cohort_tables, cohort_stats = _read_cohort_tables(mimic_dir, dead_driver)
    coh = cohort_mod.build_cohort(
        cohort_tables["ADMISSIONS"], cohort_tables["PATIENTS"],
        trigger_offset_seconds=config.trigger_offset_seconds, min_age_years=config.min_age_years)
    meta_cols = ("SUBJECT_ID", "HADM_ID", "ADMITTIME", "trigger_time", "label", "age_years", "gender",
                 "admission_type", "ethnicity", "insurance", "previous_discharge_seconds")
    metas = [(r["HADM_ID"], r) for r in coh.table.select(list(meta_cols)).to_pylist()]
    # Only what the workers need to filter events travels with the DoFn.
    cohort_index = coh.table.select(["SUBJECT_ID", "HADM_ID", "trigger_time"])
    # The lab LOINC codes name each lab code's analyte: mass <-> substance conversions need it.
    lab_bridge = release_lab_loinc(mimic_dir, dead_driver)
    loinc = {f"lab:{item}": code for item, code in fhir_codes.itemid_loinc(lab_bridge).items()}

    workers = resources.worker_count(sum(work_bytes(item) for item in event_inputs))
    with spill.spill_run(out_dir, resources.temp_dir, event_inputs, resources.split_threshold_bytes) as spill_dir:
        roads = _spill_road(event_inputs, coh, metas, cohort_index, spill_dir, resources, workers, out_dir, config)
        counts, options = _run_pipeline(roads[0], out_dir, config, loinc, (reference_units, reference_medians),
                                         with_local_workers(beam_args or [], workers), roads[1:])
        log_temp_bytes(spill_dir, ("parts", "events", "runs", "dead"))
    _write_lab_loinc(out_dir, lab_bridge)
    write_dead_letter_files(out_dir, dead_driver)
    tables = {t: manifest_mod.table_accounting(counts, t) for t in sorted({t for t, _ in event_inputs})}
    for name, st in sorted(cohort_stats.items()):
        tables[name] = {"rows_read": st.rows_read, "rows_parsed": st.rows_parsed,
                        "dead_lettered": dict(sorted(st.dead_lettered.items())), "balanced": True, "problems": []}
    return _finish(out_dir, config, counts, options, started, tables=tables, cohort_counts=coh.counts,
                   previous_discharge_counts=coh.previous_discharge_counts,
                   input_doc={"mimic_dir": mimic_dir, "event_tables": sorted({t for t, _ in event_inputs})})


def _spill_road(event_inputs, coh, metas, cohort_index, spill_dir: str, resources: spill.SpillOptions,
                workers: int, out_dir: str, config) -> tuple:
    """(source, bagging, writing) of the spilling job: disk checked, big inputs split, buckets drawn."""
    release_files = list(event_inputs)  # what rows are named and ordered by (a part names its file's lines)
    event_inputs = split_inputs(event_inputs, spill_dir, resources.split_threshold_bytes)
    n_buckets = spill.bucket_count(len(metas), workers, resources.bucket_admissions)
    spill.ensure_open_files(n_buckets, "pass a larger --bucket-admissions")
    bounds = spill.bucket_bounds(cohort_index.column("HADM_ID").to_numpy(), n_buckets)
    cohort_file = layout.join(spill_dir, "cohort.jsonl")
    ranges = spill.write_cohort_file(cohort_file, metas, bounds)
    slots = spill.lpt_slots(sorted(event_inputs), workers, work_bytes)
    log.info("%d input files, %d cohort admissions in %d buckets, %d workers; temporary files in %s",
             len(event_inputs), len(metas), len(bounds) + 1, workers, spill_dir)
    cfg = config.to_dict()
    repeats = RepeatFinder(release_files, *(cohort_index.column(c).to_numpy()
                                            for c in ("SUBJECT_ID", "HADM_ID", "trigger_time")))
    return (SpillSource(slots, cohort_index, coh.discharges, spill_dir, bounds, resources.block_size_bytes,
                        release_files),
            lambda plan: BagBuckets(BagBucket(cfg, spill_dir, cohort_file, ranges, repeats), plan, len(ranges)),
            MergeShards(out_dir, cfg))


def split_inputs(inputs: list[tuple[str, str]], spill_dir: str, threshold: int) -> list[tuple[str, str]]:
    """(table, file) inputs with every gzip file over `threshold` bytes replaced by its zstd parts (in the spill
    folder's parts/, ``table_parts.split_file``): free disk checked first."""
    temp_disk.check_free_space(spill_dir, inputs, threshold)
    if "://" in spill_dir:  # the reader reads local files: parts of a split need a local folder
        log.info("temporary folder %s is not local: big gzip inputs are read whole, not split", spill_dir)
        return inputs
    out_dir, out = layout.join(spill_dir, "parts"), []
    for table, path in inputs:
        parts = table_parts.parts_for(os.path.getsize(path), threshold)
        if parts and table_parts.is_gzip(path):
            log.info("splitting %s (%d bytes) into %d parts in %s", path, os.path.getsize(path), parts, out_dir)
            # A folder per input file: two parts of one table (`ehr-pipeline shard`'s) split apart.
            paths = table_parts.split_file(path, table, os.path.join(out_dir, os.path.basename(path)), parts,
                                           table_parts.block_bytes(threshold))
            out.extend((table, p) for p in paths)
        else:
            out.append((table, path))
    return out


def work_bytes(item: tuple[str, str]) -> int:
    """Text bytes a (table, file) input is expected to hold: gzip and zstd CSV ~5.4x their size (synthetic)."""
    path = item[1]
    return int(os.path.getsize(path) * (5.4 if path.endswith((".gz", ".zst")) else 1.0))


def log_temp_bytes(spill_dir: str, stages: tuple[str, ...]) -> None:
    """Logs the temporary disk each stage's folder holds (files are only added until the end: each is its peak)."""
    sizes = {stage: spill.folder_bytes(layout.join(spill_dir, stage)) for stage in stages}
    log.info("temporary bytes per stage: %s", json.dumps(sizes, sort_keys=True))


def run_meds_job(meds_dir: str, out_dir: str, config, beam_args: list[str] | None = None,
                 reference_units: dict[str, str] | None = None, labels_dir: str | None = None,
                 codes=None, reference_medians: dict[str, float] | None = None,
                 resources: spill.SpillOptions | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Runs the job on a MEDS dataset (built-in task, or one example per row of the label files in labels_dir).

    ``codes`` is the MEDS code map (meds.MedsCodes; default: the MIMIC-IV ETL's and to-meds' codes).
    ``resources``: workers (default: the machine's cores, one for a small input) and the temporary
    folder (spill.SpillOptions). out_dir is written whole or not at all, as by run_job (``overwrite``).
    Returns the manifest; meds_codes.json beside it records the code map for the trainer and the service.
    """
    started = time.time()
    meds_dir, out_dir = layout.absolute(meds_dir), layout.absolute(out_dir)  # as run_job, for every runner
    with output_folder.staged(out_dir, kind=output_folder.DATA_FOLDER, command="ehr-pipeline run",
                              overwrite=overwrite, inputs=[meds_dir, *([labels_dir] if labels_dir else [])]) as staging:
        manifest = _meds_job(meds_dir, staging, config, beam_args, (reference_units, reference_medians),
                             labels_dir, codes, resources or spill.SpillOptions())
        _write_run_info(staging, started, beam_args, resources)
    return manifest


def _meds_job(meds_dir: str, out_dir: str, config, beam_args: list[str] | None,
              reference: tuple[dict | None, dict | None], labels_dir: str | None, codes,
              resources: spill.SpillOptions) -> dict[str, Any]:
    """run_meds_job's work, written into out_dir (the staging folder)."""
    started = time.time()
    reference_units, reference_medians = reference
    codes = codes or meds.MedsCodes()
    files = meds_source.data_files(meds_dir, codes)
    labels = meds_labels.read_labels(labels_dir) if labels_dir is not None else None
    subject_splits = meds_source.read_subject_splits(meds_dir)
    lab_bridge = meds_source.lab_loinc_bridge(meds_dir, codes)
    loinc = {f"lab:{item}": code for item, code in fhir_codes.itemid_loinc(lab_bridge).items()}
    reader = meds_source.MedsReader(codes=codes, trigger_offset_seconds=config.trigger_offset_seconds,
                                    min_age_years=config.min_age_years, sources=tuple(config.sources),
                                    labels=labels.by_subject if labels else None, splits=subject_splits)
    times_path = layout.join(out_dir, meds_labels.PREDICTION_TIMES)
    workers = resources.worker_count(sum(os.path.getsize(f) for f in files))
    buckets = meds_bucket_count(files, workers)
    spill.ensure_open_files(buckets, None)  # stage D merges a shard's runs, one per bucket, all open at once
    slots = spill.lpt_slots(sorted(files), workers, os.path.getsize)
    cfg = config.to_dict()
    with spill.spill_run(out_dir, resources.temp_dir, [(meds_source.TABLE, f) for f in files],
                         resources.split_threshold_bytes) as spill_dir:
        log.info("%d MEDS data files, %d buckets, %d workers; temporary files in %s", len(files), buckets, workers,
                 spill_dir)
        source = MedsSource(slots, reader.to_dict(), spill_dir, buckets, times_path if labels else None)
        counts, options = _run_pipeline(source, out_dir, config, loinc, (reference_units, reference_medians),
                                        with_local_workers(beam_args or [], workers),
                                        (lambda plan: BagBuckets(BagMedsBucket(cfg, spill_dir), plan, buckets),
                                         MergeShards(out_dir, cfg, merge=True)))
        log_temp_bytes(spill_dir, ("events", "runs", "dead"))
    layout.write_json(layout.join(out_dir, layout.MEDS_CODES), {"codes": codes.to_dict()})
    _write_lab_loinc(out_dir, lab_bridge)
    cohort_counts = manifest_mod.group(counts, "cohort")
    label_doc = None
    if labels:
        label_doc = {**meds_labels.label_accounting(labels, counts), "prediction_times": {
            "file": meds_labels.PREDICTION_TIMES, "sha256": layout.sha256_of(times_path)}}
    return _finish(out_dir, config, counts, options, started, tables={meds_source.TABLE: manifest_mod.table_accounting(
        counts, meds_source.TABLE)}, cohort_counts=cohort_counts, labels=label_doc,
        previous_discharge_counts=manifest_mod.group(counts, meds_source.PREVIOUS_DISCHARGE_COUNTER),
        input_doc={"meds_dir": meds_dir, "data_files": len(files), "labels_dir": labels_dir,
                   "task": "labels" if labels else "built-in", "splits_from": "subject_splits.parquet"
                   if subject_splits else "hash"})


def _run_pipeline(source, out_dir: str, config, loinc: dict, reference: tuple[dict | None, dict | None],
                  beam_args: list[str] | None, stages: tuple) -> tuple[dict[str, int], Any]:
    """Source -> bagging -> writing; runs it, writes vocabulary, statistics and units; returns (counts, options).

    ``reference`` is (canonical units, training medians) of a model's units.json, or (None, None);
    ``stages`` is (unit plan -> the bagging transform, the writing transform) of the source.
    """
    cfg = config.to_dict()
    tmp = layout.join(out_dir, layout.TMP_DIR)
    options = pipeline_options(beam_args or [])
    p = beam.Pipeline(options=options)
    items = p | "Source" >> source
    # Each code's canonical unit is known only once every file has been read.
    reference_units, reference_medians = reference
    plan = items | "UnitPlan" >> UnitPlan(loinc, reference_units, reference_medians)
    bag, write = stages
    bagged = items | "Bag" >> bag(plan)
    written = bagged | "Write" >> write
    dead = (items, bagged) | "WriteDeadLetters" >> WriteDeadLetters(out_dir)
    counts = (
        (items | "SourceCounts" >> Select(COUNTS), bagged | "BagCounts" >> Select(COUNTS), written, dead)
        | "SumCounts" >> SumCounts()
        | "WriteCounts" >> ToJsonFile(layout.join(tmp, "counts.json"))
    )
    stats = (
        bagged
        | "Stats" >> Select(STATS)
        | "SumStats" >> beam.CombinePerKey(SumCodeStats())
        | "WriteStats" >> ToJsonFile(layout.join(tmp, "code_stats.json"))
    )
    plan_done = plan | "WriteUnitPlan" >> ToJsonFile(layout.join(tmp, "unit_plan.json"), single=True)
    errors = items | "Fatal" >> beam.FlatMap(select(FATAL)) | "WriteErrors" >> ToJsonFile(
        layout.join(tmp, "errors.json"))
    # One final sink that depends on every branch: the Dask runner computes only the
    # last transform's graph, so a branch left dangling would silently never run.
    _ = (counts, stats, plan_done, errors) | "Finish" >> beam.Flatten()
    result = p.run()
    result.wait_until_finish()
    # The Dask runner opens its own client and never closes it; left open, it keeps trying
    # to reconnect after the cluster is gone and floods the log.
    client = getattr(result, "client", None)
    if client is not None:
        client.close()

    errors_found = layout.read_json(layout.join(tmp, "errors.json"))
    if errors_found:
        raise ReaderError(errors_found[0] if len(errors_found) == 1
                          else f"{errors_found[0]} (and {len(errors_found) - 1} more file(s))")
    counts_found = dict(layout.read_json(layout.join(tmp, "counts.json")))
    code_stats = {code: tuple(st) for code, st in layout.read_json(layout.join(tmp, "code_stats.json"))}
    vocabulary = vocab.build_vocabulary(code_stats, config.vocab.min_count, config.vocab.max_size_per_source)
    layout.write_json(layout.join(out_dir, layout.VOCABULARY), {
        "schema_version": spec.SCHEMA_VERSION, "sources": vocabulary,
        "min_count": config.vocab.min_count, "built_on": "train"})
    layout.write_json(layout.join(out_dir, layout.NUMERIC_STATS), {
        "schema_version": spec.SCHEMA_VERSION, "clip_z": config.numeric.clip_z,
        "codes": vocab.normalisation_stats(code_stats), "built_on": "train"})
    plan_doc = layout.read_json(layout.join(tmp, "unit_plan.json"))
    layout.write_json(layout.join(out_dir, layout.UNITS), {
        "schema_version": spec.SCHEMA_VERSION,
        "codes": {code: dict(sorted(u.items())) for code, u in sorted(plan_doc["counts"].items())},
        "canonical": plan_doc["canonical"],
        "canonical_from": "reference" if reference_units is not None else "this release",
        "medians": plan_doc["medians"],
        # Part of units.json's bytes, which the manifest pins: the note keeps the plausibility bound's
        # module path from before the data layer had packages (now ehr_pipeline.encode.magnitudes).
        "note": "codes: rows with a numeric value per unit as written in the release; canonical: the unit "
                "every value of the code was converted to (units.Harmoniser) before bagging; medians: the "
                "training median |value| in the canonical unit that conversions are judged against "
                "(ehr_pipeline.magnitudes)"})
    return counts_found, options


def _finish(out_dir: str, config, counts: dict, options, started: float, **manifest_parts) -> dict[str, Any]:
    """Writes and returns the manifest."""
    vocabulary = layout.read_json(layout.join(out_dir, layout.VOCABULARY))["sources"]
    manifest = manifest_mod.build_manifest(out_dir=out_dir, config=config, counts=counts, vocabulary=vocabulary,
                                           seconds=time.time() - started,
                                           runner=str(options.get_all_options().get("runner")), **manifest_parts)
    layout.write_json(layout.join(out_dir, layout.MANIFEST), manifest)
    return manifest


def _read_cohort_tables(mimic_dir: str, dead: list) -> tuple[dict, dict]:
    tables, stats = {}, {}
    for name, columns in (("ADMISSIONS", cohort_mod.ADMISSION_COLUMNS), ("PATIENTS", cohort_mod.PATIENT_COLUMNS)):
        path = locate_table(mimic_dir, name)
        tables[name], stats[name] = read_table(
            path, name, columns=columns, on_dead_letter=lambda d, n=name: dead.append((n, d)))
    return tables, stats


def release_lab_loinc(mimic_dir: str, dead: list) -> dict[str, list[str]]:
    """LOINC -> lab ITEMIDs from a MIMIC-III release's D_LABITEMS ({} without it); its dead letters into `dead`."""
    path = locate_table(mimic_dir, "D_LABITEMS")
    if path is None:
        return {}
    table, _ = read_table(path, "D_LABITEMS", columns=("ITEMID", "LOINC_CODE"),
                          on_dead_letter=lambda d: dead.append(("D_LABITEMS", d)))
    return fhir_codes.lab_loinc_bridge(table.to_pylist())


def _write_lab_loinc(out_dir: str, bridge: dict[str, list[str]]) -> None:
    """lab_loinc.json: LOINC -> lab ITEMIDs from D_LABITEMS (empty without it), shipped with every export."""
    layout.write_json(layout.join(out_dir, layout.LAB_LOINC), {
        "schema_version": spec.SCHEMA_VERSION, "system": fhir_codes.LOINC, "source": "D_LABITEMS.LOINC_CODE",
        "codes": bridge})
