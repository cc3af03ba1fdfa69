"""The statistics a clinical prediction-model report asks for (TRIPOD+AI), beyond model.evaluation.statistics.metrics.

``model.evaluation.statistics.metrics`` holds what ML papers report (NLL, AUC-PR, ECE, ...); this module adds what a
hospital's reviewer reads, on the same conventions (``p`` one probability per case, ``y`` in
{0, 1}, leading batch axes where a function says so):

* calibration as clinicians read it: calibration-in-the-large (the intercept of a logistic
  recalibration with logit(p) as an offset, slope fixed at 1) and the calibration slope, fitted
  by statsmodels' GLM with Wald intervals; a LOWESS calibration curve (statsmodels) with a
  bootstrap band; equal-count bins with Wilson intervals;
* clinical utility: decision curves, net benefit = TP/n - FP/n * pt / (1 - pt) when treating
  every case with p >= pt (Vickers & Elkin 2006), against treat-all and treat-none, and what
  referring the uncertain cases does to it;
* selective prediction as numbers: AURC, AUGRC (Traub et al. 2024), the risk at a coverage and
  the coverage at a risk, per referral score, with bootstrap intervals and paired differences;
* subgroups: every metric with bootstrap intervals per group of sex, age band, admission type,
  ethnicity and insurance, and the largest gaps between a group and the rest, named.

Scalar metrics come from model.evaluation.statistics.metrics, bootstrap intervals from metrics.bootstrap_interval,
so a number here means what it means in the rest of the report. Functions are pure; the
statsmodels imports are deferred to the functions that fit.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model.export_layout import json_ready
from model.evaluation.statistics import against_truth, metrics, small_sample
# Re-exported: the report's calibration numbers are read from here, where the rest of its statistics are.
from model.evaluation.statistics.logistic_calibration import calibration_estimates, calibration_fit, logit  # noqa: F401

# Threshold probabilities of the decision curve: 1 % to 60 %. Above ~0.6 nobody would withhold
# treatment from a patient more likely than not to die, and net benefit there is noise.
DCA_THRESHOLDS: tuple[float, ...] = tuple(round(0.01 * i, 2) for i in range(1, 61))
# Thresholds the report tabulates with intervals.
DCA_TABLE_THRESHOLDS: tuple[float, ...] = (0.05, 0.1, 0.2, 0.3)
# "Risk at 80 % coverage" and "coverage at 5 % risk" by default (ehr-eval --target-coverage / --target-risk).
TARGET_COVERAGE = 0.8
TARGET_RISK = 0.05
# Referral scores besides the uncertainty measures: "risk" refers the highest p first.
RISK_SCORE = "risk"
# LOWESS span (fraction of the cases in each local fit) and points of the curve.
LOWESS_FRAC = 2.0 / 3.0
CURVE_POINTS = 50
CALIBRATION_BINS = 10

# Subgroups. Age bands in years (lower bound inclusive), ethnicity pooled from MIMIC-III's ~40
# spellings into the groups clinical papers report (a prefix match, first rule wins).
AGE_BANDS: tuple[tuple[str, float, float], ...] = (("18-44", 0.0, 45.0), ("45-64", 45.0, 65.0),
                                                   ("65-79", 65.0, 80.0), ("80+", 80.0, math.inf))
ETHNICITY_GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("WHITE", ("WHITE", "PORTUGUESE", "MIDDLE EASTERN")),
    ("BLACK", ("BLACK",)),
    ("HISPANIC", ("HISPANIC", "SOUTH AMERICAN")),
    ("ASIAN", ("ASIAN",)),
    ("UNKNOWN", ("UNKNOWN", "UNABLE TO OBTAIN", "PATIENT DECLINED")),
)
SUBGROUP_ATTRIBUTES: tuple[str, ...] = ("sex", "age_band", "admission_type", "ethnicity", "insurance")
# Groups smaller than this get their metrics but are not ranked among the gaps: with fewer
# cases a bootstrap interval is itself unreliable.
MIN_GAP_CASES = 20
MIN_GAP_EVENTS = 5
# Metrics whose gaps are named, and which way is worse (+1: higher is worse). Metrics that
# move with the outcome rate (AUC-PR, Brier, NLL) or the group size (ECE) would name the
# sickest or the smallest group rather than the worst-served one, so only these are ranked:
# discrimination, calibration in the large (|observed - expected|) and, with a known truth,
# the error against it on the log-odds scale: an absolute error |p - P| grows with the risk
# itself and would name the oldest patients for being sicker.
GAP_METRICS: dict[str, int] = {"auc_roc": -1, "abs_observed_minus_expected": +1, "logit_error_truth": +1}
# Metrics against a known truth, per group: mean |p - P| and mean |logit p - logit P|.
TRUTH_METRICS: tuple[str, ...] = ("mae_truth", "logit_error_truth")
SUBGROUP_METRICS: tuple[str, ...] = ("auc_roc", "auc_pr", "nll", "ece", "brier", "accuracy", "mean_p",
                                     "observed_rate", "observed_minus_expected")


# --------------------------------------------------------------------------- calibration


def calibration_grid(p, points: int = CURVE_POINTS) -> np.ndarray:
    """Where the smoothed curve is reported: `points` values from the 1st to the 99th percentile of p.

    LOWESS extrapolates linearly past the data, so the ends, where a few cases decide the
    curve, are left out.
    """
    lo, hi = np.quantile(np.asarray(p, dtype=np.float64), [0.01, 0.99])
    return np.linspace(lo, hi, points) if hi > lo else np.array([lo])


def lowess_curve(p, y, grid, frac: float = LOWESS_FRAC) -> np.ndarray:
    """Observed event rate as a smooth function of p at the grid (statsmodels lowess, no robustness passes), in [0, 1]."""
    from statsmodels.nonparametric.smoothers_lowess import lowess

    # it=0: the robustness passes down-weight "outliers", and with 0/1 outcomes every event is one.
    fitted = lowess(np.asarray(y, np.float64), np.asarray(p, np.float64), frac=frac, it=0,
                    xvals=np.asarray(grid, np.float64))
    return np.clip(fitted, 0.0, 1.0)


def smoothed_calibration(p, y, *, n_bootstrap: int = 1000, alpha: float = 0.05, seed: int = 0,
                         points: int = CURVE_POINTS, frac: float = LOWESS_FRAC) -> dict[str, Any]:
    """LOWESS calibration curve of y on p with a percentile bootstrap band (cases resampled)."""
    p, y = metrics.as_pair(p, y)
    grid = calibration_grid(p, points)
    curve = lowess_curve(p, y, grid, frac)
    rng = np.random.default_rng(seed)
    draws = []
    for _ in range(n_bootstrap):
        idx = rng.integers(0, y.size, y.size)
        draws.append(lowess_curve(p[idx], y[idx], grid, frac))
    band = (np.nanquantile(np.array(draws), [alpha / 2.0, 1.0 - alpha / 2.0], axis=0) if draws
            else np.full((2, grid.size), np.nan))
    return {"p": grid.tolist(), "observed": curve.tolist(), "lower": band[0].tolist(), "upper": band[1].tolist(),
            "frac": frac, "n_bootstrap": n_bootstrap,
            "method": "LOWESS of the outcome on p (statsmodels, it=0), percentile bootstrap band"}


def binned_calibration(p, y, num_bins: int = CALIBRATION_BINS, alpha: float = 0.05) -> list[dict[str, float]]:
    """Equal-count groups of p: mean p, observed rate and its Wilson (1 - alpha) interval (statsmodels), count."""
    from statsmodels.stats.proportion import proportion_confint

    p, y = metrics.as_pair(p, y)
    rows = []
    for g in np.array_split(np.argsort(p, kind="stable"), min(num_bins, p.size)):
        if not g.size:
            continue
        events = int(y[g].sum())
        lo, hi = proportion_confint(events, g.size, alpha=alpha, method="wilson")
        rows.append({"mean_p": float(p[g].mean()), "observed": events / g.size, "lower": float(lo),
                     "upper": float(hi), "n": int(g.size)})
    return rows


# --------------------------------------------------------------------------- decision curves


def net_benefit(p, y, thresholds: Sequence[float] = DCA_THRESHOLDS, treat=None) -> np.ndarray:
    """Net benefit TP/n - FP/n * pt/(1 - pt) per threshold pt, treating p >= pt (or `treat` [..., T, N] if given).

    p and y may carry leading batch axes ([..., N]); the result has shape [..., T].
    """
    p = np.asarray(p, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    t = np.asarray(thresholds, dtype=np.float64)
    if np.any((t <= 0) | (t >= 1)):
        raise ValueError("threshold probabilities must lie in (0, 1)")
    if treat is None:
        treat = p[..., None, :] >= t[:, None]
    n = y.shape[-1]
    tp = np.sum(treat & (y[..., None, :] == 1), axis=-1) / n
    fp = np.sum(treat & (y[..., None, :] == 0), axis=-1) / n
    return tp - fp * t / (1.0 - t)


def treat_all_net_benefit(y, thresholds: Sequence[float] = DCA_THRESHOLDS) -> np.ndarray:
    """Net benefit of treating everyone: prevalence - (1 - prevalence) * pt / (1 - pt), shape [..., T]."""
    y = np.asarray(y, dtype=np.float64)
    t = np.asarray(thresholds, dtype=np.float64)
    prevalence = y.mean(axis=-1)[..., None]
    return prevalence - (1.0 - prevalence) * t / (1.0 - t)


def decision_curve(p, y, referred=None, *, thresholds: Sequence[float] = DCA_THRESHOLDS,
                   table_thresholds: Sequence[float] = DCA_TABLE_THRESHOLDS, n_bootstrap: int = 1000,
                   alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Net benefit of the model, treat-all and treat-none per threshold, and what referral does to it.

    With ``referred`` (a boolean mask of the cases the referral rule hands to a clinician):
    "referral_treated" lets the model decide the kept cases and treats every referred one
    (the cautious default of a clinician who reviews them), "referral_perfect_review" decides
    the referred ones correctly (the most a review can add); "kept" holds the model, treat-all
    and treat-none among the kept cases only, per kept case. "table": at table_thresholds, the
    model's net benefit and its gain over the better of treat-all and treat-none, with
    percentile bootstrap intervals.
    """
    p, y = metrics.as_pair(p, y)
    t = np.asarray(thresholds, dtype=np.float64)
    out: dict[str, Any] = {
        "thresholds": t.tolist(), "n": int(y.size), "prevalence": float(y.mean()),
        "model": net_benefit(p, y, t).tolist(), "treat_all": treat_all_net_benefit(y, t).tolist(),
        "treat_none": [0.0] * t.size,
        "method": "net benefit = TP/n - FP/n * pt / (1 - pt), treat when p >= pt",
    }
    if referred is not None:
        referred = np.asarray(referred, dtype=bool)
        if referred.shape != y.shape:
            raise ValueError(f"referred has shape {referred.shape}, expected {y.shape}")
        by_model = p[None, :] >= t[:, None]
        out["referred_fraction"] = float(referred.mean())
        out["referral_treated"] = net_benefit(p, y, t, treat=by_model | referred).tolist()
        out["referral_perfect_review"] = net_benefit(
            p, y, t, treat=np.where(referred, y == 1, by_model)).tolist()
        kept = ~referred
        if kept.any():
            out["kept"] = {"n": int(kept.sum()), "prevalence": float(y[kept].mean()),
                           "model": net_benefit(p[kept], y[kept], t).tolist(),
                           "treat_all": treat_all_net_benefit(y[kept], t).tolist()}
    tt = np.asarray(table_thresholds, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, y.size, size=(n_bootstrap, y.size))
    boot_model = net_benefit(p[idx], y[idx], tt)  # [B, T]
    boot_gain = boot_model - np.maximum(treat_all_net_benefit(y[idx], tt), 0.0)
    model_nb = net_benefit(p, y, tt)
    gain = model_nb - np.maximum(treat_all_net_benefit(y, tt), 0.0)
    out["table"] = [
        {"threshold": float(tt[j]),
         "model": {"estimate": float(model_nb[j]), **_interval(boot_model[:, j], model_nb[j], alpha)},
         "gain_over_default": {"estimate": float(gain[j]), **_interval(boot_gain[:, j], gain[j], alpha)}}
        for j in range(tt.size)]
    return out


def useful_ranges(curve: Mapping[str, Any]) -> list[list[float]]:
    """Runs of the decision curve's thresholds (probabilities) where the model's net benefit is above both
    treat-all and treat-none, as [first, last] pairs; point estimates (the table holds the intervals)."""
    t = np.asarray(curve["thresholds"])
    better = np.asarray(curve["model"]) > np.maximum(np.asarray(curve["treat_all"]), 0.0)
    runs: list[list[float]] = []
    for j in np.flatnonzero(better):
        if runs and runs[-1][1] == float(t[j - 1]):
            runs[-1][1] = float(t[j])
        else:
            runs.append([float(t[j]), float(t[j])])
    return runs


def _interval(replicates, estimate: float, alpha: float, method: str = "percentile",
              bounds: tuple[float, float] = (-np.inf, np.inf)) -> dict[str, float]:
    """metrics.bootstrap_interval's lower / upper / n_valid (the interval rule the whole report uses)."""
    interval = metrics.bootstrap_interval(replicates, float(estimate), alpha, method, bounds)
    return {"lower": interval["lower"], "upper": interval["upper"], "n_valid": interval["n_valid"]}


# --------------------------------------------------------------------------- selective prediction


def _tie_bounds(sorted_scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """First and last position of each element's run of equal values along the last axis."""
    n = sorted_scores.shape[-1]
    pos = np.broadcast_to(np.arange(n), sorted_scores.shape)
    differs = sorted_scores[..., 1:] != sorted_scores[..., :-1]
    edge = np.ones(sorted_scores.shape[:-1] + (1,), dtype=bool)
    first = np.maximum.accumulate(np.where(np.concatenate([edge, differs], -1), pos, 0), axis=-1)
    last = np.flip(np.minimum.accumulate(np.flip(np.where(np.concatenate([differs, edge], -1), pos, n - 1), -1),
                                         axis=-1), -1)
    return first, last


def kept_loss(loss, score) -> np.ndarray:
    """Expected summed loss of the k lowest-score cases, k = 1..N, shape [..., N].

    Cases are kept in order of increasing score (the referral rule refers the highest first).
    Within a run of tied scores the order is undefined, so each count k inside a tie run gets
    the expectation over its orders: the run's loss spread evenly over its cases. A constant
    score (mutual information of one deterministic model) therefore ranks like random referral.
    """
    loss = np.asarray(loss, dtype=np.float64)
    score = np.asarray(score, dtype=np.float64)
    order = np.argsort(score, axis=-1, kind="stable")
    s = np.take_along_axis(score, order, -1)
    cum = np.cumsum(np.take_along_axis(loss, order, -1), axis=-1)
    first, last = _tie_bounds(s)
    before = np.where(first > 0, np.take_along_axis(cum, np.maximum(first - 1, 0), -1), 0.0)
    run = np.take_along_axis(cum, last, -1) - before
    pos = np.arange(loss.shape[-1])
    return before + (pos - first + 1) * run / (last - first + 1)


def selective_numbers(loss, score, target_coverage: float = TARGET_COVERAGE,
                      target_risk: float = TARGET_RISK) -> dict[str, np.ndarray]:
    """AURC, AUGRC, risk at target_coverage, coverage at target_risk and full-coverage risk, shape [...] each.

    With k kept cases (coverage k/N) the selective risk is kept_loss_k / k and the generalised
    risk kept_loss_k / N (the loss the kept cases cause, per case of the population).
    AURC = mean_k selective risk; AUGRC = mean_k generalised risk (Traub et al. 2024): both
    lower is better, and AURC over-weights the first few kept cases where AUGRC does not.
    Coverage at risk: the largest k / N whose selective risk is <= target_risk (0 if none).
    """
    cum = kept_loss(loss, score)
    n = cum.shape[-1]
    k = np.arange(1, n + 1)
    risk = cum / k
    at = max(1, min(n, math.ceil(target_coverage * n - 1e-9)))
    ok = risk <= target_risk + 1e-12
    best = np.where(ok.any(axis=-1), n - np.argmax(ok[..., ::-1], axis=-1), 0)
    return {"aurc": risk.mean(axis=-1), "augrc": (cum / n).mean(axis=-1), "risk_at_coverage": risk[..., at - 1],
            "coverage_at_risk": best / n, "full_coverage_risk": risk[..., -1]}


def error_loss(p, y, threshold: float = 0.5) -> np.ndarray:
    """0/1 loss of the decision p > threshold (metrics.accuracy's rule), shape of p."""
    return ((np.asarray(p) > threshold) != (np.asarray(y) == 1)).astype(np.float64)


def selective_summary(p, y, scores: Mapping[str, np.ndarray], *, target_coverage: float = TARGET_COVERAGE,
                      target_risk: float = TARGET_RISK, n_bootstrap: int = 1000, alpha: float = 0.05,
                      seed: int = 0) -> dict[str, Any]:
    """selective_numbers per referral score (risk = 0/1 error at p > 0.5), each with a percentile bootstrap interval."""
    p, y = metrics.as_pair(p, y)
    loss = error_loss(p, y)
    idx = np.random.default_rng(seed).integers(0, y.size, size=(n_bootstrap, y.size))
    out: dict[str, Any] = {"loss": "0/1 error of p > 0.5", "target_coverage": target_coverage,
                           "target_risk": target_risk, "n": int(y.size), "scores": {}}
    # The curve at CURVE_POINTS coverages, for the figure (the numbers use every coverage k / N).
    at = np.unique(np.clip(np.ceil(np.linspace(0.02, 1.0, CURVE_POINTS) * y.size - 1e-9).astype(int), 1, y.size))
    out["curve"] = {"coverage": (at / y.size).tolist(), "risk": {}}
    for name, score in scores.items():
        score = np.asarray(score, dtype=np.float64)
        out["curve"]["risk"][name] = (kept_loss(loss, score)[at - 1] / at).tolist()
        full = selective_numbers(loss, score, target_coverage, target_risk)
        boot = selective_numbers(loss[idx], score[idx], target_coverage, target_risk)
        out["scores"][name] = {key: {"estimate": float(full[key]), **_interval(boot[key], full[key], alpha)}
                               for key in full}
    return out


def paired_selective(loss_a, score_a: Mapping[str, np.ndarray], loss_b, score_b: Mapping[str, np.ndarray], *,
                     target_coverage: float = TARGET_COVERAGE, target_risk: float = TARGET_RISK,
                     n_bootstrap: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """B - A of selective_numbers per score both hold, on shared resamples of the same cases."""
    loss_a, loss_b = np.asarray(loss_a, np.float64), np.asarray(loss_b, np.float64)
    idx = np.random.default_rng(seed).integers(0, loss_a.size, size=(n_bootstrap, loss_a.size))
    out = {}
    for name in [s for s in score_a if s in score_b]:
        sa, sb = np.asarray(score_a[name], np.float64), np.asarray(score_b[name], np.float64)
        fa = selective_numbers(loss_a, sa, target_coverage, target_risk)
        fb = selective_numbers(loss_b, sb, target_coverage, target_risk)
        ba = selective_numbers(loss_a[idx], sa[idx], target_coverage, target_risk)
        bb = selective_numbers(loss_b[idx], sb[idx], target_coverage, target_risk)
        out[name] = {key: {"a": float(fa[key]), "b": float(fb[key]), "difference": float(fb[key] - fa[key]),
                           **_interval(bb[key] - ba[key], fb[key] - fa[key], alpha)} for key in fa}
    return out


# --------------------------------------------------------------------------- subgroups


def age_band(age_years) -> np.ndarray:
    """AGE_BANDS label of each age (years)."""
    age = np.asarray(age_years, dtype=np.float64)
    out = np.full(age.shape, "unknown", dtype=object)
    for label, lo, hi in AGE_BANDS:
        out[(age >= lo) & (age < hi)] = label
    return out


def ethnicity_group(ethnicity: str) -> str:
    """The ETHNICITY_GROUPS group of an ADMISSIONS.ETHNICITY spelling ("OTHER" when no rule matches)."""
    text = str(ethnicity).strip().upper()
    for group, prefixes in ETHNICITY_GROUPS:
        if text.startswith(prefixes):
            return group
    return "OTHER"


def subgroup_labels(attributes: Mapping[str, Sequence]) -> dict[str, np.ndarray]:
    """Case attributes (gender, age_years, admission_type, ethnicity, insurance) -> SUBGROUP_ATTRIBUTES labels."""
    out = {}
    if "gender" in attributes:
        out["sex"] = np.array([{"M": "male", "F": "female"}.get(str(g), "unknown") for g in attributes["gender"]],
                              dtype=object)
    if "age_years" in attributes:
        out["age_band"] = age_band(attributes["age_years"])
    if "admission_type" in attributes:
        out["admission_type"] = np.array([str(a) for a in attributes["admission_type"]], dtype=object)
    if "ethnicity" in attributes:
        out["ethnicity"] = np.array([ethnicity_group(e) for e in attributes["ethnicity"]], dtype=object)
    if "insurance" in attributes:
        out["insurance"] = np.array([str(i) for i in attributes["insurance"]], dtype=object)
    return out


def _group_metrics(p, y, truth, num_bins: int) -> dict[str, np.ndarray]:
    """SUBGROUP_METRICS (and mae_truth with a truth) of p against y with leading batch axes."""
    out = {"auc_roc": metrics.auc_roc(p, y), "auc_pr": metrics.auc_pr(p, y), "nll": metrics.nll(p, y),
           "ece": metrics.ece(p, y, num_bins), "brier": metrics.brier(p, y), "accuracy": metrics.accuracy(p, y),
           "mean_p": p.mean(axis=-1), "observed_rate": y.mean(axis=-1)}
    out["observed_minus_expected"] = out["observed_rate"] - out["mean_p"]
    out["abs_observed_minus_expected"] = np.abs(out["observed_minus_expected"])
    if truth is not None:
        out["mae_truth"] = np.mean(np.abs(p - truth), axis=-1)
        out["logit_error_truth"] = np.mean(np.abs(logit(p) - logit(truth)), axis=-1)
    return {k: np.asarray(v, dtype=np.float64) for k, v in out.items()}


def _resampled_metrics(p, y, truth, rows: np.ndarray, n_bootstrap: int, rng: np.random.Generator,
                       num_bins: int) -> dict[str, np.ndarray]:
    """_group_metrics on n_bootstrap resamples of the cases `rows`, [n_bootstrap] per metric."""
    idx = rows[rng.integers(0, rows.size, size=(n_bootstrap, rows.size))]
    return _group_metrics(p[idx], y[idx], None if truth is None else truth[idx], num_bins)


def subgroup_report(p, y, labels: Mapping[str, np.ndarray], truth=None, *, n_bootstrap: int = 1000,
                    alpha: float = 0.05, seed: int = 0, num_bins: int = metrics.NUM_BINS,
                    max_gaps: int = 5) -> dict[str, Any]:
    """Per attribute and group: every metric with a bootstrap interval, and each group's gap to the rest.

    Per group: n, events, each of SUBGROUP_METRICS (and TRUTH_METRICS with a truth) as
    estimate / lower / upper (percentile; "basic" for ECE, as in metrics_report.evaluate),
    and for GAP_METRICS the gap group minus rest with its interval (group and rest resampled
    independently). "gaps": the GAP_METRICS gaps where the group is served worse by more than
    z_named bootstrap standard errors, z_named the normal quantile at alpha / 2 Bonferroni-
    adjusted for the number of comparisons, largest z first (at most max_gaps); groups under
    MIN_GAP_CASES cases, or under MIN_GAP_EVENTS deaths or survivors (except for the error against
    the truth, which does not depend on the labels) are not ranked.
    "largest": per gap metric, the worst group's gap whatever its interval.
    """
    p, y = metrics.as_pair(p, y)
    truth = None if truth is None else against_truth.as_truth(truth, y.size)
    rng = np.random.default_rng(seed)
    gap_metrics = [m for m in GAP_METRICS if m not in TRUTH_METRICS or truth is not None]
    attributes: dict[str, Any] = {}
    candidates = []
    for attribute, values in labels.items():
        values = np.asarray(values, dtype=object)
        if values.shape != y.shape:
            raise ValueError(f"subgroup {attribute!r} has shape {values.shape}, expected {y.shape}")
        groups = {}
        for group in sorted(set(values.tolist()), key=str):
            rows = np.flatnonzero(values == group)
            rest = np.flatnonzero(values != group)
            est = _group_metrics(p[rows], y[rows], None if truth is None else truth[rows], num_bins)
            boot = _resampled_metrics(p, y, truth, rows, n_bootstrap, rng, num_bins)
            events = int(y[rows].sum())
            row: dict[str, Any] = {"n": int(rows.size), "events": events}
            for name in [*SUBGROUP_METRICS, *(TRUTH_METRICS if truth is not None else ())]:
                method, bounds = metrics.BOOTSTRAP_METHODS.get(name, ("percentile", (-np.inf, np.inf)))
                row[name] = {"estimate": float(est[name]), **_interval(boot[name], est[name], alpha, method, bounds)}
            if rest.size:
                rest_est = _group_metrics(p[rest], y[rest], None if truth is None else truth[rest], num_bins)
                rest_boot = _resampled_metrics(p, y, truth, rest, n_bootstrap, rng, num_bins)
                row["gap_to_rest"] = {}
                for name in gap_metrics:
                    gap = float(est[name] - rest_est[name])
                    replicates = boot[name] - rest_boot[name]
                    row["gap_to_rest"][name] = {"estimate": gap, "rest": float(rest_est[name]),
                                                **_interval(replicates, gap, alpha)}
                    finite = replicates[np.isfinite(replicates)]
                    # A group with a handful of deaths has a degenerate bootstrap for the metrics
                    # that depend on the labels: no resample shows the variation it would have.
                    rankable = rows.size >= MIN_GAP_CASES and (name in TRUTH_METRICS or min(
                        events, rows.size - events) >= MIN_GAP_EVENTS)
                    if rankable and np.isfinite(gap) and finite.size > 1:
                        candidates.append({"attribute": attribute, "group": str(group), "metric": name,
                                           "worse": GAP_METRICS[name] * gap, "se": float(finite.std()),
                                           **row["gap_to_rest"][name], "group_value": float(est[name]),
                                           "n": int(rows.size)})
            groups[str(group)] = row
        attributes[attribute] = groups
    # Every group is tested against the rest on every gap metric: dozens of tests, so a gap is
    # named only past the Bonferroni-adjusted normal quantile (z > 3.2 for 40 of them at 5 %).
    from scipy.stats import norm

    z_named = float(norm.ppf(1.0 - alpha / (2.0 * max(len(candidates), 1))))
    gaps, largest = [], {}
    for c in candidates:
        c["z"] = c["worse"] / max(c["se"], 1e-12)
        if c["z"] > z_named:
            gaps.append(c)
        if c["worse"] > 0 and c["worse"] > largest.get(c["metric"], {}).get("worse", 0.0):
            largest[c["metric"]] = c
    gaps.sort(key=lambda c: c["z"], reverse=True)
    return {"attributes": attributes, "gaps": gaps[:max_gaps], "largest": largest, "gap_metrics": gap_metrics,
            "comparisons": len(candidates), "z_named": z_named, "min_gap_cases": MIN_GAP_CASES,
            "n_bootstrap": n_bootstrap}


# --------------------------------------------------------------------------- one report


def clinical_report(p, y, scores: Mapping[str, np.ndarray], *, referred=None,
                    attributes: Mapping[str, Sequence] | None = None, truth=None, n_bootstrap: int = 1000,
                    alpha: float = 0.05, seed: int = 0, num_bins: int = metrics.NUM_BINS,
                    target_coverage: float = TARGET_COVERAGE, target_risk: float = TARGET_RISK,
                    operating: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Calibration, decision curve, selective numbers and subgroups of one set of predictions (JSON-ready).

    ``scores``: referral scores per case (the uncertainty measures); "risk" (p itself) is added.
    ``operating``: small_sample.choose_threshold's record (None: the default 0.5, given); its threshold is
    the first row of the threshold table, and the record goes into the report as "operating_threshold".
    """
    p, y = metrics.as_pair(p, y)
    all_scores = {**{k: np.asarray(v, np.float64) for k, v in scores.items()}, RISK_SCORE: p}
    report: dict[str, Any] = {
        "calibration": {**calibration_fit(p, y, alpha),
                        "smoothed": smoothed_calibration(p, y, n_bootstrap=n_bootstrap, alpha=alpha, seed=seed),
                        "binned": binned_calibration(p, y, alpha=alpha)},
        "decision_curve": decision_curve(p, y, referred, n_bootstrap=n_bootstrap, alpha=alpha, seed=seed),
        "selective": selective_summary(p, y, all_scores, target_coverage=target_coverage, target_risk=target_risk,
                                       n_bootstrap=n_bootstrap, alpha=alpha, seed=seed),
    }
    operating = dict(operating or small_sample.choose_threshold(small_sample.parse_rule(
        small_sample.DEFAULT_THRESHOLD)))
    # The operating threshold first, then the decision curve's tabulated thresholds.
    report["small_sample"] = small_sample.small_sample_report(p, y, (operating["threshold"], *DCA_TABLE_THRESHOLDS),
                                                                alpha)
    report["operating_threshold"] = operating
    # The decision facts the summary states: O/E with its interval, where the model beats both defaults.
    report["decision"] = {"observed_expected": small_sample.observed_expected(int(y.sum()), float(p.sum()),
                                                                              int(y.size), alpha),
                          "useful_ranges": useful_ranges(report["decision_curve"]),
                          "curve_range": [float(DCA_THRESHOLDS[0]), float(DCA_THRESHOLDS[-1])]}
    if attributes:
        report["subgroups"] = subgroup_report(p, y, subgroup_labels(attributes), truth, n_bootstrap=n_bootstrap,
                                              alpha=alpha, seed=seed, num_bins=num_bins)
        small_sample.subgroup_power(report["subgroups"], float(metrics.auc_roc(p, y)), int(y.sum()), int(y.size),
                                    alpha)
    return json_ready(report)



# --------------------------------------------------------------------------- who the model was built on


def _share(labels: np.ndarray) -> dict[str, float]:
    """Fraction of cases per label, most frequent first."""
    values, counts = np.unique(np.asarray(labels, dtype=object).astype(str), return_counts=True)
    order = np.argsort(-counts, kind="stable")
    return {str(values[i]): float(counts[i] / labels.size) for i in order}


def split_characteristics(labels, attributes: Mapping[str, np.ndarray], trigger_time, num_bags,
                          sources_present: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """One split's cases described as a paper's Table 1: size, outcome, period, demographics, missingness per source."""
    import datetime as dt

    y = np.asarray(labels, dtype=np.float64)
    n = int(y.size)
    if n == 0:
        return {"n": 0}
    t = np.asarray(trigger_time, dtype=np.int64)
    day = lambda s: dt.datetime.fromtimestamp(int(s), dt.timezone.utc).date().isoformat()  # noqa: E731
    age = np.asarray(attributes["age_years"], dtype=np.float64)
    groups = subgroup_labels(attributes)
    return {
        "n": n, "events": int(y.sum()), "outcome_rate": float(y.mean()),
        "period": {"first_prediction": day(t.min()), "last_prediction": day(t.max())},
        "age_years": {"median": float(np.median(age)), "q1": float(np.quantile(age, 0.25)),
                      "q3": float(np.quantile(age, 0.75))},
        **{attribute: _share(groups[attribute]) for attribute in ("sex", "admission_type", "ethnicity", "insurance")
           if attribute in groups},
        "bags": {"median": float(np.median(num_bags)), "none": float(np.mean(np.asarray(num_bags) == 0))},
        # Missing = no event of the source before the prediction time.
        "missing_source": {s: float(1.0 - np.mean(v)) for s, v in sources_present.items()},
    }


def population_profile(manifest: Mapping[str, Any], splits: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Who the model was built on: cohort and exclusions, event counts (the data manifest), each split's characteristics."""
    cohort = manifest.get("cohort") or {}
    counts = dict(cohort.get("counts") or {})
    tables = {}
    for name, t in (manifest.get("tables") or {}).items():
        row = {"rows_read": t.get("rows_read"), "dead_lettered": sum((t.get("dead_lettered") or {}).values())}
        if t.get("cohort_filter"):
            row["events_used"] = t["cohort_filter"].get("used", 0)
        tables[name] = row
    config = manifest.get("config") or {}
    return {
        "cohort": {"admissions": cohort.get("admissions"), "kept": counts.pop("kept", None),
                   "excluded": {k: v for k, v in counts.items() if v}},
        "tables": tables,
        "bagging": dict(manifest.get("bagging") or {}),
        "settings": {k: config.get(k) for k in ("trigger_offset_seconds", "min_age_years", "sources", "splits")
                     if k in config},
        "splits": {name: dict(s) for name, s in splits.items()},
    }
