"""Whole-matrix Gaussian posteriors (mean field, k-tied Normal): each layer against a manual computation.

The k-tied Normal of paper 003 is W ~ N(mu, diag(vec((U V^T)^2))) with U = exp(log_u),
V = exp(log_v). The tests rebuild U V^T, the weights' variance, the layers' output moments
and the KL with NumPy from the layer's own variables, and check what the layers do.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from model.layers import factory
from model.layers import weight_posteriors as wp
from model.layers.posterior import PosteriorConfig
from model.fit import losses


def _config(method="ktied_normal", k=2, prior_stddev=0.3, dropout_rate=1e-3) -> PosteriorConfig:
    return PosteriorConfig(method=method, ensemble_size=1, ktied_rank=k, prior_stddev=prior_stddev,
                           dropout_rate=dropout_rate)


def _uv(init: wp.TrainableKTiedNormal) -> np.ndarray:
    """U V^T from the variables, by NumPy."""
    return np.exp(init.log_u.numpy().astype(np.float64)) @ np.exp(init.log_v.numpy().astype(np.float64)).T


def _built(shape, k=2, **kwargs) -> wp.TrainableKTiedNormal:
    init = wp.TrainableKTiedNormal(k, 0.03, **kwargs)
    init.build(shape)
    return init


def test_built_by_the_factory_and_validated():
    assert {"mean_field", "ktied_normal"} <= set(factory.BUILDERS)
    assert factory.samples_weights(_config()) and not factory.samples_weights(PosteriorConfig())
    with pytest.raises(ValueError, match="ktied_rank"):
        _config(k=0)
    with pytest.raises(ValueError, match="ensemble_size must be 1"):
        PosteriorConfig(method="ktied_normal", ensemble_size=4)


@pytest.mark.parametrize("shape", [(5, 3), (3, 7), (2, 2, 3, 4)])
def test_k_equal_min_mn_represents_any_positive_stddev_matrix(shape):
    # A positive m x n matrix (m >= n) is A = U V^T with V = I + d 11^T (n x n, positive) and
    # U = A V^-T = A - c rowsum(A) 1^T, c = d / (1 + n d), positive for small d: exactly the
    # family's strictly positive factors (transpose for m < n).
    m, n = int(np.prod(shape[:-1])), shape[-1]
    a = np.random.default_rng(0).uniform(0.01, 1.0, size=(m, n))
    big, small = (a, False) if m >= n else (a.T, True)
    r = big.shape[1]
    d = 1e-3
    v = np.eye(r) + d
    u = big - d / (1 + r * d) * big.sum(axis=1, keepdims=True)
    assert u.min() > 0
    np.testing.assert_allclose(u @ v.T, big, atol=1e-12)
    init = _built(shape, k=min(m, n))
    log_u, log_v = (np.log(v), np.log(u)) if small else (np.log(u), np.log(v))
    init.log_u.assign(log_u.astype(np.float32))
    init.log_v.assign(log_v.astype(np.float32))
    np.testing.assert_allclose(wp.stddev_matrix(init).numpy(), a, rtol=1e-4)
    # The sampled kernel has the original shape: A is its reshape to [prod(leading), last].
    rv = init(shape)
    np.testing.assert_allclose(np.reshape(rv.distribution.stddev().numpy(), (m, n)), a, rtol=1e-4)


def test_initial_stddevs_average_the_mean_field_init():
    config = _config(k=3)
    tf.random.set_seed(1)
    layer = factory.dense(300, config)
    layer(tf.zeros([1, 200]))
    a = wp.stddev_matrix(layer.kernel_initializer).numpy()
    assert a.min() > 0
    # E[sigma] = init_stddev exactly by construction; 60,000 entries average it to ~0.1 %.
    assert a.mean() == pytest.approx(config.init_stddev, rel=0.01)
    # ... and each of the k terms starts at init_stddev / k (paper 003, App. D.4).
    assert np.exp(np.mean(layer.kernel_initializer.log_u.numpy()) * 2) * 3 == pytest.approx(
        config.init_stddev * math.exp(-0.1 ** 2), rel=0.05)


def test_sampled_weights_variance_is_uv_squared():
    init = _built((6, 4), k=2)
    init.log_u.assign(np.log(np.random.default_rng(1).uniform(0.2, 1.0, (6, 2))).astype(np.float32))
    tf.random.set_seed(2)
    samples = init((6, 4)).distribution.sample(20000).numpy().astype(np.float64)
    np.testing.assert_allclose(samples.var(axis=0), _uv(init) ** 2, rtol=0.05)
    np.testing.assert_allclose(samples.mean(axis=0), init.mean.numpy(), atol=4 * _uv(init).max() / math.sqrt(20000))


def test_analytic_kl_equals_monte_carlo_and_the_closed_form():
    config = _config(k=2, prior_stddev=0.5)
    init, reg = wp.ktied_normal(config, tf.keras.initializers.RandomNormal(stddev=0.3))
    init.build((5, 4))
    init.log_v.assign(init.log_v + 1.5)  # stddevs ~ 0.1-0.2: a KL well away from zero
    analytic = float(reg(init((5, 4))))
    mu, s, sp = init.mean.numpy().astype(np.float64), _uv(init), 0.5
    closed = np.sum(np.log(sp / s) + (s ** 2 + mu ** 2) / (2 * sp ** 2) - 0.5)
    assert analytic == pytest.approx(closed, rel=1e-5)
    rng = np.random.default_rng(3)
    w = mu + s * rng.standard_normal((100000, *mu.shape))
    log_q = -0.5 * ((w - mu) / s) ** 2 - np.log(s)
    log_p = -0.5 * (w / sp) ** 2 - np.log(sp)
    terms = (log_q - log_p).sum(axis=(1, 2))
    assert analytic == pytest.approx(terms.mean(), abs=4 * terms.std() / math.sqrt(len(terms)))


def _output_moments(layer, x, calls):
    forward = tf.function(lambda: layer(x))  # one trace: eager edward2 calls are slow
    outs = np.stack([forward().numpy().astype(np.float64) for _ in range(calls)])
    return outs.reshape(-1, *outs.shape[2:])


def _assert_variance(empirical, expected, calls):
    # Rows of one call share the weight draw, so only `calls` draws are independent: the
    # sample variance then scatters by ~sqrt(2 / calls) per element; their mean by far less.
    np.testing.assert_allclose(empirical, expected, rtol=5 * math.sqrt(2 / calls))
    assert empirical.sum() / expected.sum() == pytest.approx(1.0, rel=0.05)


def test_dense_layer_output_moments_match_the_manual_computation():
    # Flipout: y = x mu + ((x * s_in) (W - mu)) * s_out, so y_j ~ N(x mu_j, sum_i x_i^2 (U V^T)_ij^2)
    # for every row, whatever its signs.
    tf.random.set_seed(4)
    layer = factory.dense(3, _config(k=2), use_bias=False)
    x = tf.constant(np.random.default_rng(5).normal(size=(1, 8)), tf.float32)
    layer(x)
    layer.kernel_initializer.log_u.assign(layer.kernel_initializer.log_u + 2.0)
    xs = tf.tile(x, [40, 1])
    outs = _output_moments(layer, xs, calls=200)
    x64 = x.numpy().astype(np.float64)
    mean = x64 @ layer.kernel_initializer.mean.numpy()
    var = (x64 ** 2) @ _uv(layer.kernel_initializer) ** 2
    np.testing.assert_allclose(outs.mean(axis=0), mean[0], atol=5 * math.sqrt(var.max() / 200))
    _assert_variance(outs.var(axis=0), var[0], calls=200)


def test_conv2d_kernel_is_tied_as_a_matrix_and_output_moments_match():
    tf.random.set_seed(6)
    layer = factory.conv2d(4, 3, _config(k=2), padding="same", use_bias=False)
    x = tf.constant(np.random.default_rng(7).normal(size=(1, 5, 5, 2)), tf.float32)
    layer(x)
    init = layer.kernel_initializer
    assert init.log_u.shape == (3 * 3 * 2, 2) and init.log_v.shape == (4, 2)
    init.log_u.assign(init.log_u + 2.0)
    outs = _output_moments(layer, tf.tile(x, [20, 1, 1, 1]), calls=150)
    mean = tf.nn.convolution(tf.cast(x, tf.float64), tf.cast(init.mean, tf.float64), padding="SAME").numpy()[0]
    stddevs = np.reshape(_uv(init), (3, 3, 2, 4))
    var = tf.nn.convolution(tf.cast(x, tf.float64) ** 2, stddevs ** 2, padding="SAME").numpy()[0]
    np.testing.assert_allclose(outs.mean(axis=0), mean, atol=5 * math.sqrt(var.max() / 150))
    _assert_variance(outs.var(axis=0), var, calls=150)


def test_lstm_cell_ties_kernel_and_recurrent_kernel_and_model_kl_sums_them():
    cell = factory.lstm_cell(3, _config(k=1))
    rnn = tf.keras.layers.RNN(cell)
    model = tf.keras.Sequential([rnn])
    model(tf.zeros([2, 4, 5]))
    sites = wp.posterior_sites(cell)
    assert {name: tuple(s.stddev_matrix().shape) for name, s in sites.items()} == {
        "kernel": (5, 12), "recurrent_kernel": (3, 12)}
    expected = 0.0
    for init in sites.values():
        mu, s = init.mean.numpy().astype(np.float64), _uv(init)
        expected += np.sum(np.log(0.3 / s) + (s ** 2 + mu ** 2) / (2 * 0.3 ** 2) - 0.5)
    assert float(losses.kl_divergence(model)) == pytest.approx(expected, rel=1e-4)
    # The stddev parameters get gradients through the sampled weights (reparameterisation).
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(rnn(tf.ones([2, 4, 5])) ** 2)
    grads = tape.gradient(loss, [sites["kernel"].log_u, sites["recurrent_kernel"].log_v])
    assert all(g is not None and float(tf.reduce_max(tf.abs(g))) > 0 for g in grads)


def test_parameter_count_is_mn_plus_k_m_plus_n():
    for k in (1, 3):
        layer = factory.dense(30, _config(k=k), use_bias=False)
        layer(tf.zeros([1, 20]))
        assert sum(v.shape.num_elements() for v in layer.trainable_variables) == 20 * 30 + k * (20 + 30)
    mf = factory.dense(30, _config(method="mean_field"), use_bias=False)
    mf(tf.zeros([1, 20]))
    assert sum(v.shape.num_elements() for v in mf.trainable_variables) == 2 * 20 * 30
