"""The recalibration maths against statsmodels (one sample) and a direct optimisation (many), on fixed data."""
from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import optimize

from model.adapt import recalibration as recal
from model.export.load import Recalibration


def _data(n: int = 600, m: int = 1, seed: int = 3):
    rng = np.random.default_rng(seed)
    center = rng.normal(-1.5, 1.2, n)
    logits = center[:, None] + rng.normal(0.0, 0.4, (n, m)) * (m > 1)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(0.7 + 0.6 * center)))).astype(int)
    return logits, y


def test_intercept_and_slope_match_statsmodels_for_one_sample():
    logits, y = _data()
    offset_fit = sm.GLM(y, np.ones((len(y), 1)), family=sm.families.Binomial(), offset=logits[:, 0]).fit()
    slope_fit = sm.Logit(y, sm.add_constant(logits[:, 0])).fit(disp=0)
    intercept = recal.fit_intercept(logits, y)
    both = recal.fit_intercept_slope(logits, y)
    assert intercept.intercept == pytest.approx(offset_fit.params[0], abs=1e-6)
    assert intercept.log_likelihood == pytest.approx(offset_fit.llf, abs=1e-6)
    assert (both.intercept, both.slope) == pytest.approx(tuple(slope_fit.params), abs=1e-5)
    assert both.log_likelihood == pytest.approx(slope_fit.llf, abs=1e-6)
    assert recal.original(logits, y).log_likelihood < intercept.log_likelihood < both.log_likelihood


def test_many_samples_fit_the_likelihood_of_their_mean():
    logits, y = _data(m=8)

    def nll(ab):
        p = (1.0 / (1.0 + np.exp(-(ab[0] + ab[1] * logits)))).mean(axis=1)
        return -np.sum(y * np.log(p) + (1 - y) * np.log(1 - p))

    direct = optimize.minimize(nll, np.array([0.0, 1.0]), method="Nelder-Mead",
                               options={"xatol": 1e-8, "fatol": 1e-10, "maxiter": 4000})
    both = recal.fit_intercept_slope(logits, y)
    assert (both.intercept, both.slope) == pytest.approx(tuple(direct.x), abs=1e-4)
    assert both.log_likelihood == pytest.approx(-direct.fun, abs=1e-6)
    assert recal.log_likelihood(logits, y, both.intercept, both.slope) == pytest.approx(both.log_likelihood)


def test_the_stored_recalibration_moves_every_sample_as_the_fit_assumes():
    rng = np.random.default_rng(0)
    probs = rng.uniform(0.001, 0.999, (20, 6)).astype(np.float32)
    moved = Recalibration(intercept=0.4, slope=0.7).apply(probs)
    logits = recal.logits_of(probs)
    assert moved.dtype == np.float32 and moved.shape == probs.shape
    np.testing.assert_allclose(moved, 1.0 / (1.0 + np.exp(-(0.4 + 0.7 * logits))), rtol=1e-6)
    assert Recalibration().apply(probs) is probs  # the identity touches nothing
    a, b = recal.compose((0.4, 0.7), (-0.2, 1.5))
    np.testing.assert_allclose(Recalibration(intercept=a, slope=b).apply(probs),
                               Recalibration(intercept=-0.2, slope=1.5).apply(moved), rtol=2e-6)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="0/1"):
        recal.fit_intercept(np.zeros((3, 1)), np.array([0, 2, 1]))
    with pytest.raises(ValueError, match=r"\[N, M\]"):
        recal.fit_intercept(np.zeros(3), np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="finite"):
        recal.fit_intercept(np.array([[np.nan], [0.0]]), np.array([0, 1]))
