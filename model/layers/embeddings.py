"""Stochastic code embeddings: a mean-field Gaussian table sampled only where it is looked up.

The paper keeps Dusenberry et al. (2019)'s variational embeddings and shares them across
the K mixture members (Section 4.4): one embedding posterior q(E) = prod N(mu, sigma^2)
with a N(0, prior_stddev^2) prior, no rank-1 factors.

Why not edward2's EmbeddingReparameterization: it samples the whole [V, D] table once per
call and shares that sample across the batch, so its cost grows with the vocabulary and
every example sees the same noise. Here only the looked-up rows are gathered and one
independent sample is drawn per looked-up token per example (local reparameterisation
for a lookup), so the cost is proportional to the tokens in the batch. The KL is over the
whole table (that is the ELBO term), computed analytically.

Sharing across members: the layer knows nothing about K. Call it on the untiled batch and
tile the result to share one embedding sample across members (K times cheaper), or call it
on the tiled batch to give each member its own sample; both are unbiased ELBO estimates.
"""
from __future__ import annotations

import math
from typing import Annotated

import tensorflow as tf
from pydantic import BaseModel, ConfigDict, Field

_PosFinite = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]

from model.layers.noise import Noise


class EmbeddingConfig(BaseModel):
    """Embedding posterior: stochastic (mean-field Gaussian) or a deterministic table.

    prior_stddev: stddev of the N(0, prior_stddev^2) prior on every table entry.
    init_stddev: initial posterior stddev (softplus of the raw parameter).
    mean_init_scale: means start uniform in [-s, s] (Keras Embedding's default is 0.05).
    pad_id: id whose embedding is exactly zero (no noise, no gradient); None: no padding id.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    stochastic: Annotated[bool, Field(strict=True)] = True
    prior_stddev: _PosFinite = 1.0
    init_stddev: _PosFinite = 1e-3
    mean_init_scale: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.05
    pad_id: Annotated[int, Field(strict=True)] | None = None


class StochasticEmbedding(tf.keras.layers.Layer):
    """Looks up ids of any shape (dense or ragged) -> [..., output_dim] embedding samples."""

    def __init__(self, vocab_size: int, output_dim: int, config: EmbeddingConfig | None = None, **kwargs):
        super().__init__(**kwargs)
        if vocab_size < 1 or output_dim < 1:
            raise ValueError(f"vocab_size and output_dim must be >= 1, got {vocab_size}, {output_dim}")
        self.config = config if config is not None else EmbeddingConfig()
        if self.config.pad_id is not None and not 0 <= self.config.pad_id < vocab_size:
            raise ValueError(f"pad_id {self.config.pad_id} is outside the vocabulary [0, {vocab_size})")
        self.vocab_size = vocab_size
        self.output_dim = output_dim

    def build(self, input_shape):
        shape = [self.vocab_size, self.output_dim]
        s = self.config.mean_init_scale
        self.mean = self.add_weight(
            name="mean", shape=shape, initializer=tf.keras.initializers.RandomUniform(-s, s), trainable=True)
        if self.config.stochastic:
            x = self.config.init_stddev
            raw = x + math.log(-math.expm1(-x))  # softplus^-1(init_stddev)
            self.raw_stddev = self.add_weight(
                name="stddev", shape=shape, initializer=tf.keras.initializers.Constant(raw), trainable=True)
            # Like edward2's layers, expose the (unscaled) KL in self.losses; kl_loss() gathers it.
            self.add_loss(self.kl_divergence)
        super().build(input_shape)

    def stddev(self) -> tf.Tensor:
        """Posterior stddev of the whole table, softplus(raw)."""
        return tf.nn.softplus(self.raw_stddev)

    def kl_divergence(self) -> tf.Tensor:
        """Analytic KL(q(table) || N(0, prior_stddev^2)) summed over every entry."""
        if not self.config.stochastic:
            return tf.constant(0.0, self.dtype)
        sigma = self.stddev()
        prior = tf.constant(self.config.prior_stddev, self.dtype)
        return tf.reduce_sum(
            tf.math.log(prior) - tf.math.log(sigma) + (tf.square(sigma) + tf.square(self.mean)) / (2 * prior**2) - 0.5)

    def _lookup(self, ids: tf.Tensor, noise: Noise | None) -> tf.Tensor:
        rows = tf.gather(self.mean, ids)
        if self.config.stochastic:
            # Noise only for the gathered rows: one independent draw per token occurrence.
            scale = tf.nn.softplus(tf.gather(self.raw_stddev, ids))
            if noise is None:
                eps = tf.random.normal(tf.shape(rows), dtype=rows.dtype)
            else:
                eps = tf.reshape(noise.normal(tf.size(ids), [self.output_dim], rows.dtype), tf.shape(rows))
            rows = rows + scale * eps
        if self.config.pad_id is not None:
            keep = tf.cast(tf.not_equal(ids, self.config.pad_id), rows.dtype)[..., None]
            rows = rows * keep
        return rows

    def call(self, ids, noise: Noise | None = None):
        """Embedding samples of `ids`; noise: explicit draws (model.layers.noise), one row per id in flat order."""
        if noise is not None:
            noise = noise.fold_in(self.name)
        if isinstance(ids, tf.RaggedTensor):
            return tf.ragged.map_flat_values(self._lookup, ids, noise)
        return self._lookup(tf.convert_to_tensor(ids), noise)
