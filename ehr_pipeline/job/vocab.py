"""Vocabularies and numeric normalisation statistics, built from the training split only.

Statistics are kept as additive tuples so Beam can combine them per code across workers:
(n_examples, n_events, n_values, sum, sum of squares). Everything here is pure.
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


def combine_stats(values) -> CodeStats:
    """Sum of code statistics tuples (a Beam CombinePerKey function)."""
    total = ZERO
    for v in values:
        total = add_stats(total, v)
    return total


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

