"""Typed configuration of the weight posterior shared by every rank-1 layer.

One ``PosteriorConfig`` describes the whole network's posterior (the paper tunes these
hyperparameters once per model, Appendix B); the layer factory in ``model.rank1`` turns
it into concrete layers. Field names follow the paper's Tables 5-7 and
uncertainty-baselines so published settings can be copied verbatim.
"""
from __future__ import annotations

import dataclasses
import math

DISTRIBUTIONS = ("normal", "cauchy")
# Per-factor posterior families; "trainable_deterministic" is a point mass (no KL),
# i.e. a BatchEnsemble factor. Names match edward2 / Table 7.
FACTOR_INITIALIZERS = ("trainable_normal", "trainable_cauchy", "trainable_deterministic")
# Posteriors over whole weight matrices (model.weight_posteriors), not over rank-1 factors.
WEIGHT_POSTERIOR_METHODS = ("mean_field", "ktied_normal")
# How Bella particles are trained (model.bella.ParticleUpdate).
PARTICLE_UPDATES = ("ensemble", "svgd")


@dataclasses.dataclass(frozen=True)
class PosteriorConfig:
    """Posterior over the rank-1 factors r (alpha, on inputs) and s (gamma, on outputs).

    method: a name registered in ``model.rank1`` ("deterministic", "batchensemble",
      "rank1", the whole-matrix posteriors "mean_field" and "ktied_normal", ...).
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
    adapter_rank: r of the Bella adapters W + A_p B_p (method "bella"; model.bella).
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
    """

    method: str = "rank1"
    distribution: str = "normal"
    ensemble_size: int = 4
    prior_mean: float = 1.0
    prior_stddev: float = 0.1
    random_sign_init: float = 0.5
    dropout_rate: float = 1e-3
    use_additive_perturbation: bool = False
    l2: float = 1e-4
    alpha_initializer: str | None = None
    gamma_initializer: str | None = None
    ktied_rank: int = 2
    adapter_rank: int = 4
    particle_update: str = "ensemble"

    def __post_init__(self) -> None:
        # Imported here, not at module top: the registry lives with the layer factory
        # (which imports this module), so new posteriors register in one place only.
        from model.rank1 import registered_methods

        methods = registered_methods()
        if self.method not in methods:
            raise ValueError(f"PosteriorConfig.method={self.method!r}: expected one of {sorted(methods)}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(
                f"PosteriorConfig.distribution={self.distribution!r}: expected one of {DISTRIBUTIONS}"
            )
        if isinstance(self.ensemble_size, bool) or not isinstance(self.ensemble_size, int):
            raise TypeError(f"PosteriorConfig.ensemble_size must be an int, got {self.ensemble_size!r}")
        if self.ensemble_size < 1:
            raise ValueError(f"PosteriorConfig.ensemble_size must be >= 1, got {self.ensemble_size}")
        if isinstance(self.ktied_rank, bool) or not isinstance(self.ktied_rank, int) or self.ktied_rank < 1:
            raise ValueError(f"PosteriorConfig.ktied_rank must be an int >= 1, got {self.ktied_rank!r}")
        if self.method in WEIGHT_POSTERIOR_METHODS and self.ensemble_size != 1:
            # One posterior over the weights: K rows of the tiled batch would just be more samples.
            raise ValueError(f"PosteriorConfig.ensemble_size must be 1 for method {self.method!r}, "
                             f"got {self.ensemble_size} (draw more samples instead)")
        _require_finite("prior_mean", self.prior_mean)
        _require_finite("prior_stddev", self.prior_stddev)
        if self.prior_stddev <= 0:
            raise ValueError(f"PosteriorConfig.prior_stddev must be > 0, got {self.prior_stddev}")
        _require_finite("random_sign_init", self.random_sign_init)
        if self.random_sign_init > 1:
            raise ValueError(
                "PosteriorConfig.random_sign_init > 0 is the probability of +1 and must be <= 1, "
                f"got {self.random_sign_init} (use a negative value for N(1, |v|) means)"
            )
        _require_finite("dropout_rate", self.dropout_rate)
        if not 0.0 < self.dropout_rate < 1.0:
            # p = 0 would need softplus^-1(0) = -inf for the raw stddev.
            raise ValueError(f"PosteriorConfig.dropout_rate must be in (0, 1), got {self.dropout_rate}")
        _require_finite("l2", self.l2)
        if self.l2 < 0:
            raise ValueError(f"PosteriorConfig.l2 must be >= 0, got {self.l2}")
        if not isinstance(self.use_additive_perturbation, bool):
            raise TypeError("PosteriorConfig.use_additive_perturbation must be a bool")
        if isinstance(self.adapter_rank, bool) or not isinstance(self.adapter_rank, int) or self.adapter_rank < 1:
            raise ValueError(f"PosteriorConfig.adapter_rank must be an int >= 1, got {self.adapter_rank!r}")
        if self.particle_update not in PARTICLE_UPDATES:
            raise ValueError(
                f"PosteriorConfig.particle_update={self.particle_update!r}: expected one of {PARTICLE_UPDATES}")
        if self.method == "bella" and self.prior_mean != 0:
            # The adapters' prior is centred on the base network (A B = 0), whatever the rank-1 default.
            raise ValueError(f"PosteriorConfig.prior_mean must be 0 for method 'bella', got {self.prior_mean}")
        for name in ("alpha_initializer", "gamma_initializer"):
            value = getattr(self, name)
            if value is None:
                continue
            if value not in FACTOR_INITIALIZERS:
                raise ValueError(f"PosteriorConfig.{name}={value!r}: expected one of {FACTOR_INITIALIZERS}")
            if self.method in ("deterministic", "bella", *WEIGHT_POSTERIOR_METHODS):
                raise ValueError(f"PosteriorConfig.{name} has no effect with method={self.method!r}")
            if self.method == "batchensemble" and value != "trainable_deterministic":
                raise ValueError(
                    f"PosteriorConfig.{name}={value!r}: batchensemble factors are point masses; "
                    "use method='rank1' for stochastic factors"
                )

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


def _require_finite(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"PosteriorConfig.{name} must be a finite number, got {value!r}")
