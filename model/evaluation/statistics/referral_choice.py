"""Which uncertainty should decide referral, judged by a loss a clinician would recognise, on validation.

The report's risk-coverage numbers (clinical_stats.selective_summary) score the kept cases by the 0/1
error of p > 0.5: at a 15 % death rate hardly any case passes 0.5 and nobody treats at that
threshold, so that error mostly counts deaths. Here the loss of a kept case is its Brier score
(p - y)^2, which rewards a probability that is right at every threshold the decision curve uses.
A measure is compared by the AURC of that loss (mean Brier score of the kept cases over all
coverages, lower is better) and its Brier score at the target coverage.

A measure that is constant over the cases (mutual information of one deterministic network, 0 for
every case) cannot order them: it is reported as absent, never as a winner or a loser. ``choose``
picks the measure the export's referral rule uses when its config says "auto", on the validation
split, and the export records the comparison (metrics.json "referral"."chosen_on_validation").
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from scipy.stats import rankdata

from model.evaluation.statistics import clinical_stats, metrics

LOSS = "Brier score of the kept cases"
# Scores whose spread is below this are constant for referral (float noise of a deterministic model).
CONSTANT_SPREAD = 1e-12


def is_constant(score) -> bool:
    """True when a referral score cannot order the cases (its spread is float noise)."""
    score = np.asarray(score, dtype=np.float64)
    return bool(score.size == 0 or np.ptp(score) <= CONSTANT_SPREAD)


def brier_selective(p, y, scores: Mapping[str, np.ndarray], *,
                    target_coverage: float = clinical_stats.TARGET_COVERAGE, n_bootstrap: int = 1000,
                    alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """Per referral score: AURC and Brier at target_coverage of the kept cases (percentile CIs); constant: absent."""
    p, y = metrics.as_pair(p, y)
    loss = (p - y) ** 2
    idx = np.random.default_rng(seed).integers(0, y.size, size=(n_bootstrap, y.size))
    out: dict[str, Any] = {"loss": LOSS, "target_coverage": target_coverage, "scores": {}, "absent": []}
    for name, score in scores.items():
        score = np.asarray(score, dtype=np.float64)
        if is_constant(score):
            out["absent"].append(name)
            continue
        full = clinical_stats.selective_numbers(loss, score, target_coverage)
        boot = clinical_stats.selective_numbers(loss[idx], score[idx], target_coverage)
        cells = {}
        for key in ("aurc", "risk_at_coverage", "full_coverage_risk"):
            interval = metrics.bootstrap_interval(boot[key], float(full[key]), alpha, "percentile",
                                                  (-np.inf, np.inf))
            cells[key] = {"estimate": float(full[key]), "lower": interval["lower"], "upper": interval["upper"]}
        out["scores"][name] = cells
    ranked = sorted(out["scores"], key=lambda s: out["scores"][s]["aurc"]["estimate"])
    out["best"] = ranked[0] if ranked else None
    out["same_ranking"] = same_rankings({k: v for k, v in scores.items() if k in out["scores"]})
    return out


def same_rankings(scores: Mapping[str, np.ndarray]) -> list[list[str]]:
    """Pairs of scores that order the cases identically (Spearman correlation 1, ties alike), so referring by one
    refers the same cases as the other: with every p below 0.5 the predictive entropy is the risk ranking."""
    ranks = {name: rankdata(np.asarray(score, dtype=np.float64)) for name, score in scores.items()}
    names = list(ranks)
    return [[a, b] for i, a in enumerate(names) for b in names[i + 1:] if np.array_equal(ranks[a], ranks[b])]


def choose(probs, labels) -> dict[str, Any]:
    """The uncertainty measure (UNCERTAINTY_MEASURES) whose referral keeps the lowest Brier AURC on these cases."""
    p = metrics.predictive_mean(probs)
    y = np.asarray(labels, dtype=np.float64)
    loss = (p - y) ** 2
    aurc, absent = {}, []
    for name, score in metrics.uncertainties(probs).items():
        if is_constant(score):
            absent.append(name)
        else:
            aurc[name] = float(clinical_stats.selective_numbers(loss, np.asarray(score, np.float64))["aurc"])
    if not aurc:  # every measure constant: entropy still follows p, so it orders the cases like p does
        return {"measure": "predictive_entropy", "loss": LOSS, "aurc": {}, "absent": absent, "n": int(y.size)}
    best = min(aurc, key=aurc.get)
    return {"measure": best, "loss": LOSS, "aurc": aurc, "absent": absent, "n": int(y.size)}
