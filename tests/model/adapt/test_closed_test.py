"""Vergouwe's closed test picks the planted step: logits of a known linear model, outcomes of a known truth."""
from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm

from model.adapt import recalibration as recal
from model.adapt.closed_test import closed_test

BETA = np.array([0.8, -0.5, 0.3])


def _choose(truth, n: int = 3000, seed: int = 5) -> str:
    """The step chosen for outcomes drawn from sigmoid(truth(x, original logit))."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3))
    logit = x @ BETA - 1.0
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-truth(x, logit)))).astype(int)
    l2 = logit[:, None]
    lls = {"none": recal.original(l2, y).log_likelihood,
           "recalibrate-intercept": recal.fit_intercept(l2, y).log_likelihood,
           "recalibrate": recal.fit_intercept_slope(l2, y).log_likelihood,
           # Revision: every coefficient of the linear predictor (intercept and three weights) re-estimated.
           "revision": sm.Logit(y, sm.add_constant(x)).fit(disp=0).llf}
    return closed_test(lls, revision_parameters=4).step


@pytest.mark.parametrize("truth, expected", [
    (lambda x, l: l, "none"),
    (lambda x, l: l + 1.5, "recalibrate-intercept"),
    (lambda x, l: 0.5 + 0.4 * l, "recalibrate"),
    (lambda x, l: x @ np.array([0.8, 0.6, -0.7]) - 1.0, "revision"),
], ids=["calibrated", "baseline_risk", "overfitted", "effects_differ"])
def test_the_planted_step_is_chosen(truth, expected):
    assert _choose(truth) == expected


def test_the_tests_are_against_revision_with_the_right_degrees_of_freedom():
    result = closed_test({"none": -130.0, "recalibrate-intercept": -112.0, "recalibrate": -100.5,
                          "revision": -100.0}, revision_parameters=10)
    assert result.step == "recalibrate"
    assert [(t.simpler, t.df) for t in result.tests] == [("none", 10), ("recalibrate-intercept", 9),
                                                         ("recalibrate", 8)]
    assert result.tests[0].statistic == pytest.approx(60.0)


def test_an_incomplete_or_too_small_revision_is_refused():
    with pytest.raises(ValueError, match="missing"):
        closed_test({"none": -1.0}, revision_parameters=5)
    with pytest.raises(ValueError, match="more free parameters"):
        closed_test({"none": -1.0, "recalibrate-intercept": -1.0, "recalibrate": -1.0, "revision": -1.0}, 2)
