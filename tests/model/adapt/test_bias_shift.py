"""The Bayesian update's output-bias mode against statsmodels (no prior) and a per-member scalar search (a prior)."""
from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import optimize

from model.adapt.bayes_update import bias_shift


def _data(n: int = 400, s: int = 1, k: int = 1, seed: int = 5):
    """Logits [N, S, K] of a model that underestimates a high-risk site by ~1.5 logits, and its outcomes."""
    rng = np.random.default_rng(seed)
    center = rng.normal(-1.0, 1.0, n)
    logits = center[:, None, None] + rng.normal(0.0, 0.3, (n, s, k)) * (s * k > 1)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(center + 1.5)))).astype(int)
    return logits, y


def test_without_a_prior_one_sample_one_member_is_the_offset_regressions_intercept():
    logits, y = _data()
    glm = sm.GLM(y, np.ones((len(y), 1)), family=sm.families.Binomial(), offset=logits[:, 0, 0]).fit()
    assert bias_shift(logits, y, prior_stddev=1e6) == pytest.approx([glm.params[0]], abs=1e-5)


@pytest.mark.parametrize("s, k, stddev", [(1, 1, 0.5), (3, 2, 1.0), (5, 4, 0.3)])
def test_each_members_shift_is_the_mode_of_its_own_objective(s, k, stddev):
    logits, y = _data(s=s, k=k)
    got = bias_shift(logits, y, prior_stddev=stddev)
    for member in range(k):
        def objective(d: float) -> float:
            # Written out: the mean over samples of the summed NLL, over K (the members' average), plus the prior.
            total = 0.0
            for sample in range(s):
                p = 1.0 / (1.0 + np.exp(-(logits[:, sample, member] + d)))
                total += -np.sum(y * np.log(p) + (1 - y) * np.log(1 - p)) / s
            return total / k + d * d / (2 * stddev ** 2)

        expected = optimize.minimize_scalar(objective, bounds=(-10.0, 10.0), method="bounded",
                                            options={"xatol": 1e-9}).x
        assert got[member] == pytest.approx(expected, abs=1e-5)
    # The outcomes sit ~1.5 logits above the model (a draw of 400 of them): the shift says so.
    assert np.all((got > 0.5) & (got < 2.5))


def test_a_tighter_prior_moves_the_bias_less():
    logits, y = _data(s=2, k=2)
    loose, tight = bias_shift(logits, y, 2.0), bias_shift(logits, y, 0.02)
    # ~50 nats of gradient per member against a prior precision of 2 / 0.02^2: a shift of ~0.02.
    assert np.all(tight < loose) and np.all(np.abs(tight) < 0.05) and np.all(loose > 1.0)


def test_logits_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match=r"logits \[N, S, K\]"):
        bias_shift(np.zeros((4, 2)), np.zeros(4), 1.0)
