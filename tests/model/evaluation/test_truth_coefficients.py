"""How much of each truth term a model's logit carries, and its distance from the truth paired with another
model's, on constructed cases whose answers are known."""
from __future__ import annotations

import numpy as np
import pytest

from model.evaluation.statistics.against_truth import carried_coefficients, design_coefficients, truth_error


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _design(n=500, seed=0):
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.normal(0, 1, n), rng.normal(0, 0.2, n), np.where(rng.random(n) < 0.3,
                                                                               rng.normal(-1, 0.5, n), 0.0)])


def test_a_logit_built_from_the_design_gives_back_its_coefficients_exactly():
    x = _design()
    beta = np.array([-2.0, 0.8, 7.0, 0.5])  # intercept, then one per column
    p = _sigmoid(beta[0] + x @ beta[1:])
    assert design_coefficients(p, x) == pytest.approx(beta, abs=1e-9)
    carried = carried_coefficients(p, x, [1, 2], n_bootstrap=50)
    assert [c["estimate"] for c in carried] == pytest.approx([7.0, 0.5], abs=1e-9)
    # Every resample of an exact fit gives the same coefficients: a zero-width interval at the value.
    assert all(c["lower"] == pytest.approx(c["estimate"], abs=1e-8) == pytest.approx(c["upper"], abs=1e-8)
               for c in carried)


def test_a_model_that_carries_part_of_a_term_is_measured_with_an_interval_around_that_part():
    x = _design(seed=1)
    rng = np.random.default_rng(2)
    p = _sigmoid(-2.0 + 0.8 * x[:, 0] + 3.5 * x[:, 1] + rng.normal(0, 0.3, len(x)))
    trend, readmission = carried_coefficients(p, x, [1, 2], n_bootstrap=300, seed=4)
    assert trend["lower"] < 3.5 < trend["upper"] and trend["upper"] - trend["lower"] < 1.0
    assert readmission["lower"] < 0.0 < readmission["upper"]


def test_truth_error_is_the_mean_distance_and_the_paired_difference_keeps_the_cases_together():
    rng = np.random.default_rng(3)
    truth = rng.uniform(0.01, 0.6, 400)
    near = np.clip(truth + rng.normal(0, 0.02, truth.size), 0, 1)
    far = np.clip(truth + rng.normal(0, 0.10, truth.size), 0, 1)
    out = truth_error(near, truth, reference=far, n_bootstrap=300, seed=5)
    assert out["mean"] == pytest.approx(np.abs(near - truth).mean(), rel=1e-12)
    assert out["lower"] < out["mean"] < out["upper"]
    assert out["difference"] == pytest.approx(np.abs(near - truth).mean() - np.abs(far - truth).mean(), rel=1e-12)
    assert out["difference_upper"] < 0  # near is closer to the truth on the same cases
    alone = truth_error(near, truth, n_bootstrap=10)
    assert "difference" not in alone


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError, match="design"):
        design_coefficients(np.full(3, 0.5), np.zeros(3))
    with pytest.raises(ValueError, match="reference"):
        truth_error(np.full(3, 0.5), np.full(3, 0.5), reference=np.full(4, 0.5))
