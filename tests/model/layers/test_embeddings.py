"""Stochastic embeddings: only looked-up rows are sampled, one draw per token per example."""
from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from model.layers import factory
from model.layers.embeddings import EmbeddingConfig, StochasticEmbedding

V, DIM = 50, 4


def _layer(**kwargs):
    layer = StochasticEmbedding(V, DIM, EmbeddingConfig(**kwargs))
    layer.build(None)
    return layer


def test_noise_is_drawn_only_for_looked_up_rows():
    layer = StochasticEmbedding(100_000, DIM)  # a vocabulary far larger than the batch
    ids = tf.constant([[1, 2, 3], [4, 5, 6]])
    layer(ids)
    graph = tf.function(layer.call).get_concrete_function(tf.TensorSpec([2, 3], tf.int32)).graph
    shapes = [op.outputs[0].shape.as_list() for op in graph.get_operations() if op.type == "RandomStandardNormal"]
    assert shapes == [[2, 3, DIM]]  # per looked-up token, never [V, DIM]


def test_each_token_occurrence_gets_an_independent_sample():
    layer = _layer(init_stddev=0.5)
    out = layer(tf.constant([[7, 7], [7, 3]])).numpy()
    assert out.shape == (2, 2, DIM)
    assert not np.allclose(out[0, 0], out[1, 0])  # different examples
    assert not np.allclose(out[0, 0], out[0, 1])  # same example, repeated token


def test_samples_follow_the_row_posterior():
    layer = _layer(init_stddev=0.3)
    n = 4000
    out = layer(tf.fill([n], 9)).numpy()
    np.testing.assert_allclose(out.mean(axis=0), layer.mean.numpy()[9], atol=5 * 0.3 / np.sqrt(n))
    np.testing.assert_allclose(out.std(axis=0), 0.3, rtol=0.1)


def test_kl_matches_direct_formula_over_the_whole_table():
    layer = _layer(prior_stddev=0.7, init_stddev=0.2)
    layer.raw_stddev.assign_add(np.random.RandomState(0).randn(V, DIM).astype(np.float32) * 0.2)
    mu, sigma = layer.mean.numpy(), np.log1p(np.exp(layer.raw_stddev.numpy()))
    expected = np.sum(np.log(0.7 / sigma) + (sigma**2 + mu**2) / (2 * 0.7**2) - 0.5)
    assert float(layer.kl_divergence()) == pytest.approx(expected, rel=1e-5)
    assert float(factory.kl_loss(layer)) == pytest.approx(expected, rel=1e-5)
    assert sum(float(v) for v in layer.losses) == pytest.approx(expected, rel=1e-5)


def test_deterministic_mode_is_a_plain_lookup():
    layer = _layer(stochastic=False)
    ids = tf.constant([[1, 2], [2, 1]])
    np.testing.assert_array_equal(layer(ids).numpy(), tf.gather(layer.mean, ids).numpy())
    assert float(factory.kl_loss(layer)) == 0.0 and layer.losses == []
    assert [v.name.split("/")[-1] for v in layer.trainable_variables] == ["mean:0"]


def test_pad_id_embeds_to_zero_and_gradients_stay_sparse():
    layer = _layer(pad_id=0, init_stddev=0.5)
    ids = tf.constant([[0, 4, 0], [5, 0, 0]])
    with tf.GradientTape() as tape:
        out = layer(ids)
        loss = tf.reduce_sum(out)
    assert np.all(out.numpy()[ids.numpy() == 0] == 0)
    grad = tape.gradient(loss, layer.mean)
    assert isinstance(grad, tf.IndexedSlices)  # only looked-up rows, no dense [V, D] update
    dense = tf.convert_to_tensor(grad).numpy()
    assert np.all(dense[0] == 0) and np.all(dense[4] == 1) and np.all(dense[[1, 2, 3]] == 0)


def test_ragged_ids_are_supported():
    layer = _layer()
    ids = tf.ragged.constant([[1, 2, 3], [4]])
    out = layer(ids)
    assert isinstance(out, tf.RaggedTensor) and out.flat_values.shape == (4, DIM)


@pytest.mark.parametrize("kwargs, match", [
    (dict(prior_stddev=0.0), "prior_stddev"),
    (dict(init_stddev=-1.0), "init_stddev"),
    (dict(mean_init_scale=float("inf")), "mean_init_scale"),
    (dict(pad_id=1.5), "pad_id"),
    (dict(stochastic="yes"), "stochastic"),
])
def test_config_validation(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        EmbeddingConfig(**kwargs)
    with pytest.raises(ValueError, match="pad_id"):
        StochasticEmbedding(10, 2, EmbeddingConfig(pad_id=10))
