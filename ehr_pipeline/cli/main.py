"""`ehr-pipeline`: command-line entry point of the data layer.

Sub-commands:
  summarize  read every table of a release and count rows / dead letters
  synth      write a synthetic MIMIC-III release with known death probabilities
  synth-counterfactual  a temporal release with its trajectories changed, and the truth's answer before and after
  run        the Beam job: bag admissions (MIMIC-III) or label rows (MEDS) into SequenceExample TFRecords
  to-meds    convert a MIMIC-III release to a MEDS 0.4 dataset (a Beam job)
  shard      split a big table into parts that workers read in parallel
  demo       run the job end to end on the MIMIC-III demo and print the manifest summary
  to-fhir    write one admission as a FHIR R4 Bundle (JSON)
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

from ehr_base.cli_args import (
    DefaultsOnceFormatter,
    OneLineParser,
    existing_dir,
    output_dir,
    positive_int,
    setup_logging,
    usage_error,
)
from ehr_base.yaml_config import ConfigError
from ehr_pipeline import meds
from ehr_pipeline.cli import run_command
from ehr_pipeline.contract import load_pipeline_config, output_folder
from ehr_pipeline.meds import source as meds_source
from ehr_pipeline.meds.standard import MedsError
from ehr_pipeline.mimic import summarize_command, write_table_parts
from ehr_pipeline.reader import MissingTableError, ReaderError, locate_table, table_schemas
from ehr_pipeline.synth import cli as synth_cli

log = logging.getLogger("ehr_pipeline")
EXIT_INPUT_ERROR = 2


def _setup_logging(verbose: bool) -> None:
    setup_logging(verbose)


def _command(sub: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:
    """A sub-command whose --help shows its defaults, as the top-level one does."""
    return sub.add_parser(name, help=help, formatter_class=DefaultsOnceFormatter)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `ehr-pipeline` with every sub-command."""
    parser = OneLineParser(
        prog="ehr-pipeline",
        description="MIMIC-III v1.4 CSV tables -> bagged tf.train.SequenceExample TFRecords.",
        formatter_class=DefaultsOnceFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines, Beam's)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(sub, "summarize", "read every table of a release; count rows parsed and dead-lettered")
    p.add_argument("--mimic-dir", required=True, type=existing_dir, help="folder with TABLE.csv.gz or TABLE.csv files")
    p.add_argument("--dead-letter-dir", default=None, type=output_dir,
                   help="write bad rows of every table to DIR/dead_letters.jsonl, one JSON object per line; "
                        "without it they are only counted")

    p = _command(sub, "synth", "write a synthetic MIMIC-III release with known death probabilities")
    synth_cli.add_arguments(p)

    p = _command(sub, "synth-counterfactual",
                 "a temporal synthetic release with its trajectories changed, and the truth's logit before and after")
    synth_cli.add_counterfactual_arguments(p)

    p = _command(sub, "run", "the Beam job: bag each admission into a SequenceExample (extra args go to Beam)")
    run_command.add_arguments(p)

    p = _command(sub, "to-meds",
                 "convert a MIMIC-III release to a MEDS 0.4 dataset, as a Beam job (extra args go to Beam)")
    run_command.add_to_meds_arguments(p)

    p = _command(sub, "shard", "split one big table (e.g. CHARTEVENTS) into parts workers read in parallel")
    p.add_argument("--mimic-dir", required=True, type=existing_dir, help="release folder holding the table")
    p.add_argument("--table", default="CHARTEVENTS", type=str.upper, choices=sorted(table_schemas.TABLES),
                   metavar="TABLE", help="table to split")
    p.add_argument("--parts", type=positive_int, default=16, help="number of parts (about one per worker)")
    p.add_argument("--out", default=None, type=output_dir,
                   help="folder for the parts (default: the release folder; then move the whole "
                        "file away, since whole and parts together are refused)")

    p = _command(sub, "to-fhir",
                 "write one admission (and the patient's history up to its discharge) as a FHIR R4 Bundle")
    p.add_argument("--mimic-dir", required=True, type=existing_dir,
                   help="release folder (ADMISSIONS, PATIENTS, event tables, "
                                                      "D_LABITEMS for LOINC codings)")
    p.add_argument("--hadm-id", required=True, type=int, help="the admission's HADM_ID")
    p.add_argument("--out", required=True, help="output JSON file ('-' for stdout)")
    p.add_argument("--no-local-lab-codes", action="store_true",
                   help="code labs that have a LOINC code with LOINC only (default: LOINC and the local "
                        "MIMIC ITEMID coding)")

    p = _command(sub, "demo", "run the job end to end on the MIMIC-III demo and print the manifest summary")
    p.add_argument("--mimic-dir", default="../shared/mimic-iii-demo", type=existing_dir, help="the demo release")
    p.add_argument("--out", default="out/demo", type=output_dir, help="output folder")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs `ehr-pipeline`; returns the process exit code (2 for input that cannot be read)."""
    parser = build_parser()
    # Beam options (--runner=..., --direct_num_workers=...) pass through `run` untouched.
    args, extra = parser.parse_known_args(argv)
    _setup_logging(args.verbose)
    if extra and args.command not in ("run", "to-meds"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    problem = _misuse(args, extra)
    if problem:
        return usage_error(f"{parser.prog} {args.command}", problem)

    try:
        return _dispatch(parser, args, extra)
    except (ReaderError, OSError, MedsError, output_folder.OutputFolderError) as e:
        # Bad input is the user's to fix: one line naming the file (and line), no traceback.
        # MissingTableError is a FileNotFoundError, an OSError.
        print(f"ehr-pipeline: error: {e}", file=sys.stderr)
        return EXIT_INPUT_ERROR
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM during a job (spill.Terminated): its spill folder is gone
        signum = getattr(e, "signum", signal.SIGINT)
        print(f"ehr-pipeline: interrupted by {signal.Signals(signum).name}", file=sys.stderr)
        return 128 + signum  # the shell's code for a process ended by that signal


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    if args.command == "summarize":
        return summarize_command(args.mimic_dir, args.dead_letter_dir)
    if args.command == "synth":
        return synth_cli.run(args)
    if args.command == "synth-counterfactual":
        return synth_cli.run_counterfactual(args)
    if args.command == "run":
        return run_command.run(args, extra)
    if args.command == "to-meds":
        # Beam (~1 s to import) loads only for the commands that run a job: --help stays quick.
        from ehr_pipeline.job import SpillOptions, run_to_meds

        resources = SpillOptions(workers=args.workers, temp_dir=args.temp_dir, bucket_rows=args.bucket_rows)
        manifest = run_to_meds(args.mimic_dir, args.out, load_pipeline_config(args.config), extra, resources=resources,
                               overwrite=args.overwrite)
        rows = sum(t.get("meds_rows_written", 0) for t in manifest["tables"].values())
        print(f"wrote {args.out}: {rows:,} event rows, {manifest['task_rows']['admissions/written']:,} admissions, "
              f"{manifest['task_rows']['patients/written']:,} patients in {manifest['seconds']:.1f} s")
        print(f"every row accounted for: {'yes' if manifest['balanced'] else 'NO'} (see {args.out}/to_meds_manifest.json)")
        return 0 if manifest["balanced"] else 1
    if args.command == "shard":
        src = locate_table(args.mimic_dir, args.table)
        if src is None:
            parser.error(f"{args.table} not found in {args.mimic_dir}")
        paths, rows = write_table_parts(src, args.table, args.out or args.mimic_dir, args.parts,
                                        show_progress=sys.stderr.isatty())
        print(f"{src}: {rows:,} rows -> {len(paths)} parts in {paths[0].parent}")
        return 0
    if args.command == "to-fhir":
        # The FHIR models (fhir.resources, ~0.7 s to import) load only for this command.
        from ehr_pipeline.fhir import convert

        return convert.main(args.mimic_dir, args.hadm_id, args.out, local_lab_codes=not args.no_local_lab_codes)
    if args.command == "demo":
        from ehr_pipeline.cli import demo  # runs the job: Beam loads only for it, as for to-meds

        return demo.run(args.mimic_dir, args.out)
    parser.error(f"unknown command {args.command}")
    return 2


def _misuse(args: argparse.Namespace, beam_args: list[str]) -> str | None:
    """What is wrong with the command line beyond single flags (a folder that is no release, a bad
    pipeline config, an unknown Beam runner), or None; checked before any work starts."""
    if args.command == "run" and args.meds_dir is None and (args.labels or args.meds_codes):
        return "--labels and --meds-codes read a MEDS dataset: give --meds-dir"
    if args.command in ("summarize", "run", "demo", "to-meds") and getattr(args, "mimic_dir", None) is not None:
        try:
            for table in table_schemas.TABLES:
                if table_schemas.get(table).required:
                    locate_table(args.mimic_dir, table)
        except (MissingTableError, ReaderError) as err:
            return f"--mimic-dir: {err}"
    if args.command == "run" and args.meds_dir is not None:
        try:
            codes = meds.load_meds_codes(args.meds_codes)
        except ConfigError as err:
            return f"--meds-codes: {err}"
        try:
            meds_source.data_files(args.meds_dir, codes)
        except MedsError as err:
            return f"--meds-dir: {err}"
        if args.labels is not None and not os.path.exists(args.labels):
            return f"--labels: {args.labels} does not exist"
    if args.command in ("run", "to-meds", "synth", "synth-counterfactual"):
        problem = _output_problem(args)
        if problem:
            return problem
    if args.command in ("run", "to-meds"):
        try:
            load_pipeline_config(args.config)
        except ConfigError as err:
            return f"--config: {err}"
        return _unknown_runner(beam_args)
    return None


# What each command's --out holds, in its marker: a command replaces only its own kind of folder.
OUTPUT_KINDS = {"run": output_folder.DATA_FOLDER, "to-meds": output_folder.MEDS_DATASET,
                "synth": output_folder.SYNTHETIC_RELEASE, "synth-counterfactual": output_folder.SYNTHETIC_RELEASE}


def _output_problem(args: argparse.Namespace) -> str | None:
    """Why --out may not be written (output_folder.check_target), or None; remote targets are checked by the job."""
    if output_folder.is_url(args.out):
        return None
    inputs = [p for p in (getattr(args, "mimic_dir", None), getattr(args, "meds_dir", None),
                          getattr(args, "labels", None), getattr(args, "dictionary_dir", None),
                          getattr(args, "release", None)) if p is not None]
    try:
        output_folder.check_target(args.out, kind=OUTPUT_KINDS[args.command], overwrite=args.overwrite,
                                   inputs=[str(p) for p in inputs])
    except output_folder.OutputFolderError as err:
        return f"--out: {err}"
    return None


def _unknown_runner(beam_args: list[str]) -> str | None:
    """Why Beam would refuse the --runner among beam_args, or None."""
    # Beam logs optional-dependency chatter while it imports; the answer to a misuse is one line.
    logging.disable(logging.WARNING)
    try:
        # Beam is first imported here, with its chatter silenced (and never for --help).
        from apache_beam.options.pipeline_options import StandardOptions
        from apache_beam.runners.runner import create_runner

        from ehr_pipeline.job import pipeline_options

        runner = pipeline_options(beam_args).view_as(StandardOptions).runner
        try:
            create_runner(runner)
        except (ValueError, ImportError) as err:
            return f"--runner={runner}: {err}"
    finally:
        logging.disable(logging.NOTSET)
    return None
