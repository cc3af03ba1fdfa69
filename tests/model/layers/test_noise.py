"""Explicit noise (model.layers.noise): per-example streams, and every sampling layer's noise path against
a manual computation from the layer's own variables and the same draws."""
from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
import tensorflow as tf

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from model.layers import factory
from model.layers._edward2 import ed
from model.layers.embeddings import StochasticEmbedding
from model.layers.noise import BOX_MULLER_MIN_U, Noise, standard_draw, stateless_standard_normal
from model.layers.posterior import PosteriorConfig
from model.layers.rank1_lstm import Rank1LSTM

FINGERPRINTS = [11, 22, 33]


def _noise(fingerprints=FINGERPRINTS, seed=5) -> Noise:
    return Noise.from_fingerprints(tf.constant(fingerprints, tf.int64), tf.constant(seed, tf.int64))


def _rows_of(example: int, sizes: list[int], blocks: int) -> np.ndarray:
    """Indices of example's rows in a batch of `blocks` blocks, each holding sizes[i] rows of example i."""
    start, per_block = sum(sizes[:example]), sum(sizes)
    return np.array([b * per_block + start + j for b in range(blocks) for j in range(sizes[example])], int)


@pytest.mark.parametrize("sizes", [None, [2, 0, 3]])
def test_an_example_draws_the_same_rows_alone_and_in_any_batch(sizes):
    blocks, event = 4, [3]
    noise = _noise().fold_in("site")
    if sizes is not None:
        noise = noise.grouped(tf.constant(sizes))
    own = sizes or [1, 1, 1]
    batch = noise.normal(blocks * sum(own), event).numpy()
    assert batch.shape == (blocks * sum(own), 3)
    for i, fingerprint in enumerate(FINGERPRINTS):
        alone = _noise([fingerprint]).fold_in("site")
        if sizes is not None:
            alone = alone.grouped(tf.constant([own[i]]))
        np.testing.assert_array_equal(alone.normal(blocks * own[i], event).numpy(), batch[_rows_of(i, own, blocks)])
    # Reordering the batch only moves an example's rows.
    order = [2, 0, 1]
    reordered = _noise([FINGERPRINTS[i] for i in order]).fold_in("site")
    if sizes is not None:
        reordered = reordered.grouped(tf.constant([own[i] for i in order]))
    moved = reordered.normal(blocks * sum(own), event).numpy()
    for j, i in enumerate(order):
        np.testing.assert_array_equal(moved[_rows_of(j, [own[i] for i in order], blocks)],
                                      batch[_rows_of(i, own, blocks)])


def test_sites_and_seeds_select_independent_streams_and_a_site_repeats_itself():
    noise = _noise()
    a = noise.fold_in("a").normal(6, [4]).numpy()
    np.testing.assert_array_equal(noise.fold_in("a").normal(6, [4]).numpy(), a)
    assert not np.allclose(noise.fold_in("b").normal(6, [4]).numpy(), a)
    assert not np.allclose(_noise(seed=6).fold_in("a").normal(6, [4]).numpy(), a)
    # Static draws (no batch axis) depend on the seed and the site only, not on the examples.
    np.testing.assert_array_equal(_noise([1]).fold_in("w").static_normal([3, 2]).numpy(),
                                  _noise([7, 8]).fold_in("w").static_normal([3, 2]).numpy())
    signs = noise.signs(300, [5]).numpy()
    assert set(np.unique(signs)) == {-1.0, 1.0}
    u = noise.uniform(300, [5], minval=2.0, maxval=3.0).numpy()
    assert u.min() >= 2.0 and u.max() < 3.0
    z = noise.fold_in("moments").normal(3000, [10]).numpy()
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03


def test_stateless_standard_normal_is_box_muller_of_the_keys_uniforms_and_standard_normal():
    key = tf.constant([3, 4], tf.int64)
    z = stateless_standard_normal(7, key).numpy()
    # By NumPy from the same key's uniforms: radius from the first row, angle from the second.
    u = tf.random.stateless_uniform([2, 4], key, minval=BOX_MULLER_MIN_U, maxval=1.0).numpy().astype(np.float64)
    radius, angle = np.sqrt(-2 * np.log(u[0])), 2 * np.pi * u[1]
    np.testing.assert_allclose(z, np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:7],
                               rtol=1e-5, atol=1e-6)
    big = stateless_standard_normal(200_000, key).numpy()
    assert stats.kstest(big, "norm").pvalue > 1e-3
    assert np.isfinite(big).all() and np.abs(big).max() <= np.sqrt(-2 * np.log(BOX_MULLER_MIN_U)) + 1e-5
    assert stateless_standard_normal(6, key, tf.float64).dtype == tf.float64


K, E, D, U = 2, 3, 4, 5  # members, examples, input dim, units


@pytest.mark.parametrize("distribution", ["normal", "cauchy"])
def test_rank1_dense_with_noise_equals_the_per_member_computation(distribution):
    config = PosteriorConfig(ensemble_size=K, distribution=distribution, dropout_rate=0.05)
    layer = factory.dense(U, config, name="hidden")
    x = np.random.RandomState(0).randn(K * E, D).astype(np.float32)
    layer(x)
    layer.ensemble_bias.assign(np.random.RandomState(1).randn(K, U).astype(np.float32))
    noise = _noise()
    y = layer(x, noise=noise).numpy()
    np.testing.assert_array_equal(layer(x, noise=noise).numpy(), y)  # no hidden state: same draw again

    def factor(site):
        init = getattr(layer, f"{site}_initializer")
        loc = (init.mean if distribution == "normal" else init.loc).numpy()
        raw = (init.stddev if distribution == "normal" else init.scale).numpy()
        eps = standard_draw(distribution, noise.fold_in("hidden").fold_in(site), K * E, loc.shape[-1], tf.float32)
        # One draw per row of the tiled batch; edward2 clips the factors to [-10, 10].
        return np.clip(np.repeat(loc, E, axis=0) + np.repeat(np.log1p(np.exp(raw)), E, axis=0) * eps.numpy(),
                       -10, 10)

    alpha, gamma = factor("alpha"), factor("gamma")
    bias = np.repeat(layer.ensemble_bias.numpy(), E, axis=0)
    expected = ((x * alpha) @ layer.kernel.numpy()) * gamma + bias
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert not np.allclose(layer(x, noise=_noise(seed=9)).numpy(), y)


def test_rank1_lstm_with_noise_uses_the_same_factor_layout():
    config = PosteriorConfig(ensemble_size=K, dropout_rate=0.05)
    lstm = factory.lstm(3, config, name="lstm")
    x = tf.constant(np.random.RandomState(0).randn(K * E, 4, D), tf.float32)
    lstm(x)
    noise = _noise()
    out = lstm(x, noise=noise)
    cell = lstm.cell
    sites = ("alpha", "gamma", "recurrent_alpha", "recurrent_gamma")
    loc = tf.concat([getattr(cell, f"{s}_initializer").mean for s in sites], axis=-1)
    scale = tf.concat([tf.nn.softplus(getattr(cell, f"{s}_initializer").stddev) for s in sites], axis=-1)
    eps = standard_draw("normal", noise.fold_in("lstm/normal"), K * E, loc.shape[-1], tf.float32)
    draw = tf.repeat(loc, E, axis=0) + tf.repeat(scale, E, axis=0) * eps
    p = dict(zip(sites, tf.split(draw, [s[-1] for s in (cell.alpha_shape, cell.gamma_shape,
                                                         cell.recurrent_alpha_shape, cell.recurrent_gamma_shape)],
                                 axis=-1)))
    np.testing.assert_allclose(out.numpy(), lstm(x, perturbations=p).numpy(), rtol=1e-6, atol=1e-6)
    # A factor posterior that explicit noise cannot draw is refused, not drawn statefully.
    other = Rank1LSTM(ed.layers.LSTMCellRank1(3, ensemble_size=K, alpha_initializer="trainable_log_normal"))
    other(tf.zeros([K, 2, D]))
    with pytest.raises(ValueError, match="explicit noise"):
        other.sample_perturbations(K, noise)


def test_stochastic_embedding_with_noise_draws_per_token_rows():
    layer = StochasticEmbedding(7, 3, name="emb")
    ids = tf.constant([1, 4, 4, 6, 0])
    layer(ids)
    # Tokens of the three examples: 2, 1 and 2 consecutive ids.
    noise = _noise().grouped(tf.constant([2, 1, 2]))
    out = layer(ids, noise=noise).numpy()
    eps = noise.fold_in("emb").normal(5, [3]).numpy()
    expected = tf.gather(layer.mean, ids).numpy() + tf.gather(layer.stddev(), ids).numpy() * eps
    np.testing.assert_allclose(out, expected, rtol=1e-6, atol=1e-7)
    # The same token twice draws two samples.
    assert not np.allclose(out[1], out[2])


def _ktied_config() -> PosteriorConfig:
    return PosteriorConfig(method="ktied_normal", ensemble_size=1, ktied_rank=2, dropout_rate=0.05)


def _weights(init, noise: Noise) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sample) of a k-tied kernel: mean + (U V^T) * eps, by NumPy from the variables."""
    mean = init.mean.numpy()
    stddev = (np.exp(init.log_u.numpy()) @ np.exp(init.log_v.numpy()).T).reshape(mean.shape)
    return mean, mean + stddev * noise.static_normal(mean.shape).numpy()


def test_flipout_dense_with_noise_equals_the_manual_computation():
    layer = factory.dense(U, _ktied_config(), name="head")
    x = np.random.RandomState(0).randn(E, D).astype(np.float32)
    layer(x)
    noise = _noise()
    mean, kernel = _weights(layer.kernel_initializer, noise.fold_in("head/kernel"))
    sign_in = noise.fold_in("head/sign_in").signs(E, [D]).numpy()
    sign_out = noise.fold_in("head/sign_out").signs(E, [U]).numpy()
    expected = x @ mean + ((x * sign_in) @ (kernel - mean)) * sign_out + layer.bias.numpy()
    np.testing.assert_allclose(layer(x, noise=noise).numpy(), expected, rtol=1e-5, atol=1e-5)


def test_flipout_lstm_cell_with_explicit_draws_equals_edward2s_own_step():
    cell = factory.lstm_cell(U, _ktied_config(), name="cell")
    rnn = tf.keras.layers.RNN(cell)
    x = tf.constant(np.random.RandomState(0).randn(E, 4, D), tf.float32)
    rnn(x)
    draws = cell.explicit_draws(_noise(), E, tf.float32)
    zeros = tf.zeros([E, U])
    ours = rnn(x, initial_state=[zeros, zeros], constants=draws).numpy()
    # edward2's step reads the same weights and signs from the cell's attributes.
    kernel_mean, kernel, rec_mean, rec = draws[:4]
    np.testing.assert_allclose(kernel_mean.numpy(), cell.kernel_initializer.mean.numpy())
    cell.kernel = ed.RandomVariable(cell.kernel_initializer(kernel.shape).distribution, value=kernel)
    cell.recurrent_kernel = ed.RandomVariable(cell.recurrent_initializer(rec.shape).distribution, value=rec)
    cell.sign_input, cell.sign_output, cell.recurrent_sign_input, cell.recurrent_sign_output = draws[4:]
    cell.called_weights = True
    state = [zeros, zeros]
    for t in range(x.shape[1]):
        h, state = ed.layers.LSTMCellFlipout.call(cell, x[:, t], state)
    np.testing.assert_allclose(ours, h.numpy(), rtol=1e-5, atol=1e-6)
