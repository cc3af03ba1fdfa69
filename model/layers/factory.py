"""The layer factory: the one place that turns a ``PosteriorConfig`` into layers.

Model code (the EHR LSTM, the image models) only calls ``dense``, ``conv2d``,
``lstm_cell`` / ``lstm`` and ``kl_loss``; which posterior those layers carry is data
(``config.method``). ``BUILDERS`` maps every name of ``posterior.METHODS`` to how that
posterior builds each layer kind, so a new low-rank posterior is one name there and one
entry here, without touching model code.

Entries:
  deterministic  plain Keras layers (the tiled batch just repeats the same network).
  rank1          edward2 rank-1 layers; factors with trainable Normal/Cauchy posteriors
                 and a KL to the (mixture) prior in ``layer.losses``.
  bella          low-rank particle adapters W + A_p B_p on frozen base weights (model.layers.bella);
                 P = ensemble_size particles, no KL (their prior enters the particle loss).
  batchensemble  the same edward2 layers with point-mass factors: plain Keras
                 initializers make edward2 use its variables directly (no sampling, no KL).
                 Sharing the rank-1 classes keeps one code path and identical variable
                 layouts, so a BatchEnsemble checkpoint can warm-start a rank-1 run.
  mean_field     a Gaussian on every kernel entry (Flipout layers; model.layers.weight_posteriors).
  ktied_normal   the same, its stddev matrix tied to rank k = config.ktied_rank (paper 003).

Losses: edward2 puts the KL (summed over all K members, not divided by the dataset size)
into ``layer.losses`` next to Keras' L2 terms, so ``sum(model.losses)`` mixes two things
that need different scaling. Use ``kl_loss`` (scale by 1/N_train and the annealing factor)
and ``l2_loss`` separately.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Callable, Iterable

import tensorflow as tf

from model.layers import FACTOR_SITES, bella, weight_posteriors
from model.layers._edward2 import ed
from model.layers.noise import Noise, posterior_loc_scale, standard_draw
from model.layers.posterior import KERNEL_PENALTY_METHODS, WEIGHT_POSTERIOR_METHODS, PosteriorConfig, softplus_inverse
from model.layers.rank1_lstm import Rank1LSTM

Layer = tf.keras.layers.Layer


@dataclasses.dataclass(frozen=True)
class LayerBuilder:
    """How one posterior method builds each layer kind."""

    # (units, config, *, activation, use_bias, name[, kernel_regularizer]) -> Layer; the last only
    # for KERNEL_PENALTY_METHODS
    dense: Callable[..., Layer]
    conv2d: Callable[..., Layer]  # (filters, kernel_size, config, *, strides, padding, activation, use_bias, name)
    lstm_cell: Callable[..., Layer]  # (units, config, *, name) -> a tf.keras.layers.LSTMCell


def _builder(config: PosteriorConfig) -> LayerBuilder:
    if not isinstance(config, PosteriorConfig):
        raise TypeError(f"expected a PosteriorConfig, got {type(config).__name__}")
    return BUILDERS[config.method]


# --- public factory -------------------------------------------------------------------

def dense(units: int, config: PosteriorConfig, *, activation=None, use_bias: bool = True,
          kernel_regularizer=None, name: str | None = None) -> Layer:
    """A dense layer under `config`'s posterior; input [K*batch, d] for ensemble methods.

    kernel_regularizer: a Keras regularizer in place of config.l2's on the shared kernel (an L1
    penalty, say); only for methods whose kernel is a point estimate (KERNEL_PENALTY_METHODS).
    """
    if kernel_regularizer is None:
        return _builder(config).dense(units, config, activation=activation, use_bias=use_bias, name=name)
    if config.method not in KERNEL_PENALTY_METHODS:
        raise ValueError(f"method {config.method!r} has no point-estimated kernel to penalise "
                         f"(methods with one: {KERNEL_PENALTY_METHODS})")
    return _builder(config).dense(units, config, activation=activation, use_bias=use_bias, name=name,
                                  kernel_regularizer=kernel_regularizer)


def conv2d(filters: int, kernel_size, config: PosteriorConfig, *, strides=(1, 1), padding: str = "valid",
           activation=None, use_bias: bool = True, name: str | None = None) -> Layer:
    """A 2-D convolution under `config`'s posterior (channels_last)."""
    return _builder(config).conv2d(filters, kernel_size, config, strides=strides, padding=padding,
                                   activation=activation, use_bias=use_bias, name=name)


def lstm_cell(units: int, config: PosteriorConfig, *, name: str | None = None) -> Layer:
    """An LSTM cell under `config`'s posterior (usable in tf.keras.layers.RNN)."""
    return _builder(config).lstm_cell(units, config, name=name)


def lstm(units: int, config: PosteriorConfig, *, return_sequences: bool = False,
         return_state: bool = False, name: str | None = None) -> Rank1LSTM:
    """The fast LSTM layer (model.layers.rank1_lstm) around ``lstm_cell(units, config)``."""
    cell = lstm_cell(units, config, name=f"{name}_cell" if name else None)
    return Rank1LSTM(cell, return_sequences=return_sequences, return_state=return_state, name=name)


# --- losses ---------------------------------------------------------------------------

# Sites whose posterior carries a KL: the factors, and a per-member bias where a layer has one
# with a trainable posterior (same <site>_initializer / _regularizer convention).
_KL_SITES = (*FACTOR_SITES, "ensemble_bias")


def _modules(obj: Any) -> list[tf.Module]:
    seen: dict[int, tf.Module] = {}
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, tf.Module):
            for module in (item, *item.submodules):
                seen.setdefault(id(module), module)
        elif isinstance(item, Iterable) and not isinstance(item, (str, bytes)):
            stack.extend(item)
        else:
            raise TypeError(f"expected layers or a model, got {type(item).__name__}")
    return list(seen.values())


def kl_loss(layers_or_model: Any) -> tf.Tensor:
    """Sum of all KL(q || prior) terms under a layer, model or list of them (unscaled)."""
    terms = []
    for module in _modules(layers_or_model):
        own = getattr(module, "kl_divergence", None)
        if callable(own):  # our own stochastic layers (e.g. embeddings)
            terms.append(own())
            continue
        for site in _KL_SITES:
            init = getattr(module, f"{site}_initializer", None)
            reg = getattr(module, f"{site}_regularizer", None)
            # Same call edward2 registers as the layer's loss: regularizer(q as RandomVariable).
            if isinstance(init, Layer) and reg is not None and init.built:
                terms.append(reg(init(getattr(module, f"{site}_shape"), module.dtype)))
    if not terms:
        return tf.constant(0.0)
    return tf.add_n([tf.reduce_sum(t) for t in terms])


def l2_loss(layers_or_model: Any) -> tf.Tensor:
    """Sum of the L2 penalties on shared weight matrices (kernels, recurrent kernels)."""
    terms = []
    for module in _modules(layers_or_model):
        for reg_name, var_name in (("kernel_regularizer", "kernel"), ("recurrent_regularizer", "recurrent_kernel")):
            reg = getattr(module, reg_name, None)
            var = getattr(module, var_name, None)
            if reg is not None and isinstance(var, tf.Variable):
                terms.append(reg(var))
    if not terms:
        return tf.constant(0.0)
    return tf.add_n(terms)


# --- initializers -----------------------------------------------------------------------

def mean_initializer(config: PosteriorConfig) -> tf.keras.initializers.Initializer:
    """Factor means per Appendix B: random signs (v > 0), N(1, |v|) (v < 0), ones (v == 0)."""
    v = config.random_sign_init
    if v > 0:
        return ed.initializers.RandomSign(probs=v)
    if v < 0:
        return tf.keras.initializers.RandomNormal(mean=1.0, stddev=-v)
    return tf.keras.initializers.Ones()


def factor_posterior(config: PosteriorConfig, factor: str) -> tuple[Any, Any]:
    """(initializer, regularizer) for one rank-1 factor site; a fresh pair per site."""
    kind = config.factor_initializer(factor)
    loc_init = mean_initializer(config)
    if kind == "trainable_deterministic":
        # A plain initializer: edward2 uses the variable as is, no sampling and no KL.
        return loc_init, None
    # Constant, not uncertainty-baselines' jittered TruncatedNormal: the initial stddev is
    # exactly the dropout parameterisation's sqrt(p / (1 - p)).
    raw_scale = tf.keras.initializers.Constant(softplus_inverse(config.init_stddev))
    if kind == "trainable_normal":
        return (ed.initializers.TrainableNormal(mean_initializer=loc_init, stddev_initializer=raw_scale,
                                                stddev_constraint="softplus"),
                ed.regularizers.NormalKLDivergence(mean=config.prior_mean, stddev=config.prior_stddev))
    return (ed.initializers.TrainableCauchy(loc_initializer=loc_init, scale_initializer=raw_scale,
                                            scale_constraint="softplus"),
            ed.regularizers.CauchyKLDivergence(loc=config.prior_mean, scale=config.prior_stddev))


def _l2(config: PosteriorConfig):
    return tf.keras.regularizers.l2(config.l2) if config.l2 > 0 else None


# --- the builders of each method ---------------------------------------------------------

def _det_dense(units, config, *, activation, use_bias, name, kernel_regularizer=None):
    return tf.keras.layers.Dense(units, activation=activation, use_bias=use_bias,
                                 kernel_regularizer=kernel_regularizer or _l2(config), name=name)


def _det_conv2d(filters, kernel_size, config, *, strides, padding, activation, use_bias, name):
    return tf.keras.layers.Conv2D(filters, kernel_size, strides=strides, padding=padding, activation=activation,
                                  use_bias=use_bias, kernel_regularizer=_l2(config), name=name)


def _det_lstm_cell(units, config, *, name):
    return tf.keras.layers.LSTMCell(units, kernel_regularizer=_l2(config), recurrent_regularizer=_l2(config),
                                    name=name)


def _factor_kwargs(config: PosteriorConfig, prefix: str = "") -> dict[str, Any]:
    alpha_init, alpha_reg = factor_posterior(config, "alpha")
    gamma_init, gamma_reg = factor_posterior(config, "gamma")
    return {f"{prefix}alpha_initializer": alpha_init, f"{prefix}alpha_regularizer": alpha_reg,
            f"{prefix}gamma_initializer": gamma_init, f"{prefix}gamma_regularizer": gamma_reg}


class DenseRank1(ed.layers.DenseRank1):
    """edward2's DenseRank1; ``call(x, noise=...)`` draws the factors from explicit noise (model.layers.noise).

    edward2 samples inside ``call`` with stateful ops; with noise the same factors come from the
    layer's own posterior variables and the explicit source, then the same computation follows
    (clipped perturbations, per-member bias). Rows of x are member-major blocks of the examples.
    """

    def call(self, inputs, noise: Noise | None = None):
        if noise is None:
            return super().call(inputs)
        noise = noise.fold_in(self.name)
        k = self.ensemble_size
        batch = tf.shape(inputs)[0]
        per_member = batch // k
        x = tf.reshape(inputs, [k, per_member, self.alpha_shape[-1]])
        clip = (self.min_perturbation_value, self.max_perturbation_value)
        alpha = self._member_rows("alpha", noise, per_member, clip)
        gamma = self._member_rows("gamma", noise, per_member, clip)
        if self.use_additive_perturbation:
            outputs = tf.matmul(x + alpha, self.kernel) + gamma
        else:
            outputs = tf.matmul(x * alpha, self.kernel) * gamma
        if self.use_ensemble_bias:
            outputs += self._member_rows("ensemble_bias", noise, per_member, None)
        if self.ensemble_activation is not None:
            outputs = self.ensemble_activation(outputs)
        return tf.reshape(outputs, [batch, self.units])

    def _member_rows(self, site: str, noise: Noise, per_member, clip) -> tf.Tensor:
        """[K, per_member or 1, dim]: a site's sample per row (stochastic) or its point value."""
        init = getattr(self, f"{site}_initializer")
        if not isinstance(init, Layer):
            return getattr(self, site)[:, None, :]
        family, loc, scale = posterior_loc_scale(init)
        k, dim = loc.shape
        eps = tf.reshape(standard_draw(family, noise.fold_in(site), k * per_member, dim, loc.dtype),
                         [k, per_member, dim])
        draw = loc[:, None, :] + scale[:, None, :] * eps
        return draw if clip is None else tf.clip_by_value(draw, *clip)


def _r1_dense(units, config, *, activation, use_bias, name, kernel_regularizer=None):
    return DenseRank1(units, activation=activation, use_bias=use_bias,
                      kernel_regularizer=kernel_regularizer or _l2(config),
                      use_additive_perturbation=config.use_additive_perturbation,
                      ensemble_size=config.ensemble_size, name=name, **_factor_kwargs(config))


def _r1_conv2d(filters, kernel_size, config, *, strides, padding, activation, use_bias, name):
    return ed.layers.Conv2DRank1(filters, kernel_size, strides=strides, padding=padding, activation=activation,
                                 use_bias=use_bias, kernel_regularizer=_l2(config),
                                 use_additive_perturbation=config.use_additive_perturbation,
                                 ensemble_size=config.ensemble_size, name=name, **_factor_kwargs(config))


def _r1_lstm_cell(units, config, *, name):
    return ed.layers.LSTMCellRank1(units, kernel_regularizer=_l2(config), recurrent_regularizer=_l2(config),
                                   use_additive_perturbation=config.use_additive_perturbation,
                                   ensemble_size=config.ensemble_size, name=name,
                                   **_factor_kwargs(config), **_factor_kwargs(config, prefix="recurrent_"))


_RANK1_BUILDER = LayerBuilder(dense=_r1_dense, conv2d=_r1_conv2d, lstm_cell=_r1_lstm_cell)


def _weight_posterior_builder(posterior: Callable[..., Any]) -> LayerBuilder:
    return LayerBuilder(dense=functools.partial(weight_posteriors.dense, posterior),
                        conv2d=functools.partial(weight_posteriors.conv2d, posterior),
                        lstm_cell=functools.partial(weight_posteriors.lstm_cell, posterior))


# One entry per posterior.METHODS name (a test checks the two agree).
BUILDERS: Mapping[str, LayerBuilder] = MappingProxyType({
    "deterministic": LayerBuilder(dense=_det_dense, conv2d=_det_conv2d, lstm_cell=_det_lstm_cell),
    "rank1": _RANK1_BUILDER,
    # Same layers; PosteriorConfig.factor_initializer resolves to point masses for this method.
    "batchensemble": _RANK1_BUILDER,
    "bella": LayerBuilder(dense=bella.dense, conv2d=bella.conv2d, lstm_cell=bella.lstm_cell),
    "mean_field": _weight_posterior_builder(weight_posteriors.mean_field),
    "ktied_normal": _weight_posterior_builder(weight_posteriors.ktied_normal),
})


def samples_weights(config: PosteriorConfig) -> bool:
    """Whether the method samples whole weight matrices (Flipout layers, Keras' RNN for the LSTM)."""
    return config.method in WEIGHT_POSTERIOR_METHODS
