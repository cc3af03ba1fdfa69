"""metrics.json: every number of one prediction matrix (``evaluate``) or of two models on the
same cases (``paired_bootstrap``), as plain JSON-ready values; and the performance a prediction
matrix expects before its labels arrive (``estimate_performance``, below).

The numbers come from the statistics beside it (``metrics``, ``against_truth``, ``clinical_stats``);
this module assembles them, so the report, the CLI tables (model.evaluation.report.formatting) and
report.html agree. The expected performance scores outcomes it draws with those same functions.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from model.export_layout import DECISION_THRESHOLD, UNCERTAINTY_MEASURES, json_ready
from model.evaluation.statistics import clinical_stats, metrics
from model.evaluation.statistics.against_truth import as_truth, truth_report
from model.evaluation.statistics.metrics import (BOOTSTRAP_METHODS, NUM_BINS, REFERRAL_RATES, SCALAR_METRICS,
                                      accuracy, as_labels, as_matrix, as_pair, auc_pr,
                                      auc_roc, bootstrap_ci, bootstrap_interval, brier, ece, expected_entropy,
                                      member_disagreement, member_means, nll, per_component_nll,
                                      scalar_metrics, selective_prediction, uncertainties)


def evaluate(
    probs,
    y,
    K: int,
    S: int,
    truth=None,
    *,
    num_bins: int = NUM_BINS,
    n_bootstrap: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    referral_rates: Sequence[float] = REFERRAL_RATES,
) -> dict:
    """Everything about one [N, M] prediction matrix as one JSON-serialisable dict (undefined -> None)."""
    probs = as_matrix(probs)
    y = as_labels(y)
    if y.shape != (probs.shape[0],):
        raise ValueError(f"y has shape {y.shape}, expected ({probs.shape[0]},)")
    means = member_means(probs, K, S)
    p = means.mean(axis=1)  # equals predictive_mean(probs): every member has S samples
    overall = scalar_metrics(p, y, num_bins)
    overall["per_component_nll"] = float(per_component_nll(probs, y))
    metric_fns = {
        "auc_pr": auc_pr,
        "auc_roc": auc_roc,
        "nll": nll,
        "ece": lambda q, t: ece(q, t, num_bins),
        "brier": brier,
        "accuracy": accuracy,
    }
    ci = {}
    for name in SCALAR_METRICS:
        method, bounds = BOOTSTRAP_METHODS.get(name, ("percentile", (-np.inf, np.inf)))
        ci[name] = bootstrap_ci(metric_fns[name], p, y, n=n_bootstrap, alpha=alpha, seed=seed, method=method,
                                bounds=bounds)
    measures = uncertainties(probs)
    report = {
        "n": int(y.size),
        "prevalence": float(y.mean()),
        "K": int(K),
        "S": int(S),
        "num_bins": int(num_bins),
        "ci_level": 1.0 - alpha,
        "overall": overall,
        "ci": ci,
        # A member's NLL is that of its own S-sample mixture, i.e. of its member mean.
        "members": [scalar_metrics(means[:, k], y, num_bins) for k in range(K)],
        "uncertainty": {
            "predictive_entropy": float(measures["predictive_entropy"].mean()),
            "expected_entropy": float(expected_entropy(probs).mean()),
            "mutual_information": float(measures["mutual_information"].mean()),
            "predictive_std": float(measures["predictive_std"].mean()),
            "member_disagreement": float(member_disagreement(probs, K, S).mean()),
        },
        "selective": {
            name: selective_prediction(p, y, measures[name], referral_rates, num_bins)
            for name in UNCERTAINTY_MEASURES
        },
    }
    if truth is not None:
        report["truth"] = truth_report(probs, y, truth, K, S, referral_rates=referral_rates, seed=seed)
    return json_ready(report)


# --------------------------------------------------------------------------- paired comparison

# Metrics of a paired comparison; "truth_mae" (mean |p - truth|) only when the truth is known.
PAIRED_METRICS: tuple[str, ...] = ("nll", "auc_pr", "auc_roc", "ece", "brier", "truth_mae")


def _paired_metrics(p, y, truth, num_bins: int) -> dict[str, np.ndarray]:
    """PAIRED_METRICS of p against (y, truth) with leading batch axes; truth None leaves truth_mae out."""
    out = {"nll": nll(p, y), "auc_pr": auc_pr(p, y), "auc_roc": auc_roc(p, y), "ece": ece(p, y, num_bins),
           "brier": brier(p, y)}
    if truth is not None:
        out["truth_mae"] = np.mean(np.abs(p - truth), axis=-1)
    return out


def paired_bootstrap(p_a, p_b, y, truth=None, *, n: int = 1000, alpha: float = 0.05, seed: int = 0,
                     num_bins: int = NUM_BINS) -> dict[str, dict[str, float]]:
    """Metric(b) - metric(a) on the same cases, with a bootstrap interval from shared resamples.

    Both models are scored on the same resampled cases, so the case-to-case variation they
    share cancels: the interval of the difference is much narrower than two separate
    intervals suggest. Percentile intervals, except "basic" for ECE (see bootstrap_interval).
    Per metric of PAIRED_METRICS: "a", "b", "difference" (b - a), "lower", "upper", "n_valid".
    """
    p_a, y = as_pair(p_a, y)
    p_b, _ = as_pair(p_b, y)
    if p_a.ndim != 1:
        raise ValueError("p_a, p_b and y must have shape [N]")
    truth = None if truth is None else as_truth(truth, y.size)
    full_a = _paired_metrics(p_a, y, truth, num_bins)
    full_b = _paired_metrics(p_b, y, truth, num_bins)
    idx = np.random.default_rng(seed).integers(0, y.size, size=(n, y.size))
    truth_idx = None if truth is None else truth[idx]
    boot_a = _paired_metrics(p_a[idx], y[idx], truth_idx, num_bins)
    boot_b = _paired_metrics(p_b[idx], y[idx], truth_idx, num_bins)
    out = {}
    for name in full_a:
        a, b = float(full_a[name]), float(full_b[name])
        method = "basic" if name == "ece" else "percentile"
        interval = bootstrap_interval(boot_b[name] - boot_a[name], b - a, alpha, method)
        out[name] = {"a": a, "b": b, "difference": b - a, "lower": interval["lower"], "upper": interval["upper"],
                     "n_valid": interval["n_valid"]}
    return out


# --------------------------------------------------------------------------- performance before labels
#
# Performance expected on a population before its outcomes arrive, and with what doubt.
#
# A model scores a new population (``probs``, ``[N, M]`` as in model.evaluation.statistics.metrics).
# Its outcomes come days or weeks later. If the model's probabilities were the truth, each outcome
# would be Bernoulli(p): so the metric the model can expect is E_y[metric(p, y)], y_n ~ Bernoulli(p_n),
# found here by drawing outcomes and scoring the predictive mean ``p`` against them (NannyML's CBPE
# does the same with one calibrated probability per case). The estimate adds the posterior: each
# replicate first draws one of the M sampled probability columns (a rank-1 sample of one member),
# then the outcomes from it, so the interval carries the model's own doubt about the risks as well
# as the outcome noise of a population of N. With M = 1, or identical columns, it is CBPE's answer.
#
# ``expected_performance(p, outcome_probs)`` is the general form: the metric of ``p`` when outcomes
# are drawn from ``outcome_probs`` ([N, M'] or [N]). The estimate is ``outcome_probs = probs``; a
# synthetic site's truth-expected metric is ``outcome_probs = truth``, the same function, so the
# bench's "estimated vs truth-expected" compares like with like.
#
# Metrics (each from the project's metrics modules, so a number means what it means elsewhere):
# AUROC, AUC-PR, Brier score (metrics), observed/expected deaths (calibration-in-the-large as a
# ratio: sum y / sum p, 1 when calibrated) and net benefit at the decision thresholds
# (clinical_stats.net_benefit). AUROC and AUC-PR are undefined on a draw with one class: such
# draws are left out of those two, and counted.
#
# Assumptions, stated where the numbers are shown (docs/shift.md): the model is calibrated on the
# new population (or its posterior covers the miscalibration), the relation between the inputs and
# death is the training site's (no concept shift), and the population has no region the model
# never saw. The estimate cannot see a violation of any of them: the outcomes (the alarm) can.

# The estimated metrics, in the order tables show them.
ESTIMATED_METRICS: tuple[str, ...] = ("auc_roc", "auc_pr", "brier", "observed_expected")
# Replicates (posterior column, outcomes) per estimate: the 5 % and 95 % quantiles of 1,000 draws
# move by about 0.3 standard errors between seeds, well inside the interval's own width.
DEFAULT_DRAWS = 1000
# The 90 % interval: the bench counts how often it covers the truth-expected value.
DEFAULT_LEVEL = 0.9
# Draws scored per batch: [chunk, N] float64 arrays stay near 80 MB at N = 50,000.
_CHUNK_CELLS = 10_000_000


def decision_thresholds(decision_threshold: float = DECISION_THRESHOLD) -> tuple[float, ...]:
    """The model's decision threshold and the decision-curve table's thresholds, sorted, without repeats."""
    return tuple(sorted({float(decision_threshold), *clinical_stats.DCA_TABLE_THRESHOLDS}))


def as_outcome_probs(outcome_probs, n: int) -> np.ndarray:
    """Probabilities that generate outcomes as [N, M'] (a [N] vector is one column), validated."""
    q = np.asarray(outcome_probs, dtype=np.float64)
    if q.ndim == 1:
        q = q[:, None]
    q = metrics.as_matrix(q)
    if q.shape[0] != n:
        raise ValueError(f"outcome probabilities have {q.shape[0]} rows, the predictions {n}")
    return q


def _scores(p: np.ndarray, y: np.ndarray, thresholds: np.ndarray) -> dict[str, np.ndarray]:
    """Every metric of p against a batch of outcome draws y [B, N], shape [B] ([B, T] for net benefit)."""
    pb = np.broadcast_to(p, y.shape)
    expected = p.sum()
    return {
        "auc_roc": np.asarray(metrics.auc_roc(pb, y), dtype=np.float64),
        "auc_pr": np.asarray(metrics.auc_pr(pb, y), dtype=np.float64),
        "brier": np.asarray(metrics.brier(pb, y), dtype=np.float64),
        "observed_expected": y.sum(axis=-1) / expected if expected > 0 else np.full(y.shape[0], np.nan),
        "net_benefit": clinical_stats.net_benefit(p, y, thresholds),
    }


def draw_metrics(p, outcome_probs, *, thresholds: Sequence[float] | None = None, n_draws: int = DEFAULT_DRAWS,
                 seed: int = 0) -> dict[str, np.ndarray]:
    """Each metric of p over n_draws replicates (a column of outcome_probs drawn, then y ~ Bernoulli of it).

    Returns arrays of shape [n_draws] ([n_draws, T] for "net_benefit"); NaN where a draw leaves a
    metric undefined. Deterministic for a seed: the draws do not depend on the chunking.
    """
    p = np.asarray(p, dtype=np.float64)
    if p.ndim != 1 or p.size == 0 or np.any((p < 0) | (p > 1)) or np.any(np.isnan(p)):
        raise ValueError(f"p must be a non-empty [N] vector of probabilities, got shape {p.shape}")
    q = as_outcome_probs(outcome_probs, p.size)
    if n_draws < 1:
        raise ValueError(f"n_draws must be at least 1, got {n_draws}")
    t = np.asarray(decision_thresholds() if thresholds is None else thresholds, dtype=np.float64)
    rng = np.random.default_rng(seed)
    columns = rng.integers(0, q.shape[1], size=n_draws)
    uniforms_per_chunk = max(1, _CHUNK_CELLS // p.size)
    parts: list[dict[str, np.ndarray]] = []
    for start in range(0, n_draws, uniforms_per_chunk):
        cols = columns[start:start + uniforms_per_chunk]
        # One uniform per (draw, case) from a single stream, so the result does not depend on the chunk size.
        y = (rng.random((cols.size, p.size)) < q[:, cols].T).astype(np.float64)
        parts.append(_scores(p, y, t))
    return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}


def _summary(values: np.ndarray, level: float) -> dict[str, Any]:
    """Mean and central `level` interval of one metric's draws, NaN draws left out and counted."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return {"estimate": None, "lower": None, "upper": None, "n_draws": 0}
    lower, upper = np.quantile(finite, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return {"estimate": float(finite.mean()), "lower": float(lower), "upper": float(upper),
            "n_draws": int(finite.size)}


def expected_performance(p, outcome_probs, *, thresholds: Sequence[float] | None = None,
                         n_draws: int = DEFAULT_DRAWS, level: float = DEFAULT_LEVEL, seed: int = 0) -> dict[str, Any]:
    """The metrics of p expected when outcomes come from outcome_probs, each with its central `level` interval.

    "metrics": {name: {estimate, lower, upper, n_draws}} for ESTIMATED_METRICS; "net_benefit":
    one such row per threshold, with "threshold". The estimate is the mean over draws (for
    AUROC and AUC-PR: over draws with both classes, i.e. given that the metric exists).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"interval level must lie in (0, 1), got {level}")
    t = decision_thresholds() if thresholds is None else tuple(float(v) for v in thresholds)
    draws = draw_metrics(p, outcome_probs, thresholds=t, n_draws=n_draws, seed=seed)
    p = np.asarray(p, dtype=np.float64)
    return {
        "n": int(p.size),
        "columns": int(as_outcome_probs(outcome_probs, p.size).shape[1]),
        "expected_deaths": float(p.sum()),
        "level": level, "n_draws": n_draws, "seed": seed,
        "metrics": {name: _summary(draws[name], level) for name in ESTIMATED_METRICS},
        "net_benefit": [{"threshold": t[j], **_summary(draws["net_benefit"][:, j], level)} for j in range(len(t))],
    }


def estimate_performance(probs, *, thresholds: Sequence[float] | None = None, n_draws: int = DEFAULT_DRAWS,
                         level: float = DEFAULT_LEVEL, seed: int = 0) -> dict[str, Any]:
    """The performance a model expects on a population it scored, probs [N, M]: with and without its posterior.

    "posterior" draws outcomes from the M sampled columns (the model's doubt and the population's
    size); "mean_only" from the predictive mean alone (CBPE's answer: outcome noise only). Both
    score the predictive mean, as every realized metric of the project does.
    """
    probs = metrics.as_matrix(probs)
    p = probs.mean(axis=1)
    kwargs = {"thresholds": thresholds, "n_draws": n_draws, "level": level, "seed": seed}
    return {"posterior": expected_performance(p, probs, **kwargs),
            "mean_only": expected_performance(p, p, **kwargs),
            "method": "metric of the predictive mean against outcomes drawn as Bernoulli(a sampled column of the "
                      "model's probabilities) (posterior) or Bernoulli(the predictive mean) (mean_only); estimate = "
                      "mean over draws, interval = central quantiles"}


def realized_beside(estimate: dict[str, Any], p, y) -> dict[str, Any]:
    """The realized metrics of p on labels y, keyed like an estimate's, with whether each lies in its interval."""
    p, y = metrics.as_pair(p, y)
    expected = float(p.sum())
    realized = {"auc_roc": float(metrics.auc_roc(p, y)), "auc_pr": float(metrics.auc_pr(p, y)),
                "brier": float(metrics.brier(p, y)),
                "observed_expected": float(y.sum() / expected) if expected > 0 else float("nan")}
    thresholds = [row["threshold"] for row in estimate["net_benefit"]]
    nb = clinical_stats.net_benefit(p, y, thresholds)
    out: dict[str, Any] = {"metrics": {}, "net_benefit": []}
    for name, value in realized.items():
        row = estimate["metrics"][name]
        out["metrics"][name] = {"value": None if np.isnan(value) else value,
                                "inside": _inside(value, row)}
    for j, row in enumerate(estimate["net_benefit"]):
        out["net_benefit"].append({"threshold": row["threshold"], "value": float(nb[j]),
                                   "inside": _inside(float(nb[j]), row)})
    return out


def _inside(value: float, row: dict[str, Any]) -> bool | None:
    if np.isnan(value) or row["lower"] is None:
        return None
    return bool(row["lower"] <= value <= row["upper"])
