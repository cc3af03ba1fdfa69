"""Fast rank-1 LSTM vs edward2's LSTMCellRank1 in keras RNN: same cell (so same variables
and KL), same per-sequence noise -> same outputs."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from model.layers import factory
from model.layers.posterior import PosteriorConfig
from model.layers.rank1_lstm import Rank1LSTM

K, E, T, D, U = 2, 3, 5, 4, 6


def _inputs(seed=0):
    x = np.random.RandomState(seed).randn(E, T, D).astype(np.float32)
    return tf.constant(np.concatenate([x] * K, axis=0))


def _reference_samples(cell):
    """The samples edward2 drew in get_initial_state (one per sequence, reused every step)."""
    return {s: getattr(cell, f"{s}_sample") for s in ("alpha", "gamma", "recurrent_alpha", "recurrent_gamma")}


def _run_both(config, lengths=None):
    cell = factory.lstm_cell(U, config)
    reference = tf.keras.layers.RNN(cell, return_sequences=True, return_state=True)
    fast = Rank1LSTM(cell, return_sequences=True, return_state=True)
    x = _inputs()
    mask = None if lengths is None else tf.sequence_mask(lengths, T)
    ref = reference(x, mask=mask)
    noise = _reference_samples(cell) if fast.is_rank1 else None
    ours = fast(x, lengths=lengths, perturbations=noise)
    return cell, reference, fast, ref, ours, noise, x


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(use_additive_perturbation=True),
    dict(distribution="cauchy", dropout_rate=0.01),
    dict(method="batchensemble"),
    dict(alpha_initializer="trainable_deterministic"),  # mixed point-mass / stochastic sites
])
def test_fast_lstm_equals_edward2_reference_given_same_noise(kwargs):
    kwargs = dict(kwargs)
    config = PosteriorConfig(ensemble_size=K, dropout_rate=kwargs.pop("dropout_rate", 0.05), **kwargs)
    cell, reference, fast, ref, ours, _, _ = _run_both(config)
    for a, b in zip(ref, ours):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-5, atol=1e-5)
    # Shared cell: identical variables and identical KL.
    assert [id(v) for v in fast.trainable_variables] == [id(v) for v in reference.trainable_variables]
    if config.distribution == "normal":
        assert float(factory.kl_loss(fast)) == pytest.approx(float(factory.kl_loss(reference)), rel=1e-6)


def test_fast_lstm_masking_by_sequence_length_matches_masked_reference():
    lengths = tf.constant([5, 2, 1] * K)
    _, _, _, ref, ours, _, _ = _run_both(PosteriorConfig(ensemble_size=K), lengths=lengths)
    mask = tf.sequence_mask(lengths, T).numpy()
    # Final states: the state after each sequence's last valid step.
    np.testing.assert_allclose(ours[1].numpy(), ref[1].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours[2].numpy(), ref[2].numpy(), rtol=1e-5, atol=1e-5)
    # Valid outputs equal; padded outputs are zeros here.
    np.testing.assert_allclose(ours[0].numpy()[mask], ref[0].numpy()[mask], rtol=1e-5, atol=1e-5)
    assert np.all(ours[0].numpy()[~mask] == 0)


def test_padding_does_not_change_the_final_state():
    config = PosteriorConfig(ensemble_size=K)
    fast = factory.lstm(U, config)
    x = _inputs()
    fast.build(x.shape)
    noise = fast.sample_perturbations(K * E)
    short = fast(x[:, :3], perturbations=noise)
    padded = fast(x, lengths=tf.fill([K * E], 3), perturbations=noise)
    np.testing.assert_allclose(padded.numpy(), short.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kwargs", [dict(), dict(use_additive_perturbation=True), dict(method="deterministic")])
@pytest.mark.parametrize("return_sequences", [False, True])
def test_bfloat16_inference_path_stays_close_to_float32_and_keeps_masking(kwargs, return_sequences):
    config = PosteriorConfig(ensemble_size=1 if kwargs.get("method") else K, **kwargs)
    fast = factory.lstm(U, config, return_sequences=return_sequences, return_state=True)
    x = _inputs()
    rows = int(x.shape[0])
    fast.build(x.shape)
    noise = fast.sample_perturbations(rows)
    lengths = tf.constant(([5, 2, 1] * K)[:rows])
    exact = [t.numpy() for t in fast(x, lengths=lengths, perturbations=noise)]
    same = [t.numpy() for t in fast(x, lengths=lengths, perturbations=noise, matmul_dtype="float32")]
    low = [t.numpy() for t in tf.function(lambda: fast(x, lengths=lengths, perturbations=noise,
                                                        matmul_dtype="bfloat16"))()]
    for a, b, c in zip(exact, same, low):
        np.testing.assert_array_equal(b, a)  # "float32" is the exact path itself
        # bfloat16 operands keep 8 mantissa bits (relative 2^-9 per operand); states are O(1).
        np.testing.assert_allclose(c, a, rtol=0, atol=2e-2)
    assert max(np.abs(c - a).max() for a, c in zip(exact, low)) > 0  # bfloat16 really ran
    if return_sequences:
        mask = tf.sequence_mask(lengths, T).numpy()
        assert np.all(low[0][~mask] == 0)  # padded steps emit zeros and keep the state
        np.testing.assert_array_equal(low[1], low[0][np.arange(rows), lengths.numpy() - 1])



@pytest.mark.parametrize("return_sequences", [False, True])
def test_bfloat16_path_without_padding_skips_the_mask_and_equals_the_masked_loop(return_sequences):
    # All sequences at full length: the layer runs its unmasked loop. Shortening one row sends the
    # same batch through the masked loop; every other row must come out the same.
    fast = factory.lstm(U, PosteriorConfig(ensemble_size=K), return_sequences=return_sequences, return_state=True)
    x = _inputs()
    rows = int(x.shape[0])
    fast.build(x.shape)
    noise = fast.sample_perturbations(rows)
    run = tf.function(lambda lengths: fast(x, lengths=lengths, perturbations=noise, matmul_dtype="bfloat16"))
    full = [t.numpy() for t in run(tf.fill([rows], T))]
    short = [t.numpy() for t in run(tf.constant([T - 2] + [T] * (rows - 1)))]
    for a, b in zip(full, short):
        np.testing.assert_allclose(b[1:], a[1:], rtol=0, atol=1e-6)
    assert not np.allclose(short[-1][0], full[-1][0])  # the shortened row did stop early
def test_unknown_matmul_dtype_is_refused():
    fast = factory.lstm(U, PosteriorConfig(ensemble_size=K))
    with pytest.raises(ValueError, match="matmul_dtype"):
        fast(_inputs(), matmul_dtype="float16")


def test_deterministic_fast_lstm_equals_keras_lstm():
    cell = factory.lstm_cell(U, PosteriorConfig(method="deterministic"))
    reference = tf.keras.layers.RNN(cell, return_sequences=True)
    fast = Rank1LSTM(cell, return_sequences=True)
    x = _inputs()
    np.testing.assert_allclose(fast(x).numpy(), reference(x).numpy(), rtol=1e-5, atol=1e-5)
    assert fast.ensemble_size == 1 and not fast.is_rank1


def test_gradients_match_reference_and_reach_every_variable():
    config = PosteriorConfig(ensemble_size=K, dropout_rate=0.05)
    cell = factory.lstm_cell(U, config)
    reference = tf.keras.layers.RNN(cell)
    fast = Rank1LSTM(cell)
    x = _inputs()
    with tf.GradientTape(persistent=True) as tape:
        ref_out = reference(x)
        noise = _reference_samples(cell)
        ours = fast(x, perturbations=noise)
        ref_loss, our_loss = tf.reduce_sum(ref_out**2), tf.reduce_sum(ours**2)
    shared = [cell.kernel, cell.recurrent_kernel, cell.bias]
    for g_ref, g_ours in zip(tape.gradient(ref_loss, shared), tape.gradient(our_loss, shared)):
        np.testing.assert_allclose(g_ours.numpy(), g_ref.numpy(), rtol=1e-4, atol=1e-5)
    # With its own sampling, every posterior parameter (means and stddevs) gets a gradient.
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(fast(x) ** 2) + factory.kl_loss(fast)
    grads = tape.gradient(loss, fast.trainable_variables)
    assert all(g is not None and np.any(g.numpy() != 0) for g in grads), [v.name for v in fast.trainable_variables]


def test_sampled_perturbations_follow_the_member_posteriors():
    config = PosteriorConfig(ensemble_size=K, dropout_rate=0.2, random_sign_init=-0.5)
    fast = factory.lstm(U, config)
    fast.build([None, T, D])
    n = 3000
    draws = fast.sample_perturbations(K * n)
    init = fast.cell.recurrent_gamma_initializer
    mean, std = init.mean.numpy(), tf.nn.softplus(init.stddev).numpy()
    sample = draws["recurrent_gamma"].numpy().reshape(K, n, -1)  # row block k <-> member k
    np.testing.assert_allclose(sample.mean(axis=1), mean, atol=5 * std.max() / np.sqrt(n))
    np.testing.assert_allclose(sample.std(axis=1), std, rtol=0.1)
    assert {k: v.shape.as_list() for k, v in draws.items()} == {
        "alpha": [K * n, D], "gamma": [K * n, 4 * U], "recurrent_alpha": [K * n, U], "recurrent_gamma": [K * n, 4 * U]}


def test_each_sequence_draws_its_own_sample():
    fast = factory.lstm(U, PosteriorConfig(ensemble_size=K, dropout_rate=0.2))
    x = tf.constant(np.repeat(np.random.RandomState(0).randn(1, T, D), K * E, axis=0).astype(np.float32))
    y = fast(x).numpy()
    assert not np.allclose(y[0], y[1])  # same member, same input, different sample
    batchensemble = factory.lstm(U, PosteriorConfig(method="batchensemble", ensemble_size=K))
    y = batchensemble(x).numpy()
    np.testing.assert_allclose(y[0], y[1])  # point masses: only members differ
    assert not np.allclose(y[0], y[E])


def test_xla_compiled_forward_matches_eager():
    fast = factory.lstm(U, PosteriorConfig(ensemble_size=K), return_sequences=True)
    x = _inputs()
    fast.build(x.shape)
    noise = fast.sample_perturbations(K * E)
    lengths = tf.constant([5, 4, 2] * K)
    compiled = tf.function(lambda x, n, l: fast(x, lengths=l, perturbations=n), jit_compile=True)
    np.testing.assert_allclose(compiled(x, noise, lengths).numpy(), fast(x, lengths=lengths, perturbations=noise).numpy(),
                               rtol=1e-5, atol=1e-5)


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="dropout"):
        Rank1LSTM(tf.keras.layers.LSTMCell(4, dropout=0.1))
    with pytest.raises(TypeError, match="LSTMCell"):
        Rank1LSTM(tf.keras.layers.GRUCell(4))
