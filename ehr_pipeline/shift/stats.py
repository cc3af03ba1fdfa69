"""The statistics of a comparison (``compare``): the population stability index, the chi-square and rank
tests on counts over shared bins, Holm's correction, and the ratio of two medians with its interval.

Pure numbers on ``population.Distribution`` s and count vectors; ``ehr_pipeline.shift`` turns them
into findings (docs/shift.md).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ehr_pipeline.shift.population import Distribution

_SMOOTH = 0.5  # added to every bin count before PSI: an empty bin of a small sample is not infinitely far
_MIN_EXPECTED = 5.0  # chi-square bins are merged until each expects this many admissions
_Z95 = 1.959963984540054


def psi(reference: Sequence[float], current: Sequence[float]) -> float:
    """Population stability index of two count vectors over the same bins (counts smoothed by 0.5 each)."""
    r = np.asarray(reference, dtype=np.float64) + _SMOOTH
    c = np.asarray(current, dtype=np.float64) + _SMOOTH
    r, c = r / r.sum(), c / c.sum()
    return float(np.sum((c - r) * np.log(c / r)))


def homogeneity_p(reference: Sequence[float], current: Sequence[float]) -> float:
    """p-value of the chi-square test that two count vectors over the same bins come from one distribution.

    Adjacent bins are merged until each expects at least 5 admissions on the smaller side, where
    the chi-square approximation holds; one bin left means nothing to test (p = 1).
    """
    from scipy.stats import chi2

    r, c = np.asarray(reference, dtype=np.float64), np.asarray(current, dtype=np.float64)
    nr, nc = r.sum(), c.sum()
    if nr <= 0 or nc <= 0:
        return 1.0
    share = min(nr, nc) / (nr + nc)
    merged_r, merged_c, acc_r, acc_c = [], [], 0.0, 0.0
    for a, b in zip(r, c):
        acc_r, acc_c = acc_r + a, acc_c + b
        if (acc_r + acc_c) * share >= _MIN_EXPECTED:
            merged_r.append(acc_r)
            merged_c.append(acc_c)
            acc_r = acc_c = 0.0
    if acc_r + acc_c > 0:
        if merged_r:
            merged_r[-1] += acc_r
            merged_c[-1] += acc_c
        else:
            merged_r, merged_c = [acc_r], [acc_c]
    if len(merged_r) < 2:
        return 1.0
    table = np.array([merged_r, merged_c])
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    statistic = float(np.sum((table - expected) ** 2 / expected))
    return float(chi2.sf(statistic, df=len(merged_r) - 1))


def rank_p(reference: Sequence[float], current: Sequence[float]) -> float:
    """Two-sided p-value of the Mann-Whitney test on counts over ordered bins (values in one bin tie).

    Power against a shift of location (an assay reading 15% high) that the chi-square test spreads
    over every bin; the normal approximation with the tie correction, from the counts alone.
    """
    from scipy.stats import norm

    r, c = np.asarray(reference, dtype=np.float64), np.asarray(current, dtype=np.float64)
    nr, nc = r.sum(), c.sum()
    if nr <= 0 or nc <= 0:
        return 1.0
    t = r + c
    n = t.sum()
    mid_rank = np.cumsum(t) - (t - 1.0) / 2.0  # the mean rank of each bin's tied values
    u = float(np.sum(c * mid_rank)) - nc * (nc + 1.0) / 2.0
    variance = nr * nc / 12.0 * ((n + 1.0) - float(np.sum(t ** 3 - t)) / (n * (n - 1.0)))
    if variance <= 0:
        return 1.0
    return float(2.0 * norm.sf(abs(u - nr * nc / 2.0) / math.sqrt(variance)))


def distribution_p(reference: Sequence[float], current: Sequence[float], ordered: bool) -> float:
    """p-value that two count vectors come from one distribution: ordered bins take the better of the
    chi-square and the rank test (Bonferroni over the two), categories the chi-square test."""
    chi = homogeneity_p(reference, current)
    return min(1.0, 2.0 * min(chi, rank_p(reference, current))) if ordered else chi


def holm(p_values: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control, any dependence)."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.size
    if not m:
        return p
    order = np.argsort(p)
    adjusted = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adjusted
    return out


def median_ratio(reference: Distribution, current: Distribution) -> tuple[float, float, float] | None:
    """(current / reference median, 95% interval low, high) for positive medians; None otherwise.

    The interval combines each median's order-statistic interval on the log scale as if normal.
    Total on any medians: a ratio past the largest float is inf, one below the smallest 0.
    """
    if not (reference.median > 0 and current.median > 0):
        return None
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        ratio = float(np.float64(current.median) / reference.median)
        if reference.median_low > 0 and current.median_low > 0:
            se = float(np.hypot(np.log(np.float64(reference.median_high) / reference.median_low),
                                np.log(np.float64(current.median_high) / current.median_low))) / (2 * _Z95)
            return ratio, float(ratio * np.exp(-_Z95 * se)), float(ratio * np.exp(_Z95 * se))
    return ratio, math.nan, math.nan
