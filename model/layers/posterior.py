"""Typed configuration of the weight posterior shared by every rank-1 layer.

One ``PosteriorConfig`` describes the whole network's posterior (the paper tunes these
hyperparameters once per model, Appendix B); the layer factory in ``model.layers.factory`` turns
it into concrete layers. Field names follow the paper's Tables 5-7 and
uncertainty-baselines so published settings can be copied verbatim.
"""
from __future__ import annotations

import math
from typing import Annotated, Literal, get_args

import pydantic
from pydantic import BaseModel, ConfigDict, Field

# Every posterior the layer factory builds (model.layers.factory.BUILDERS has one entry per name):
#   deterministic, rank1, batchensemble (point-mass rank-1 factors), bella (particle adapters),
#   mean_field and ktied_normal (posteriors over whole weight matrices, model.layers.weight_posteriors).
Method = Literal["deterministic", "rank1", "batchensemble", "bella", "mean_field", "ktied_normal"]
METHODS: tuple[str, ...] = get_args(Method)
Distribution = Literal["normal", "cauchy"]
DISTRIBUTIONS: tuple[str, ...] = get_args(Distribution)
# Per-factor posterior families; "trainable_deterministic" is a point mass (no KL),
# i.e. a BatchEnsemble factor. Names match edward2 / Table 7.
FactorInitializer = Literal["trainable_normal", "trainable_cauchy", "trainable_deterministic"]
FACTOR_INITIALIZERS: tuple[str, ...] = get_args(FactorInitializer)
# Posteriors over whole weight matrices (model.layers.weight_posteriors), not over rank-1 factors.
WEIGHT_POSTERIOR_METHODS = ("mean_field", "ktied_normal")
# Methods whose dense kernel is a point estimate under an L2 penalty, which another penalty may
# replace (the others: a distribution with its own prior, or Bella's frozen base weights).
KERNEL_PENALTY_METHODS = ("deterministic", "rank1", "batchensemble")
# How Bella particles are trained (model.layers.bella.ParticleUpdate).
ParticleUpdate = Literal["ensemble", "svgd"]
PARTICLE_UPDATES: tuple[str, ...] = get_args(ParticleUpdate)

# Strict ints and bools: YAML `2.0` or `true` must not quietly become an ensemble size.
_PosInt = Annotated[int, Field(strict=True, ge=1)]
_Bool = Annotated[bool, Field(strict=True)]
_Finite = Annotated[float, Field(allow_inf_nan=False)]


class PosteriorConfig(BaseModel):
    """Posterior over the rank-1 factors r (alpha, on inputs) and s (gamma, on outputs).

    method: one of METHODS ("deterministic", "batchensemble", "rank1", "bella", the
      whole-matrix posteriors "mean_field" and "ktied_normal").
    distribution: family of the rank-1 posterior and of its mixture prior.
    ensemble_size: K mixture components; the minibatch is tiled K times.
    prior_mean, prior_stddev: location/scale of the prior on every factor element
      (Normal stddev or Cauchy scale). The paper uses mean 1 (0.5 for Cauchy MIMIC).
    random_sign_init: initialisation of the factor means (uncertainty-baselines
      convention, Appendix B): v > 0 -> random signs, +1 with probability v
      (0.5 gives +-1 evenly); v < 0 -> N(1, |v|); v == 0 -> all ones.
    dropout_rate: p of the "dropout initialisation" of posterior stddevs,
      sigma = sqrt(p / (1 - p)) (Section 3.5); only used at initialisation.
    use_additive_perturbation: (x + r) W + s instead of (x * r) W * s.
    l2: L2 coefficient on the shared weight matrices W (the paper's Normal prior on W).
    adapter_rank: r of the Bella adapters W + A_p B_p (method "bella"; model.layers.bella).
    particle_update: how Bella's particles train: "ensemble" (each its own loss) or "svgd".
    alpha_initializer, gamma_initializer: per-factor posterior family, one of
      FACTOR_INITIALIZERS; None follows `method` ("trainable_<distribution>" for rank1,
      "trainable_deterministic" for batchensemble). Allows Section 3's ablations
      (only r or only s stochastic).
    ktied_rank: k of the k-tied Normal posterior (method "ktied_normal"): every weight
      matrix's stddevs are U V^T with U, V of k columns (paper 003, Eq. 8).

    The whole-matrix posteriors ("mean_field", "ktied_normal") use prior_stddev as the
    stddev of their zero-mean Normal weight prior and init_stddev as the starting stddev
    of every weight.

    A pydantic model: unknown keys are refused, so it is also the ``posterior`` section of
    the image configs. Importing it loads no TensorFlow.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    method: Method = "rank1"
    distribution: Distribution = "normal"
    ensemble_size: _PosInt = 4
    prior_mean: _Finite = 1.0
    prior_stddev: Annotated[_Finite, Field(gt=0.0)] = 0.1
    random_sign_init: Annotated[_Finite, Field(
        le=1.0, description="> 0 is the probability of +1 (use a negative value for N(1, |v|) means)")] = 0.5
    # p = 0 would need softplus^-1(0) = -inf for the raw stddev.
    dropout_rate: Annotated[_Finite, Field(gt=0.0, lt=1.0)] = 1e-3
    use_additive_perturbation: _Bool = False
    l2: Annotated[_Finite, Field(ge=0.0)] = 1e-4
    alpha_initializer: FactorInitializer | None = None
    gamma_initializer: FactorInitializer | None = None
    ktied_rank: _PosInt = 2
    adapter_rank: _PosInt = 4
    particle_update: ParticleUpdate = "ensemble"

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> PosteriorConfig:
        if self.method in WEIGHT_POSTERIOR_METHODS and self.ensemble_size != 1:
            # One posterior over the weights: K rows of the tiled batch would just be more samples.
            raise ValueError(f"ensemble_size must be 1 for method {self.method!r}, "
                             f"got {self.ensemble_size} (draw more samples instead)")
        if self.method == "bella" and self.prior_mean != 0:
            # The adapters' prior is centred on the base network (A B = 0), whatever the rank-1 default.
            raise ValueError(f"prior_mean must be 0 for method 'bella', got {self.prior_mean}")
        for name in ("alpha_initializer", "gamma_initializer"):
            value = getattr(self, name)
            if value is None:
                continue
            if self.method in ("deterministic", "bella", *WEIGHT_POSTERIOR_METHODS):
                raise ValueError(f"{name} has no effect with method={self.method!r}")
            if self.method == "batchensemble" and value != "trainable_deterministic":
                raise ValueError(f"{name}={value!r}: batchensemble factors are point masses; "
                                 "use method='rank1' for stochastic factors")
        return self

    @classmethod
    def mimic_normal(cls, **overrides) -> "PosteriorConfig":
        """Table 7 of the paper: Gaussian rank-1 Bayesian RNN on MIMIC-III."""
        base = dict(method="rank1", distribution="normal", ensemble_size=4, prior_mean=1.0,
                    prior_stddev=0.1, random_sign_init=0.5, dropout_rate=1e-3, l2=1e-4)
        return cls(**{**base, **overrides})

    @classmethod
    def mimic_cauchy(cls, **overrides) -> "PosteriorConfig":
        """Table 7 of the paper: Cauchy rank-1 Bayesian RNN on MIMIC-III."""
        base = dict(method="rank1", distribution="cauchy", ensemble_size=4, prior_mean=0.5,
                    prior_stddev=1e-4, random_sign_init=0.5, dropout_rate=5e-7, l2=1e-4)
        return cls(**{**base, **overrides})

    @property
    def init_stddev(self) -> float:
        """Initial posterior stddev (or Cauchy scale) from the dropout parameterisation."""
        return math.sqrt(self.dropout_rate / (1.0 - self.dropout_rate))

    def factor_initializer(self, factor: str) -> str:
        """Resolved posterior family of factor "alpha" or "gamma"."""
        if factor not in ("alpha", "gamma"):
            raise ValueError(f"factor must be 'alpha' or 'gamma', got {factor!r}")
        explicit = getattr(self, f"{factor}_initializer")
        if explicit is not None:
            return explicit
        if self.method == "batchensemble":
            return "trainable_deterministic"
        return f"trainable_{self.distribution}"


def softplus_inverse(x: float) -> float:
    """Raw parameter whose softplus is x (stable for small and large x)."""
    return x + math.log(-math.expm1(-x))

