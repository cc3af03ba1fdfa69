"""Does a model's answer move as the truth's does when only the trajectory changes? The counterfactual bench.

  python bench/methods/counterfactual.py --patients 3000 --scale medium           # the issue's size
  python bench/methods/counterfactual.py --patients 1000 --scale tiny --methods deterministic

A `synth --truth temporal` release (site A) and its counterfactual (`ehr-pipeline
synth-counterfactual --change CHANGE`; reverse-course: each single-admission patient's pre-admission
creatinine results in reverse time order, same values, so the same vocabulary and statistics;
delay-readmission: each readmission 180 days later after the previous discharge) are bagged by
the Beam job. Every method of the comparison (bench/methods/compare_setup.py: its
configs at --scale, trained as compare_runs.train_run trains them; a deep ensemble of
ENSEMBLE_SIZE deterministic runs with --deep-ensemble; the logistic and boosted-tree baselines; the
well-specified logistic on the truth's own design) is trained on the original release and scores
the test split of both. Per method (model.evaluation.statistics.against_truth.counterfactual_response):
the slope of its logit change (the logit of the predictive mean) regressed on the truth's, with a
case-bootstrap interval; the share of the cases whose truth logit moves by >= 1 where the model
moves the same way; its mean |dp| beside the truth's.

Then, for the methods with several members or samples (rank-1), whether the posterior knows what it
has not learned (against_truth.uncertainty_where_decided): mean mutual information and 95%-interval
width on the original test cases where the truth's trajectory terms (10 x trend + the readmission
term, the truth's own TemporalModel.design) are largest in size (top quartile) minus where they are
smallest (bottom quartile), with a case-bootstrap interval.

--early-stop trains with the plateau schedule and early stopping on validation NLL
(train.lr_schedule plateau, patience, min_delta) up to --steps, in runs of their own;
--time-inputs NAME ... trains with those model.time_inputs on (docs/model.md, "Time inputs"), in
runs and a section of their own: the ablation of each input against the same release and seed;
--set model.KEY=VALUE / train.KEY=VALUE varies a size or the optimisation the same way (a search
made on validation NLL, which every run's table row prints).
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np
import pandas as pd

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
from bench.harness import command_line, machine_info, publish  # noqa: E402
from bench.methods.compare_runs import load_split, make_data, make_release, predict, train_run, truth_design  # noqa: E402
from bench.methods.compare_setup import (BASELINES, DEEP_ENSEMBLE, ENSEMBLE_SIZE, METHODS, SCALES,  # noqa: E402
                                         WELL_SPECIFIED)
from ehr_pipeline.synth.counterfactual import (CHANGES, COUNTERFACTUAL_FILE, DEFAULT_DELAY_DAYS,  # noqa: E402
                                               make_counterfactual)
from ehr_pipeline.synth.temporal import temporal_model  # noqa: E402
from model.ehr.inputs import TIME_INPUTS  # noqa: E402
from model.evaluation.statistics.against_truth import (LARGE_TRUTH_CHANGE, all_uncertainties,  # noqa: E402
                                                       carried_coefficients, counterfactual_response,
                                                       interval_coverage, truth_error, uncertainty_where_decided)

SECTION = "counterfactual"
# --early-stop: the plateau schedule and early stopping (model.fit.training_loop.StopRule), in validations.
EARLY_STOP = {"lr_schedule": "plateau", "early_stopping_patience": 6, "early_stopping_min_delta": 0.001,
              "lr_decay_patience": 3, "lr_decay_factor": 0.5}
# ... and neither a stop nor a decay before this share of --steps: a run that has learned the window's values
# can sit on a plateau before it finds the trajectory; without it one of the first 7,000-patient runs stopped
# there at step 1,200 (model.fit.training_loop.StopRule.min_steps).
EARLY_STOP_MIN_SHARE = 0.5
# The uncertainty comparison's groups: quartiles of |the truth's trajectory contribution to the logit|.
DECIDED_QUANTILE, UNDECIDED_QUANTILE = 0.75, 0.25
EPS = 1e-7


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the bench."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--patients", type=int, default=3000, help="patients of the temporal release")
    p.add_argument("--seed", type=int, default=11, help="the release's seed (and the runs' seed)")
    p.add_argument("--truth", choices=("temporal", "linear"), default="temporal",
                   help="the release's truth family (ehr-pipeline synth --truth); linear: no trajectory terms, so no "
                        "counterfactual: only the factual table (abs(p - P) paired, coverage), to check that time "
                        "inputs cost nothing where the truth has no trajectory")
    p.add_argument("--change", choices=CHANGES, default="reverse-course", help="the counterfactual "
                   f"(ehr-pipeline synth-counterfactual --change; delay-readmission by {DEFAULT_DELAY_DAYS} days)")
    p.add_argument("--scale", choices=tuple(SCALES), default="medium", help="model sizes and optimisation "
                   "(bench/methods/compare_setup.py SCALES)")
    p.add_argument("--steps", type=int, default=None, help="max_steps per run; none: the scale's")
    p.add_argument("--methods", nargs="+", default=["deterministic", "rank1_normal"], choices=METHODS,
                   help="network methods to train")
    p.add_argument("--deep-ensemble", action="store_true",
                   help=f"also train the other {ENSEMBLE_SIZE - 1} members of a deep ensemble of deterministic runs")
    p.add_argument("--no-baselines", action="store_true", help="skip the logistic, boosted-tree and well-specified rows")
    p.add_argument("--early-stop", action="store_true",
                   help=f"train with {EARLY_STOP} up to --steps, no stop before {EARLY_STOP_MIN_SHARE:g} of "
                        "them (runs of their own)")
    p.add_argument("--time-inputs", nargs="+", default=[], choices=TIME_INPUTS, metavar="INPUT",
                   help=f"train with these model.time_inputs on (any of {', '.join(TIME_INPUTS)}; runs of their own); "
                        "none: the config's")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a model. or train. value of the scale's configs, as ehr-train --set does "
                        "(e.g. model.rnn_dim=64; runs of their own, named by the overrides)")
    p.add_argument("--reference", default=None, metavar="RUN",
                   help="a finished run under WORK/runs scored first, as the row the others are paired with "
                        "(e.g. deterministic_esmin_s44: the deterministic LSTM without time inputs); none: the first method")
    p.add_argument("--samples", type=int, default=25, help="S evaluation samples per member (1 for deterministic)")
    p.add_argument("--n-bootstrap", type=int, default=1000, help="case resamples of the intervals")
    p.add_argument("--work", default="out/counterfactual", help="folder for releases, data and runs")
    p.add_argument("--out", default="docs/benchmarks.md", help="markdown file that receives the section")
    p.add_argument("--no-write", action="store_true", help="print the section only")
    return p


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1.0 - EPS)
    return np.log(p) - np.log1p(-p)


def _mean_logit(probs: np.ndarray) -> np.ndarray:
    """Logit of the predictive mean of [N, M] sampled probabilities."""
    return _logit(np.asarray(probs, np.float64).reshape(len(probs), -1).mean(axis=1))


def _train_args(args: argparse.Namespace) -> argparse.Namespace:
    """What compare_runs.run_config reads, with the early-stopping settings and time inputs folded in when asked."""
    ns = argparse.Namespace(scale=args.scale, steps=args.steps, samples=args.samples)
    # compare_runs.run_config reads a run's settings from SCALES by name: a variant is registered there,
    # for this process only, under a name of its own (its runs get their own folders too).
    if args.early_stop:
        scale = SCALES[ns.scale]
        ns.scale = f"{ns.scale}+early_stop"
        SCALES[ns.scale] = {**scale, "train": {**scale["train"], **EARLY_STOP, "early_stopping_min_steps":
                                               int(EARLY_STOP_MIN_SHARE * (args.steps or scale["steps"]))}}
    if args.time_inputs:
        scale = SCALES[ns.scale]
        ns.scale = f"{ns.scale}+time_inputs"
        SCALES[ns.scale] = {**scale, "model": {**scale["model"], "time_inputs": list(args.time_inputs)}}
    overrides = _overrides(args)
    if overrides:
        scale = SCALES[ns.scale]
        ns.scale = f"{ns.scale}+set"
        SCALES[ns.scale] = {**scale, **{section: {**scale[section], **values} for section, values in overrides.items()}}
    return ns


def _overrides(args: argparse.Namespace) -> dict[str, dict[str, object]]:
    """--set items as {'model': {...}, 'train': {...}}; another section is refused (SystemExit naming it)."""
    from ehr_base.yaml_config import ConfigError
    from model.cli.ehr_train import parse_overrides

    try:
        overrides = parse_overrides(args.overrides)
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    other = sorted(set(overrides) - {"model", "train"})
    if other:
        raise SystemExit(f"--set {other[0]}.*: only model. and train. values vary a run here")
    return overrides


def _tag(args: argparse.Namespace) -> str:
    """The suffix of a variant's run folders and section name."""
    sets = "".join(f"_{key.split('.', 1)[1]}-{value}" for key, value in
                   sorted(item.partition("=")[::2] for item in args.overrides))
    return ("_esmin" if args.early_stop else "") + (
        "_ti-" + "-".join(sorted(args.time_inputs)) if args.time_inputs else "") + sets


def score_methods(args: argparse.Namespace, work: pathlib.Path) -> dict[str, dict]:
    """{method: {'before': [N, M] probs, 'after': [N, M] probs, 'K': members, 'S': samples}} on the test split."""
    temporal = args.truth == "temporal"
    release, changed = work / "release", (_changed_release(work, args.change) if temporal else None)
    make_release("A", args.patients, args.seed, release, truth=args.truth)
    make_data(release, work / "data")
    before = load_split(work / "data", release, "test")
    after = None
    if temporal:
        if not (changed / COUNTERFACTUAL_FILE).exists():
            make_counterfactual(release, changed, args.change)
        make_data(changed, work / f"data_{args.change}")
        after = load_split(work / f"data_{args.change}", changed, "test")
        if not np.array_equal(before.hadm_ids, after.hadm_ids):
            raise RuntimeError("the counterfactual's test split holds other admissions than the original's")
    targs = _train_args(args)
    tag = _tag(args)
    truth = release / "SYNTH_TRUTH.csv"
    out: dict[str, dict] = {}

    def scored(name: str, exports: list, samples: int, seconds: float, steps: list[int]) -> None:
        from model.export.load import load_export

        loaded = [load_export(str(e)) for e in exports]
        out[name] = {"before": predict(loaded, before, samples, args.seed),
                     "after": None if after is None else predict(loaded, after, samples, args.seed),
                     "K": sum(e.ensemble_size for e in loaded), "S": samples, "seconds": seconds, "steps": steps}

    def run_steps(export: pathlib.Path) -> str:
        """'best step, validation NLL; why it ended' of a run (its best.json)."""
        best = json.loads((export.parent / "best.json").read_text())
        ended = (best.get("stop_reason") or "").split(":")[0].split(" (")[0].replace(" reached", "")
        return f"{best['step']}, {best['validation_nll']:.4f}; {ended}"

    if args.reference:
        export = work / "runs" / args.reference / "export"
        if not (export / "manifest.json").exists():
            raise SystemExit(f"--reference {args.reference}: no finished run's export at {export}")
        card = json.loads((export / "model_card.json").read_text())
        samples = 1 if card["method"] == "deterministic" else args.samples
        scored(f"reference: {args.reference}", [export], samples, float("nan"), [run_steps(export)])
    for method in args.methods:
        seeds = range(ENSEMBLE_SIZE if method == "deterministic" and args.deep_ensemble else 1)
        runs = [train_run(method, args.seed * ENSEMBLE_SIZE + k, targs, work / "data", truth, work,
                          f"{method}{tag}_s{args.seed * ENSEMBLE_SIZE + k}") for k in seeds]
        samples = 1 if method in ("deterministic", "batchensemble") else args.samples
        scored(method, [runs[0][0]], samples, runs[0][2], [run_steps(runs[0][0])])
        if len(runs) > 1:
            scored(DEEP_ENSEMBLE, [r[0] for r in runs], 1, sum(r[2] for r in runs), [run_steps(r[0]) for r in runs])
    if not args.no_baselines:
        from model.ehr.baselines import fit_baseline

        for kind in BASELINES:
            started = time.time()
            fitted = fit_baseline(work / "data", kind, seed=0)
            out[kind] = {"before": fitted.predict_data(work / "data", "test")[:, None],
                         "after": fitted.predict_data(work / f"data_{args.change}", "test")[:, None] if temporal
                         else None,
                         "K": 1, "S": 1, "seconds": time.time() - started, "steps": []}
        out[WELL_SPECIFIED] = _well_specified(work, changed, before.hadm_ids)
    return out


def _changed_release(work: pathlib.Path, change: str) -> pathlib.Path:
    """The counterfactual release of a change in the work folder."""
    return work / f"release_{change}"


def _well_specified(work: pathlib.Path, changed: pathlib.Path | None, test_ids: np.ndarray) -> dict:
    """The truth's own design with coefficients fitted on the training split, scored before and after (no
    counterfactual: before only)."""
    from sklearn.linear_model import LogisticRegression

    started = time.time()
    rows = truth_design(work / "release")
    rows_after = None if changed is None else truth_design(changed)
    train = load_split(work / "data", work / "release", "train")
    fit = LogisticRegression(C=1e6, max_iter=5000).fit(np.stack([rows[h] for h in train.hadm_ids]), train.labels)
    return {"before": fit.predict_proba(np.stack([rows[h] for h in test_ids]))[:, 1:],
            "after": None if rows_after is None else fit.predict_proba(np.stack([rows_after[h] for h in test_ids]))[:, 1:],
            "K": 1, "S": 1, "seconds": time.time() - started, "steps": []}


def _settings(args: argparse.Namespace) -> str:
    """The section title's tail: the training settings that differ from the scale's."""
    return (", early stopping" if args.early_stop else "") + (
        ", time inputs " + " ".join(args.time_inputs) if args.time_inputs else "")


def report(args: argparse.Namespace, work: pathlib.Path, scores: dict[str, dict], argv) -> str:
    """The section's markdown: the counterfactual table and, for sampled posteriors, the uncertainty table."""
    test = load_split(work / "data", work / "release", "test")
    ids = test.hadm_ids
    if args.truth == "linear":
        return linear_report(args, scores, test, truth_design(work / "release"), argv)
    cf = pd.read_csv(_changed_release(work, args.change) / COUNTERFACTUAL_FILE).set_index("HADM_ID").reindex(ids)
    truth_before, truth_after = cf.LOGIT_BEFORE.to_numpy(), cf.LOGIT_AFTER.to_numpy()
    title = f"## Counterfactual: {args.change}{_settings(args)}"
    lines = [f"{title} (`bench/methods/counterfactual.py`)", "", f"Command: `{command_line(__file__, argv)}`", "",
             f"One site-A temporal release ({args.patients:,} patients, seed {args.seed}) and its {args.change} "
             f"counterfactual; {len(ids):,} test admissions, {int(cf.CHANGED.sum()):,} of them changed (the truth's "
             f"mean |dP| there {np.abs(cf.P_DEATH_AFTER - cf.P_DEATH_BEFORE)[cf.CHANGED == 1].mean():.3f}). "
             f"Scale {args.scale}{' with early stopping ' + str(EARLY_STOP) if args.early_stop else ''}"
             f"{' with model.time_inputs ' + str(list(args.time_inputs)) if args.time_inputs else ''}, "
             f"run seed {args.seed}; one release and one run per method: a measurement, not a finding.", "",
             f"| method | slope (95% CI) | sign agreement, truth change >= {LARGE_TRUTH_CHANGE:g} in size | mean abs dp "
             "(truth) | best step, validation NLL; end | train s |",
             "|---|---|---|---|---|---|"]
    for name, s in scores.items():
        r = counterfactual_response(_mean_logit(s["before"]), _mean_logit(s["after"]), truth_before, truth_after,
                                    n_bootstrap=args.n_bootstrap, seed=args.seed)
        steps = " / ".join(s["steps"]) or "-"
        lines.append(f"| {name} | {r['slope']:.3f} ({r['slope_lower']:.3f}, {r['slope_upper']:.3f}) | "
                     f"{r['sign_agreement']:.2f} (n={r['n_large']}) | {r['mean_abs_dp']:.4f} "
                     f"({r['truth_mean_abs_dp']:.4f}) | {steps} | {s['seconds']:.0f} |")
    rows = truth_design(work / "release")
    design = np.stack([rows[h] for h in ids])
    lines += factual_lines(args, scores, design, test.truth)
    sampled = {n: s for n, s in scores.items() if s["K"] * s["S"] > 1 and n != DEEP_ENSEMBLE}
    if sampled:
        trajectory = np.abs(design[:, -2:] @ temporal_model(1.0).coefficients())
        decided = trajectory >= np.quantile(trajectory, DECIDED_QUANTILE)
        undecided = trajectory <= np.quantile(trajectory, UNDECIDED_QUANTILE)
        lines += ["", "Does the posterior know what it has not learned? Mean uncertainty on the original test cases "
                  f"whose trajectory terms of the truth's logit are in the top quartile in size (n={int(decided.sum())}) "
                  f"minus the bottom quartile (n={int(undecided.sum())}), 95% case-bootstrap interval:", "",
                  "| method | measure | decided | undecided | difference (95% CI) |", "|---|---|---|---|---|"]
        for name, s in sampled.items():
            measures = all_uncertainties(s["before"], s["K"], s["S"])
            for measure in ("mutual_information", "interval_width_95"):
                u = uncertainty_where_decided(measures[measure], decided, undecided, n_bootstrap=args.n_bootstrap,
                                              seed=args.seed)
                lines.append(f"| {name} | {measure} | {u['decided_mean']:.4f} | {u['undecided_mean']:.4f} | "
                             f"{u['difference']:+.4f} ({u['lower']:+.4f}, {u['upper']:+.4f}) |")
    lines += ["", machine_info()]
    return "\n".join(lines)


def linear_report(args: argparse.Namespace, scores: dict[str, dict], test, rows: dict, argv) -> str:
    """The section's markdown on a linear-truth release: the factual table alone (no trajectory to change)."""
    design = np.stack([rows[h] for h in test.hadm_ids])
    title = f"## Factual: linear truth{_settings(args)}"
    lines = [f"{title} (`bench/methods/counterfactual.py`)", "", f"Command: `{command_line(__file__, argv)}`", "",
             f"One site-A linear-truth release ({args.patients:,} patients, seed {args.seed}); "
             f"{len(test.hadm_ids):,} test admissions. Scale {args.scale}, run seed {args.seed}; one release and one "
             "run per method: a measurement, not a finding."]
    lines += factual_lines(args, scores, design, test.truth, trajectory=False)
    lines += ["", "| method | best step, validation NLL; end | train s |", "|---|---|---|"]
    lines += [f"| {name} | {' / '.join(sc['steps']) or '-'} | {sc['seconds']:.0f} |" for name, sc in scores.items()]
    lines += ["", machine_info()]
    return "\n".join(lines)


def _coef(c: dict) -> str:
    """A coefficient and its interval to 2 decimals; a rounding residue such as -1e-15 prints as 0.00, not -0.00."""
    return " ".join([f"{round(c['estimate'], 2) + 0.0:.2f}",
                     f"({round(c['lower'], 2) + 0.0:.2f}, {round(c['upper'], 2) + 0.0:.2f})"])


def factual_lines(args: argparse.Namespace, scores: dict[str, dict], design: np.ndarray,
                  truth: np.ndarray, trajectory: bool = True) -> list[str]:
    """The original test split against P_DEATH: abs(p - P) (paired with the first method), coefficients carried (a
    temporal truth's two trajectory terms; trajectory=False: none), coverage."""
    coefficients = temporal_model(1.0).coefficients()
    trajectory_columns = [design.shape[1] - 2, design.shape[1] - 1]  # TemporalModel.design's two terms come last
    names = list(scores)
    columns = (f" | trend coef. (truth {coefficients[0]:g}) | readmission coef. (truth {coefficients[1]:g})"
               if trajectory else "")
    lines = ["", "The original test split against the truth (P_DEATH), 95% case-bootstrap intervals: abs(p - P) of "
             f"the predictive mean, paired minus {names[0]}'s on the same cases; "
             + ("the coefficient of each trajectory term its logit carries (regressed on the truth's own design, as in "
                "docs/results.md's bisection table); " if trajectory else "")
             + "the share of cases whose P lies in the 95% interval of the sampled probabilities.", "",
             f"| method | abs(p - P) | minus {names[0]}{columns} | 95% coverage |",
             "|---|---|---|" + ("---|---|" if trajectory else "") + "---|"]
    reference = scores[names[0]]["before"].mean(axis=1)
    for name, s in scores.items():
        p = s["before"].mean(axis=1)
        err = truth_error(p, truth, reference=reference, n_bootstrap=args.n_bootstrap, seed=args.seed)
        carried = ""
        if trajectory:
            trend, readm = carried_coefficients(p, design, trajectory_columns, n_bootstrap=args.n_bootstrap,
                                                seed=args.seed)
            carried = f"{_coef(trend)} | {_coef(readm)} | "
        coverage = interval_coverage(s["before"], truth, (0.95,))["0.95"]
        paired = ("-" if name == names[0] else
                  f"{err['difference']:+.4f} ({err['difference_lower']:+.4f}, {err['difference_upper']:+.4f})")
        lines.append(f"| {name} | {err['mean']:.4f} ({err['lower']:.4f}, {err['upper']:.4f}) | {paired} | "
                     f"{carried}{'-' if np.isnan(coverage) else f'{coverage:.2f}'} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    """Makes the releases, trains and scores every method, prints and writes the section; returns the exit code."""
    args = build_parser().parse_args(argv)
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    scores = score_methods(args, work)
    change = args.change if args.truth == "temporal" else "linear_truth"
    section = f"{SECTION}_{change}" + ("_early_stop" if args.early_stop else "") + (
        "_time_inputs" if args.time_inputs else "")
    publish(section, report(args, work, scores, argv), args.out, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
