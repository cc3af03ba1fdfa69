"""Does the rank-1 LSTM add anything to the logistic regression on the same window aggregates?

  python bench/residual_lstm.py                  # reuses bench/compare_methods.py's medium release A

The medium comparison (docs/results.md) found the L1 logistic regression on the admission
window's aggregates closer to the known truth than every LSTM, and a jointly trained linear
("wide") part did not close the gap. This script asks the sharper question: starting from that
logistic regression, can the sequence model find anything it misses? It

1. fits ``model.baselines``' logistic regression (penalty and C chosen by validation NLL) on the
   Featurizer's ``window_aggregates`` (the baseline's own columns, computed in the graph);
2. puts it into a rank-1 model with a wide part (``rank1_normal_wide``, compare_methods' medium
   config): the wide kernel and the output bias hold the fitted coefficients and intercept, the
   wide layer is frozen with its rank-1 factors at 1, and the LSTM head's output kernel starts
   at 0, so the model starts as the logistic regression exactly;
3. trains the rest (the LSTM, its head and their posteriors) as a residual, with the medium
   comparison's settings, one run per seed; the best validation NLL's checkpoint is kept;
4. scores both on site A's test split against P_DEATH, paired on the same cases.

If the residual LSTM's validation NLL cannot go below the logistic regression's, the sequence
model has nothing to add at this data size, and the target "better than the best scikit-learn
baseline" is out of its reach here, whatever its encoding.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import shlex
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import ehr_pipeline  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.residual_lstm")

ROW = "rank1_normal_wide"  # compare_methods' row whose config the residual runs use
RESIDUAL, LOGISTIC = "residual_lstm", "logistic"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", default="out/compare_methods",
                   help="bench/compare_methods.py's folder: its release_A and data_A are used; runs go to "
                        "WORK/residual_lstm")
    p.add_argument("--seeds", type=int, default=3, help="residual LSTM runs, one per seed")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member")
    p.add_argument("--steps", type=int, default=None, help="max_steps per run (default: the medium scale's)")
    p.add_argument("--n-bootstrap", type=int, default=2000, help="resamples of the paired bootstrap")
    p.add_argument("--out", default="docs/results.md", help="markdown file that receives the section")
    return p


def _split_features(files, featurizer, split: str):
    """model.baselines.SplitFeatures of a split from the Featurizer's window_aggregates (file order)."""
    from model import baselines, inputs

    rows, labels, hadm_ids = [], [], []
    for features, y in inputs.dataset(files, featurizer, split, 512):
        rows.append(features["window_aggregates"].numpy())
        labels.append(y.numpy().astype(np.int64))
        hadm_ids.append(features["hadm_id"].numpy())
    return baselines.SplitFeatures(np.concatenate(hadm_ids), np.concatenate(labels), np.concatenate(rows))


def raw_coefficients(pipeline) -> tuple[np.ndarray, float]:
    """(weights [F], intercept) of a StandardScaler + LogisticRegression pipeline on unscaled columns."""
    scaler, logistic = pipeline[0], pipeline[-1]
    weights = logistic.coef_[0] / scaler.scale_
    return weights, float(logistic.intercept_[0] - np.sum(weights * scaler.mean_))


def start_from_logistic(weights: np.ndarray, intercept: float):
    """An ``initialize`` hook for model.train.train: the model starts as the fitted logistic regression."""
    import tensorflow as tf

    def initialize(model) -> None:
        model.wide.kernel.assign(weights[:, None].astype(np.float32))
        for variable in model.wide.variables:  # rank-1 factor means (alpha, gamma) at 1: no sign flips
            if variable.name.endswith("/mean:0"):
                variable.assign(tf.ones_like(variable))
        for variable in model.output_layer.variables:
            if "bias" in variable.name:
                variable.assign(tf.fill(variable.shape, np.float32(intercept)))
            elif variable.name.endswith("/kernel:0"):
                variable.assign(tf.zeros_like(variable))
        model.wide.trainable = False

    return initialize


def run(args: argparse.Namespace) -> tuple[dict, dict, dict]:
    """(runs {row: [per-seed arrays]}, truth arrays, info) in bench/compare_methods.py's layout."""
    from threadpoolctl import threadpool_limits

    from bench import compare_methods
    from model import baselines, inputs
    from model.predict import predict_probs
    from model.train import featurizer_for, train

    work = pathlib.Path(args.work)
    data, release = work / "data_A", work / "release_A"
    if not (data / "manifest.json").exists():
        raise SystemExit(f"{data}: no Beam job output; run bench/compare_methods.py --scale medium first")
    grid_args = argparse.Namespace(scale="medium", steps=args.steps, samples=args.samples)
    config0 = compare_methods._config(ROW, 0, grid_args)
    files = inputs.load_data_files(data)
    featurizer = featurizer_for(files, config0.model)
    features = {s: _split_features(files, featurizer, s) for s in ("train", "validation", "test")}
    started = time.time()
    with threadpool_limits(limits=1):
        pipeline, params, scores = baselines.fit_logistic(features["train"], features["validation"], seed=0)
    fit_seconds = time.time() - started
    log.info("logistic regression: %s, validation NLL %.4f", params, min(scores.values()))
    weights, intercept = raw_coefficients(pipeline)

    test = compare_methods._split(data, release, "test")
    order = {h: i for i, h in enumerate(features["test"].hadm_ids.tolist())}
    rows = np.array([order[h] for h in test.hadm_ids.tolist()])  # the Featurizer's order -> read_split's
    with threadpool_limits(limits=1):
        p_logistic = pipeline.predict_proba(features["test"].x[rows])[:, 1]
    runs = {LOGISTIC: [{"probs_A": p_logistic[:, None], "params": weights.size + 1, "seconds": fit_seconds}]}
    validation = {LOGISTIC: [min(scores.values())]}
    for seed in range(args.seeds):
        config = compare_methods._config(ROW, seed, grid_args)
        started = time.time()
        result = train(config, data, work / "residual_lstm" / f"run_s{seed}", progress=False,
                       truth_path=release / "SYNTH_TRUTH.csv", initialize=start_from_logistic(weights, intercept))
        probs = predict_probs([str(result.export_dir)], test.records, args.samples, seed)
        card = json.loads((result.export_dir / "model_card.json").read_text())
        runs.setdefault(RESIDUAL, []).append({"probs_A": probs, "params": card["num_parameters"],
                                              "seconds": time.time() - started})
        validation.setdefault(RESIDUAL, []).append(float(result.best["validation_nll"]))
        log.info("residual seed %d: best step %s, validation NLL %.4f", seed, result.best["step"],
                 result.best["validation_nll"])
    truth = {"labels_A": test.labels, "truth_A": test.truth}
    return runs, truth, {"params": params, "validation": validation, "n_test": test.labels.size}


def report(runs: dict, truth: dict, info: dict, command: str, n_boot: int) -> str:
    """The markdown section: both models against the truth, and their paired differences."""
    from bench import compare_methods
    from bench.report import machine_info

    val = info["validation"]
    lines = ["## Can the LSTM add anything to the logistic regression? (medium scale)", "",
             f"Command (repo root): `{command}`", "",
             f"The logistic regression ({info['params']}, chosen by validation NLL) on the Featurizer's window "
             "aggregates, and rank-1 LSTMs (compare_methods' `rank1_normal_wide` config) that start as that "
             "logistic regression (frozen wide part, LSTM head at 0) and train the rest as a residual, "
             f"{len(val[RESIDUAL])} seed(s), best validation checkpoint. Site A test split, n = {info['n_test']}.", "",
             f"Validation NLL: logistic {val[LOGISTIC][0]:.4f}; residual LSTM "
             + ", ".join(f"{v:.4f}" for v in val[RESIDUAL]) + " (one per seed).", "",
             *compare_methods._table(runs, truth, "A"), "",
             "Paired differences on the same test cases (95% bootstrap interval over cases):", "",
             *compare_methods._paired_lines(runs, truth, "A", n_boot, pairs=[(LOGISTIC, RESIDUAL)]),
             "", "Machine:", "", machine_info()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Fits, trains and writes the section of the results file; returns the exit code."""
    args = build_parser().parse_args(argv)
    from ehr_pipeline.cli_args import setup_logging

    setup_logging()
    runs, truth, info = run(args)
    command = "python bench/residual_lstm.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    markdown = report(runs, truth, info, command.strip(), args.n_bootstrap)
    from bench.report import write_section

    path = write_section("residual_lstm", markdown, args.out)
    print(markdown)
    print(f"\nwritten to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
