"""`ehr-pipeline synth` and `ehr-pipeline synth-counterfactual`: argument definitions and the command bodies.

Wiring in ehr_pipeline/cli/main.py is one line per hook:
``synth.add_arguments(sub.add_parser("synth", help=...))`` and dispatch to ``synth.run(args)``;
likewise ``add_counterfactual_arguments`` / ``run_counterfactual``.
"""
from __future__ import annotations

import argparse
import pathlib

from ehr_base.cli_args import existing_dir, output_dir, usage_error
from ehr_pipeline.synth.config import (COUNTERFACTUAL_CHANGES, DEFAULT_DELAY_DAYS, DIALECTS, PLANTABLE_TYPES,
                                       TRUTH_FAMILIES, SynthConfig)
from ehr_pipeline.synth.release import write_release
from ehr_pipeline.synth.site import SITES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the synth flags to a (sub)parser."""
    parser.add_argument("--patients", type=int, required=True,
                        help="number of patients to generate (required; ~1.4 admissions each)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed; equal seeds and settings give byte-identical files (default: %(default)s)")
    parser.add_argument("--out", type=output_dir, required=True,
                        help="output directory: new, empty, or (with --overwrite) an earlier synthetic release; "
                             "written whole when the release is complete (required)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier `synth` release in --out whole; a folder synth did not write, or "
                             "one holding files it did not write, is refused with or without it (default: refuse "
                             "any non-empty --out)")
    parser.add_argument("--dialect", choices=DIALECTS, default="demo",
                        help="CSV dialect: 'demo' = quoted UPPERCASE header and quoted strings as in the "
                             "MIMIC-III demo, 'physionet' = lowercase header, minimal quoting (default: %(default)s)")
    parser.add_argument("--no-gzip", dest="gzip", action="store_false",
                        help="write TABLE.csv instead of TABLE.csv.gz (default: gzip)")
    parser.add_argument("--trigger-offset-seconds", type=int, default=86_400,
                        help="prediction time after ADMITTIME; deaths of stays reaching it happen after it, "
                             "whole minutes >= 4 h (default: %(default)s)")
    parser.add_argument("--events-scale", type=float, default=1.0,
                        help="multiplies every measurement rate; 1.0 is ~300 events per ICU day "
                             "(default: %(default)s)")
    parser.add_argument("--compresslevel", type=int, default=1,
                        help="gzip level 0-9; higher is smaller and slower (default: %(default)s)")
    parser.add_argument("--dictionary-dir", type=pathlib.Path, default=None,
                        help="a MIMIC-III release whose D_ITEMS / D_LABITEMS are written in full, with our "
                             "items added (default: built-in catalogue only)")
    sites = "; ".join(f"{name}: {site.description}" for name, site in SITES.items())
    parser.add_argument("--site", choices=tuple(SITES), default="A",
                        help=f"hospital the release comes from ({sites}); P_DEATH is the same function of the "
                             "physiology at sites A, B and C, and differs at D and E (see docs/synthetic.md, "
                             "'Sites') (default: %(default)s)")
    parser.add_argument("--truth", choices=TRUTH_FAMILIES, default="linear",
                        help="the mortality truth: 'linear' in per-code aggregates of the first day (the "
                             "releases as they always were), or 'temporal', which adds a pre-admission clinic "
                             "course (outpatient creatinine on 2-4 days) and makes P_DEATH depend on its trend and "
                             "on the days since the previous discharge, which no window aggregate expresses (see "
                             "docs/synthetic.md, 'The temporal truth') (default: %(default)s)")
    parser.add_argument("--plant-subgroup", choices=PLANTABLE_TYPES, default=None, metavar="ADMISSION_TYPE",
                        help="admissions of this type die by a reversed physiology (lactate, creatinine, heart "
                             "rate and low blood pressure lower the risk, twice as strongly as they raise it "
                             "elsewhere): a subgroup a "
                             "model fitted to everyone serves worse, for testing subgroup reports; one of "
                             f"{', '.join(PLANTABLE_TYPES)} (default: none, the release is unchanged)")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="hide the progress bar (default: shown when stderr is a terminal)")


def run(args: argparse.Namespace) -> int:
    """Runs `synth` with parsed arguments; prints the summary; returns the exit code."""
    try:
        cfg = SynthConfig(patients=args.patients, seed=args.seed,
                          trigger_offset_seconds=args.trigger_offset_seconds, dialect=args.dialect,
                          gzip=args.gzip, events_scale=args.events_scale, compresslevel=args.compresslevel,
                          dictionary_dir=args.dictionary_dir, site=args.site, plant_subgroup=args.plant_subgroup,
                          truth=args.truth)
    except ValueError as e:
        return usage_error("ehr-pipeline synth", e)
    if cfg.dictionary_dir is not None and not cfg.dictionary_dir.is_dir():
        return usage_error("ehr-pipeline synth", f"--dictionary-dir {cfg.dictionary_dir} is not a directory")
    summary = write_release(cfg, pathlib.Path(args.out), show_progress=args.progress, overwrite=args.overwrite)
    print(summary.format())
    return 0


def add_counterfactual_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the synth-counterfactual flags to a (sub)parser."""
    # default=SUPPRESS on the required flags: the help then shows no "(default: None)" beside "(required)".
    parser.add_argument("--release", type=existing_dir, required=True, default=argparse.SUPPRESS,
                        help="a `synth --truth temporal` release to change (required)")
    parser.add_argument("--change", choices=COUNTERFACTUAL_CHANGES, default="reverse-course",
                        help="reverse-course: each single-admission patient's pre-admission creatinine results in "
                             "reverse time order (same values; the truth's trend term changes); delay-readmission: "
                             "each readmission, with all its rows, --days later after the previous discharge (the "
                             "readmission term changes by ln(gap / (gap + days)), the age term by the years moved) "
                             "(default: %(default)s)")
    parser.add_argument("--days", type=int, default=DEFAULT_DELAY_DAYS,
                        help="delay-readmission: days each readmission moves after the previous discharge "
                             "(default: %(default)s)")
    parser.add_argument("--out", type=output_dir, required=True, default=argparse.SUPPRESS,
                        help="output directory: new, empty, or (with --overwrite) an earlier synthetic release; "
                             "written whole with SYNTH_COUNTERFACTUAL.csv (the truth's logit before and after per "
                             "admission) (required)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier synthetic release in --out whole; without it a non-empty --out "
                             "is refused")


def run_counterfactual(args: argparse.Namespace) -> int:
    """Runs `synth-counterfactual` with parsed arguments; prints the summary; returns the exit code."""
    # Imported here: the counterfactual reads the tables with pandas, which the job's install group (this CLI's
    # `run`) does not carry.
    from ehr_pipeline.synth.counterfactual import CounterfactualError, make_counterfactual

    try:
        summary = make_counterfactual(args.release, args.out, args.change, days=args.days,
                                      overwrite=args.overwrite)
    except CounterfactualError as e:
        return usage_error("ehr-pipeline synth-counterfactual", e)
    print(summary.format())
    return 0
