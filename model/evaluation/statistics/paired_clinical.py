"""B - A of the clinical headline numbers on the same cases: calibration slope, calibration-in-the-large, net benefit.

metrics_report.paired_bootstrap pairs the ML metrics (AUROC, Brier, ...); a reviewer comparing two models
also asks whether B is better calibrated and more useful at the thresholds a clinician acts on. Each
resample draws the same cases for both models, so the interval of the difference holds the
correlation between them. A resample whose labels hold one class has no calibration fit and is dropped
(metrics.bootstrap_interval counts the valid ones).

Also: which referral scores a model lacks. A score constant over the cases (mutual information of a
deterministic network) cannot order them; comparing its AURC with a varying one would credit the other
model's uncertainty for an ordering this one never had, so the comparison marks it absent.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from model.evaluation.statistics import clinical_stats, metrics, referral_choice


def _cell(a: float, b: float, replicates: np.ndarray, alpha: float) -> dict[str, Any]:
    interval = metrics.bootstrap_interval(replicates, float(b - a), alpha, "percentile", (-np.inf, np.inf))
    return {"a": float(a), "b": float(b), "difference": float(b - a), "lower": interval["lower"],
            "upper": interval["upper"], "n_valid": interval["n_valid"]}


def paired_calibration_and_benefit(p_a, p_b, y, *, thresholds: Sequence[float] = clinical_stats.DCA_TABLE_THRESHOLDS,
                                   n_bootstrap: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """B - A of calibration slope, calibration-in-the-large and net benefit per threshold, paired percentile CIs."""
    p_a, y = metrics.as_pair(p_a, y)
    p_b = np.asarray(p_b, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, y.size, size=(n_bootstrap, y.size))
    fit_a, fit_b = clinical_stats.calibration_fit(p_a, y, alpha), clinical_stats.calibration_fit(p_b, y, alpha)
    (int_a, slope_a), (int_b, slope_b) = (clinical_stats.calibration_estimates(p[idx], y[idx]) for p in (p_a, p_b))
    reps = {"slope": slope_b - slope_a, "intercept": int_b - int_a}
    out = {key: _cell(fit_a[key]["estimate"], fit_b[key]["estimate"], reps[key], alpha) for key in reps}
    nb_a, nb_b = clinical_stats.net_benefit(p_a, y, thresholds), clinical_stats.net_benefit(p_b, y, thresholds)
    boot = clinical_stats.net_benefit(p_b[idx], y[idx], thresholds) - clinical_stats.net_benefit(p_a[idx], y[idx],
                                                                                                   thresholds)
    out["net_benefit"] = {f"{t:g}": _cell(nb_a[i], nb_b[i], boot[:, i], alpha) for i, t in enumerate(thresholds)}
    return out


def absent_scores(scores_a: Mapping[str, np.ndarray], scores_b: Mapping[str, np.ndarray]) -> dict[str, list[str]]:
    """Per referral score, the models ('A', 'B') in which it is constant over the cases, or lacking."""
    out = {}
    for name in sorted(set(scores_a) | set(scores_b)):
        lacking = [side for side, scores in (("A", scores_a), ("B", scores_b))
                   if name not in scores or referral_choice.is_constant(scores[name])]
        if lacking:
            out[name] = lacking
    return out
