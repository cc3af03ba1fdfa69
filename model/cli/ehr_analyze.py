"""ehr-analyze: analyses of trained runs (EHR and image alike) and of new data against a model.

  ehr-analyze posterior-rank --model RUN_DIR --data DATA [--split validation]   # an EHR run
  ehr-analyze posterior-rank --model RUN_DIR [--split validation]               # an image run
  ehr-analyze shift --model EXPORT --data NEW_DATA [--out DIR] [--fail-on severe]

posterior-rank (paper 003, Section 2): per posterior stddev matrix (mean-field / k-tied kernels,
variational embeddings) the singular values and the variance kept by ranks 1, 2, 3; then the
run is re-evaluated with every mean-field stddev matrix replaced by its rank-k approximation
(model.evaluation.posterior_rank), with the metrics of ``model.evaluation.statistics.metrics`` (EHR: mixture
NLL, AUC-PR, AUC-ROC, ECE; image: NLL, accuracy, ECE). Writes posterior_rank.json, posterior_rank.md and
singular_values.png into --out (default RUN_DIR/posterior_rank).

shift (docs/shift.md): the new data folder (the Beam job's output, all its splits by default)
against the population the model learnt from (the export's reference_profile.json): per-code
value distributions in the model's units, unit mismatches and conversions, out-of-vocabulary
codes, charting frequency, case mix, the model's mutual information and the performance it expects
there before any outcome arrives (model.evaluation.statistics.metrics_report.estimate_performance). Prints the findings
worst first; writes shift.json, shift.md and shift.png into --out; exits with code 3 when the
level reaches --fail-on (2: a usage error, 0 otherwise).
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys
from typing import Any, Callable

from ehr_base import console
from ehr_base.cli_args import DefaultsOnceFormatter, OneLineParser, existing_dir, output_dir, positive_int, setup_logging, usage_error
from ehr_pipeline.contract import SPLIT_NAMES, integrity, output_folder
from model.cli import EXIT_SHIFT, FAIL_ON
from model.cli.ehr_eval import resolve_model_dir
from model.export_layout import MAX_SAMPLES
from model.evaluation.statistics import metrics
from model.export.load import ExportError
from model.image.cli import wants_image

log = logging.getLogger("ehr-analyze")

FULL = "full"  # row name of the unmodified posterior


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ehr-analyze."""
    parser = OneLineParser(prog="ehr-analyze", description=__doc__.split("\n\n")[0],
                                     formatter_class=DefaultsOnceFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("posterior-rank", help="singular values of posterior stddevs; rank-k replacement re-evaluated",
                       formatter_class=DefaultsOnceFormatter)
    p.add_argument("--model", required=True, metavar="RUN_DIR", type=existing_dir, help="run folder of ehr-train (EHR or image)")
    p.add_argument("--data", default=None, type=existing_dir,
                   help="EHR: output folder of the Beam job (required); image: CIFAR folder, None = the run's")
    p.add_argument("--split", default="validation", choices=("train", "validation", "test"), help="split to evaluate")
    p.add_argument("--ranks", type=positive_int, nargs="+", default=[1, 2, 3], help="ranks of the post-hoc replacements")
    p.add_argument("--samples", type=positive_int, default=None,
                   help="S posterior samples per example; None = the run's eval.num_samples")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same for every rank)")
    p.add_argument("--out", default=None, type=output_dir,
                   help="output folder, written whole once complete; None = RUN_DIR/posterior_rank")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier ehr-analyze report in --out whole (never a folder holding anything else)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")

    p = sub.add_parser("shift", help="new data against the population the model learnt from (exit 3 at --fail-on)",
                       formatter_class=DefaultsOnceFormatter)
    p.add_argument("--model", required=True, metavar="EXPORT", type=existing_dir,
                   help="export directory (MODEL_DIR) or run folder holding export/")
    p.add_argument("--data", required=True, metavar="NEW_DATA", type=existing_dir,
                   help="output folder of the Beam job on the new data")
    p.add_argument("--splits", nargs="+", default=list(SPLIT_NAMES), choices=SPLIT_NAMES,
                   help="splits of --data that make the new population")
    p.add_argument("--out", default=None, type=output_dir,
                   help="write shift.json, shift.md and shift.png here, whole once complete; None = only print "
                        "the findings")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier ehr-analyze report in --out whole (never a folder holding anything else)")
    p.add_argument("--fail-on", default="severe", choices=FAIL_ON,
                   help="exit with code 3 when the report's level is this or worse (never: always 0)")
    p.add_argument("--reference-data", default=None, metavar="DATA", type=existing_dir,
                   help="the data folder the model was trained on: its reference is computed from it (for exports "
                        "without reference_profile.json, or to replace it)")
    p.add_argument("--no-model", action="store_true",
                   help="leave out the model's mutual information and expected performance (no forward passes: faster)")
    p.add_argument("--samples", type=positive_int, default=None,
                   help="S samples per member for the mutual information; None = the reference's (else 25)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--batch-size", type=positive_int, default=64, help="examples per prediction call")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="debug logging, and the libraries' own notices (TensorFlow's C++ start-up lines)")
    return parser


def _ehr_evaluator(args) -> tuple[Any, Callable[[], dict[str, float]], int]:
    """(model, evaluate(), S) of an EHR run."""
    # why: these import TensorFlow, which loads only once the arguments are valid
    from model import data_folder
    from model.export.predict import Predictor, predict_probs
    from model.ehr.train import load_run

    if args.data is None:
        raise ValueError("an EHR run needs --data (the Beam job's output folder)")
    integrity.verify_folder(args.data, (args.split,))  # a cut shard: one line, not a DataLossError
    config, model, featurizer, _ = load_run(args.model, args.data)
    split_records = data_folder.read_split(data_folder.load_data_files(args.data), args.split)
    records, labels = split_records.records, split_records.labels
    samples = args.samples or config.eval.num_samples
    predictor = Predictor(featurizer, model)

    def evaluate() -> dict[str, float]:
        probs = predict_probs(predictor, records, samples, seed=args.seed)
        scalar = metrics.scalar_metrics(metrics.predictive_mean(probs), labels, config.eval.num_bins)
        return {"nll": float(metrics.mixture_nll(probs, labels)), "auc_pr": scalar["auc_pr"],
                "auc_roc": scalar["auc_roc"], "ece": scalar["ece"]}

    return model, evaluate, samples


def _image_evaluator(args) -> tuple[Any, Callable[[], dict[str, float]], int]:
    """(model, evaluate(), S) of an image run."""
    import tensorflow as tf

    # why: these import TensorFlow, which loads only once the arguments are valid
    from model.image import evaluate as evaluation
    from model.image.train import load_run

    config, model, data, _ = load_run(args.model, data_dir=args.data)
    images, labels = {"train": (data.x_train, data.y_train), "validation": (data.x_val, data.y_val),
                      "test": (data.x_test, data.y_test)}[args.split]
    if labels.size == 0:
        raise ValueError(f"{args.model}: the {args.split} split is empty")
    samples = evaluation.effective_samples(config, args.samples)

    def evaluate() -> dict[str, float]:
        tf.random.set_seed(args.seed)  # the same weight draws for every rank
        logits = evaluation.predict_logits(model, images, num_samples=samples, batch_size=config.eval.batch_size)
        row = evaluation.classification_metrics(logits, labels, config.eval.num_bins)
        return {key: row[key] for key in ("nll", "accuracy", "ece")}

    return model, evaluate, samples


def posterior_rank(args) -> dict[str, Any]:
    """The analysis of one run as a JSON-ready dict (also written to --out)."""
    # why: TensorFlow (posterior_rank) and matplotlib (plots) load only once the arguments are valid
    from model.evaluation import posterior_rank as pr
    from model.evaluation.report.plots import singular_values_plot

    run = pathlib.Path(args.model)
    model, evaluate, samples = (_image_evaluator if wants_image(["--model", str(run)]) else _ehr_evaluator)(args)
    sites = pr.stddev_sites(model)
    if not sites:
        raise ValueError(f"{run}: the model has no Gaussian posterior stddevs (a deterministic or rank-1 run?)")
    table = pr.spectrum_table(sites, args.ranks)
    results = {FULL: evaluate()}
    if any(s.raw is not None for s in sites):
        for rank in args.ranks:
            with pr.replaced_by_rank(sites, rank):
                results[f"rank {rank}"] = evaluate()
            log.info("rank %d: %s", rank, results[f"rank {rank}"])
    report = {"run": str(run), "split": args.split, "samples": samples, "seed": args.seed, "sites": table,
              "evaluation": results}
    # The default folder is the run's own (inside it by design); a chosen --out may not overlap the inputs.
    inputs = [] if not args.out else [str(run), *([args.data] if args.data else [])]
    with output_folder.staged(args.out or run / "posterior_rank", kind=output_folder.EVALUATION,
                              command="ehr-analyze posterior-rank", overwrite=args.overwrite or not args.out,
                              inputs=inputs) as staging:
        out = pathlib.Path(staging)
        singular_values_plot({row["site"]: row["singular_values"] for row in table}, out / "singular_values.png")
        (out / "posterior_rank.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "posterior_rank.md").write_text(format_report(report) + "\n")
    return report


def format_report(report: dict[str, Any]) -> str:
    """Markdown: the spectrum table and the rank-k replacement table."""
    ranks = sorted(int(key[len("variance_rank"):]) for key in report["sites"][0] if key.startswith("variance_rank"))
    lines = ["| Posterior stddev matrix | family | shape | mean stddev | "
             + " | ".join(f"variance rank {k}" for k in ranks) + " | top 3 singular values |",
             "|---|---|---|---|" + "---|" * (len(ranks) + 1)]
    for row in report["sites"]:
        top = ", ".join(f"{v:.3g}" for v in row["singular_values"][:3])
        lines.append(f"| {row['site']} | {row['family']} | {' x '.join(map(str, row['shape']))} | "
                     f"{row['mean_stddev']:.4g} | " + " | ".join(f"{row[f'variance_rank{k}']:.4f}" for k in ranks)
                     + f" | {top} |")
    metric_names = list(report["evaluation"][FULL])
    lines += ["", f"{report['split']} split, S = {report['samples']}, seed {report['seed']}; every mean-field / "
              "embedding stddev matrix replaced by its rank-k approximation (clipped at 0):", "",
              "| Posterior | " + " | ".join(metric_names) + " |", "|---|" + "---|" * len(metric_names)]
    for name, row in report["evaluation"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row[m]:.4f}" for m in metric_names) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `ehr-analyze`; returns the exit code."""
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if args.out:  # before TensorFlow loads and the analysis runs: a refused --out costs nothing
        try:
            output_folder.check_target(args.out, kind=output_folder.EVALUATION, overwrite=args.overwrite,
                                       inputs=[args.model, *([args.data] if args.data else [])])
        except output_folder.OutputFolderError as err:
            return usage_error("ehr-analyze", f"--out: {err}")
    console.load_tensorflow(args.verbose)

    if args.command == "shift":
        return shift(args)
    try:
        report = posterior_rank(args)
    except (FileNotFoundError, ValueError) as err:
        return usage_error("ehr-analyze", err)
    print(format_report(report))
    return 0


def shift(args) -> int:
    """`ehr-analyze shift`: prints the findings, writes the files, returns 0, 2 (usage) or 3 (shift at --fail-on)."""
    # why: the use case imports TensorFlow, which loads only once the arguments are valid
    from model.evaluation.against_reference import write_outputs
    from model.evaluation.run_evaluation import run_shift

    if args.samples is not None and args.samples > MAX_SAMPLES:
        return usage_error("ehr-analyze", f"--samples must be at most {MAX_SAMPLES}, got {args.samples}")
    try:
        model_dir = resolve_model_dir(args.model)
        result = run_shift(model_dir, args.data, splits=args.splits, use_model=not args.no_model,
                           samples=args.samples, seed=args.seed, batch_size=args.batch_size,
                           reference_data=args.reference_data, progress=not args.no_progress)
    except (ExportError, FileNotFoundError, ValueError) as err:
        return usage_error("ehr-analyze", err)
    print(result.text())
    if args.out:
        with output_folder.staged(args.out, kind=output_folder.EVALUATION, command="ehr-analyze shift",
                                  overwrite=args.overwrite, inputs=[str(model_dir), args.data]) as staging:
            paths = write_outputs(staging, result, extra={"model": str(model_dir), "data": args.data,
                                                          "splits": list(args.splits)})
        print(f"report: {pathlib.Path(args.out) / paths['json'].name}, {paths['markdown'].name}, "
              f"{paths['plot'].name}")
    return EXIT_SHIFT if result.fails(args.fail_on) else 0


if __name__ == "__main__":
    sys.exit(main())
