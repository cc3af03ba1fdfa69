"""`ehr-eval`: evaluate one export, or a deep ensemble of several, on a split of a data folder.

  ehr-eval --model runs/rank1/export --data out/demo/data --split test --samples 25 --out eval/rank1
  ehr-eval --model runs/det_s0 --model runs/det_s1 --model runs/det_s2 --data DATA --export-ensemble runs/deep_ens
  ehr-eval --baseline logistic --data DATA --truth RELEASE/SYNTH_TRUTH.csv --out eval/logistic
  ehr-eval --compare eval/logistic/predictions.csv eval/rank1/predictions.csv --out eval/rank1_vs_logistic

All S samples x K members of an example are one vectorised pass inside the export; the
probabilities are the ones the service computes for the same example and seed. Before anything is
scored, the data folder is checked against its manifest and the model's schema version, and values
in other units than the model's are converted (or refused with the fix; --force scores them as they
are): one line and exit code 2 for each problem, before any metric. On data that is
not the model's training data, the shift report (docs/shift.md) of the evaluated split against
the model's training population is printed and, with --out, written beside the metrics.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys

import pydantic

from ehr_base import console
from ehr_base.cli_args import (DefaultsOnceFormatter, OneLineParser, existing_dir, existing_file, fraction, output_dir, setup_logging,
                               usage_error)
from ehr_pipeline.contract import output_folder
from model.cli import EXIT_SHIFT, FAIL_ON
from model.export_layout import EXPORT_DIR, MANIFEST, MAX_SAMPLES, UNCERTAINTY_MEASURES
from model.evaluation.statistics import clinical_stats, small_sample
from model.export.load import ExportError
from model.image import cli as image_cli
from model.ehr.config import BASELINE_KINDS, EvalConfig

log = logging.getLogger("model.eval")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `ehr-eval`."""
    d = EvalConfig()
    parser = OneLineParser(
        prog="ehr-eval",
        description="Evaluate exported EHR models on one split: NLL, AUC-PR, AUC-ROC, ECE, Brier with bootstrap "
                    "confidence intervals, uncertainty, selective prediction and referral at the threshold chosen "
                    "on validation. Several --model give a deep ensemble (members side by side along K).",
        formatter_class=DefaultsOnceFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", action="append", metavar="DIR",
                      help="export directory (MODEL_DIR) or run folder holding export/; repeat for an ensemble")
    what.add_argument("--baseline", choices=BASELINE_KINDS, default=None,
                      help="fit a scikit-learn baseline on --data's train split (settings chosen on validation) "
                           "and evaluate it like a model")
    what.add_argument("--compare", nargs=2, metavar=("A", "B"), default=None, type=existing_file,
                      help="two predictions.csv files of earlier evaluations on the same cases: paired bootstrap "
                           "differences B - A of NLL, AUC-PR, AUC-ROC, ECE, Brier (and |p - P_DEATH| with --truth "
                           "or a P_TRUTH column), selective prediction and the clinical report of both; writes "
                           "comparison.json and report.html to --out")
    parser.add_argument("--data", default=None, type=existing_dir,
                        help="output folder of the Beam job (needed with --model/--baseline)")
    parser.add_argument("--split", default="test", help="split to evaluate (train, validation, test)")
    parser.add_argument("--samples", type=int, default=d.num_samples, help=f"S samples per member (1-{MAX_SAMPLES})")
    parser.add_argument("--seed", type=int, default=d.seed, help="sampling seed")
    parser.add_argument("--out", default=None, type=output_dir,
                        help="write metrics.json, PNG plots, predictions.csv and report.html (one self-contained "
                             "page for a clinical reviewer) here, whole once complete (a new or empty folder, or an "
                             "earlier report with --overwrite); without it the report is only printed")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier ehr-eval report in --out (and an earlier export in "
                             "--export-ensemble) whole; a folder holding anything else is refused with or without it")
    parser.add_argument("--truth", default=None, type=existing_file,
                        help="known-truth CSV (HADM_ID,P_DEATH,...) of a synthetic release: adds error vs truth, "
                             "coverage of P_DEATH by the 50/80/95%% sample intervals, Spearman correlations of "
                             "each uncertainty with |p - P_DEATH| and referral against the truth")
    parser.add_argument("--batch-size", type=int, default=d.batch_size, help="examples per prediction call")
    parser.add_argument("--referral-rate", type=float, default=None,
                        help="referral rate; default: the rate stored with a single model (re-chosen on "
                             f"validation if given, and always for ensembles, where it defaults to {d.referral_rate})")
    parser.add_argument("--referral-measure", default=None,
                        choices=UNCERTAINTY_MEASURES,
                        help="uncertainty for referral; default: the stored one (for ensembles, the measure whose "
                             "referral keeps the lowest Brier score on the validation split; predictive_entropy for a "
                             "baseline, whose mutual information is 0)")
    parser.add_argument("--bootstrap", type=int, default=d.n_bootstrap, help="bootstrap resamples for the CIs")
    parser.add_argument("--num-bins", type=int, default=d.num_bins, help="ECE bins")
    parser.add_argument("--target-coverage", type=fraction, default=clinical_stats.TARGET_COVERAGE,
                        help="selective prediction: report the error rate of the cases kept at this coverage "
                             "(fraction of cases the model decides alone)")
    parser.add_argument("--target-risk", type=fraction, default=clinical_stats.TARGET_RISK,
                        help="selective prediction: report the largest coverage whose kept cases' error rate "
                             "(p > 0.5 against the label) is at most this")
    parser.add_argument("--threshold", default=small_sample.DEFAULT_THRESHOLD, type=_threshold_rule,
                        metavar="RULE",
                        help="operating threshold of the report (summary, threshold table): a probability, used as "
                             "given, or sensitivity:TARGET, the highest risk threshold reaching TARGET sensitivity "
                             "on the validation split (with fewer than 10 validation deaths the default is used "
                             "and the report says so); the default is the export's decision threshold, where "
                             "accuracy is counted")
    parser.add_argument("--export-ensemble", default=None, metavar="DIR", type=output_dir,
                        help="also write the --model exports as one ensemble export (MODEL_DIR) here")
    parser.add_argument("--fail-on-shift", choices=FAIL_ON, default="never",
                        help="when the data is not the model's training data, a shift report (shift.json, shift.md, "
                             "shift.png in --out) compares it with the model's training population; exit with code "
                             "3 when its level reaches this (never: the exit code does not depend on it)")
    parser.add_argument("--force", action="store_true",
                        help="score data whose values are in other units than the model's as they are (by default "
                             "they are converted to the model's units before scoring, or refused when they cannot "
                             "be: prepare such data with `ehr-pipeline run --units-from MODEL_DIR`)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")
    return parser


def _threshold_rule(text: str) -> str:
    """--threshold's value as given, once small_sample.parse_rule accepts it (argparse says why not)."""
    try:
        small_sample.parse_rule(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--threshold {text!r}: ")) from None
    return text


def resolve_model_dir(path: str) -> pathlib.Path:
    """An export directory, given either itself or a run folder that holds export/."""
    p = pathlib.Path(path)
    if (p / MANIFEST).is_file():
        return p
    if (p / EXPORT_DIR / MANIFEST).is_file():
        return p / EXPORT_DIR
    raise FileNotFoundError(f"{p}: neither an export directory nor a run folder with {EXPORT_DIR}/")


# The flags that are EvalConfig fields, so the config's bounds are the flags' bounds.
_EVAL_FLAGS = {"num_samples": "--samples", "batch_size": "--batch-size", "n_bootstrap": "--bootstrap",
               "num_bins": "--num-bins", "seed": "--seed", "referral_rate": "--referral-rate"}


def flag_problem(args: argparse.Namespace) -> str | None:
    """The first flag value EvalConfig refuses, as 'FLAG: why', or None (checked before any prediction)."""
    values = {field: getattr(args, flag[2:].replace("-", "_")) for field, flag in _EVAL_FLAGS.items()}
    try:
        EvalConfig(**{k: v for k, v in values.items() if v is not None})
    except pydantic.ValidationError as err:
        first = err.errors()[0]
        return f"{_EVAL_FLAGS[first['loc'][0]]}: {first['msg']}, got {first['input']!r}"
    return None


def _export_or_given(path: str) -> str:
    """The export a --model names (itself, or its run folder's export/), or the path as given when it is neither."""
    try:
        return str(resolve_model_dir(path))
    except FileNotFoundError:
        return path


def output_problem(args: argparse.Namespace) -> str | None:
    """Why --out or --export-ensemble may not be written (output_folder.check_target), or None; before any work."""
    # A run folder given as --model stands for its export: a report beside the export, in the run, is fine.
    models = [_export_or_given(m) for m in args.model or []]
    inputs = [*models, *(args.compare or []), *([args.data] if args.data else []),
              *([args.truth] if args.truth else [])]
    for flag, target, kind in (("--out", args.out, output_folder.EVALUATION),
                               ("--export-ensemble", args.export_ensemble, output_folder.MODEL_EXPORT)):
        if target is None:
            continue
        try:
            output_folder.check_target(target, kind=kind, overwrite=args.overwrite, inputs=inputs)
        except output_folder.OutputFolderError as err:
            return f"{flag}: {err}"
    if args.out and args.export_ensemble and os.path.realpath(args.out) == os.path.realpath(args.export_ensemble):
        return "--out and --export-ensemble name the same folder: give each its own"
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ehr-eval`; returns the exit code."""
    # One command for both families: a task: image config (or run folder) goes to the image models.
    if image_cli.wants_image(argv):
        return image_cli.eval_main(argv)
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    problem = flag_problem(args) or output_problem(args)
    if problem:
        return usage_error("ehr-eval", problem)
    console.load_tensorflow(args.verbose)
    if args.compare:
        return _compare(args)
    if args.data is None:
        return usage_error("ehr-eval", "--data is required with --model or --baseline")
    if args.baseline:
        return _baseline(args)
    return _evaluate(args)


def _evaluate(args: argparse.Namespace) -> int:
    """--model DIR...: the exports (a deep ensemble when several) on --split, printed and written to --out."""
    # why: the use case imports TensorFlow; --help and usage errors answer before it loads
    from model.evaluation import evaluate as evaluation, run_evaluation
    from model.evaluation.report import formatting, report_html
    from model.evaluation.report.performance_table import estimate_markdown

    try:
        request = run_evaluation.EvaluationRequest(
            model_dirs=tuple(resolve_model_dir(m) for m in args.model), data_dir=args.data, split=args.split,
            num_samples=args.samples, seed=args.seed, batch_size=args.batch_size, truth_path=args.truth,
            referral_rate=args.referral_rate, referral_measure=args.referral_measure, n_bootstrap=args.bootstrap,
            num_bins=args.num_bins, out_dir=args.out, export_ensemble=args.export_ensemble, overwrite=args.overwrite,
            progress=not args.no_progress, target_coverage=args.target_coverage, target_risk=args.target_risk,
            force_units=args.force, threshold=args.threshold)
        result = run_evaluation.evaluate_exports(request)
    except (ExportError, FileNotFoundError, ValueError) as err:
        return usage_error("ehr-eval", err)
    report = result.report
    print(formatting.format_table(report))
    r = report["referral"]
    print(f"referral ({r['measure']} > {r['threshold']}, chosen on validation for rate {r['rate']}): "
          f"{r['referred_fraction']:.3f} referred")
    print(report_html.format_clinical(report["clinical"]))
    performance = report[run_evaluation.PERFORMANCE_KEY]
    print(estimate_markdown(performance["estimate"], performance["realized"], performance.get("truth_expected")))
    shifted = result.shift
    if shifted is not None:
        print(shifted.report.text(limit=15))
    if args.out:
        print(f"report: {pathlib.Path(args.out) / evaluation.REPORT_HTML}")
    if result.export_dir is not None:
        print(f"ensemble export: {result.export_dir}")
    if shifted is not None and shifted.fails(args.fail_on_shift):
        return EXIT_SHIFT
    return 0


def _compare(args: argparse.Namespace) -> int:
    """--compare A B: paired bootstrap of two predictions files, printed and written to --out."""
    # why: the report modules load matplotlib, which --help and usage errors do without
    from model.evaluation import evaluate as evaluation
    from model.evaluation.report import formatting, report_html

    try:
        comparison = evaluation.compare_predictions(*args.compare, truth_path=args.truth, n_bootstrap=args.bootstrap,
                                                    seed=args.seed, num_bins=args.num_bins,
                                                    target_coverage=args.target_coverage, target_risk=args.target_risk,
                                                    threshold=args.threshold)
    except (FileNotFoundError, ValueError) as err:
        return usage_error("ehr-eval", err)
    print(formatting.format_comparison(comparison))
    print(report_html.format_selective_difference(comparison["clinical"]["selective_difference"]))
    if args.out:
        out = pathlib.Path(args.out)
        with output_folder.staged(out, kind=output_folder.EVALUATION, command="ehr-eval --compare",
                                  overwrite=args.overwrite, inputs=list(args.compare)) as staging:
            (pathlib.Path(staging) / evaluation.COMPARISON_FILE).write_text(
                json.dumps(comparison, indent=2, allow_nan=False) + "\n")
            report_html.write(pathlib.Path(staging) / evaluation.REPORT_HTML, comparison)
        print(f"comparison: {out / evaluation.COMPARISON_FILE}")
        print(f"report: {out / evaluation.REPORT_HTML}")
    return 0


def _baseline(args: argparse.Namespace) -> int:
    """--baseline KIND: fit on train, choose on validation, evaluate --split like a model."""
    # why: the use case and the baselines' featurizer import TensorFlow; --help answers before it loads
    from model.evaluation import evaluate as evaluation, run_evaluation
    from model.evaluation.report import formatting, report_html
    from model.ehr.baselines import fit_baseline

    try:
        request = run_evaluation.BaselineRequest(
            kind=args.baseline, data_dir=args.data, split=args.split, seed=args.seed, truth_path=args.truth,
            referral_rate=args.referral_rate, referral_measure=args.referral_measure, n_bootstrap=args.bootstrap,
            num_bins=args.num_bins, out_dir=args.out, overwrite=args.overwrite, target_coverage=args.target_coverage,
            target_risk=args.target_risk, threshold=args.threshold)
        report = run_evaluation.evaluate_baseline(request, fit_baseline)
    except (FileNotFoundError, ValueError) as err:
        return usage_error("ehr-eval", err)
    print(f"{args.baseline} baseline, chosen on validation: {report['baseline']['params']}")
    print(formatting.format_table(report))
    print(report_html.format_clinical(report["clinical"]))
    if args.out:
        print(f"report: {pathlib.Path(args.out) / evaluation.REPORT_HTML}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
