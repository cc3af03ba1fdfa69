"""The counterfactual's response statistics and the uncertainty-where-decided difference, on constructed
cases whose answers are known, and against a direct least-squares fit."""
from __future__ import annotations

import numpy as np
import pytest

from model.evaluation.statistics.against_truth import counterfactual_response, uncertainty_where_decided


def _truth(n=400, seed=0):
    rng = np.random.default_rng(seed)
    before = rng.normal(-2.0, 1.0, n)
    change = np.where(rng.random(n) < 0.5, rng.normal(0.0, 2.0, n), 0.0)
    return before, before + change


def test_a_model_that_moves_a_tenth_of_the_truth_has_slope_a_tenth_and_full_sign_agreement():
    tb, ta = _truth()
    mb = 0.5 * tb + 0.3
    ma = mb + 0.1 * (ta - tb)
    out = counterfactual_response(mb, ma, tb, ta, n_bootstrap=200)
    assert out["slope"] == pytest.approx(0.1, abs=1e-12)
    assert out["slope_lower"] == pytest.approx(0.1, abs=1e-9) and out["slope_upper"] == pytest.approx(0.1, abs=1e-9)
    assert out["sign_agreement"] == 1.0 and out["n_large"] == int(np.sum(np.abs(ta - tb) >= 1.0))
    assert 0 < out["mean_abs_dp"] < out["truth_mean_abs_dp"]
    assert out["n_changed"] == int(np.sum(ta != tb))


def test_the_slope_is_the_least_squares_fit_and_its_interval_covers_it():
    rng = np.random.default_rng(1)
    tb, ta = _truth(seed=1)
    mb = rng.normal(0, 1, tb.size)
    ma = mb + 0.4 * (ta - tb) + rng.normal(0, 0.5, tb.size)
    out = counterfactual_response(mb, ma, tb, ta, n_bootstrap=300, seed=3)
    expected = np.polyfit(ta - tb, ma - mb, 1)[0]
    assert out["slope"] == pytest.approx(expected, rel=1e-10)
    assert out["slope_lower"] < expected < out["slope_upper"] and out["slope_upper"] - out["slope_lower"] < 0.2


def test_a_model_that_ignores_the_change_agrees_in_sign_by_its_noise_only():
    tb, ta = _truth(n=2000, seed=2)
    rng = np.random.default_rng(5)
    mb = rng.normal(0, 1, tb.size)
    ma = mb + rng.normal(0, 0.01, tb.size)
    out = counterfactual_response(mb, ma, tb, ta, n_bootstrap=200)
    assert abs(out["slope"]) < 0.01 and 0.4 < out["sign_agreement"] < 0.6
    blind = counterfactual_response(mb, mb, tb, ta, n_bootstrap=50)  # cannot see the change at all
    assert blind["sign_agreement"] == 0.5 and blind["slope"] == 0.0 and blind["mean_abs_dp"] == 0.0
    with pytest.raises(ValueError, match=r"\[N\] alike"):
        counterfactual_response(mb, ma[:-1], tb, ta)


def test_uncertainty_where_decided_is_the_difference_of_the_group_means():
    u = np.r_[np.full(50, 0.3), np.full(50, 0.1), np.full(20, 5.0)]
    decided = np.r_[np.ones(50, bool), np.zeros(70, bool)]
    undecided = np.r_[np.zeros(50, bool), np.ones(50, bool), np.zeros(20, bool)]
    out = uncertainty_where_decided(u, decided, undecided, n_bootstrap=200)
    assert out["difference"] == pytest.approx(0.2) and out["ratio"] == pytest.approx(3.0)
    assert out["lower"] == pytest.approx(0.2) and out["upper"] == pytest.approx(0.2)  # constant within groups
    assert (out["n_decided"], out["n_undecided"]) == (50, 50)
    noisy = u + np.random.default_rng(0).normal(0, 0.05, u.size)
    out = uncertainty_where_decided(noisy, decided, undecided, n_bootstrap=500)
    assert out["lower"] < out["difference"] < out["upper"] and out["lower"] > 0.15
    same = uncertainty_where_decided(np.random.default_rng(1).random(u.size), decided, undecided, n_bootstrap=500)
    assert same["lower"] < 0 < same["upper"]
    with pytest.raises(ValueError, match="overlap"):
        uncertainty_where_decided(u, decided, decided)
