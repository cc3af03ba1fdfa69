"""metrics.json: every number of one prediction matrix (``evaluate``) or of two models on the
same cases (``paired_bootstrap``), as plain JSON-ready values.

The numbers come from the statistics beside it (``metrics``, ``against_truth``); this module only assembles
them, so the report, the CLI tables (model.evaluation.report.formatting) and report.html agree.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from model.export_layout import UNCERTAINTY_MEASURES, json_ready
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

