"""model.ehr.wide: the fitted logistic regression's Laplace posterior on raw columns, and the layer that samples it."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from model.layers.noise import Noise
from model.ehr import baselines
from model.ehr.wide import PRIOR_PRECISION, GaussianLinear, fit_laplace, laplace_posterior


@pytest.fixture(scope="module")
def fitted():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(1200, 6)) * np.array([1.0, 3.0, 0.5, 2.0, 1.0, 1.0]) + np.array([0, 5, 0, -1, 0, 0])
    logit = -1.0 + 0.8 * x[:, 0] - 0.3 * (x[:, 1] - 5) + 1.5 * x[:, 2]  # columns 3-5 carry nothing
    y = (rng.random(1200) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    train = baselines.SplitFeatures(np.zeros(800, np.int64), y[:800], x[:800])
    val = baselines.SplitFeatures(np.zeros(400, np.int64), y[800:], x[800:])
    return x[:800], y[:800], x[800:], y[800:], fit_laplace(train, val)


def test_the_mean_predicts_what_the_chosen_scikit_learn_fit_predicts(fitted):
    x, y, xv, yv, fit = fitted
    train = baselines.SplitFeatures(np.zeros(len(y), np.int64), y, x)
    val = baselines.SplitFeatures(np.zeros(len(yv), np.int64), yv, xv)
    pipeline, params, _ = baselines.fit_logistic(train, val, 0)
    assert params == fit.params
    p_mean = 1 / (1 + np.exp(-(fit.mean[0] + xv @ fit.mean[1:])))
    np.testing.assert_allclose(p_mean, pipeline.predict_proba(xv)[:, 1], rtol=0, atol=1e-9)


def test_the_covariance_is_the_inverse_hessian_mapped_to_raw_columns(fitted):
    x, y, _, _, fit = fitted
    kept = np.flatnonzero(np.abs(fit.mean[1:]) > 0)
    # An independent computation: the Hessian in raw columns is T^-T H_std T^-1, so the raw
    # covariance's inverse over the kept columns is the raw design's Hessian plus the prior
    # precision mapped back: sum p(1 - p) x x^T + PRIOR_PRECISION * D^2 (D = diag of the scales).
    mean, std = x.mean(axis=0), x.std(axis=0)
    design = np.c_[np.ones(len(x)), x[:, kept]]
    p = 1 / (1 + np.exp(-(design @ fit.mean[np.r_[0, kept + 1]])))
    to_std = np.eye(1 + kept.size)  # raw (b, w) -> standardised (b + w.m, w * s)
    to_std[0, 1:] = mean[kept]
    to_std[1:, 1:] = np.diag(std[kept])
    precision = design.T @ (design * (p * (1 - p))[:, None]) + PRIOR_PRECISION * to_std.T @ to_std
    covariance = fit.scale @ fit.scale.T
    idx = np.r_[0, kept + 1]
    np.testing.assert_allclose(covariance[np.ix_(idx, idx)], np.linalg.inv(precision), rtol=1e-6, atol=1e-9)
    dropped = np.setdiff1d(np.arange(1, x.shape[1] + 1), kept + 1)
    assert not covariance[dropped].any()  # a dropped column has no weight and no variance


def _standardised_pipeline(fitted):
    x, y, xv, yv, _ = fitted
    train = baselines.SplitFeatures(np.zeros(len(y), np.int64), y, x)
    val = baselines.SplitFeatures(np.zeros(len(yv), np.int64), yv, xv)
    return baselines.fit_logistic(train, val, 0)[0]


def _raw_to_standardised(x):
    """The map M with (b_std, c_std) = M (b_raw, w_raw), i.e. b + w.m and w * s."""
    m = np.eye(1 + x.shape[1])
    m[0, 1:] = x.mean(axis=0)
    m[1:, 1:] = np.diag(x.std(axis=0))
    return m


def test_the_sandwich_covariance_is_p_inverse_j_p_inverse_in_standardised_columns(fitted):
    x, y, *_ = fitted
    pipeline = _standardised_pipeline(fitted)
    mean, scale = laplace_posterior(pipeline, x, sandwich_labels=y)
    _, laplace_scale = laplace_posterior(pipeline, x)
    kept = np.flatnonzero(np.r_[True, pipeline[-1].coef_[0] != 0])
    z = np.c_[np.ones(len(x)), (x - x.mean(axis=0)) / x.std(axis=0)][:, kept]
    to_std = _raw_to_standardised(x)[np.ix_(kept, kept)]
    coef_std = to_std @ mean[kept]
    p = 1 / (1 + np.exp(-z @ coef_std))
    precision_inv = np.linalg.inv(z.T @ (z * (p * (1 - p))[:, None]) + PRIOR_PRECISION * np.eye(kept.size))
    g = z * (y - p)[:, None]
    want = precision_inv @ g.T @ g @ precision_inv
    got = (scale @ scale.T)[np.ix_(kept, kept)]
    np.testing.assert_allclose(to_std @ got @ to_std.T, want, rtol=1e-6, atol=1e-10)
    assert not np.allclose(scale @ scale.T, laplace_scale @ laplace_scale.T)  # a different covariance


def test_a_dropped_column_prior_gives_every_column_variance_from_the_full_precision(fitted):
    x, *_ = fitted
    pipeline = _standardised_pipeline(fitted)
    pipeline[-1].coef_[0, 4] = 0.0  # as if the L1 fit had dropped column 4
    mean, scale = laplace_posterior(pipeline, x, prior_precision=2.0, dropped_precision=50.0)
    z = np.c_[np.ones(len(x)), (x - x.mean(axis=0)) / x.std(axis=0)]
    to_std = _raw_to_standardised(x)
    p = 1 / (1 + np.exp(-z @ (to_std @ mean)))
    prior = np.r_[2.0, 2.0, 2.0, 2.0, 2.0, 50.0, 2.0]
    prior[1:][pipeline[-1].coef_[0] == 0] = 50.0
    want = np.linalg.inv(z.T @ (z * (p * (1 - p))[:, None]) + np.diag(prior))
    np.testing.assert_allclose(to_std @ (scale @ scale.T) @ to_std.T, want, rtol=1e-6, atol=1e-10)
    assert mean[5] == 0.0 and (scale @ scale.T)[5, 5] > 0  # dropped, yet uncertain


def test_each_row_draws_its_own_weights_from_the_explicit_noise(fitted):
    *_, fit = fitted
    layer = GaussianLinear(6, name="wide_logit")
    layer.set_fit(fit)
    x = tf.constant(np.random.default_rng(1).normal(size=(5, 6)), tf.float32)
    noise = Noise.from_fingerprints(tf.range(5, dtype=tf.int64), tf.constant(3, tf.int64))
    out = layer(x, noise=noise).numpy()[:, 0]
    eps = noise.fold_in("wide_logit").normal(5, [7]).numpy()
    weights = fit.mean[None, :] + eps @ fit.scale.T  # one weight vector per row
    want = np.sum(np.c_[np.ones(5), x.numpy()] * weights, axis=1)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(layer(x, noise=noise).numpy()[:, 0], out)  # same noise, same draw
    draws = np.stack([layer(x).numpy()[:, 0] for _ in range(400)])  # stateful: the posterior's spread
    sd = np.sqrt(np.einsum("ij,jk,ik->i", np.c_[np.ones(5), x.numpy()], fit.scale @ fit.scale.T,
                           np.c_[np.ones(5), x.numpy()]))
    np.testing.assert_allclose(draws.std(axis=0), sd, rtol=0.15)
    assert not layer.trainable_weights
