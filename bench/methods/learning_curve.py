"""How close to the known truth a learner gets as the training split grows: docs/results.md's learning curve.

  python bench/methods/learning_curve.py                       # one large release (~25k admissions), sizes 1.6k-all
  python bench/methods/learning_curve.py --patients 7000 --seed 11 --work out/compare_methods --release-name A

The medium-scale targets (mean abs(p - P_DEATH) <= 0.025, NLL within 0.005 nats of the truth's)
were set for ~6,600 training admissions. This script asks whether a general-purpose learner can
meet them at that size at all, and how many admissions it would need. It writes one large
release with the project's generator, runs the Beam job on it, and fits, on random subsets of
its training split (REPEATS draws per size), two models chosen and read exactly as in
bench/methods/compare_methods.py:

* ``logistic``: model.ehr.baselines' logistic regression on the 634 window aggregates (L1 or L2 and C
  chosen by NLL on the full validation split), the strongest general-purpose learner of the
  medium comparison;
* ``well_specified_logistic``: the truth's own nine terms recomputed from the tables, with
  fitted coefficients: what a model that knew the formula pays for estimating it. Its Laplace
  posterior's 95% interval (cov 95%) shows what coverage of P_DEATH a Bayesian model reaches
  when the only error left is parameter uncertainty.

Every fit is scored on the same full test split against P_DEATH. A power law
``abs(p - P) = a * n^b`` fitted to the logistic points (log-log least squares over sizes)
estimates the training size at which the general-purpose learner would reach the target.
"""
from __future__ import annotations

import argparse
import json
import logging
import math
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.methods.learning_curve")

DEFAULT_SIZES = (1650, 3300, 6600, 13000)
TARGET_ABS_ERROR = 0.025  # the target for mean abs(p - P_DEATH) at medium scale
TARGET_EXCESS_NLL = 0.005  # nats above the truth's NLL
# The medium comparison's training split; its step budget is scaled by the split size so that
# an LSTM on a larger split sees as many epochs (a fixed step count would starve it).
MEDIUM_TRAIN_ADMISSIONS = 6577


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--patients", type=int, default=21000, help="patients of the release (~1.2 admissions each)")
    p.add_argument("--seed", type=int, default=13, help="generator seed of the release")
    p.add_argument("--work", default="out/learning_curve", help="folder for the release and the Beam job's output")
    p.add_argument("--release-name", default="L",
                   help="WORK/release_NAME and WORK/data_NAME (an existing pair, e.g. compare_methods' A, is reused)")
    p.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES),
                   help="training-split sizes (admissions) to subsample; the whole split is always added")
    p.add_argument("--repeats", type=int, default=3, help="random subsets per size (the whole split: one)")
    p.add_argument("--lstm-seeds", type=int, default=3,
                   help="rank-1 Normal LSTMs (compare_methods' medium config) trained on the whole training split, "
                        "one per seed; 0 skips them")
    p.add_argument("--lstm-steps", type=int, default=None,
                   help="max_steps of each LSTM (default: the medium comparison's epochs on this split's size)")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member of the LSTMs")
    p.add_argument("--out", default="docs/results.md", help="markdown file that receives the table")
    return p


def run(args: argparse.Namespace) -> list[dict]:
    """Every (size, repeat) fit's test scores against P_DEATH."""
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    from bench.methods.compare_runs import make_data, make_release, truth_design
    from model.evaluation.statistics import metrics
    from model.evaluation.evaluate import load_truth
    from model.ehr import baselines
    from model.ehr.inputs import Featurizer
    from model.data_folder import load_data_files

    work = pathlib.Path(args.work)
    release, data = work / f"release_{args.release_name}", work / f"data_{args.release_name}"
    make_release("A", args.patients, args.seed, release)
    make_data(release, data)
    files = load_data_files(data)
    featurizer = Featurizer.from_data_files(files, baselines.DEFAULT_WINDOW_HOURS)
    feats = {s: baselines.read_features(files, s, featurizer) for s in ("train", "validation", "test")}
    design = truth_design(release)
    rows = {s: np.stack([design[h] for h in feats[s].hadm_ids.tolist()]) for s in feats}
    truth = load_truth(release / "SYNTH_TRUTH.csv", feats["test"].hadm_ids)
    y_test = feats["test"].labels
    truth_nll = float(metrics.nll(truth, y_test))
    n_train = len(feats["train"].labels)
    sizes = sorted({min(n, n_train) for n in args.sizes} | {n_train})
    jobs = [(n, r) for n in sizes for r in range(1 if n == n_train else args.repeats)]
    results = []
    for n, repeat in tqdm(jobs, desc="fits", unit="fit"):
        idx = np.sort(np.random.default_rng(repeat).choice(n_train, n, replace=False))
        y = feats["train"].labels[idx]
        with threadpool_limits(limits=1):
            subset = baselines.SplitFeatures(feats["train"].hadm_ids[idx], y, feats["train"].x[idx])
            model, params, _ = baselines.fit_logistic(subset, feats["validation"], seed=0)
            chosen = f"{params['penalty']},C={params['C']:g}"
            p_logistic = model.predict_proba(feats["test"].x)[:, 1]
            if n == n_train:
                whole_split_logistic = p_logistic
            well = LogisticRegression(C=1e6, max_iter=5000).fit(rows["train"][idx], y)
            p_well = well.predict_proba(rows["test"])[:, 1]
            low, high = laplace_interval(well, rows["train"][idx], rows["test"], 0.95, seed=repeat)
        for name, p in (("logistic", p_logistic), ("well_specified_logistic", p_well)):
            results.append({"model": name, "n": n, "repeat": repeat, "chosen": chosen if name == "logistic" else "",
                            "abs_error": float(np.mean(np.abs(p - truth))),
                            "excess_nll": float(metrics.nll(p, y_test)) - truth_nll,
                            "coverage_95": float(np.mean((low <= truth) & (truth <= high)))
                            if name == "well_specified_logistic" else float("nan")})
        log.info("n=%d repeat %d: logistic (%s) abs %.4f; well-specified abs %.4f", n, repeat, chosen,
                 results[-2]["abs_error"], results[-1]["abs_error"])
    lstm = _lstm_runs(args, work, data, release, feats["test"].hadm_ids, truth, y_test, truth_nll, whole_split_logistic,
                      n_train)
    return results + lstm, {"n_train": n_train, "n_validation": len(feats["validation"].labels), "n_test": len(y_test),
                     "test_deaths": int(y_test.sum()), "truth_nll": truth_nll}


def _lstm_runs(args, work: pathlib.Path, data: pathlib.Path, release: pathlib.Path, hadm_ids: np.ndarray,
               truth: np.ndarray, y_test: np.ndarray, truth_nll: float, p_logistic: np.ndarray,
               n_train: int) -> list[dict]:
    """Rank-1 Normal LSTMs on the whole training split: test scores per seed, paired with the logistic fit."""
    from bench.methods.compare_runs import load_split, predict, train_run
    from model.evaluation.statistics import against_truth, metrics, metrics_report

    if args.lstm_seeds <= 0:
        return []
    from bench.methods.compare_setup import SCALES

    steps = args.lstm_steps or math.ceil(SCALES["medium"]["steps"] * n_train / MEDIUM_TRAIN_ADMISSIONS)
    grid_args = argparse.Namespace(scale="medium", steps=steps, samples=args.samples)
    split = load_split(data, release, "test")
    if not np.array_equal(split.hadm_ids, hadm_ids):
        raise RuntimeError("the test split's order differs between the baseline features and the LSTM reader")
    out = []
    for seed in range(args.lstm_seeds):
        export, _, seconds = train_run("rank1_normal", seed, grid_args, data, release / "SYNTH_TRUTH.csv", work)
        probs = predict([export], split, args.samples, seed)  # [N, S * K]
        p = probs.mean(axis=1)
        coverage = against_truth.interval_coverage(probs, truth, levels=(0.95,))["0.95"]
        best_step = json.loads((export.parent / "best.json").read_text())["step"]
        out.append({"model": "rank1_normal", "n": n_train, "repeat": seed, "chosen": "", "p": p, "samples": args.samples,
                    "max_steps": steps, "best_step": best_step,
                    "abs_error": float(np.mean(np.abs(p - truth))),
                    "excess_nll": float(metrics.nll(p, y_test)) - truth_nll,
                    "coverage_95": coverage, "train_seconds": seconds})
    # Paired on the same cases: the seed-averaged LSTM against the logistic fit on the same split.
    mean_p = np.mean([r["p"] for r in out], axis=0)
    paired = metrics_report.paired_bootstrap(p_logistic, mean_p, y_test, truth, n=2000)
    for r in out:
        r["paired_vs_logistic"] = paired
    return out


def laplace_interval(model, x_train: np.ndarray, x: np.ndarray, level: float, seed: int,
                     draws: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Central `level` interval of p per row of x under the Laplace posterior of a fitted logistic regression.

    The posterior of (intercept, coefficients) is Normal at the fit with the inverse Hessian of
    the log likelihood as covariance (an unpenalised fit: a flat prior).
    """
    design = np.hstack([np.ones((len(x_train), 1)), x_train])
    p = model.predict_proba(x_train)[:, 1]
    hessian = design.T @ (design * (p * (1 - p))[:, None])
    mean = np.concatenate([model.intercept_, model.coef_[0]])
    # pinv: a term constant in a small subset (e.g. no neonate drawn) has no curvature; its
    # direction then gets no spread instead of an error.
    theta = np.random.default_rng(seed).multivariate_normal(mean, np.linalg.pinv(hessian, hermitian=True),
                                                            size=draws, method="eigh")
    probs = 1.0 / (1.0 + np.exp(-(theta[:, :1] + theta[:, 1:] @ x.T)))  # [draws, N]
    tail = (1 - level) / 2
    return np.quantile(probs, tail, axis=0), np.quantile(probs, 1 - tail, axis=0)


def power_law(ns: np.ndarray, errors: np.ndarray) -> tuple[float, float]:
    """(a, b) of errors = a * ns**b by least squares on logs."""
    b, log_a = np.polyfit(np.log(ns), np.log(errors), 1)
    return float(math.exp(log_a)), float(b)


def report(results: list[dict], info: dict, command: str, seconds: float) -> str:
    """Markdown: the curve per size, the fitted power law and the size it predicts for the target."""
    from bench.methods.compare_report import _fmt, _mean_sem

    lines = [
        "## Learning curve against the known truth",
        "",
        f"Command (repo root): `{command}`",
        "",
        f"One release; subsets of its training split ({info['n_train']:,} admissions), choices on the full "
        f"validation split (n = {info['n_validation']:,}), scores on the full test split (n = {info['n_test']:,}, "
        f"{info['test_deaths']} deaths; the truth's own NLL {info['truth_nll']:.4f}). Mean +- SEM over the "
        "random subsets of a size (one fit on the whole split). Took "
        f"{seconds / 60:.1f} min.",
        "",
        "| training admissions | logistic abs(p - P) | logistic NLL - truth | logistic's choice | "
        "well-specified abs(p - P) | well-specified NLL - truth | well-specified cov 95% |",
        "|---|---|---|---|---|---|---|",
    ]
    sizes = sorted({r["n"] for r in results if r["model"] == "logistic"})
    means = {}
    for n in sizes:
        cells = [f"{n:,}"]
        for name in ("logistic", "well_specified_logistic"):
            rows = [r for r in results if r["model"] == name and r["n"] == n]
            for key in ("abs_error", "excess_nll") + (("coverage_95",) if name != "logistic" else ()):
                mean, sem = _mean_sem(r[key] for r in rows)
                cells.append(_fmt(mean, sem))
                means[name, key, n] = mean
            if name == "logistic":
                cells.append(", ".join(sorted({r["chosen"] for r in rows})))
        lines.append("| " + " | ".join(cells) + " |")
    lstm = [r for r in results if r["model"] == "rank1_normal"]
    if lstm:
        def cell(key: str) -> str:
            return _fmt(*_mean_sem(r[key] for r in lstm))

        paired = lstm[0]["paired_vs_logistic"]
        diff = {k: f"{paired[k]['difference']:+.4f} [{paired[k]['lower']:+.4f}, {paired[k]['upper']:+.4f}]"
                for k in ("truth_mae", "nll")}
        lines += [
            "",
            f"Rank-1 Normal LSTM on the whole training split ({lstm[0]['n']:,} admissions; compare_methods' medium "
            f"config, up to {lstm[0]['max_steps']:,} steps (the comparison's epochs), best checkpoint by validation "
            f"NLL (steps {', '.join(str(r['best_step']) for r in lstm)}), S = {lstm[0]['samples']} per member; "
            f"{len(lstm)} seeds, mean +- SEM; "
            f"{np.mean([r['train_seconds'] for r in lstm]):.0f} s of training per seed):",
            "",
            "| model | abs(p - P) | NLL - truth | cov 95% |",
            "|---|---|---|---|",
            f"| rank1_normal | {cell('abs_error')} | {cell('excess_nll')} | {cell('coverage_95')} |",
            "",
            "Paired on the same test cases, the seed-averaged rank-1 LSTM minus the logistic regression fitted "
            f"on the same split (bootstrap 95% interval): abs(p - P) {diff['truth_mae']}, NLL {diff['nll']}.",
        ]
    ns = np.array(sizes, dtype=float)
    a, b = power_law(ns, np.array([means["logistic", "abs_error", n] for n in sizes]))
    needed = (TARGET_ABS_ERROR / a) ** (1 / b) if b < 0 else float("inf")
    lines += [
        "",
        f"Power law fitted to the logistic regression's mean abs(p - P): {a:.3f} * n^{b:.3f}; it reaches the "
        f"target {TARGET_ABS_ERROR} at about {needed:,.0f} training admissions"
        + (" (an extrapolation beyond the sizes measured)." if needed > ns.max() else "."),
        f"Excess-NLL target ({TARGET_EXCESS_NLL} nats): met by the logistic regression at "
        + (", ".join(f"{n:,}" for n in sizes if means["logistic", "excess_nll", n] <= TARGET_EXCESS_NLL) or "no size")
        + " measured; by the well-specified model at "
        + (", ".join(f"{n:,}" for n in sizes if means["well_specified_logistic", "excess_nll", n] <= TARGET_EXCESS_NLL)
           or "no size") + ".",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Fits the curve and writes its section of the results file; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.harness import command_line, publish
    from ehr_base.cli_args import setup_logging

    setup_logging()
    started = time.time()
    results, info = run(args)
    markdown = report(results, info, command_line(__file__, argv), time.time() - started)
    publish("learning_curve", markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
