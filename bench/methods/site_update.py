"""Every updating method of ehr-adapt at several local sample sizes, against the known truth of synthetic sites.

  python bench/methods/site_update.py                       # the issue's grid: sizes 100..2,500, 3 x 3 x 3, sites B, D, E
  python bench/methods/site_update.py --quick               # a smoke run: tiny releases, one of each, size 100
  python bench/methods/site_update.py --design matched      # 3 cells per site and size instead of 27 (below)

A rank-1 model (configs/ehr_rank1_normal.yaml at the --scale's sizes) is trained on each of
--train-releases site-A releases (bench/methods/compare_setup.py's seeds). Each shifted site (B: case mix
and measurement, same truth; D: twice the odds of death; E: other predictor effects; docs/synthetic.md)
has --site-releases releases, bagged with the model's units (``ehr-pipeline run --units-from``).
For every local size n and draw d, n admissions of the site release's train split are drawn
(seed d) and every --methods update runs on them (model.adapt.update.adapt, the code ehr-adapt
runs); the updated model then predicts the release's test split (S samples per member), scored
against P_DEATH: mean |p - P|, mixture NLL, calibration slope (logistic regression of the outcome
on logit p) and the share of admissions whose 95% sample interval covers P. By default the
updated model predicts in memory (the recalibration applied as the export's reader applies it,
or the updated network behind the same Predictor the export is traced from); --write-exports
goes through ehr-adapt's export and loader instead (slower: each weight update is saved).

--design matched pairs the i-th training release with the i-th site release and the i-th draw:
every source of variation (the model's training data, the site's release, the local sample)
still differs between the cells, in 3 cells per site and size where the grid has 27. A site
release is bagged once per set of units, so the models of one site share its data folders.

Paired differences: for each pair (bayes vs closed-test, finetune, retrain), the difference of
mean |p - P| on the same cells (train release x site release x draw), per site and size, with a
95% interval whose variance is clustered by model and by site release (clustered_interval: cells
that share either are not independent; in the matched design it is the t-interval over cells,
and it is never narrower than that t-interval).
Every cell is appended to WORK/adapt/cells.jsonl as it finishes; a rerun skips cells already
there, so the grid can grow in parts (--report-only writes the tables from it). Each group of
cells that shares a model, a site release and a size is scored in a fresh process: TensorFlow
keeps about 70 MB of every updated network, and one process ran out of 23 GB in a few hundred
cells. Output: WORK/adapt/adapt.md (the tables), adapt.json and adapt.png, and the 'adapt'
section of --out (docs/results.md) with the plot copied to --figure.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import hashlib
import json
import logging
import multiprocessing
import os
import pathlib
import shutil
import sys
import time
from collections.abc import Callable

import matplotlib
import numpy as np
from scipy import stats

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
# The comparison's release, bagging and training steps, reused so both grids train and bag alike.
from bench.methods.compare_runs import load_split, make_data, make_release, train_run  # noqa: E402
from bench.methods.compare_setup import SCALES  # noqa: E402
from ehr_pipeline.contract import layout  # noqa: E402
from model.adapt import recalibration  # noqa: E402
from model.adapt.config import METHODS, AdaptConfig  # noqa: E402
from model.adapt.export_update import write_update  # noqa: E402
from model.adapt.local_data import read_local  # noqa: E402
from model.adapt.update import adapt  # noqa: E402
from model.evaluation.statistics import metrics  # noqa: E402
from model.export.load import Recalibration, load_export  # noqa: E402
from model.export.predict import Predictor, predict_probs  # noqa: E402

log = logging.getLogger("bench.methods.site_update")

SIZES = (100, 250, 500, 1000, 2500)
SITES = ("B", "D", "E")
# One release seed per site-release index (site A's training releases come from compare_setup.SCALES).
SITE_SEEDS = {"B": (12, 22, 32), "D": (14, 24, 34), "E": (15, 25, 35)}
PAIRS = (("bayes", "closed-test"), ("bayes", "finetune"), ("bayes", "retrain"))
MODEL = "rank1_normal"


def build_parser() -> argparse.ArgumentParser:
    """The bench's flags; defaults are the issue's grid."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--scale", choices=("tiny", "medium"), default="medium",
                        help="release and model sizes (bench/methods/compare_setup.py SCALES)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="local sample sizes, comma-separated")
    parser.add_argument("--train-releases", type=int, default=3, help="site-A training releases (one model each)")
    parser.add_argument("--site-releases", type=int, default=3, help="releases of each shifted site")
    parser.add_argument("--sites", default=",".join(SITES), help="shifted sites, comma-separated (B, D, E)")
    parser.add_argument("--draws", type=int, default=3, help="draws of the local sample per size")
    parser.add_argument("--design", choices=("grid", "matched"), default="grid",
                        help="grid: every training release x site release x draw; matched: the i-th training "
                             "release with the i-th site release and the i-th draw (needs the three counts equal)")
    parser.add_argument("--train-index", default=None,
                        help="only these training releases (comma-separated indices; default: all of them), to run "
                             "parts in parallel")
    parser.add_argument("--prepare-only", action="store_true",
                        help="only make the releases, the data and the trained models (then run parts in parallel, "
                             "e.g. one process per --train-index)")
    parser.add_argument("--methods", default=",".join(METHODS), help="ehr-adapt methods, comma-separated")
    parser.add_argument("--samples", type=int, default=10, help="S samples per member, fitting and scoring")
    parser.add_argument("--epochs", type=int, default=30, help="weight methods: most epochs")
    parser.add_argument("--revision-steps", type=int, default=200, help="closed test: revision's Adam steps")
    parser.add_argument("--steps", type=int, default=None, help="training steps (None: the scale's)")
    parser.add_argument("--work", default="runs/adapt", help="releases, data, runs and results")
    parser.add_argument("--write-exports", action="store_true",
                        help="score through ehr-adapt's written export and loader instead of in memory")
    parser.add_argument("--report-only", action="store_true", help="only write the tables from cells.jsonl")
    parser.add_argument("--out", default="docs/results.md",
                        help="markdown file whose 'adapt' section receives the tables ('' : print only)")
    parser.add_argument("--figure", default="docs/figures/adapt_medium.png",
                        help="where the plot is copied for --out ('' : not copied)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: --scale tiny, sizes 100, one training and one site release per site, "
                             "one draw, 3 epochs, 20 revision steps, S = 3, 100 training steps; docs not written")
    return parser


def _quick(args: argparse.Namespace) -> argparse.Namespace:
    """The smoke run's settings over whatever was given."""
    return dataclasses.replace(_Args(**vars(args)), scale="tiny", sizes="100", train_releases=1, site_releases=1,
                               draws=1, epochs=3, revision_steps=20, samples=3, steps=100, out="", figure="")


@dataclasses.dataclass
class _Args:
    scale: str
    sizes: str
    train_releases: int
    site_releases: int
    sites: str
    draws: int
    design: str
    train_index: str | None
    prepare_only: bool
    methods: str
    samples: int
    epochs: int
    revision_steps: int
    steps: int | None
    work: str
    write_exports: bool
    report_only: bool
    out: str
    figure: str
    quick: bool


def score(probs: np.ndarray, labels: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """|p - P|, mixture NLL, calibration slope and 95% coverage of P_DEATH of sampled probabilities [N, M]."""
    mean = metrics.predictive_mean(probs)
    low, high = np.quantile(probs, [0.025, 0.975], axis=1)
    slope = recalibration.fit_intercept_slope(recalibration.logits_of(mean[:, None]), labels).slope
    return {"abs_error": float(np.mean(np.abs(mean - truth))), "nll": float(metrics.mixture_nll(probs, labels)),
            "calibration_slope": float(slope), "coverage95": float(np.mean((truth >= low) & (truth <= high)))}


def _updated_probs(loaded, local, method: str, draw: int, args, test, cell_dir: pathlib.Path,
                   parent: Callable[[], np.ndarray]) -> tuple[np.ndarray, dict]:
    """The updated model's test predictions [N, S*K] and its adaptation record's summary.

    `parent` gives the parent's seeded test predictions (computed once per test split: every
    recalibration of every cell transforms the same samples).
    """
    config = AdaptConfig(method=method, sample_size=local.sample.n, seed=draw,
                         samples=args.samples, epochs=args.epochs, revision_steps=args.revision_steps)
    update = adapt(loaded, local, config)
    summary = {"step": update.record.get("closed_test", {}).get("step"), "recalibration": update.recalibration}
    if args.write_exports:
        return predict_probs(load_export(write_update(cell_dir / method, loaded, local, update, config)),
                             test.records, args.samples, 0), summary
    if update.network is not None:
        return predict_probs(Predictor(update.network.featurizer, update.network.model), test.records,
                             args.samples, 0), summary
    # The export reader's own transform of the parent's samples: what the written export would answer.
    a, b = update.recalibration
    return Recalibration(intercept=a, slope=b).apply(parent()), summary


def units_key(data: pathlib.Path) -> str:
    """A short digest of a data folder's canonical units: the only thing --units-from takes from it."""
    canonical = layout.read_json(str(data / layout.UNITS))["canonical"]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()[:12]


def _sites(args, work: pathlib.Path, train_data: pathlib.Path, releases: list[int]):
    """(site, release index, data folder, release folder) of every shifted release, bagged in the model's units.

    A site release is bagged once per set of units, not once per model: training releases of one
    site share their units, and the Beam job takes nothing else from the model's data.
    """
    patients = SCALES[args.scale]["releases"]["A"][0]
    units = units_key(train_data)
    for site in args.sites.split(","):
        for r in releases:
            seed = SITE_SEEDS[site][r]
            release = work / "releases" / f"{site}_{seed}"
            make_release(site, patients, seed, release)
            data = work / "data" / f"{site}_{seed}_units_{units}"
            make_data(release, data, units_from=train_data)
            yield site, r, data, release


def run_grid(args, work: pathlib.Path) -> None:
    """Trains, draws, updates and scores every cell not yet in cells.jsonl."""
    cells_path = work / "adapt" / "cells.jsonl"
    cells_path.parent.mkdir(parents=True, exist_ok=True)
    done = {json.dumps(c["key"]) for c in _read_cells(cells_path)}
    seeds = SCALES[args.scale]["releases"]["A"][1]
    patients = SCALES[args.scale]["releases"]["A"][0]
    chosen = range(args.train_releases) if args.train_index is None else [int(i) for i in args.train_index.split(",")]
    for t in chosen:
        release = work / "releases" / f"A_{seeds[t]}"
        make_release("A", patients, seeds[t], release)
        train_data = work / "data" / f"A_{seeds[t]}"
        make_data(release, train_data)
        export, _, _ = train_run(MODEL, seeds[t], args, train_data, release / "SYNTH_TRUTH.csv", work,
                              name=f"{MODEL}_t{t}")
        # Matched: this model meets only its own site release and local draw.
        matched = args.design == "matched"
        releases = [t] if matched else list(range(args.site_releases))
        draws = [t] if matched else list(range(args.draws))
        for site, r, data, site_release in _sites(args, work, train_data, releases):
            for n in [] if args.prepare_only else [int(s) for s in args.sizes.split(",")]:
                keys = [{"train": t, "site": site, "release": r, "size": n, "draw": d, "method": method}
                        for d in draws for method in args.methods.split(",")]
                keys = [k for k in keys if json.dumps(k) not in done]
                if keys:
                    _in_child(_score_group, args, export, data, site_release, keys, cells_path)


def _in_child(function: Callable, *arguments) -> None:
    """Runs function(*arguments) in a fresh process: each updated network leaves about 70 MB behind
    in TensorFlow however it is released, and a process that scored a few hundred cells ran out of memory."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context, max_tasks_per_child=1) as pool:
        pool.submit(function, *arguments).result()


def _score_group(args, export: pathlib.Path, data: pathlib.Path, site_release: pathlib.Path, keys: list[dict],
                 cells_path: pathlib.Path) -> None:
    """Scores the cells `keys` of one model, site release and local size, appending each to cells_path."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    loaded = load_export(export)
    test = load_split(data, site_release, "test")
    parent = functools.cache(lambda: predict_probs(loaded, test.records, args.samples, 0))
    for d in sorted({k["draw"] for k in keys}):
        local = read_local(loaded, data, "train", sample_size=keys[0]["size"], seed=d)
        for key in [k for k in keys if k["draw"] == d]:
            started = time.time()
            folder = cells_path.parent / "exports" / f"t{key['train']}_{key['site']}{key['release']}_n{key['size']}_d{d}"
            probs, summary = _updated_probs(loaded, local, key["method"], d, args, test, folder, parent)
            cell = {"key": key, **score(probs, test.labels, test.truth), **summary,
                    "seconds": time.time() - started, "events": local.sample.events}
            log.info("%s: |p-P| %.4f, NLL %.4f, slope %.2f, coverage %.2f", key, cell["abs_error"], cell["nll"],
                     cell["calibration_slope"], cell["coverage95"])
            with cells_path.open("a") as f:
                f.write(json.dumps(cell) + "\n")


def _read_cells(path: pathlib.Path) -> list[dict]:
    """The cells appended so far, each key once (parts run side by side may both have scored one: the first counts)."""
    cells: dict[str, dict] = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        cell = json.loads(line)
        cells.setdefault(json.dumps(cell["key"]), cell)
    return list(cells.values())


def clustered_interval(diff: np.ndarray, models: list, releases: list) -> dict:
    """Mean of paired differences and its 95% interval, the variance clustered by model and by site release.

    Cells that share a trained model, or a site release (and so its test split and local draws),
    are not independent; treating the 27 cells of a crossed grid as 27 independent ones would
    shrink the interval. The two-way cluster-robust variance (Cameron, Gelbach & Miller, 2011)
    is V_model + V_release - V_both, each V = G / (G - 1) * sum over clusters of the summed
    residuals squared / n^2, with min(G) - 1 degrees of freedom. When every cell has its own
    model and release (the matched design) it is the plain t-interval over cells. On 3 clusters
    the cluster sums can cancel (when the draws, not the models or releases, carry the variation),
    so the interval is never narrower than the t-interval that treats the cells as independent.
    """
    n, residual = len(diff), diff - diff.mean()

    def variance(labels: list) -> tuple[float, int]:
        groups: dict = {}
        for label, r in zip(labels, residual):
            groups[label] = groups.get(label, 0.0) + r
        g = len(groups)
        return (g / (g - 1) * sum(v * v for v in groups.values()) / n ** 2 if g > 1 else float("nan")), g

    (v_model, g_model), (v_release, g_release) = variance(models), variance(releases)
    v_both, _ = variance(list(zip(models, releases)))
    var = v_model + v_release - v_both
    if not var > 0:  # the difference of estimates can fall below 0 on few clusters: keep the larger one-way
        var = max(v_model, v_release)
    half = stats.t.ppf(0.975, min(g_model, g_release) - 1) * np.sqrt(var) if min(g_model, g_release) > 1 \
        else float("nan")
    if not np.isnan(half):  # one model or one release: no clustered interval to widen
        v_cells, _ = variance(list(range(n)))  # each cell its own cluster: the naive variance of the mean
        half = max(half, stats.t.ppf(0.975, n - 1) * np.sqrt(v_cells))
    mean = float(diff.mean())
    return {"mean": mean, "low": float(mean - half), "high": float(mean + half), "cells": n,
            "models": g_model, "releases": g_release}


def paired(cells: list[dict], first: str, second: str, metric: str = "abs_error") -> dict | None:
    """Mean of first - second over cells both ran (same train/site release/size/draw), with its clustered 95% interval."""
    def by_cell(method):
        return {tuple(v for k, v in c["key"].items() if k != "method"): c for c in cells if c["key"]["method"] == method}

    a, b = by_cell(first), by_cell(second)
    common = sorted(set(a) & set(b))
    if not common:
        return None
    diff = np.array([a[k][metric] - b[k][metric] for k in common])
    keys = [a[k]["key"] for k in common]
    # A model is one training release (shared by every site); a release is one site's release.
    return clustered_interval(diff, [k["train"] for k in keys], [(k["site"], k["release"]) for k in keys])


def report(cells: list[dict], work: pathlib.Path) -> tuple[str, dict]:
    """The tables (markdown) by site and size: each method's means, then the paired differences."""
    lines = ["| site | n | method | cells | mean abs(p - P) | NLL | calibration slope | 95% coverage of P | s per cell |",
             "|---|---|---|---|---|---|---|---|---|"]
    groups = sorted({(c["key"]["site"], c["key"]["size"]) for c in cells})
    methods = [m for m in METHODS if any(c["key"]["method"] == m for c in cells)]
    summary: dict = {"means": [], "paired": []}
    for site, n in groups:
        for method in methods:
            mine = [c for c in cells if (c["key"]["site"], c["key"]["size"], c["key"]["method"]) == (site, n, method)]
            if not mine:
                continue
            means = {k: float(np.mean([c[k] for c in mine])) for k in
                     ("abs_error", "nll", "calibration_slope", "coverage95", "seconds")}
            summary["means"].append({"site": site, "size": n, "method": method, "cells": len(mine), **means})
            lines.append(f"| {site} | {n} | {method} | {len(mine)} | {means['abs_error']:.4f} | {means['nll']:.4f} | "
                         f"{means['calibration_slope']:.2f} | {means['coverage95']:.2f} | {means['seconds']:.0f} |")
    lines += ["", "| site | n | difference of mean abs(p - P) | mean | 95% interval | cells | models x site releases |",
              "|---|---|---|---|---|---|---|"]
    # Every site together as well: the same pairs over three times the cells.
    pooled = [("all", n) for n in sorted({n for _, n in groups})] if len({s for s, _ in groups}) > 1 else []
    for site, n in groups + pooled:
        here = [c for c in cells if c["key"]["size"] == n and site in ("all", c["key"]["site"])]
        for first, second in PAIRS:
            p = paired(here, first, second)
            if p is not None:
                summary["paired"].append({"site": site, "size": n, "pair": f"{first} - {second}", **p})
                lines.append(f"| {site} | {n} | {first} - {second} | {p['mean']:+.4f} | "
                             f"[{p['low']:+.4f}, {p['high']:+.4f}] | {p['cells']} | {p['models']} x {p['releases']} |")
    (work / "adapt" / "adapt.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(summary["means"], work / "adapt" / "adapt.png")
    return "\n".join(lines) + "\n", summary


def _plot(means: list[dict], path: pathlib.Path) -> None:
    """Mean abs(p - P) against the local size, one panel per site, one line per method."""
    sites = sorted({m["site"] for m in means})
    if not sites:
        return
    fig, axes = plt.subplots(1, len(sites), figsize=(4.5 * len(sites), 3.5), squeeze=False)
    for ax, site in zip(axes[0], sites):
        for method in METHODS:
            rows = sorted((m["size"], m["abs_error"]) for m in means if m["site"] == site and m["method"] == method)
            if rows:
                ax.plot(*zip(*rows), marker="o", label=method)
        ax.set_xscale("log")
        ax.set_title(f"site {site}")
        ax.set_xlabel("local admissions")
        ax.set_ylabel("mean |p - P_DEATH|")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Runs the grid (or only its report) and prints the tables."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        datefmt="%H:%M:%S")
    args = build_parser().parse_args(argv)
    if args.quick:
        args = _quick(args)
    unknown = sorted(set(args.methods.split(",")) - set(METHODS))
    if unknown:
        print(f"bench/methods/site_update.py: error: --methods: unknown {unknown}; known: {METHODS}", file=sys.stderr)
        return 2
    if args.design == "matched" and not args.train_releases == args.site_releases == args.draws:
        print("bench/methods/site_update.py: error: --design matched needs --train-releases, --site-releases and --draws equal",
              file=sys.stderr)
        return 2
    work = pathlib.Path(args.work)
    if not args.report_only:
        run_grid(args, work)
    cells = _read_cells(work / "adapt" / "cells.jsonl")
    table, summary = report(cells, work)
    (work / "adapt" / "adapt.md").write_text(table)
    if not args.out:
        print(table)
        return 0
    from bench.harness import command_line, publish

    figure = None
    if args.figure and (work / "adapt" / "adapt.png").exists():
        target = ROOT / args.figure
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(work / "adapt" / "adapt.png", target)
        figure = os.path.relpath(target, (ROOT / args.out).parent)
    command = command_line(__file__, argv, drop=("--report-only",))
    publish("adapt", section(table, summary, cells, args, command, figure), args.out)
    return 0


def target_lines(summary: dict) -> list[str]:
    """The issue's targets, each as measured: which (site, n) meet it and which do not."""
    def where(rows) -> str:
        return ", ".join(f"{r['site']} {r['size']}" for r in rows) or "none"

    paired = {(p["site"], p["size"], p["pair"]): p for p in summary["paired"] if p["site"] != "all"}
    lines = []
    # "At least as good": the interval is not wholly above 0; "better": wholly below 0.
    for pair, below, better, claim in (
            ("bayes - closed-test", None, False, "at least as good as closed-test (interval not wholly above 0)"),
            ("bayes - closed-test", None, True, "better than closed-test (interval wholly below 0)"),
            ("bayes - finetune", 1000, True, "better than finetune below 1,000 (interval wholly below 0)"),
            ("bayes - retrain", 1000, True, "better than retrain below 1,000 (interval wholly below 0)")):
        rows = [p for (_, n, name), p in sorted(paired.items()) if name == pair and (below is None or n < below)]
        ok = [p for p in rows if np.isfinite(p["high"]) and (p["high"] < 0 if better else p["low"] <= 0)]
        lines.append(f"- bayes {claim}: met at {len(ok)} of {len(rows)} (site, n): {where(ok)}; "
                     f"not at {where([p for p in rows if p not in ok])}.")
    bayes = [m for m in summary["means"] if m["method"] == "bayes"]
    covered = [m for m in bayes if m["coverage95"] >= 0.90]
    lines.append(f"- bayes' 95% interval covers P_DEATH in >= 90% of cases: at {len(covered)} of {len(bayes)} "
                 f"(site, n); its coverage ranges {min((m['coverage95'] for m in bayes), default=float('nan')):.2f}"
                 f"-{max((m['coverage95'] for m in bayes), default=float('nan')):.2f}.")
    return lines


def _design(keys: list[dict]) -> str:
    """How one group's cells cross training releases, site releases and draws, e.g. 'crossed, 27 cells (...)'."""
    triples = {(k["train"], k["release"], k["draw"]) for k in keys}
    counts = [len({t[i] for t in triples}) for i in range(3)]
    if len(triples) == counts[0] * counts[1] * counts[2]:
        kind = "crossed"
    elif len(triples) == counts[0] == counts[1] == counts[2]:
        kind = "matched"
    else:
        kind = "partly crossed"
    return f"{kind}, {len(triples)} cells ({counts[0]} training x {counts[1]} site releases x {counts[2]} draws)"


def designs(cells: list[dict]) -> str:
    """Per local size (and per site where the sites differ), how its cells are laid out: a sentence."""
    parts = []
    for n in sorted({c["key"]["size"] for c in cells}):
        here = [c["key"] for c in cells if c["key"]["size"] == n]
        by_site = {site: _design([k for k in here if k["site"] == site]) for site in sorted({k["site"] for k in here})}
        if len(set(by_site.values())) == 1:
            parts.append(f"n = {n}: {next(iter(by_site.values()))} per site and method")
        else:
            parts.append(f"n = {n}: " + ", ".join(f"site {site} {text}" for site, text in by_site.items())
                         + " per method")
    return "; ".join(parts)


def remaining(cells: list[dict], args) -> tuple[int, int, float]:
    """(cells of the full grid, cells not yet scored, their hours at the mean measured seconds of their size and method)."""
    sizes, methods = [int(n) for n in args.sizes.split(",")], args.methods.split(",")
    per = len(args.sites.split(",")) * (args.train_releases if args.design == "matched"
                                        else args.train_releases * args.site_releases * args.draws)
    seconds: dict = {}
    for c in cells:
        seconds.setdefault((c["key"]["size"], c["key"]["method"]), []).append(c["seconds"])
    missing, hours = 0, 0.0
    for n in sizes:
        for method in methods:
            measured = seconds.get((n, method), [])
            missing += max(per - len(measured), 0)
            hours += max(per - len(measured), 0) * float(np.mean(measured or [np.nan])) / 3600
    return per * len(sizes) * len(methods), missing, hours


def section(table: str, summary: dict, cells: list[dict], args, command: str, figure: str | None) -> str:
    """docs/results.md's 'adapt' section: the design as run, the tables, the plot and the targets as measured."""
    keys = [c["key"] for c in cells]
    count = {name: len({k[name] for k in keys}) for name in ("site", "size", "method")}
    hours = sum(c["seconds"] for c in cells) / 3600
    full, missing, left = remaining(cells, args)
    grid_text = (f" Of the {args.design} design's {full} method-cells, {missing} are not yet scored ("
                 + (f"about {left:.1f} h summed at the measured mean time of their size and method"
                    if np.isfinite(left) else "their time is not yet measured") + "; a rerun resumes)." if missing else "")
    text = [f"Command (repo root): `{command}`", "",
            f"{len(cells)} cells: {count['method']} methods x {count['size']} local sizes x {count['site']} sites. "
            f"{designs(cells)}. Scale {args.scale}; S = {args.samples} samples per member "
            f"to fit and to score; weight methods at most {args.epochs} epochs; revision {args.revision_steps} "
            f"steps. Scored on each site release's test split against P_DEATH. The cells took {hours:.1f} h "
            f"summed (each cell's wall time).{grid_text} Paired differences: the same cells (training "
            "release, site release, draw); 95% interval with the variance clustered by model and by site "
            "release (two-way cluster-robust, t with min(clusters) - 1 degrees of freedom: cells that share a "
            "model or a release are not independent), and never narrower than the t-interval over cells "
            "taken as independent; 'all' pools the sites.", "",
            table.strip(), ""]
    if figure:
        text += [f"![mean abs(p - P_DEATH) against the local sample's size]({figure})", ""]
    return "\n".join(text + ["Targets, as measured:", *target_lines(summary)]) + "\n"


if __name__ == "__main__":
    sys.exit(main())
