"""`ehr-adapt`: update an export with a site's own labelled admissions; write the updated export.

  ehr-pipeline run --mimic-dir SITE_RELEASE --out site_data --units-from runs/rank1/export
  ehr-adapt --model runs/rank1/export --data site_data --out runs/rank1_site [--method closed-test]
  ehr-eval --model runs/rank1_site --data site_data --split test --out eval/site_after
  ehr-adapt --model runs/rank1/export --outcomes OUTCOME_DIR --out runs/rank1_site


Only the export is needed (no training data). The local admissions are the data folder's --split
(train by default; its test split stays untouched for evaluation), all of them or --sample-size
drawn with --seed. Or --outcomes: the service's outcome store (ehr-serve --outcome-dir, run with
--outcome-keep-admissions), whose kept admissions with their outcomes, answered by the export's
model version, are the local data. The updated export records its parent's checksum, the method, the admissions
and deaths used, and a new reference population; ehr-serve and ehr-eval load it like any export.
Methods (docs/model.md, "Updating a model at a new site"): none, recalibrate-intercept,
recalibrate, closed-test (the default: Vergouwe's closed test chooses among them and revision),
finetune, bayes (the training posterior as the prior) and retrain.
"""
from __future__ import annotations

import argparse
import logging
import sys

import pydantic

from ehr_base import console
from ehr_base.cli_args import DefaultsOnceFormatter, OneLineParser, existing_dir, output_dir, setup_logging, usage_error
from ehr_pipeline.contract import output_folder
from model.adapt.config import METHODS, AdaptConfig
from model.export.load import ExportError

log = logging.getLogger("model.adapt")

# Flag -> AdaptConfig field, so the config's bounds are the flags' bounds and its defaults their defaults.
_FLAGS = {"--method": "method", "--split": "split", "--sample-size": "sample_size", "--seed": "seed",
          "--samples": "samples", "--alpha": "alpha", "--validation-fraction": "validation_fraction",
          "--epochs": "epochs", "--patience": "patience", "--batch-size": "batch_size",
          "--learning-rate": "learning_rate", "--bayes-learning-rate": "bayes_learning_rate",
          "--bias-prior-stddev": "bias_prior_stddev", "--revision-steps": "revision_steps"}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `ehr-adapt`."""
    parser = OneLineParser(
        prog="ehr-adapt",
        description="Update an exported model with a site's labelled admissions (a data folder prepared with "
                    "`ehr-pipeline run --units-from MODEL_DIR`, or the service's outcome store): recalibrate it, "
                    "revise it, fine-tune it, update its "
                    "posterior or retrain it, and write the updated export.",
        formatter_class=DefaultsOnceFormatter,
    )
    parser.add_argument("--model", required=True, type=existing_dir, help="the export to update (MODEL_DIR)")
    local = parser.add_mutually_exclusive_group(required=True)
    local.add_argument("--data", type=existing_dir,
                       help="the site's data folder (Beam job output, prepared with --units-from MODEL_DIR)")
    local.add_argument("--outcomes", type=existing_dir, metavar="OUTCOME_DIR",
                       help="instead of --data: the service's outcome store folder (ehr-serve --outcome-dir, with "
                            "--outcome-keep-admissions); its kept admissions that MODEL_DIR's version answered, with "
                            "their outcomes, are the local data (--split does not apply)")
    parser.add_argument("--out", required=True, type=output_dir,
                        help="where to write the updated export: a new or empty folder, or (with --overwrite) an "
                             "earlier export; never an input, or a folder holding anything else")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export in --out whole, once the update is complete")
    fields = AdaptConfig.model_fields
    for flag, name in _FLAGS.items():
        field = fields[name]
        kwargs = {"default": field.default, "help": field.description}
        if name == "method":
            kwargs["choices"] = METHODS
        elif field.annotation in (int, float):
            kwargs["type"] = field.annotation
        elif name == "sample_size":
            kwargs["type"] = int
        parser.add_argument(flag, **kwargs)
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")
    return parser


def config_of(args: argparse.Namespace) -> AdaptConfig | str:
    """The AdaptConfig of the flags, or 'FLAG: why' for the first value it refuses."""
    values = {name: getattr(args, flag[2:].replace("-", "_")) for flag, name in _FLAGS.items()}
    try:
        return AdaptConfig(**values)
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        flag = next(f for f, n in _FLAGS.items() if n == first["loc"][0])
        return f"{flag}: {first['msg']}, got {first['input']!r}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ehr-adapt`; returns the exit code."""
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    config = config_of(args)
    if isinstance(config, str):
        return usage_error("ehr-adapt", config)
    try:  # before TensorFlow loads and the update runs: a refused --out costs nothing
        output_folder.check_target(args.out, kind=output_folder.MODEL_EXPORT, overwrite=args.overwrite,
                                   inputs=[args.model, args.data or args.outcomes])
    except output_folder.OutputFolderError as err:
        return usage_error("ehr-adapt", f"--out: {err}")
    console.load_tensorflow(args.verbose)
    # why: the update imports TensorFlow; --help and usage errors answer before it loads
    from model.adapt.run_update import run_update

    try:
        result = run_update(args.model, args.data or args.outcomes, args.out, config, progress=not args.no_progress,
                            overwrite=args.overwrite, from_outcomes=args.outcomes is not None)
    except (ExportError, FileNotFoundError, ValueError) as err:
        return usage_error("ehr-adapt", err)
    print(result.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
