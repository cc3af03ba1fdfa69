"""Gaussian posteriors over whole weight matrices: mean field and the k-tied Normal (paper 003).

Both families put an independent Normal on every kernel entry, N(mu_ij, sigma_ij^2), and
differ only in how the stddev matrix A = [sigma_ij] is parameterised:

  mean field     A = softplus(rho), one free parameter per weight (m*n of them);
  k-tied Normal  A = U V^T with U = exp(log_u) (m x k) and V = exp(log_v) (n x k), so
                 k (m + n) parameters (paper 003, Eq. 8). Every entry of U and V is
                 positive, hence every sigma_ij is, for any values of log_u and log_v.

A kernel with more than two axes (a conv kernel [h, w, c_in, c_out], the LSTM's [d, 4u])
is the matrix [prod(leading axes), last axis] (paper 003, Appendix D.3): all weights of
one output filter share a column of A.

Both families plug into the same edward2 layers as trainable initializers (a Keras layer
that returns an ``ed.RandomVariable``), so they share the Flipout estimator, the KL
against the zero-mean Normal prior ``N(0, prior_stddev^2)`` (analytic, elementwise: the
k-tied stddev matrix is materialised once, O(mn) memory, never the mn x mn covariance)
and the KL annealing of the trainers. ``model.layers.factory`` registers them as the posteriors
"mean_field" and "ktied_normal".
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np
import tensorflow as tf

from model.layers._edward2 import ed
from model.layers.noise import Noise
from model.layers.posterior import PosteriorConfig, softplus_inverse

# Noise on the initial log factors breaks the symmetry between the k columns (App. D.4).
KTIED_INIT_LOG_JITTER = 0.1


class TrainableKTiedNormal(tf.keras.layers.Layer):
    """k-tied Normal as an edward2 initializer: W ~ N(mean, diag(vec((U V^T)^2))), U, V > 0.

    Initialisation (paper 003, App. D.4): log_u and log_v start at
    0.5 (log(init_stddev) - log(k)) plus N(0, jitter^2) noise; the -jitter^2 / 2 shift of
    each makes E[sigma_ij] = init_stddev exactly, the mean-field starting value.
    """

    def __init__(self, rank: int, init_stddev: float, mean_initializer="glorot_uniform",
                 log_jitter: float = KTIED_INIT_LOG_JITTER, **kwargs):
        super().__init__(**kwargs)
        if rank < 1:
            raise ValueError(f"k-tied rank must be >= 1, got {rank}")
        self.rank = rank
        self.init_stddev = init_stddev
        self.mean_initializer = tf.keras.initializers.get(mean_initializer)
        self.log_jitter = log_jitter

    def build(self, shape, dtype=None):
        shape = tf.TensorShape(shape)
        rows, cols = matrix_shape(shape)
        log_init = 0.5 * (math.log(self.init_stddev) - math.log(self.rank)) - 0.5 * self.log_jitter ** 2
        dtype = dtype or self.dtype
        self.mean = self.add_weight("mean", shape=shape, initializer=self.mean_initializer, dtype=dtype)
        # A fresh initializer per factor: one unseeded Keras initializer repeats its draws.
        self.log_u, self.log_v = (
            self.add_weight(name, shape=[size, self.rank], dtype=dtype,
                            initializer=tf.keras.initializers.RandomNormal(mean=log_init, stddev=self.log_jitter))
            for name, size in (("log_u", rows), ("log_v", cols)))
        self.built = True

    def stddev_matrix(self) -> tf.Tensor:
        """A = U V^T, [rows, cols]: the stddev of every weight (units of the weights)."""
        return tf.matmul(tf.exp(self.log_u), tf.exp(self.log_v), transpose_b=True)

    def __call__(self, shape, dtype=None):
        if not self.built:
            self.build(shape, dtype)
        scale = tf.reshape(self.stddev_matrix(), tf.shape(self.mean))
        return ed.Independent(ed.Normal(loc=self.mean, scale=scale).distribution,
                              reinterpreted_batch_ndims=len(self.mean.shape))

    def get_config(self):
        return {"rank": self.rank, "init_stddev": self.init_stddev, "log_jitter": self.log_jitter,
                "mean_initializer": tf.keras.initializers.serialize(self.mean_initializer)}


def matrix_shape(shape) -> tuple[int, int]:
    """(m, n) of a kernel seen as a matrix: all leading axes flattened, the last axis kept."""
    dims = [int(d) for d in tf.TensorShape(shape)]
    if len(dims) < 2:
        raise ValueError(f"a weight posterior needs a kernel of rank >= 2, got shape {dims}")
    return int(np.prod(dims[:-1])), dims[-1]


# --- posteriors: (config, mean initializer) -> (edward2 initializer, KL regularizer) ------------

def _prior(config: PosteriorConfig):
    # Zero-mean weight prior (prior_mean is the rank-1 factors' prior location, not the weights').
    return ed.regularizers.NormalKLDivergence(mean=0.0, stddev=config.prior_stddev)


def mean_field(config: PosteriorConfig, mean_initializer) -> tuple[Any, Any]:
    """(initializer, KL regularizer) of a mean-field Gaussian weight matrix."""
    raw = tf.keras.initializers.Constant(softplus_inverse(config.init_stddev))
    init = ed.initializers.TrainableNormal(mean_initializer=mean_initializer, stddev_initializer=raw,
                                           stddev_constraint="softplus")
    return init, _prior(config)


def ktied_normal(config: PosteriorConfig, mean_initializer) -> tuple[Any, Any]:
    """(initializer, KL regularizer) of a k-tied Normal weight matrix, k = config.ktied_rank."""
    return TrainableKTiedNormal(config.ktied_rank, config.init_stddev, mean_initializer), _prior(config)


Posterior = Callable[[PosteriorConfig, Any], tuple[Any, Any]]


def stddev_matrix(initializer: tf.keras.layers.Layer) -> tf.Tensor:
    """The [m, n] matrix of posterior stddevs of a built mean-field or k-tied initializer."""
    if isinstance(initializer, TrainableKTiedNormal):
        return initializer.stddev_matrix()
    if isinstance(initializer, ed.initializers.TrainableNormal):
        rows, cols = matrix_shape(initializer.stddev.shape)
        return tf.reshape(initializer.stddev_constraint(initializer.stddev), [rows, cols])
    raise TypeError(f"no stddev matrix for {type(initializer).__name__}")


# --- layers ---------------------------------------------------------------------------

def _random_signs(shape, dtype) -> tf.Tensor:
    # Integer draws: edward2 0.0.2's float uniform in [0, 2) gives 2u - 1 in [-1, 3), not +-1.
    return tf.cast(2 * tf.random.uniform(shape, 0, 2, dtype=tf.int32) - 1, dtype)


def _kernel_draw(initializer, noise: Noise) -> tuple[tf.Tensor, tf.Tensor]:
    """(posterior mean, one explicit sample) of a Gaussian weight matrix; one draw for the whole pass."""
    loc = tf.convert_to_tensor(initializer.mean)
    scale = tf.reshape(stddev_matrix(initializer), tf.shape(loc))
    return loc, loc + scale * noise.static_normal(loc.shape, loc.dtype)


class DenseFlipout(ed.layers.DenseFlipout):
    """edward2 0.0.2's DenseFlipout with +-1 sign vectors (upstream's have mean 1, biasing the estimator).

    ``call(x, noise=...)`` draws the kernel and the sign vectors from explicit noise (model.layers.noise;
    x [rows, d], rows laid out as that module describes).
    """

    def call(self, inputs, noise: Noise | None = None):
        if not isinstance(self.kernel, ed.RandomVariable):
            return super().call(inputs)
        if noise is None:
            self.call_weights()
            shape = tf.shape(inputs)
            out_shape = tf.concat([shape[:-1], [self.units]], 0)
            mean, kernel = self.kernel.distribution.mean(), self.kernel
            sign_in, sign_out = _random_signs(shape, inputs.dtype), _random_signs(out_shape, inputs.dtype)
        else:
            noise = noise.fold_in(self.name)
            mean, kernel = _kernel_draw(self.kernel_initializer, noise.fold_in("kernel"))
            rows = tf.shape(inputs)[0]
            sign_in = noise.fold_in("sign_in").signs(rows, inputs.shape[1:], inputs.dtype)
            sign_out = noise.fold_in("sign_out").signs(rows, [self.units], inputs.dtype)
        outputs = tf.matmul(inputs, mean) + tf.matmul(inputs * sign_in, kernel - mean) * sign_out
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        return self.activation(outputs) if self.activation is not None else outputs


class Conv2DFlipout(ed.layers.Conv2DReparameterization):
    """Flipout 2-D convolution (channels_last): edward2 0.0.2's own Conv2DFlipout misses its conv op."""

    def call(self, inputs):
        if not isinstance(self.kernel, ed.RandomVariable):
            return super().call(inputs)
        self.call_weights()
        conv = functools.partial(tf.nn.convolution, strides=self.strides, padding=self.padding.upper(),
                                 dilations=self.dilation_rate)
        batch = tf.shape(inputs)[0]
        sign_in = _random_signs(tf.stack([batch, 1, 1, tf.shape(inputs)[-1]]), inputs.dtype)
        sign_out = _random_signs(tf.stack([batch, 1, 1, self.filters]), inputs.dtype)
        mean = self.kernel.distribution.mean()
        outputs = conv(inputs, mean) + conv(inputs * sign_in, self.kernel - mean) * sign_out
        if self.use_bias:
            outputs = tf.nn.bias_add(outputs, self.bias)
        return self.activation(outputs) if self.activation is not None else outputs


class LSTMCellFlipout(ed.layers.LSTMCellFlipout):
    """edward2's Flipout LSTM cell that can also take its weights and signs as RNN ``constants``.

    edward2 draws them statefully in ``get_initial_state``; for an explicit draw call
    ``RNN(cell)(x, initial_state=..., constants=cell.explicit_draws(noise, batch, dtype))``.
    The step is edward2's (implementation 2): x K + ((x s_in) dK) s_out + h R + ((h r_in) dR) r_out + b.
    """

    def explicit_draws(self, noise: Noise, batch_size, dtype) -> list[tf.Tensor]:
        """[kernel mean, kernel, recurrent mean, recurrent kernel, 4 sign matrices] drawn from `noise`."""
        noise = noise.fold_in(self.name)
        kernel_mean, kernel = _kernel_draw(self.kernel_initializer, noise.fold_in("kernel"))
        rec_mean, rec = _kernel_draw(self.recurrent_initializer, noise.fold_in("recurrent_kernel"))
        widths = {"sign_input": kernel.shape[0], "sign_output": 4 * self.units,
                  "recurrent_sign_input": self.units, "recurrent_sign_output": 4 * self.units}
        signs = [noise.fold_in(name).signs(batch_size, [width], dtype) for name, width in widths.items()]
        return [kernel_mean, kernel, rec_mean, rec, *signs]

    def call(self, inputs, states, training=None, constants=None):
        if constants is None:
            return super().call(inputs, states, training)
        kernel_mean, kernel, rec_mean, rec, sign_in, sign_out, rec_sign_in, rec_sign_out = constants
        h, c = states[0], states[1]
        z = (tf.matmul(inputs, kernel_mean) + tf.matmul(inputs * sign_in, kernel - kernel_mean) * sign_out
             + tf.matmul(h, rec_mean) + tf.matmul(h * rec_sign_in, rec - rec_mean) * rec_sign_out)
        if self.use_bias:
            z = tf.nn.bias_add(z, self.bias)
        z_i, z_f, z_c, z_o = tf.split(z, 4, axis=1)
        c = self.recurrent_activation(z_f) * c + self.recurrent_activation(z_i) * self.activation(z_c)
        h = self.recurrent_activation(z_o) * self.activation(c)
        return h, [h, c]


def dense(posterior: Posterior, units, config, *, activation, use_bias, name):
    """A Flipout dense layer whose kernel carries `posterior`."""
    init, reg = posterior(config, tf.keras.initializers.GlorotUniform())
    return DenseFlipout(units, activation=activation, use_bias=use_bias, kernel_initializer=init,
                        kernel_regularizer=reg, name=name)


def conv2d(posterior: Posterior, filters, kernel_size, config, *, strides, padding, activation, use_bias, name):
    """A Flipout conv layer whose kernel (as the matrix [h*w*c_in, filters]) carries `posterior`."""
    init, reg = posterior(config, tf.keras.initializers.GlorotUniform())
    return Conv2DFlipout(filters, kernel_size, strides=strides, padding=padding, activation=activation,
                         use_bias=use_bias, kernel_initializer=init, kernel_regularizer=reg, name=name)


def lstm_cell(posterior: Posterior, units, config, *, name):
    """edward2's Flipout LSTM cell; kernel and recurrent kernel each carry `posterior`."""
    k_init, k_reg = posterior(config, tf.keras.initializers.GlorotUniform())
    r_init, r_reg = posterior(config, tf.keras.initializers.Orthogonal())
    return LSTMCellFlipout(units, kernel_initializer=k_init, kernel_regularizer=k_reg,
                                     recurrent_initializer=r_init, recurrent_regularizer=r_reg, name=name)


WEIGHT_POSTERIOR_LAYERS = (ed.layers.DenseReparameterization, ed.layers.Conv2DReparameterization,
                           ed.layers.LSTMCellReparameterization)


def is_weight_posterior_layer(module: tf.Module) -> bool:
    """Whether a module samples whole weight matrices (its KL lives in ``layer.losses``)."""
    return isinstance(module, WEIGHT_POSTERIOR_LAYERS)


def posterior_sites(module: tf.Module) -> dict[str, tf.keras.layers.Layer]:
    """{"kernel": init, "recurrent_kernel": init} of a weight-posterior layer's trainable initializers."""
    sites = {}
    for attr, site in (("kernel_initializer", "kernel"), ("recurrent_initializer", "recurrent_kernel")):
        init = getattr(module, attr, None)
        if isinstance(init, (TrainableKTiedNormal, ed.initializers.TrainableNormal)) and init.built:
            sites[site] = init
    return sites
