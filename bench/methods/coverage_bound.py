"""What coverage of P_DEATH an honest posterior over the logistic regression reaches: docs/results.md.

  python bench/methods/coverage_bound.py                  # the medium comparison's releases (made if missing)

The medium comparison's best-covering model, ``rank1_normal_laplace``, covers P_DEATH with its
95% interval in ~88% of site-A test cases, short of the 90% target; nearly all of its spread
comes from the Laplace posterior over the logistic regression it starts from (model.ehr.wide). This
script asks whether another posterior over that regression, chosen without the truth, would
cover 90%. On site A's training split it fits the regression chosen exactly as the trainer does
(model.ehr.baselines, L1 or L2 and C by validation NLL) and compares posteriors over its weights:

* ``laplace``: the shipped one (model.ehr.wide.fit_laplace): the Hessian plus a unit prior over the
  columns the fit keeps;
* ``laplace xTAU``: the same covariance scaled by TAU (a tempered posterior);
* ``sandwich``: the misspecification-robust sampling covariance P^-1 J P^-1;
* ``penalty prior``: every column free, the dropped ones under the Normal prior whose variance
  matches the fit's own penalty (L1 with inverse strength C: a Laplace prior of scale C,
  precision 1 / (2 C^2); L2: precision 1 / C on every column);
* ``bootstrap``: the regression refitted, with the same penalty and C, on resamples of the
  training split: the estimator's sampling distribution, column selection included.

Each is scored against P_DEATH on site A's (and site B's) test split, and, without the truth,
by the NLL of its predictive mean on the validation split and by K-fold cross-validation on
the training split (the posterior rebuilt on each fold's training part; paired differences
against ``laplace`` on the same held-out admissions).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import sys
import time
from collections.abc import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)

log = logging.getLogger("bench.methods.coverage_bound")

LEVELS = (0.5, 0.8, 0.95)
TARGET_COVERAGE_95 = 0.90  # the target for the 95% interval, in distribution


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the benchmark."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", default="out/compare_methods",
                   help="compare_methods' folder: WORK/release_A, data_A (and _B) are reused or made")
    p.add_argument("--patients", type=int, default=7000, help="patients of each release if it must be made")
    p.add_argument("--seed", type=int, default=11, help="generator seed of site A's release if it must be made "
                                                        "(site B: seed + 1, as compare_methods)")
    p.add_argument("--no-shift", action="store_true", help="skip site B")
    p.add_argument("--scales", type=float, nargs="+", default=[0.5, 1.25, 1.5, 2.0],
                   help="covariance scales TAU of the tempered Laplace rows (1 is the shipped row)")
    p.add_argument("--bootstrap", type=int, default=200, help="refits of the bootstrap row (per CV fold too)")
    p.add_argument("--folds", type=int, default=5, help="K of the cross-validation on the training split")
    p.add_argument("--draws", type=int, default=2000, help="weight draws of each Gaussian posterior")
    p.add_argument("--random-seed", type=int, default=0, help="seed of the draws, resamples and folds")
    p.add_argument("--out", default="docs/results.md", help="markdown file that receives the table")
    return p


@dataclasses.dataclass(frozen=True)
class Posterior:
    """A named way to turn a fitted pipeline and its training rows into weight draws [D, 1 + F] on raw columns."""

    name: str
    draw: Callable[[object, np.ndarray, np.ndarray], np.ndarray]


def posteriors(params: dict, args: argparse.Namespace) -> list[Posterior]:
    """The posteriors compared, the shipped one first."""
    from model.ehr.wide import laplace_posterior

    def gaussian(tau: float = 1.0, sandwich: bool = False, **kwargs) -> Callable:
        def draw(pipeline, x, y):
            mean, scale = laplace_posterior(pipeline, x, sandwich_labels=y if sandwich else None, **kwargs)
            # The same noise for every row: their differences are the posteriors', not the draws'.
            noise = np.random.default_rng(args.random_seed).standard_normal((args.draws, mean.size))
            return mean + np.sqrt(tau) * noise @ scale.T
        return draw

    if params["penalty"] == "l1":
        penalty_prior = {"dropped_precision": 1.0 / (2.0 * params["C"] ** 2)}
    else:
        penalty_prior = {"prior_precision": 1.0 / params["C"]}
    rows = [Posterior("laplace", gaussian())]
    rows += [Posterior(f"laplace x{tau:g}", gaussian(tau)) for tau in args.scales if tau != 1.0]
    rows += [Posterior("sandwich", gaussian(sandwich=True)),
             Posterior("penalty prior", gaussian(**penalty_prior)),
             Posterior("bootstrap", lambda pipeline, x, y: bootstrap_draws(pipeline, x, y, args.bootstrap,
                                                                           args.random_seed))]
    return rows


def bootstrap_draws(pipeline, x: np.ndarray, y: np.ndarray, refits: int, seed: int) -> np.ndarray:
    """Raw-column weights [refits, 1 + F] of the pipeline refitted on bootstrap resamples of (x, y)."""
    from sklearn.base import clone

    from model.ehr.wide import raw_coefficients

    rng = np.random.default_rng(seed)
    resamples = (rng.integers(0, len(y), len(y)) for _ in range(refits))
    return np.array([raw_coefficients(clone(pipeline).fit(x[idx], y[idx])) for idx in resamples])


def sampled_probs(draws: np.ndarray, x: np.ndarray) -> np.ndarray:
    """P(death) [N, D] of each row of x under each weight draw."""
    return 1.0 / (1.0 + np.exp(-(draws[:, 0][None, :] + x @ draws[:, 1:].T)))


def scores(probs: np.ndarray, labels: np.ndarray, truth: np.ndarray | None) -> dict:
    """Predictive-mean NLL, and against the truth abs(p - P), coverage per level and the mean 95% width."""
    from model.evaluation.statistics import against_truth, metrics

    p = probs.mean(axis=1)
    out = {"nll": float(metrics.nll(p, labels))}
    if truth is not None:
        out["abs_error"] = float(np.mean(np.abs(p - truth)))
        out["coverage"] = against_truth.interval_coverage(probs, truth, levels=LEVELS)
        low, high = against_truth.sample_interval(probs, 0.95)
        out["width_95"] = float(np.mean(high - low))
    return out


def cross_validated_p(pipeline, rows: list[Posterior], x: np.ndarray, y: np.ndarray, folds: int,
                      seed: int) -> dict[str, np.ndarray]:
    """Held-out predictive mean [N] per training admission of each posterior, rebuilt on each fold's training part."""
    from sklearn.base import clone
    from tqdm.auto import tqdm

    fold = np.random.default_rng(seed).permutation(np.arange(len(y)) % folds)
    out = {row.name: np.zeros(len(y)) for row in rows}
    for k in tqdm(range(folds), desc="cross-validation", unit="fold"):
        fit_rows, held = fold != k, fold == k
        fitted = clone(pipeline).fit(x[fit_rows], y[fit_rows])
        for row in rows:
            out[row.name][held] = sampled_probs(row.draw(fitted, x[fit_rows], y[fit_rows]), x[held]).mean(axis=1)
    return out


def run(args: argparse.Namespace) -> tuple[list[dict], dict]:
    """Every posterior's scores: test against P_DEATH (site A, B), validation NLL, CV NLL vs the shipped one."""
    from threadpoolctl import threadpool_limits
    from tqdm.auto import tqdm

    from bench.methods.compare_runs import make_data, make_release
    from model.evaluation.statistics import metrics, metrics_report
    from model.evaluation.evaluate import load_truth
    from model.ehr import baselines
    from model.ehr.inputs import Featurizer
    from model.data_folder import load_data_files

    work = pathlib.Path(args.work)
    sites = {"A": args.seed} if args.no_shift else {"A": args.seed, "B": args.seed + 1}
    for site, seed in sites.items():
        make_release(site, args.patients, seed, work / f"release_{site}")
        make_data(work / f"release_{site}", work / f"data_{site}")
    files = load_data_files(work / "data_A")
    featurizer = Featurizer.from_data_files(files, baselines.DEFAULT_WINDOW_HOURS)
    feats = {s: baselines.read_features(files, s, featurizer) for s in ("train", "validation", "test")}
    tests = {"A": feats["test"]}
    if "B" in sites:  # featurized with site A's vocabulary and statistics, as the trained model sees it
        tests["B"] = baselines.read_features(load_data_files(work / "data_B"), "test", featurizer)
    truths = {site: load_truth(work / f"release_{site}" / "SYNTH_TRUTH.csv", split.hadm_ids)
              for site, split in tests.items()}
    train, val = feats["train"], feats["validation"]
    with threadpool_limits(limits=1):
        pipeline, params, _ = baselines.fit_logistic(train, val, args.random_seed)
        rows = posteriors(params, args)
        results = []
        for row in tqdm(rows, desc="posteriors", unit="posterior"):
            draws = row.draw(pipeline, train.x, train.labels)
            result = {"name": row.name, "validation": scores(sampled_probs(draws, val.x), val.labels, None)}
            for site, split in tests.items():
                result[site] = scores(sampled_probs(draws, split.x), split.labels, truths[site])
            results.append(result)
            log.info("%s: site A coverage 95%% %.3f, abs(p - P) %.4f, validation NLL %.4f", row.name,
                     result["A"]["coverage"]["0.95"], result["A"]["abs_error"], result["validation"]["nll"])
        held_out = cross_validated_p(pipeline, rows, train.x, train.labels, args.folds, args.random_seed)
    for result in results:
        result["cv_nll"] = float(metrics.nll(held_out[result["name"]], train.labels))
        result["cv_vs_laplace"] = metrics_report.paired_bootstrap(held_out["laplace"], held_out[result["name"]],
                                                           train.labels, n=2000, seed=args.random_seed)["nll"]
    kept = int(np.count_nonzero(pipeline[-1].coef_[0]))
    info = {"params": params, "kept": kept, "columns": int(train.x.shape[1]), "n_train": len(train.labels),
            "n_validation": len(val.labels), **{f"n_test_{site}": len(split.labels) for site, split in tests.items()}}
    return results, info


def report(results: list[dict], info: dict, args: argparse.Namespace, command: str, seconds: float) -> str:
    """Markdown: one row per posterior, and which of them validation and cross-validation choose."""
    shift = "B" in results[0]
    lines = [
        "## Coverage bound: posteriors over the logistic regression",
        "",
        f"Command (repo root): `{command}`",
        "",
        f"Site A's training split ({info['n_train']:,} admissions); the regression chosen on validation as the "
        f"trainer does ({info['params']['penalty'].upper()}, C = {info['params']['C']:g}: {info['kept']} of "
        f"{info['columns']} columns kept). Test against P_DEATH: site A n = {info['n_test_A']:,}"
        + (f", site B n = {info['n_test_B']:,}" if shift else "")
        + f". Gaussian rows: {args.draws:,} weight draws; bootstrap: {args.bootstrap} refits. Without the truth: "
        f"NLL of the predictive mean on validation (n = {info['n_validation']:,}) and in {args.folds}-fold "
        "cross-validation on the training split, with the paired difference from `laplace` on the same held-out "
        f"admissions (bootstrap 95% interval). Took {seconds / 60:.1f} min.",
        "",
        "| posterior | cov 50% | cov 80% | cov 95% | 95% width | abs(p - P) | test NLL | "
        + ("site B cov 95% | site B abs(p - P) | " if shift else "")
        + "validation NLL | CV NLL | CV NLL - laplace |",
        "|---|---|---|---|---|---|---|" + ("---|---|" if shift else "") + "---|---|---|",
    ]
    for r in results:
        a, cv = r["A"], r["cv_vs_laplace"]
        cells = [f"`{r['name']}`", *(f"{a['coverage'][str(level)]:.1%}" for level in LEVELS),
                 f"{a['width_95']:.3f}", f"{a['abs_error']:.4f}", f"{a['nll']:.4f}"]
        if shift:
            cells += [f"{r['B']['coverage']['0.95']:.1%}", f"{r['B']['abs_error']:.4f}"]
        cells += [f"{r['validation']['nll']:.4f}", f"{r['cv_nll']:.5f}",
                  "0" if r["name"] == "laplace" else
                  f"{cv['difference']:+.5f} [{cv['lower']:+.5f}, {cv['upper']:+.5f}]"]
        lines.append("| " + " | ".join(cells) + " |")
    by_val = min(results, key=lambda r: r["validation"]["nll"])
    by_cv = min(results, key=lambda r: r["cv_nll"])
    covering = [r["name"] for r in results if r["A"]["coverage"]["0.95"] >= TARGET_COVERAGE_95]
    worse = [r["name"] for r in results if r["name"] in covering and r["cv_vs_laplace"]["lower"] > 0]
    lines += [
        "",
        f"Chosen without the truth: validation NLL picks `{by_val['name']}` "
        f"(cov 95% {by_val['A']['coverage']['0.95']:.1%}), cross-validation picks `{by_cv['name']}` "
        f"(cov 95% {by_cv['A']['coverage']['0.95']:.1%}). "
        f"Rows reaching the {TARGET_COVERAGE_95:.0%} target: "
        + (", ".join(f"`{n}`" for n in covering) or "none")
        + (f"; of those, cross-validation finds {', '.join(f'`{n}`' for n in worse)} worse than `laplace` "
           "beyond its bootstrap interval." if worse else "."),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Compares the posteriors and writes their section of the results file; returns the exit code."""
    args = build_parser().parse_args(argv)
    from bench.harness import command_line, publish
    from ehr_base.cli_args import setup_logging

    setup_logging()
    started = time.time()
    results, info = run(args)
    markdown = report(results, info, args, command_line(__file__, argv), time.time() - started)
    publish("coverage_bound", markdown, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
