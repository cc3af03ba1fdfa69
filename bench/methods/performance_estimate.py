"""The performance a model expects before outcomes arrive, against the truth of synthetic sites; NannyML's CBPE beside it.

  python bench/methods/performance_estimate.py --work out/perf_estimate              # the issue's grid (hours)
  python bench/methods/performance_estimate.py --work out/perf_estimate_smoke --quick  # a smoke run (minutes)

A rank-1 model (configs/ehr_demo.yaml, --steps) is trained on a site-A release (--patients, seed
0). Each site of --sites (A: fresh seeds, B: case mix and assays, C: other units, prepared with
the model's units like ``ehr-pipeline run --units-from``, D: twice the odds of death, E: other
predictor effects; docs/synthetic.md) has --releases releases; the model scores each release's
test split (S samples per member). Per (site, release) cell:

* estimated: model.evaluation.statistics.metrics_report.estimate_performance (posterior, and the
  mean-only CBPE-like draw), its 90% interval;
* truth-expected: the same function with outcomes drawn from the release's P_DEATH (free of outcome
  noise); realized: the metric on the release's own drawn outcomes;
* naive: the model's metric on its own validation split (what a team quotes without an estimate);
* NannyML's CBPE (ROC AUC), given the validation split as reference and the test split as analysis,
  run in its own environment (--nannyml-python; bench/requirements-nannyml.txt) on files this bench
  writes, since its dependencies would change the product's;
* the alarm (model.adapt.outcome_alarm): --streams streams of outcomes drawn from P_DEATH for the
  release's cases resampled in random order; the share of streams whose alarm fired by 300, 1,000
  and 3,000 outcomes (at A: the false-alarm rate); beside it the calibration slope's Wald test
  (slope 1 outside its 95% interval), one test at each of those sizes.

Output: WORK/perf_estimate.json (every cell) and WORK/perf_estimate.md (the tables). Numbers are
claimed for the sizes and seeds this command ran with, printed beside them.
"""
from __future__ import annotations

import argparse
import json
import logging
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.methods.compare_runs import load_split, make_data, make_release  # noqa: E402
from model.adapt import outcome_alarm  # noqa: E402
from model.evaluation.statistics import logistic_calibration, metrics, metrics_report  # noqa: E402

log = logging.getLogger("bench.methods.performance_estimate")

SITES = ("A", "B", "C", "D", "E")
# Release seeds per site, apart from the training release's seed 0.
SEEDS = {"A": (101, 102, 103), "B": (201, 202, 203), "C": (301, 302, 303), "D": (401, 402, 403),
         "E": (501, 502, 503)}
STREAM_SIZES = (300, 1000, 3000)
METRICS = ("auc_roc", "brier", "observed_expected")
CBPE_SCRIPT = pathlib.Path(__file__).with_name("nannyml_cbpe.py")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--work", type=pathlib.Path, required=True, help="work folder (releases, data, run, results)")
    p.add_argument("--patients", type=int, default=3000, help="patients per release")
    p.add_argument("--releases", type=int, default=3, help="releases per site")
    p.add_argument("--sites", nargs="+", default=list(SITES), choices=SITES)
    p.add_argument("--steps", type=int, default=600, help="training steps of the site-A model")
    p.add_argument("--samples", type=int, default=10, help="S samples per member when scoring")
    p.add_argument("--draws", type=int, default=1000, help="draws per estimate")
    p.add_argument("--streams", type=int, default=20, help="outcome streams per cell for the alarm")
    p.add_argument("--nannyml-python", default=None, help="python of an environment with nannyml (none: no CBPE)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 400 patients, 1 release, 60 steps, S 4")
    args = p.parse_args(argv)
    if args.quick:
        args.patients, args.releases, args.steps, args.samples, args.draws = 400, 1, 60, 4, 300
    return args


def train_model(args, data: pathlib.Path, release: pathlib.Path) -> pathlib.Path:
    """The site-A model's export (trained once; a finished run is reused)."""
    # why: TensorFlow loads only once the arguments are valid
    from model.ehr.config import load_config
    from model.ehr.train import train

    run_dir = args.work / "run"
    if not (run_dir / "export" / "manifest.json").exists():
        config = load_config(ROOT / "configs" / "ehr_demo.yaml").with_overrides(
            train={"max_steps": args.steps, "seed": 0}, eval={"num_samples": args.samples, "n_bootstrap": 100})
        train(config, data, run_dir, progress=False, truth_path=release / "SYNTH_TRUTH.csv")
    return run_dir / "export"


def cbpe_auroc(python: str | None, p_ref, y_ref, p_new, threshold: float) -> float | None:
    """NannyML CBPE's estimated ROC AUC of the analysis set, run in its own environment; None without one."""
    if python is None:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        np.savetxt(tmp / "reference.csv", np.column_stack([p_ref, y_ref]), delimiter=",", header="p,y", comments="")
        np.savetxt(tmp / "analysis.csv", np.asarray(p_new)[:, None], delimiter=",", header="p", comments="")
        out = subprocess.run([python, str(CBPE_SCRIPT), str(tmp), str(threshold)], capture_output=True, text=True,
                             timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"nannyml CBPE failed: {out.stderr[-2000:]}")
        return json.loads(out.stdout.strip().splitlines()[-1])["roc_auc"]


def stream_power(p, truth, *, streams: int, seed: int) -> dict[str, dict[str, float]]:
    """Over outcome streams (cases resampled in random order, outcomes ~ P_DEATH), the share in which each test fired
    by each of STREAM_SIZES outcomes: "oe", the service's O/E alarm (its looks, its spent alpha); "slope", the
    calibration slope's 95% Wald interval excluding 1, one test after exactly that many outcomes."""
    rng = np.random.default_rng(seed)
    fired_at, slope_fired = [], {n: [] for n in STREAM_SIZES}
    for _ in range(streams):
        idx = rng.integers(0, p.size, size=max(STREAM_SIZES))
        y = (rng.random(idx.size) < truth[idx]).astype(float)
        fired_at.append(outcome_alarm.first_alarm(p[idx], y))
        for n in STREAM_SIZES:
            slope = logistic_calibration.calibration_fit(p[idx[:n]], y[:n])["slope"]
            slope_fired[n].append(bool(not slope["lower"] <= 1.0 <= slope["upper"]))
    return {"oe": {str(n): float(np.mean([f is not None and f <= n for f in fired_at])) for n in STREAM_SIZES},
            "slope": {str(n): float(np.mean(slope_fired[n])) for n in STREAM_SIZES}}


def score_cell(args, probs, labels, truth, p_val, y_val, threshold: float, seed: int) -> dict:
    """Every number of one (site, release) cell."""
    p = metrics.predictive_mean(probs)
    thresholds = metrics_report.decision_thresholds(threshold)
    estimate = metrics_report.estimate_performance(probs, thresholds=thresholds, n_draws=args.draws, seed=seed)
    truth_expected = metrics_report.expected_performance(p, truth, thresholds=thresholds, n_draws=args.draws,
                                                         seed=seed + 1)
    realized = metrics_report.realized_beside(estimate["posterior"], p, labels)
    naive = {"auc_roc": float(metrics.auc_roc(p_val, y_val)), "brier": float(metrics.brier(p_val, y_val)),
             "observed_expected": float(y_val.sum() / p_val.sum())}
    cell = {"n": int(p.size), "deaths": int(labels.sum()), "truth_mean": float(truth.mean()),
            "p_mean": float(p.mean()), "metrics": {}}
    for name in METRICS:
        post, mean_only = estimate["posterior"]["metrics"][name], estimate["mean_only"]["metrics"][name]
        target = truth_expected["metrics"][name]
        cell["metrics"][name] = {
            "estimate": post["estimate"], "lower": post["lower"], "upper": post["upper"],
            "mean_only": mean_only["estimate"], "truth_expected": target["estimate"],
            "truth_lower": target["lower"], "truth_upper": target["upper"],
            "realized": realized["metrics"][name]["value"], "naive_validation": naive[name],
            "covered": bool(post["lower"] <= target["estimate"] <= post["upper"]),
            "width": post["upper"] - post["lower"], "realized_width": target["upper"] - target["lower"]}
    cell["cbpe_auroc"] = cbpe_auroc(args.nannyml_python, p_val, y_val, p, threshold)
    cell["alarm"] = stream_power(p, truth, streams=args.streams, seed=seed + 2)
    return cell


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    # why: TensorFlow loads only once the arguments are valid
    from model.export.load import load_export
    from model.export.predict import predict_probs

    args.work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    train_release, train_data = args.work / "releases" / "A_0", args.work / "data" / "A_0"
    make_release("A", args.patients, 0, train_release)
    make_data(train_release, train_data)
    export = load_export(str(train_model(args, train_data, train_release)))
    threshold = export.files.metrics.decision_threshold
    val = load_split(train_data, train_release, "validation")
    p_val = metrics.predictive_mean(predict_probs(export, val.records, args.samples, 0))
    y_val = np.asarray(val.labels, dtype=float)
    cells = []
    for site in args.sites:
        for seed in SEEDS[site][:args.releases]:
            release, data = args.work / "releases" / f"{site}_{seed}", args.work / "data" / f"{site}_{seed}"
            make_release(site, args.patients, seed, release)
            make_data(release, data, units_from=None if site == "A" else train_data)
            test = load_split(data, release, "test")
            probs = predict_probs(export, test.records, args.samples, seed)
            cell = score_cell(args, probs, np.asarray(test.labels, dtype=float), test.truth, p_val, y_val,
                              threshold, seed)
            cells.append({"site": site, "seed": seed, **cell})
            log.info("%s seed %d: %s", site, seed, json.dumps(cell["metrics"]["auc_roc"]))
    doc = {"command": " ".join(["python bench/methods/performance_estimate.py", *(argv or sys.argv[1:])]),
           "patients": args.patients, "releases": args.releases, "steps": args.steps, "samples": args.samples,
           "draws": args.draws, "streams": args.streams, "seconds": time.time() - started, "cells": cells}
    (args.work / "perf_estimate.json").write_text(json.dumps(doc, indent=2) + "\n")
    table = format_tables(doc)
    (args.work / "perf_estimate.md").write_text(table + "\n")
    print(table)
    return 0


def summarise(cells: list[dict], metric: str) -> dict[str, float]:
    """Mean |estimated - truth-expected| (posterior, mean-only, naive, CBPE for AUROC) and coverage over cells."""
    rows = [c["metrics"][metric] for c in cells]
    out = {"cells": len(rows),
           "abs_error": float(np.mean([abs(r["estimate"] - r["truth_expected"]) for r in rows])),
           "abs_error_mean_only": float(np.mean([abs(r["mean_only"] - r["truth_expected"]) for r in rows])),
           "abs_error_naive": float(np.mean([abs(r["naive_validation"] - r["truth_expected"]) for r in rows])),
           "coverage": float(np.mean([r["covered"] for r in rows])),
           "width_ratio": float(np.mean([r["width"] / r["realized_width"] for r in rows if r["realized_width"]]))}
    if metric == "auc_roc" and all(c["cbpe_auroc"] is not None for c in cells):
        out["abs_error_cbpe"] = float(np.mean([abs(c["cbpe_auroc"] - c["metrics"]["auc_roc"]["truth_expected"])
                                               for c in cells]))
    return out


def _f(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def format_tables(doc: dict) -> str:
    """Markdown: per site and metric the mean errors and coverage; per site the alarm's firing shares."""
    sites = sorted({c["site"] for c in doc["cells"]})
    lines = [f"Measured with `{doc['command']}` ({doc['patients']} patients per release, {doc['releases']} "
             f"release(s) per site, model configs/ehr_demo.yaml {doc['steps']} steps on site A seed 0, S = "
             f"{doc['samples']}, {doc['draws']} draws, {doc['streams']} alarm streams; {doc['seconds']:.0f} s).", "",
             "| site | metric | cells | mean abs error: posterior | mean-only (CBPE-like) | validation split | "
             "NannyML CBPE | 90% coverage | width / realized width |", "|---|---|---|---|---|---|---|---|---|"]
    for site in sites:
        cells = [c for c in doc["cells"] if c["site"] == site]
        for metric in METRICS:
            s = summarise(cells, metric)
            cbpe = f"{s['abs_error_cbpe']:.3f}" if "abs_error_cbpe" in s else "-"
            lines.append(f"| {site} | {metric} | {s['cells']} | {s['abs_error']:.3f} | {s['abs_error_mean_only']:.3f} "
                         f"| {s['abs_error_naive']:.3f} | {cbpe} | {s['coverage']:.2f} | {s['width_ratio']:.2f} |")
    lines += paired_lines(doc)
    lines += ["", "| site | release | AUROC estimated [90%] | truth-expected | realized | O/E estimated | O/E truth-"
              "expected | O/E alarm fired by 300 / 1,000 / 3,000 outcomes | slope test fired by 300 / 1,000 / 3,000 |",
              "|---|---|---|---|---|---|---|---|---|"]
    for c in doc["cells"]:
        auc, oe = c["metrics"]["auc_roc"], c["metrics"]["observed_expected"]
        alarm = " / ".join(f"{c['alarm']['oe'][str(n)]:.2f}" for n in STREAM_SIZES)
        slope = " / ".join(f"{c['alarm']['slope'][str(n)]:.2f}" for n in STREAM_SIZES)
        lines.append(f"| {c['site']} | {c['seed']} | {auc['estimate']:.3f} [{auc['lower']:.3f}, {auc['upper']:.3f}] "
                     f"| {auc['truth_expected']:.3f} | {_f(auc['realized'])} | {oe['estimate']:.2f} | "
                     f"{oe['truth_expected']:.2f} | {alarm} | {slope} |")
    return "\n".join(lines)


def paired_difference(diffs, *, n_boot: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of per-cell paired differences with a 95% bootstrap interval over cells (few cells: a wide interval)."""
    diffs = np.asarray(diffs, dtype=float)
    means = diffs[np.random.default_rng(seed).integers(0, diffs.size, (n_boot, diffs.size))].mean(axis=1)
    interval = metrics.bootstrap_interval(means, float(diffs.mean()))
    return float(diffs.mean()), interval["lower"], interval["upper"]


def paired_lines(doc: dict) -> list[str]:
    """Markdown: per site and over A-C, |estimate - truth-expected| minus that of CBPE and of the validation split,
    paired on the same cells (below 0: the posterior estimate is closer)."""
    lines = ["", "Paired on the same cells: mean |posterior estimate - truth-expected| minus that of the other "
             "answer, 95% bootstrap interval over cells (below 0: the posterior estimate is closer).", "",
             "| sites | cells | AUROC: minus CBPE | AUROC: minus validation split | Brier: minus validation split | "
             "O/E: minus validation split |", "|---|---|---|---|---|---|"]
    groups = [(site, (site,)) for site in sorted({c["site"] for c in doc["cells"]})]
    if {"A", "B", "C"} <= {c["site"] for c in doc["cells"]}:
        groups.append(("A, B, C", ("A", "B", "C")))
    for label, sites in groups:
        cells = [c for c in doc["cells"] if c["site"] in sites]

        def err(metric, key, cells=cells):
            return np.array([abs(c["metrics"][metric][key] - c["metrics"][metric]["truth_expected"]) for c in cells])

        row = [label, str(len(cells))]
        if all(c["cbpe_auroc"] is not None for c in cells):
            cbpe = np.array([abs(c["cbpe_auroc"] - c["metrics"]["auc_roc"]["truth_expected"]) for c in cells])
            row.append("{:+.4f} ({:+.4f}, {:+.4f})".format(*paired_difference(err("auc_roc", "estimate") - cbpe)))
        else:
            row.append("-")
        for metric in METRICS:
            row.append("{:+.4f} ({:+.4f}, {:+.4f})".format(
                *paired_difference(err(metric, "estimate") - err(metric, "naive_validation"))))
        lines.append("| " + " | ".join(row) + " |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
