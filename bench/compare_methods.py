"""Every method x several seeds on a synthetic release: a Table-4-style comparison into docs/results.md.

Usage (a synthetic release has SYNTH_TRUTH.csv, so the table also has the error vs the truth):

  ehr-pipeline synth --patients 3000 --out out/synth           # the release (MIMIC-III CSVs)
  python bench/compare_methods.py --release out/synth --work out/compare --seeds 3 --scale tiny

  # or on an existing Beam job output folder:
  python bench/compare_methods.py --data out/compare/data --truth out/synth/SYNTH_TRUTH.csv ...

For every method (configs/ehr_<method>.yaml) and seed, one run is trained with
model.train.train (which also evaluates the test split with S samples and writes the
export); "deep_ensemble" combines the deterministic runs of all seeds (members side by side).
Each row reports mean +- SEM over seeds of the test NLL (mixture over S x K), AUC-PR, AUC-ROC,
ECE, the mean absolute error of the predictive probability vs the true P_DEATH, and the
number of trainable parameters. ``--scale tiny`` shrinks the networks and the step counts so
the whole grid runs on a laptop CPU; ``--scale paper`` trains the configs as written (GPU).
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import pathlib
import shlex
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ehr_pipeline  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.compare_methods")

# Table 4's rows, in its order; each maps to configs/ehr_<name>.yaml.
METHODS = ("deterministic", "batchensemble", "bayesian_embeddings", "fully_bayesian", "rank1_normal",
           "rank1_cauchy")
DEEP_ENSEMBLE = "deep_ensemble"
COLUMNS = (("nll", "NLL"), ("auc_pr", "AUC-PR"), ("auc_roc", "AUC-ROC"), ("ece", "ECE"),
           ("truth_mae", "|p - p_true|"))
# --scale tiny: small enough for 2 CPU cores (about a minute per run on ~1k admissions). A
# few hundred steps at the paper's learning rate (3e-4) barely move the weights, so the tiny
# scale trains faster (3e-3) for fewer steps.
TINY = {"model": {"embedding_dim": 16, "rnn_dim": 32, "hidden_layer_dim": 32},
        "train": {"batch_size": 32, "learning_rate": 3e-3, "eval_every_steps": 0, "checkpoint_every_steps": 250,
                  "log_every_steps": 50, "shuffle_buffer": 1024}}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--release", help="synthetic MIMIC-III release (ehr-pipeline synth): the Beam job runs on it")
    src.add_argument("--data", help="an existing Beam job output folder (give --truth for the error vs truth)")
    p.add_argument("--truth", default=None, help="SYNTH_TRUTH.csv (default: RELEASE/SYNTH_TRUTH.csv)")
    p.add_argument("--work", default="out/compare_methods", help="folder for the data and the runs")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="methods to train")
    p.add_argument("--seeds", type=int, default=3, help="seeds per method (>= 3 for a SEM)")
    p.add_argument("--scale", choices=("tiny", "paper"), default="tiny",
                   help="tiny: small networks for a CPU; paper: the configs as written")
    p.add_argument("--steps", type=int, default=1000, help="max_steps per run at --scale tiny")
    p.add_argument("--kl-scale", type=float, default=None,
                   help="override train.kl_scale (None: the configs' 1.0, the ELBO; small data sets make the "
                        "KL / N_train term relatively larger than on MIMIC-III's ~40k admissions)")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member")
    p.add_argument("--out", default="docs/results.md", help="markdown file that receives the table")
    return p


def _run_config(method: str, seed: int, args: argparse.Namespace):
    from model.config import load_config

    config = load_config(ROOT / "configs" / f"ehr_{method}.yaml")
    eval_samples = 1 if config.model.method in ("deterministic", "batchensemble") else args.samples
    overrides = {"train": {"seed": seed}, "eval": {"num_samples": eval_samples, "seed": seed}}
    if args.kl_scale is not None:
        overrides["train"]["kl_scale"] = args.kl_scale
    if args.scale == "tiny":
        anneal = min(config.train.kl_annealing_steps, (2 * args.steps) // 3)  # App. B: 2/3 of training
        overrides["model"] = dict(TINY["model"])
        overrides["train"].update(TINY["train"], max_steps=args.steps, kl_annealing_steps=anneal,
                                  batch_size=min(config.train.batch_size, TINY["train"]["batch_size"]))
    return config.with_overrides(**overrides)


def _mean_sem(values: list[float]) -> tuple[float, float]:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return float("nan"), float("nan")
    mean = sum(vals) / len(vals)
    if len(vals) < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in vals) / (len(vals) - 1)
    return mean, math.sqrt(var / len(vals))


def _row(report: dict, num_parameters: int) -> dict[str, float]:
    o = report["overall"]
    return {"nll": o["nll"], "auc_pr": o["auc_pr"], "auc_roc": o["auc_roc"], "ece": o["ece"],
            "truth_mae": (report.get("truth") or {}).get("mae"), "params": num_parameters}


def _markdown(rows: dict[str, list[dict]], args: argparse.Namespace, data_dir: str, command: str,
              seconds: float) -> str:
    from bench.report import machine_info

    head = "| Method | " + " | ".join(name for _, name in COLUMNS) + " | # Parameters | runs |"
    lines = [f"## Method comparison on a synthetic release ({args.scale} scale)", "",
             f"Command (repo root): `{command}`", "",
             f"Data: `{data_dir}`; test split; mean +- SEM over seeds; S = {args.samples} samples per member "
             "for the Bayesian methods (1 for deterministic members); NLL is the mixture NLL over S x K; "
             "|p - p_true| is the mean absolute error of the predictive probability vs the release's true "
             "P_DEATH.",
             f"Wall time {seconds / 60:.1f} min.", "", head, "|" + "---|" * (len(COLUMNS) + 3)]
    for method, runs in rows.items():
        cells = []
        for key, _ in COLUMNS:
            mean, sem = _mean_sem([r[key] for r in runs])
            cells.append("n/a" if not math.isfinite(mean) else
                         f"{mean:.4f}" + ("" if not math.isfinite(sem) else f" +- {sem:.4f}"))
        params = runs[0]["params"]
        lines.append(f"| {method} | " + " | ".join(cells) + f" | {params:,} | {len(runs)} |")
    lines += ["", "Machine:", "", machine_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Trains the grid and writes the table; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for noisy in ("absl", "tensorflow"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from ehr_pipeline.config import PipelineConfig
    from model.evaluate import run_evaluation
    from model.train import train

    started = time.time()
    work = pathlib.Path(args.work)
    if args.release:
        data_dir = work / "data"
        truth = pathlib.Path(args.truth or pathlib.Path(args.release) / "SYNTH_TRUTH.csv")
        if not (data_dir / "manifest.json").exists():
            from ehr_pipeline.job import run_job

            log.info("running the Beam job on %s", args.release)
            run_job(args.release, str(data_dir), PipelineConfig())
    else:
        data_dir = pathlib.Path(args.data)
        truth = pathlib.Path(args.truth) if args.truth else None

    rows: dict[str, list[dict]] = {}
    det_exports = []
    for method in args.methods:
        for seed in range(args.seeds):
            config = _run_config(method, seed, args)
            run_dir = work / "runs" / f"{method}_s{seed}"
            log.info("training %s seed %d -> %s", method, seed, run_dir)
            result = train(config, data_dir, run_dir, progress=True, truth_path=truth)
            card = json.loads((result.export_dir / "model_card.json").read_text())
            rows.setdefault(method, []).append(_row(result.test_report, card["num_parameters"]))
            if method == "deterministic":
                det_exports.append(result.export_dir)
    if len(det_exports) >= 2:
        report, _ = run_evaluation(det_exports, data_dir, "test", num_samples=1, truth_path=truth, n_bootstrap=200)
        params = sum(json.loads((d / "model_card.json").read_text())["num_parameters"] for d in det_exports)
        rows[f"{DEEP_ENSEMBLE} ({len(det_exports)} deterministic)"] = [_row(report, params)]

    command = "python bench/compare_methods.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    markdown = _markdown(rows, args, str(data_dir), command, time.time() - started)
    from bench.report import write_section

    target = pathlib.Path(args.out) if pathlib.Path(args.out).is_absolute() else ROOT / args.out
    if not target.exists():
        target.write_text("# Results\n\nMethod comparisons written by bench/compare_methods.py.\n")
    path = write_section("compare_methods", markdown, target)
    print(markdown)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
