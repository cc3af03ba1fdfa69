"""Vocabulary and normalisation statistics against direct computations."""
import functools
import math

import numpy as np
import pytest

from ehr_pipeline.job import vocab


def test_example_stats_match_direct_computation():
    codes = np.array(["lab:1", "lab:1", "chart:2", "lab:1"], dtype=object)
    values = np.array([1.0, np.nan, 5.0, 3.0])
    st = vocab.example_code_stats(codes, values)
    assert st["lab:1"] == (1, 3, 2, 4.0, 10.0)
    assert st["chart:2"] == (1, 1, 1, 5.0, 25.0)


def test_vocabulary_orders_by_frequency_and_applies_limits():
    stats = {
        "lab:a": (5, 9, 0, 0.0, 0.0),
        "lab:b": (7, 7, 0, 0.0, 0.0),
        "lab:c": (1, 1, 0, 0.0, 0.0),
        "chart:x": (2, 2, 0, 0.0, 0.0),
    }
    v = vocab.build_vocabulary(stats, min_count=2, max_size=None)
    assert v == {"chart": ["chart:x"], "lab": ["lab:b", "lab:a"]}
    assert vocab.build_vocabulary(stats, min_count=1, max_size=1)["lab"] == ["lab:b"]


def test_normalisation_matches_numpy_and_handles_constant_codes():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=500)
    parts = [vocab.example_code_stats(np.array(["lab:v"] * len(c), dtype=object), c)
             for c in np.array_split(x, 7)]
    merged = {"lab:v": functools.reduce(vocab.add_stats, (p["lab:v"] for p in parts), vocab.ZERO)}
    norm = vocab.normalisation_stats(merged)
    assert norm["lab:v"]["mean"] == pytest.approx(x.mean())
    assert norm["lab:v"]["std"] == pytest.approx(x.std())
    assert merged["lab:v"][0] == 7
    const = vocab.normalisation_stats({"lab:k": (1, 3, 3, 6.0, 12.0)})
    assert const["lab:k"] == {"mean": 2.0, "std": 1.0, "n": 3}


def test_statistics_that_overflow_are_left_out_not_written_as_infinity(caplog):
    stats = {"lab:huge": (1, 2, 2, 2e200, 2e400), "lab:fine": (1, 2, 2, 3.0, 5.0)}
    norm = vocab.normalisation_stats(stats)
    assert list(norm) == ["lab:fine"] and "lab:huge" in caplog.text


def test_exact_sums_equal_fsum_whatever_the_order():
    """The job's sums across examples: math.fsum (correctly rounded, written apart) in every order and grouping."""
    rng = np.random.default_rng(1)
    x = rng.normal(0.0, 1.0, 400) * 10.0 ** rng.integers(-6, 6, 400)
    x[:2] = [5e-324, -1e-310]  # subnormals
    stats = [(1, 1, 1, float(v), float(v) * 0.5) for v in x]
    expected = (math.fsum(x), math.fsum(x * 0.5))
    for order in (np.arange(x.size), rng.permutation(x.size), rng.permutation(x.size)):
        groups = np.array_split(order, 7)  # bundles combined, then merged: as Beam's lifted combine does
        parts = [functools.reduce(vocab.add_exact, (vocab.exact_stats(stats[i]) for i in g), vocab.EXACT_ZERO)
                 for g in groups]
        total = vocab.rounded_stats(functools.reduce(vocab.add_exact, parts[::-1], vocab.EXACT_ZERO))
        assert total[:3] == (400, 400, 400) and total[3:] == expected
    # Plain float sums in other orders are not all it: the test can tell an order-dependent sum.
    assert {sum(x[rng.permutation(x.size)]) for _ in range(5)} - {expected[0]}


def test_exact_sums_keep_infinities_and_overflow():
    inf = vocab.add_exact(vocab.exact_stats((1, 1, 1, math.inf, 1.0)), vocab.exact_stats((1, 1, 1, 2.0, 1.0)))
    assert vocab.rounded_stats(inf)[3:] == (math.inf, 2.0)
    both = vocab.add_exact(inf, vocab.exact_stats((1, 1, 1, -math.inf, 1.0)))
    assert math.isnan(vocab.rounded_stats(both)[3])
    big = vocab.exact_stats((1, 1, 1, 1.7e308, 0.0))
    assert vocab.rounded_stats(vocab.add_exact(big, big))[3] == math.inf
