"""Image models: the tiled rank-1 convolution against a per-member computation with the drawn factors read
back, the sample-major layout, per-member batch norm, and the parameter counts of WRN-28-10."""
from __future__ import annotations

import types

import numpy as np
import pytest
import tensorflow as tf

from model.image.config import ImageModelConfig
from model.fit.training_loop import count_parameters
from model.image.models import EnsembleBatchNorm, ImageModel, build_model
from model.layers import factory
from model.layers._edward2 import ed
from model.layers.posterior import PosteriorConfig

K, E = 3, 2  # members, examples per member


class _Recorder(tf.keras.layers.Layer):
    """Stands in for a trainable posterior initializer and keeps every factor sample edward2 draws."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.samples = []

    def __call__(self, shape, dtype=None):  # the call Conv2DRank1 makes: init(shape, dtype).distribution.sample(n)
        distribution = self.inner(shape, dtype).distribution
        samples = self.samples

        def sample(n):
            value = distribution.sample(n)
            samples.append(value.numpy())
            return value

        return types.SimpleNamespace(distribution=types.SimpleNamespace(sample=sample))


def _tiled(x: np.ndarray) -> tf.Tensor:
    return tf.constant(np.concatenate([x] * K, axis=0), tf.float32)


@pytest.mark.parametrize("use_bias, stride", [(False, 2), (True, 1)])
def test_rank1_conv_tiled_forward_equals_per_member_convolution(use_bias, stride):
    """Row e of member k: ((x_e * r_ke) conv W) * s_ke + b_k, with r, s the draws of that row."""
    config = PosteriorConfig(method="rank1", ensemble_size=K, dropout_rate=0.05, random_sign_init=-0.5)
    layer = factory.conv2d(4, 3, config, strides=stride, padding="same", use_bias=use_bias)
    x = np.random.RandomState(0).randn(E, 6, 6, 2).astype(np.float32)
    layer(_tiled(x))  # build
    layer.alpha_initializer = _Recorder(layer.alpha_initializer)
    layer.gamma_initializer = _Recorder(layer.gamma_initializer)
    bias = np.random.RandomState(1).randn(K, 4).astype(np.float32)
    if use_bias:
        layer.ensemble_bias.assign(bias)
    y = layer(_tiled(x)).numpy()
    # Draws are [E, K, d]: one independent sample per example and member.
    alpha, gamma = layer.alpha_initializer.samples[-1], layer.gamma_initializer.samples[-1]
    assert alpha.shape == (E, K, 2) and gamma.shape == (E, K, 4)
    assert not np.allclose(alpha[0], alpha[1])  # examples of one member draw different factors
    kernel = layer.kernel.numpy()
    for k in range(K):
        for e in range(E):
            conv = tf.nn.conv2d(x[e:e + 1] * alpha[e, k], kernel, strides=stride, padding="SAME").numpy()[0]
            expected = conv * gamma[e, k] + (bias[k] if use_bias else 0.0)
            np.testing.assert_allclose(y[k * E + e], expected, rtol=1e-4, atol=1e-5)


def _tiny(method="rank1", k=K, **kwargs) -> ImageModelConfig:
    posterior = PosteriorConfig(method=method, ensemble_size=k, random_sign_init=-0.5, dropout_rate=0.01)
    return ImageModelConfig(depth=10, width=1, posterior=posterior, **kwargs)


@pytest.fixture(scope="module")
def images():
    return tf.constant(np.random.default_rng(0).random((5, 8, 8, 1)), tf.float32)


def test_every_conv_and_dense_comes_from_the_factory(monkeypatch):
    made = []
    for name in ("conv2d", "dense"):
        original = getattr(factory, name)
        monkeypatch.setattr(factory, name, lambda *a, _f=original, _n=name, **kw: made.append(_n) or _f(*a, **kw))
    model = build_model(_tiny("rank1"), (8, 8, 1), 10)
    convs = [m for m in model.submodules if isinstance(m, tf.keras.layers.Conv2D)]
    dense = [m for m in model.submodules if isinstance(m, (tf.keras.layers.Dense, ed.layers.DenseRank1))]
    # WRN-10-1: stem + 3 blocks x 2 convs + 2 projections, one classifier.
    assert made.count("conv2d") == len(convs) == 9 and made.count("dense") == len(dense) == 1
    assert all(isinstance(m, ed.layers.Conv2DRank1) for m in convs)
    assert isinstance(dense[0], ed.layers.DenseRank1)


def test_sample_major_layout_and_independent_examples(images):
    model = build_model(_tiny("batchensemble"), (8, 8, 1), 10)
    logits = model(images, num_samples=2).numpy()
    assert logits.shape == (5, 2 * K, 10)
    np.testing.assert_allclose(logits[:, :K], logits[:, K:], rtol=1e-5, atol=1e-5)  # no sampling: s = 0 == s = 1
    assert not np.allclose(logits[:, 0], logits[:, 1], atol=1e-3)  # members differ
    alone = model(images[2:3], num_samples=1).numpy()
    np.testing.assert_allclose(alone[0], logits[2, :K], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(model.predict_logits(images, 2).numpy(), logits, rtol=1e-5, atol=1e-5)


def test_rank1_samples_and_mc_dropout_differ_deterministic_does_not(images):
    rank1_model = build_model(_tiny("rank1"), (8, 8, 1), 10)
    logits = rank1_model(images, num_samples=2).numpy()
    assert not np.allclose(logits[:, :K], logits[:, K:], atol=1e-4)
    dropout = build_model(_tiny("deterministic", k=1, mc_dropout_rate=0.2), (8, 8, 1), 10)
    assert not np.allclose(dropout(images).numpy(), dropout(images).numpy())
    deterministic = build_model(_tiny("deterministic", k=1), (8, 8, 1), 10)
    np.testing.assert_array_equal(deterministic(images).numpy(), deterministic(images).numpy())


def test_ensemble_batch_norm_normalises_each_member_on_its_own():
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(3.0 * k, 1.0 + k, (4, 3, 3, 2)) for k in range(K)]).astype(np.float32)
    layer = EnsembleBatchNorm(K, momentum=0.5)
    layer(tf.constant(x), training=False)
    scales = rng.normal(1.0, 0.3, (K, 2)).astype(np.float32)
    for k, norm in enumerate(layer.norms):
        norm.gamma.assign(scales[k])
        norm.beta.assign(-scales[k])
    y = layer(tf.constant(x), training=True).numpy()
    for k in range(K):
        block = x[k * 4:(k + 1) * 4]
        mean, var = block.mean(axis=(0, 1, 2)), block.var(axis=(0, 1, 2))
        expected = (block - mean) / np.sqrt(var + layer.norms[k].epsilon) * scales[k] - scales[k]
        np.testing.assert_allclose(y[k * 4:(k + 1) * 4], expected, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(layer.norms[k].moving_mean.numpy(), 0.5 * mean, rtol=1e-4)


def test_per_member_batch_norm_parameters_and_layout(images):
    shared = count_parameters(build_model(_tiny("batchensemble"), (8, 8, 1), 10))
    model = build_model(_tiny("batchensemble", batch_norm="per_member"), (8, 8, 1), 10)
    per_member = count_parameters(model)
    logits = model.predict_logits(images, 2).numpy()  # S*K row blocks split into K member blocks of S*B rows
    np.testing.assert_allclose(logits[:, :K], logits[:, K:], rtol=1e-5, atol=1e-5)
    # WRN-10-1's norms: 3 blocks x 2 + the final one, over 16 / 16,32 / 32,64 / 64 channels; 2 parameters each.
    channels = 16 + 16 + 16 + 32 + 32 + 64 + 64
    assert per_member - shared == (K - 1) * 2 * channels


def test_wrn28_10_parameters_and_rank1_overhead_under_one_percent():
    """Paper, Table 2: 36.5M (deterministic) vs 36.6M (rank-1, K = 4)."""
    counts = {}
    for method in ("deterministic", "rank1"):
        posterior = PosteriorConfig(method=method, ensemble_size=1 if method == "deterministic" else 4)
        counts[method] = count_parameters(build_model(ImageModelConfig(posterior=posterior), (32, 32, 3), 10))
    assert 36.4e6 < counts["deterministic"] < 36.55e6
    assert 36.55e6 < counts["rank1"] < 36.7e6
    assert (counts["rank1"] - counts["deterministic"]) / counts["deterministic"] < 0.01


def test_resnet18_is_the_standard_cifar_resnet18():
    config = ImageModelConfig(architecture="resnet", depth=18, width=4,
                              posterior=PosteriorConfig(method="deterministic", ensemble_size=1))
    model = build_model(config, (32, 32, 3), 10)
    assert count_parameters(model) == 11_173_962  # the usual CIFAR ResNet-18 (64-128-256-512, 10 classes)
    assert model(tf.zeros((2, 32, 32, 3))).shape == (2, 1, 10)
    assert isinstance(model, ImageModel)


@pytest.mark.parametrize("kwargs, match", [
    (dict(depth=12), "6n \\+ 4"),
    (dict(architecture="resnet", depth=20), "resnet depth"),
    (dict(posterior=PosteriorConfig(method="deterministic", ensemble_size=2)), "ensemble_size must be 1"),
    (dict(mc_dropout_rate=0.1), "MC-dropout"),
])
def test_model_config_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ImageModelConfig(**kwargs)
