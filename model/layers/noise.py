"""Explicit, stateless noise for seeded prediction: a key per example, passed through the layers.

A sampling layer takes ``noise=None`` in ``call``. Without it (training, ad-hoc use) the layer
draws with TensorFlow's stateful ops as before; with a ``Noise`` it draws every perturbation
from stateless ops keyed by that object, so a traced prediction graph depends only on its
inputs (the seed among them) and holds no hidden random state.

Batch independence. A perturbation with a batch axis is requested as ``[rows, *event]``, where
``rows`` is the tiled batch axis laid out the way every layer here lays it out: ``blocks``
repeats (members x samples) of the N examples, example i owning ``rows_per_example[i]``
consecutive rows of each block (1 for an LSTM state or a dense input; an admission's token
count for the embedding). Example i draws its own stream, keyed by (its key, the site) and
indexed by its *local* row (block b, own row j -> b * rows_i + j), so its noise does not depend
on which other examples share the batch. A perturbation without a batch axis (one weight matrix
for the whole batch) is keyed by (seed, site) alone, which is just as batch independent.

Sites. Every draw names its site (``fold_in("hidden").fold_in("alpha")``); the name, not the
order of calls, selects the stream, so layers may be traced in any order and two traces of one
model draw the same numbers. One site drawn twice gives the same numbers twice.
"""
from __future__ import annotations

import inspect
import math
import zlib

import tensorflow as tf

from model.layers._edward2 import ed

# Inverse-CDF Cauchy draws keep u in [CAUCHY_MIN_U, 1) so tan stays finite.
CAUCHY_MIN_U = 1e-7


def _site_id(name: str) -> int:
    # A stable 31-bit id (Python's hash() is salted per process).
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class Noise:
    """Stateless noise source of one seeded pass over N examples (immutable; ``fold_in`` derives sub-sites)."""

    def __init__(self, example_keys: tf.Tensor, seed: tf.Tensor, *, rows_per_example: tf.Tensor | None = None,
                 site: str = ""):
        self.example_keys = tf.convert_to_tensor(example_keys, tf.int64)  # [N, 2]
        self.seed = tf.convert_to_tensor(seed, tf.int64)  # scalar
        self.rows_per_example = None if rows_per_example is None else tf.cast(rows_per_example, tf.int32)
        self.site = site

    @classmethod
    def from_fingerprints(cls, fingerprints: tf.Tensor, seed: tf.Tensor) -> Noise:
        """Noise keyed by (seed, fingerprint) per example; fingerprints [N] int64."""
        fingerprints = tf.convert_to_tensor(fingerprints, tf.int64)
        seed = tf.convert_to_tensor(seed, tf.int64)
        return cls(tf.stack([tf.fill(tf.shape(fingerprints), seed), fingerprints], axis=1), seed)

    def fold_in(self, name: str | int) -> Noise:
        """The noise of a named sub-site (a layer, a factor, a member): independent of every other site."""
        return Noise(self.example_keys, self.seed, rows_per_example=self.rows_per_example,
                     site=f"{self.site}/{name}")

    def grouped(self, rows_per_example: tf.Tensor) -> Noise:
        """The same site with example i owning rows_per_example[i] consecutive rows of each block."""
        return Noise(self.example_keys, self.seed, rows_per_example=rows_per_example, site=self.site)

    # --- draws with a batch axis (per-example streams) ---------------------------------------

    def normal(self, rows, event_shape=(), dtype=tf.float32) -> tf.Tensor:
        """Standard normal [rows, *event_shape], one stream per example (see the module docstring)."""
        return self._per_example(rows, event_shape, dtype,
                                 lambda length, key: stateless_standard_normal(length, key, dtype))

    def uniform(self, rows, event_shape=(), dtype=tf.float32, minval=0, maxval=None) -> tf.Tensor:
        """Uniform [minval, maxval) [rows, *event_shape] (integer dtypes need maxval), one stream per example."""
        return self._per_example(rows, event_shape, dtype, lambda length, key: tf.random.stateless_uniform(
            [length], key, minval=minval, maxval=maxval, dtype=dtype))

    def signs(self, rows, event_shape=(), dtype=tf.float32) -> tf.Tensor:
        """Random +-1 [rows, *event_shape] (Flipout's sign vectors), one stream per example."""
        return tf.cast(2 * self.uniform(rows, event_shape, tf.int32, 0, 2) - 1, dtype)

    def _per_example(self, rows, event_shape, dtype, draw_flat) -> tf.Tensor:
        rows = tf.cast(rows, tf.int32)
        event_shape = [int(d) for d in event_shape]
        width = math.prod(event_shape)
        out_shape = tf.concat([[rows], event_shape], 0)
        n = tf.shape(self.example_keys)[0]
        site = _site_id(self.site)

        def streams(lengths, signature):
            # Stateless ops take one key per call (no batched-key kernel): one draw per example;
            # the network itself still runs once on the whole batch.
            return tf.map_fn(
                lambda args: tf.reshape(draw_flat(args[1] * width, tf.random.experimental.stateless_fold_in(
                    args[0], site)), [-1, width]),
                (self.example_keys, lengths), fn_output_signature=signature, parallel_iterations=16)

        if self.rows_per_example is None:
            # One row per example per block: example i's stream is its rows b = 0, 1, ... in order.
            blocks = rows // tf.maximum(n, 1)
            own = streams(tf.fill([n], blocks), tf.TensorSpec([None, width], dtype))  # [N, blocks, width]
            return tf.reshape(tf.transpose(own, [1, 0, 2]), out_shape)
        sizes = self.rows_per_example
        per_block = tf.maximum(tf.reduce_sum(sizes), 1)
        blocks = rows // per_block
        # Row r of the batch axis -> (example, local row): block b = r // C, offset o = r % C.
        r = tf.range(rows)
        b, o = r // per_block, r % per_block
        ends = tf.cumsum(sizes)
        owner = tf.searchsorted(ends, o, side="right", out_type=tf.int32)
        local = b * tf.gather(sizes, owner) + o - tf.gather(ends - sizes, owner)
        own = streams(blocks * sizes, tf.RaggedTensorSpec([None, width], dtype, ragged_rank=0))  # [N, (rows_i), width]
        first = tf.gather(tf.cast(own.row_starts(), tf.int32), owner)
        return tf.reshape(tf.gather(own.flat_values, first + local), out_shape)

    # --- draws without a batch axis (one for the whole pass) ---------------------------------

    def _static_key(self) -> tf.Tensor:
        return tf.random.experimental.stateless_fold_in(tf.stack([self.seed, tf.constant(0, tf.int64)]),
                                                        _site_id(self.site))

    def static_normal(self, shape, dtype=tf.float32) -> tf.Tensor:
        """Standard normal of a static shape, keyed by (seed, site) only (e.g. one weight-matrix draw)."""
        return tf.reshape(stateless_standard_normal(math.prod(shape), self._static_key(), dtype), shape)


# Box-Muller's first uniform stays in [BOX_MULLER_MIN_U, 1) so its log is finite (|z| <= 5.8).
BOX_MULLER_MIN_U = 2.0**-24


def stateless_standard_normal(n, key: tf.Tensor, dtype=tf.float32) -> tf.Tensor:
    """n standard normal draws [n] from one stateless key: Box-Muller on stateless uniforms.

    TensorFlow's own stateless normal kernel runs on one core: 5.8 ms for the 475k draws of a
    Table-7 LSTM's factors (100 rows), a seventh of the whole bfloat16 pass. The same Box-Muller
    transform as element-wise ops, which TensorFlow spreads over the cores, took 3.5 ms.
    """
    n = tf.cast(n, tf.int32)
    compute = tf.float64 if dtype == tf.float64 else tf.float32
    u = tf.random.stateless_uniform(tf.stack([2, (n + 1) // 2]), key, minval=BOX_MULLER_MIN_U, maxval=1.0,
                                    dtype=compute)
    radius = tf.sqrt(-2.0 * tf.math.log(u[0]))
    angle = (2.0 * math.pi) * u[1]
    return tf.cast(tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)[:n], dtype)


def standard_draw(family: str, noise: Noise | None, rows, width: int, dtype) -> tf.Tensor:
    """[rows, width] standard "normal" or "cauchy" draws: from `noise`, or stateful when it is None."""
    if family == "normal":
        if noise is None:
            return tf.random.normal(tf.stack([rows, width]), dtype=dtype)
        return noise.normal(rows, [width], dtype)
    if family != "cauchy":
        raise ValueError(f"family {family!r}: expected 'normal' or 'cauchy'")
    if noise is None:
        u = tf.random.uniform(tf.stack([rows, width]), minval=CAUCHY_MIN_U, maxval=1.0, dtype=dtype)
    else:
        u = noise.uniform(rows, [width], dtype, minval=CAUCHY_MIN_U, maxval=1.0)
    return tf.tan(math.pi * (u - 0.5))


def posterior_loc_scale(initializer) -> tuple[str, tf.Tensor, tf.Tensor]:
    """(family, loc, scale) of a built edward2 TrainableNormal / TrainableCauchy, constrained as edward2 does.

    Read from the variables: calling the initializer would build an ``ed.RandomVariable``,
    which draws its value statefully as soon as it is made.
    """
    if isinstance(initializer, ed.initializers.TrainableNormal):
        family = "normal"
        loc, loc_c, scale, scale_c = (initializer.mean, initializer.mean_constraint, initializer.stddev,
                                      initializer.stddev_constraint)
    elif isinstance(initializer, ed.initializers.TrainableCauchy):
        family = "cauchy"
        loc, loc_c, scale, scale_c = (initializer.loc, initializer.loc_constraint, initializer.scale,
                                      initializer.scale_constraint)
    else:
        raise TypeError(f"explicit noise cannot draw from a {type(initializer).__name__} posterior")
    loc = loc_c(loc) if loc_c else tf.convert_to_tensor(loc)
    scale = scale_c(scale) if scale_c else tf.convert_to_tensor(scale)
    return family, loc, scale


def call_sampling(layer: tf.keras.layers.Layer, *args, noise: Noise | None = None, **kwargs):
    """layer(*args, noise=noise) for a layer that samples (its call takes ``noise``), else layer(*args)."""
    if noise is not None and "noise" in inspect.signature(layer.call).parameters:
        kwargs["noise"] = noise
    return layer(*args, **kwargs)
