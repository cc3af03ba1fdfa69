"""Vocabularies and numeric normalisation statistics, built from the training split only.

Statistics are kept as additive tuples so Beam can combine them per code across workers:
(n_examples, n_events, n_values, sum, sum of squares). Across examples the job sums them exactly
(``exact_stats`` / ``add_exact`` / ``rounded_stats``): a float sum depends on the order of its
terms, and the order of Beam's bundles depends on the number of workers, so plain float sums
gave a numeric_stats.json that differed in the last digit between one worker and two. The
exact sum, rounded once, is the same whatever the order. Everything here is pure.
"""
from __future__ import annotations

import logging
import math
from collections.abc import Mapping

import numpy as np

logger = logging.getLogger(__name__)

# (n_examples, n_events, n_values, value_sum, value_sumsq)
CodeStats = tuple[int, int, int, float, float]
ZERO: CodeStats = (0, 0, 0, 0.0, 0.0)


def add_stats(a: CodeStats, b: CodeStats) -> CodeStats:
    """Sums two statistics tuples (associative and commutative, as a Beam combiner needs)."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4])


# Every finite float64 is an integer multiple of 2**-1074 (the smallest subnormal): scaled by
# 2**1074 a sum of floats is a sum of Python integers, exact and independent of its order.
_SCALE_BITS = 1074
# An exact sum: (the finite terms' sum x 2**1074, the non-finite terms' float sum). Adding the
# non-finite terms (inf, -inf, nan) as floats is order-independent too: nan absorbs, inf + -inf is nan.
ExactSum = tuple[int, float]
# (n_examples, n_events, n_values, exact sum, exact sum of squares)
ExactCodeStats = tuple[int, int, int, ExactSum, ExactSum]
EXACT_ZERO: ExactCodeStats = (0, 0, 0, (0, 0.0), (0, 0.0))


def exact_sum(x: float) -> ExactSum:
    """One float as an exact sum (no rounding)."""
    if math.isfinite(x):
        numerator, denominator = float(x).as_integer_ratio()  # the denominator is a power of two
        return numerator << (_SCALE_BITS + 1 - denominator.bit_length()), 0.0
    return 0, float(x)


def rounded_sum(total: ExactSum) -> float:
    """An exact sum rounded once to the nearest float (int / int division is correctly rounded)."""
    scaled, special = total
    if special != 0.0 or math.isnan(special):
        return special
    try:
        return scaled / (1 << _SCALE_BITS)
    except OverflowError:  # beyond the largest float, as a float sum would have overflowed
        return math.inf if scaled > 0 else -math.inf


def exact_stats(st: CodeStats) -> ExactCodeStats:
    """A statistics tuple with its sums made exact (for add_exact)."""
    return (st[0], st[1], st[2], exact_sum(st[3]), exact_sum(st[4]))


def add_exact(a: ExactCodeStats, b: ExactCodeStats) -> ExactCodeStats:
    """Sums two exact statistics tuples: associative and commutative in fact, not only up to rounding."""
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], (a[3][0] + b[3][0], a[3][1] + b[3][1]),
            (a[4][0] + b[4][0], a[4][1] + b[4][1]))


def rounded_stats(st: ExactCodeStats) -> CodeStats:
    """An exact statistics tuple with its sums rounded once to floats."""
    return (st[0], st[1], st[2], rounded_sum(st[3]), rounded_sum(st[4]))


def example_code_stats(codes: np.ndarray, values: np.ndarray) -> dict[str, CodeStats]:
    """Per-code statistics of one example's events (each code counts as one example)."""
    if len(codes) == 0:
        return {}
    uniq, inverse = np.unique(np.asarray(codes, dtype=np.str_), return_inverse=True)  # no copy of str arrays
    values = np.asarray(values, dtype=np.float64)
    has = ~np.isnan(values)
    v = np.where(has, values, 0.0)
    n_events = np.bincount(inverse, minlength=len(uniq))
    n_values = np.bincount(inverse, weights=has, minlength=len(uniq))
    sums = np.bincount(inverse, weights=v, minlength=len(uniq))
    sumsq = np.bincount(inverse, weights=v * v, minlength=len(uniq))
    return {
        str(c): (1, int(n_events[i]), int(n_values[i]), float(sums[i]), float(sumsq[i]))
        for i, c in enumerate(uniq)
    }


def source_of(code: str) -> str:
    """The source namespace of a code ("lab:50912" -> "lab")."""
    return code.split(":", 1)[0]


def build_vocabulary(
    stats: Mapping[str, CodeStats], min_count: int, max_size: int | None
) -> dict[str, list[str]]:
    """Per-source code lists, most frequent first (by training examples, then events, then code)."""
    by_source: dict[str, list[tuple[str, CodeStats]]] = {}
    for code, st in stats.items():
        if st[0] >= min_count:
            by_source.setdefault(source_of(code), []).append((code, st))
    vocab = {}
    for source, items in sorted(by_source.items()):
        items.sort(key=lambda cs: (-cs[1][0], -cs[1][1], cs[0]))
        if max_size is not None and max_size > 0:
            items = items[:max_size]
        vocab[source] = [c for c, _ in items]
    return vocab


def normalisation_stats(stats: Mapping[str, CodeStats], min_values: int = 2) -> dict[str, dict]:
    """Mean and standard deviation of numeric values per code (population std, floored)."""
    out = {}
    for code in sorted(stats):
        _, _, n, s, ss = stats[code]
        if n < min_values:
            continue
        mean = s / n
        var = max(ss / n - mean * mean, 0.0)
        if not (math.isfinite(mean) and math.isfinite(var)):
            # Finite values beyond ~1e154 overflow the sum of squares: no z-score could use them.
            logger.warning("%s: values too large for float64 statistics (sum %r, sum of squares %r); "
                           "left out of numeric_stats.json", code, s, ss)
            continue
        # A constant-valued code would divide by zero when z-scored; 1.0 keeps it a no-op scale.
        std = math.sqrt(var) if var > 1e-12 else 1.0
        out[code] = {"mean": mean, "std": std, "n": int(n)}
    return out

