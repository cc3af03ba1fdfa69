"""The curves the report draws beside its numbers: the ROC curve and the distribution of predicted risk.

Stored in metrics.json (``clinical.curves``) so the page draws them without recomputing anything.
The ROC curve is scikit-learn's (every threshold, ties as one step), thinned to at most
``MAX_ROC_POINTS`` points for the file; the histogram counts deaths and survivors per risk bin of
width 1 / ``HISTOGRAM_BINS``, because a calibration curve says nothing where no cases lie (most
predicted risks here crowd below 0.1).
"""
from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.metrics import roc_curve

from model.evaluation.statistics import metrics

MAX_ROC_POINTS = 200
HISTOGRAM_BINS = 50


def roc_points(p, y) -> dict[str, list[float]]:
    """False- and true-positive rates of 'positive when p >= t' over every threshold t, at most MAX_ROC_POINTS."""
    p, y = metrics.as_pair(p, y)
    if y.min() == y.max():
        return {"fpr": [], "tpr": []}
    fpr, tpr, _ = roc_curve(y, p, drop_intermediate=True)
    if fpr.size > MAX_ROC_POINTS:  # keep the ends; evenly spaced in between
        keep = np.unique(np.round(np.linspace(0, fpr.size - 1, MAX_ROC_POINTS)).astype(int))
        fpr, tpr = fpr[keep], tpr[keep]
    return {"fpr": fpr.tolist(), "tpr": tpr.tolist()}


def risk_histogram(p, y, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """Counts of deaths and survivors per predicted-risk bin on [0, 1] (bins of equal width, probability)."""
    p, y = metrics.as_pair(p, y)
    edges = np.linspace(0.0, 1.0, bins + 1)
    deaths, _ = np.histogram(p[y == 1], edges)
    survivors, _ = np.histogram(p[y == 0], edges)
    return {"edges": edges.tolist(), "deaths": deaths.tolist(), "survivors": survivors.tolist()}


def report_curves(p, y) -> dict[str, Any]:
    """Both curves of one set of predictions (JSON-ready)."""
    return {"roc": roc_points(p, y), "histogram": risk_histogram(p, y)}
