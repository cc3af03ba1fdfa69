"""`ehr-pipeline run`: flags of the Beam job (anything unrecognised is a Beam pipeline option)."""
from __future__ import annotations

import argparse
import logging
import os
import time

from ehr_base.cli_args import existing_dir, existing_file, output_dir, positive_int
from ehr_pipeline.contract import layout, load_pipeline_config
from ehr_pipeline.encode import units
from ehr_pipeline.meds import load_meds_codes

log = logging.getLogger(__name__)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the job's flags to `parser`."""
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--mimic-dir", type=existing_dir,
                       help="folder with the MIMIC-III v1.4 tables (TABLE.csv.gz or TABLE.csv)")
    where.add_argument("--meds-dir", type=existing_dir,
                       help="a MEDS 0.4 dataset (data/**/*.parquet, metadata/), e.g. the MIMIC-IV MEDS ETL's output "
                            "or `ehr-pipeline to-meds`'s (docs/meds.md)")
    parser.add_argument("--labels", default=None, metavar="FILE_OR_DIR",
                        help="with --meds-dir: MEDS label files (subject_id, prediction_time, boolean_value as "
                             "bool; e.g. ACES output): one example per row, events strictly before prediction_time; "
                             "default: the built-in task (in-hospital death at admission + trigger_offset_seconds)")
    parser.add_argument("--meds-codes", default=None, type=existing_file, metavar="YAML",
                        help="with --meds-dir: the MEDS code -> source map (see configs/meds_codes.yaml); default: "
                             "the MIMIC-IV MEDS ETL's and to-meds' codes")
    parser.add_argument("--out", required=True, type=output_dir,
                        help="output folder (local path or a Beam filesystem URL): written whole when the job "
                             "completes, untouched when it fails; must be new, empty, or (with --overwrite) an "
                             "earlier run's output")
    add_overwrite_argument(parser, "an earlier `ehr-pipeline run` output in --out")
    parser.add_argument("--config", default=None, type=existing_file,
                        help="pipeline YAML (see configs/pipeline.yaml); default: built-in defaults")
    parser.add_argument("--units-from", default=None, metavar="DIR_OR_FILE", type=reference_units,
                        help="convert every value to the units of this model export or data folder (its "
                             "units.json) instead of this release's most common unit per code, and judge each "
                             "conversion against its training medians (docs/units.md): use it to prepare another "
                             "site's data for a model trained elsewhere; default: none")
    local = add_local_run_arguments(parser, "MIMIC-III or MEDS input")
    local.add_argument("--bucket-admissions", type=positive_int, default=1000, metavar="N",
                       help="cohort admissions bagged together by one worker (its memory: ~1.5x their spilled "
                            "events, ~40 MB per 1,000 synthetic admissions); MIMIC-III input only (MEDS buckets "
                            "hold ~32 MB of data files each)")
    parser.epilog = (
        "Any other flag is passed to Beam, e.g. --runner=FlinkRunner --flink_master=HOST:8081, "
        "--runner=SparkRunner --spark_master_url=spark://HOST:7077, or --runner=DataflowRunner "
        "--project=P --region=R --temp_location=gs://B/tmp. Default runner: FnApiRunner (local, "
        "with --workers processes).")


def add_overwrite_argument(parser: argparse.ArgumentParser, what: str) -> None:
    """--overwrite: replace the command's own earlier output whole (never a folder it did not write)."""
    parser.add_argument("--overwrite", action="store_true",
                        help=f"replace {what} whole, once the new one is complete; a folder this command did not "
                             "write, or one holding files it did not write, is refused with or without it")


def add_local_run_arguments(parser: argparse.ArgumentParser, scope: str) -> argparse._ArgumentGroup:
    """--workers and --temp-dir of a job that spills to disk, in a group the caller adds its bucket size to."""
    local = parser.add_argument_group(f"local run ({scope}; docs/pipeline.md, \"Bounded memory\")")
    local.add_argument("--workers", type=local_workers, default=None,
                       help="worker processes of the local runner (multi_processing); ignored, with a log line, "
                            "on other runners; memory ~0.3 GB + ~0.5 GB per worker; at most 2 per core "
                            f"({2 * (os.cpu_count() or 1)} here: past the cores a worker adds memory, not speed); "
                            f"default: the machine's cores ({os.cpu_count() or 1} here), or one process for a small "
                            "input (under 64 MiB of text), where starting workers costs more than they save")
    local.add_argument("--temp-dir", default=None, metavar="DIR",
                       help="where the job spills its rows and splits big gzip tables (local path or a Beam "
                            "filesystem URL every worker sees); needs about 2x the event tables' size plus 1x "
                            "the gzip tables it splits free (measured peak: 1.5x the demo's input); a folder of its "
                            "own is made in it and deleted at the end; None: a folder inside the output's staging "
                            "folder")
    return local


def local_workers(value: str) -> int:
    """argparse type: a worker count from 1 to spill.max_local_workers() (2 per core of this machine)."""
    # Beam's import chatter is silenced, as in main's runner check, so that a misuse stays one line.
    logging.disable(logging.WARNING)
    try:
        # why: spill loads Beam (~1 s), which --help and the other commands never need
        from ehr_pipeline.job import spill
    finally:
        logging.disable(logging.NOTSET)
    workers = positive_int(value)
    if workers > spill.max_local_workers():
        raise argparse.ArgumentTypeError(
            f"{workers} is more than {spill.max_local_workers()}, {spill.MAX_WORKERS_PER_CORE} per core of this "
            f"machine's {os.cpu_count() or 1}: past the cores a local worker adds memory (~0.5 GB), not speed")
    return workers


def add_to_meds_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `ehr-pipeline to-meds`."""
    parser.add_argument("--mimic-dir", required=True, type=existing_dir, help="folder with the MIMIC-III v1.4 tables")
    parser.add_argument("--out", required=True, type=output_dir,
                        help="the MEDS dataset folder to write (whole when the job completes, untouched when it "
                             "fails)")
    add_overwrite_argument(parser, "an earlier `ehr-pipeline to-meds` dataset in --out")
    parser.add_argument("--config", default=None, type=existing_file,
                        help="pipeline YAML: its splits, split_salt and num_shards place the subjects; "
                             "default: built-in")
    local = add_local_run_arguments(parser, "every runner's rows are spilled; workers for the local one")
    local.add_argument("--bucket-rows", type=positive_int, default=500_000, metavar="N",
                       help="the most MEDS rows of one shard a worker sorts at a time, as whole subjects (its "
                            "memory: ~0.3 KB per row; default: 500000); counted from the rows spilled, so a "
                            "release's row width cannot push it over")


def run(args: argparse.Namespace, beam_args: list[str]) -> int:
    """Runs the job from parsed flags; returns the exit code."""
    # Beam (~1 s to import) loads only when a job runs: --help and the misuse checks stay quick.
    from ehr_pipeline.job import SpillOptions, format_manifest_summary, run_job, run_meds_job

    config = load_pipeline_config(args.config)
    started = time.time()
    resources = SpillOptions(workers=args.workers, temp_dir=args.temp_dir, bucket_admissions=args.bucket_admissions)
    if args.meds_dir is not None:
        manifest = run_meds_job(args.meds_dir, args.out, config, beam_args, labels_dir=args.labels,
                                codes=load_meds_codes(args.meds_codes), resources=resources,
                                overwrite=args.overwrite, **_reference(args.units_from))
    else:
        manifest = run_job(args.mimic_dir, args.out, config, beam_args, resources=resources,
                           overwrite=args.overwrite, **_reference(args.units_from))
    seconds = time.time() - started
    print(format_manifest_summary(manifest))
    print(f"\nwrote {args.out} in {seconds:.1f} s")
    if not manifest["balanced"]:
        for table, t in manifest["tables"].items():
            for problem in t["problems"]:
                log.error("%s: %s", table, problem)
        for problem in manifest.get("labels", {}).get("problems", []):
            log.error("labels: %s", problem)
        return 1
    return 0


def _reference(found) -> dict:
    """The job's keyword arguments for --units-from (a units.Reference or None)."""
    if found is None:
        return {"reference_units": None, "reference_medians": None}
    return {"reference_units": found.canonical, "reference_medians": found.medians}


def reference_units(path: str):
    """argparse type: the canonical units and training medians (units.Reference) of a units.json, or its folder's."""
    file = os.path.join(path, layout.UNITS) if os.path.isdir(path) else path
    if not os.path.isfile(file):
        raise argparse.ArgumentTypeError(f"{file} does not exist (give a model export or data folder with "
                         f"{layout.UNITS}, or the file itself)")
    try:
        doc = layout.read_json(file)
        _, canonical = units.read_units_file(doc)
        medians = units.read_medians(doc)
    except (ValueError, AttributeError, TypeError) as err:
        raise argparse.ArgumentTypeError(f"{file} is not a units.json file ({err})") from None
    if not canonical:
        raise argparse.ArgumentTypeError(f"{file} has no canonical units (written before units were harmonised: "
                         "re-run the job that made it)")
    return units.Reference(canonical, medians)
