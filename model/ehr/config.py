"""The experiment configuration of the EHR model: pydantic models loaded from ``configs/ehr_*.yaml``.

One YAML file describes one training run (model, optimisation, evaluation). Every model
rejects unknown keys, so a typo (``learning_rat: 1e-3``) fails loudly, naming the key,
instead of silently training with a default. Configs are frozen values, passed explicitly.

Field names follow the paper's Table 7 (and uncertainty-baselines) so published settings
can be copied verbatim. Importing this module is cheap: no TensorFlow.
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from ehr_base import yaml_config
from ehr_base.yaml_config import ConfigModel
from model.export_layout import MAX_SAMPLES
from model.evaluation.statistics.metrics import DEFAULT_REFERRAL_RATE
from model.fit.experiment import ExperimentBase
from model.layers.posterior import KERNEL_PENALTY_METHODS, PosteriorConfig

# Strict ints: YAML `1.5` must not quietly become 1, nor `true` the integer 1.
_Int = Annotated[int, Field(strict=True)]
_PosInt = Annotated[int, Field(strict=True, gt=0)]
_NonNegInt = Annotated[int, Field(strict=True, ge=0)]
_PosFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
_NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
_Prob = Annotated[float, Field(gt=0.0, lt=1.0, allow_inf_nan=False)]

# The methods of the paper's Table 4 (deep ensembles are independently trained
# "deterministic" runs combined at evaluation/export time, not a training method).
# ktied_normal is fully_bayesian with every weight matrix's stddevs tied to rank ktied_rank (paper 003).
# "bella" (paper 002) adapts a trained deterministic run (ehr-train --base RUN_DIR).
METHODS = ("deterministic", "batchensemble", "bayesian_embeddings", "fully_bayesian", "rank1", "ktied_normal",
           "bella")
Method = Literal["deterministic", "batchensemble", "bayesian_embeddings", "fully_bayesian", "rank1", "ktied_normal",
                 "bella"]
# Methods whose ensemble dimension K is meaningful; the others are single networks (K = 1).
ENSEMBLE_METHODS = ("batchensemble", "rank1", "bella")
# Methods with a stochastic (variational) embedding table, shared by the K members.
STOCHASTIC_EMBEDDING_METHODS = ("bayesian_embeddings", "fully_bayesian", "rank1", "ktied_normal")
# The layer factory's posterior (model.layers.posterior.METHODS) behind each method: bayesian_embeddings
# differs from deterministic in its embeddings only, fully_bayesian is a mean field over the weights.
FACTORY_METHODS = {"deterministic": "deterministic", "bayesian_embeddings": "deterministic",
                   "batchensemble": "batchensemble", "rank1": "rank1", "fully_bayesian": "mean_field",
                   "ktied_normal": "ktied_normal", "bella": "bella"}


class ModelConfig(ConfigModel):
    """Architecture and posterior of the EHR model (see docs/model.md)."""

    method: Method = "rank1"
    distribution: Literal["normal", "cauchy"] = Field(
        "normal", description="Family of the rank-1 posteriors and priors (rank1 only).")
    ensemble_size: _PosInt = Field(4, description="K mixture components / ensemble members.")
    embedding_dim: _PosInt = Field(32, description="Width of a code embedding and of a bag vector.")
    rnn_dim: _PosInt = Field(512, description="LSTM units.")
    hidden_layer_dim: _PosInt = Field(512, description="Units of the hidden dense layer.")
    prior_mean: float = Field(1.0, allow_inf_nan=False, description="Mean of the rank-1 factor prior.")
    prior_stddev: _PosFloat = Field(0.1, description="Stddev (Cauchy: scale) of the factor prior, and "
                                                     "of the weight prior of fully_bayesian / ktied_normal.")
    random_sign_init: float = Field(
        0.5, le=1.0, allow_inf_nan=False,
        description="Factor mean init: v > 0 random signs (+1 w.p. v), v < 0 N(1, |v|), 0 ones.")
    dropout_rate: _Prob = Field(1e-3, description="Posterior stddev init sigma = sqrt(p / (1 - p)).")
    use_additive_perturbation: bool = False
    l2: _NonNegFloat = Field(1e-4, description="L2 coefficient on the shared (point-estimated) weights.")
    embedding_prior_stddev: _PosFloat = Field(1.0, description="Stddev of the N(0, s^2) embedding prior.")
    embedding_init_stddev: _PosFloat = Field(1e-3, description="Initial embedding posterior stddev.")
    pooling: Literal["mean", "sum", "max", "mean_max", "attention"] = Field(
        "attention", description="How a bag's token vectors become one bag vector: mean (dilutes one abnormal "
                                "value among many normal ones), sum, elementwise max, mean and max side by side "
                                "(2x wide), or attention (softmax over tokens per head, attention_heads learned "
                                "queries, heads side by side).")
    attention_heads: _PosInt = Field(
        4, description="Learned queries of pooling: attention; each attends to its own tokens (lactate, say) "
                       "and the bag vector is attention_heads x embedding_dim wide.")
    wide: bool = Field(
        False, description="Add a linear ('wide') part to the logit on the admission window's per-code aggregates "
                           "(log counts, min / max / mean / last z-scores, context; model.ehr.inputs); wide_posterior "
                           "says how it is trained.")
    wide_window_hours: _PosFloat = Field(48.0, description="wide: the window, hours before the prediction time.")
    wide_posterior: Literal["factory", "laplace"] = Field(
        "factory", description="wide: 'factory' trains the linear part with the LSTM under the method's posterior; "
                               "'laplace' fits model.ehr.baselines' logistic regression on the training split before the "
                               "first step (penalty and C by validation NLL), fixes it with its Laplace posterior "
                               "(model.ehr.wide) and lets the LSTM learn the residual from 0.")
    wide_l1: _NonNegFloat = Field(
        0.0, description="wide: L1 penalty (per example) on the linear part's kernel in place of l2, which selects "
                         "a few analytes among hundreds of columns; 0 keeps l2. deterministic / rank1 / "
                         "batchensemble only.")
    time_inputs: tuple[Literal["bag_gap", "trigger_scales", "since_admit", "previous_discharge", "value_change"],
                       ...] = Field(
        (), description="Time inputs the model reads besides log(1 + hours to the trigger) (model.ehr.inputs, "
                        "docs/model.md): bag_gap (time since the previous bag), trigger_scales (time to the trigger "
                        "on hour-to-year scales), since_admit (time since admission), previous_discharge (the "
                        "previous admission's discharge, marked, with the time since it), value_change (per valued code, its "
                        "change since the code's previous value and the time between them). None by default: what "
                        "exports made before they existed read.")
    ktied_rank: _PosInt = Field(2, description="ktied_normal: rank k of every weight matrix's stddevs U V^T.")
    adapter_rank: _PosInt = Field(4, description="bella: rank r of every adapter W + A_p B_p.")
    particle_update: Literal["ensemble", "svgd"] = Field(
        "ensemble", description="bella: particles trained independently (ensemble) or jointly (svgd).")

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.method not in ENSEMBLE_METHODS and self.ensemble_size != 1:
            # K copies of one network would just repeat the same prediction K times.
            raise ValueError(f"ensemble_size must be 1 for method {self.method!r} (got {self.ensemble_size}); "
                             "a deep ensemble combines separate deterministic runs at evaluation time")
        if self.wide_posterior == "laplace" and (not self.wide or self.wide_l1 > 0):
            raise ValueError("wide_posterior 'laplace' needs wide: true and no wide_l1 (the fit chooses its penalty)")
        if self.wide_l1 > 0 and FACTORY_METHODS[self.method] not in KERNEL_PENALTY_METHODS:
            raise ValueError(f"wide_l1 applies to a point-estimated kernel; method {self.method!r} has none "
                             "(its kernels carry the posterior's own prior)")
        if len(set(self.time_inputs)) != len(self.time_inputs):
            raise ValueError(f"time_inputs names one twice: {list(self.time_inputs)}")
        if self.method != "rank1" and self.distribution != "normal":
            raise ValueError(f"distribution={self.distribution!r} only applies to method 'rank1'")
        try:  # the posterior's own rules (e.g. bella's zero prior mean), reported when the file loads
            self.posterior
        except pydantic.ValidationError as err:
            raise ValueError(yaml_config.describe_errors(err)) from None
        return self

    @property
    def posterior(self) -> PosteriorConfig:
        """The layer factory's PosteriorConfig for this method."""
        return PosteriorConfig(
            method=FACTORY_METHODS[self.method], distribution=self.distribution, ensemble_size=self.ensemble_size,
            prior_mean=self.prior_mean, prior_stddev=self.prior_stddev, random_sign_init=self.random_sign_init,
            dropout_rate=self.dropout_rate, use_additive_perturbation=self.use_additive_perturbation, l2=self.l2,
            ktied_rank=self.ktied_rank, adapter_rank=self.adapter_rank, particle_update=self.particle_update)

    @property
    def stochastic_embeddings(self) -> bool:
        """Whether the code embeddings are variational (and carry a KL term)."""
        return self.method in STOCHASTIC_EMBEDDING_METHODS


class TrainConfig(ConfigModel):
    """Optimisation of one run (defaults: Table 7, Gaussian rank-1 RNN)."""

    batch_size: _PosInt = Field(128, description="B examples per step; the model sees B*K rows.")
    learning_rate: _PosFloat = 3.0352e-4
    lr_schedule: Literal["constant", "cosine", "plateau"] = Field(
        "constant", description="constant (Table 7); cosine decay from learning_rate to 0 at max_steps: a "
                                "small final step size lowers the minibatch noise in the weights that are kept; or "
                                "plateau: the rate is multiplied by lr_decay_factor after lr_decay_patience "
                                "validations without a validation NLL lower by more than early_stopping_min_delta, "
                                "so a run that stops early has still ended on small steps (needs eval_every_steps).")
    lr_decay_factor: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.5, description="plateau: the learning rate's factor at each decay.")
    lr_decay_patience: _PosInt = Field(
        2, description="plateau: validations without a significant improvement before each decay; below "
                       "early_stopping_patience, so the rate decays before the run stops.")
    fast_weight_lr_multiplier: _PosFloat = Field(
        1.0, description="Learning-rate factor of the rank-1 factors (alpha/gamma) and their posteriors.")
    clip_norm: _PosFloat = Field(7.29199, description="Global-norm gradient clipping.")
    kl_scale: _NonNegFloat = Field(1.0, description="Weight of KL / N_train in the loss (1 = the ELBO).")
    kl_annealing_steps: _NonNegInt = Field(
        20000, description="KL weight rises linearly from 0 to kl_scale over these steps (0 = off). A method with a KL "
                           "term keeps no best checkpoint and counts no early-stopping patience until they are over "
                           "(when they are fewer than max_steps).")
    max_steps: _PosInt = 25000
    loss: Literal["average", "mixture"] = Field(
        "average", description="average: mean per-member NLL (App. D.4); mixture: NLL of the K-mixture (D.5).")
    eval_every_steps: _NonNegInt = Field(
        1000, description="Validation every N steps and at the last step (0 = none: the last step is exported). "
                          "The checkpoint with the best validation mixture NLL is the one evaluated and exported.")
    early_stopping_patience: _NonNegInt = Field(
        0, description="Stop after this many validations in a row without a better validation NLL (0 = never); "
                       "the best validated checkpoint is the one evaluated and exported, whether or not the run "
                       "stopped early.")
    early_stopping_min_delta: _NonNegFloat = Field(
        0.0, description="Nats per example: a validation NLL counts as better (resets early_stopping_patience and "
                         "the plateau schedule's count) only when below the last such one by more than this; the "
                         "lowest NLL's checkpoint is kept whatever the gain. 0 = any decrease counts.")
    early_stopping_min_steps: _NonNegInt = Field(
        0, description="No early stop and no plateau decay before this step (patience still counts): a network "
                       "can sit on a plateau for a while before it finds a slower signal (on the temporal truth: the "
                       "window's values first, the trajectory thousands of steps later), and a stop there ends the "
                       "run before it learns it. 0 = from the first validation.")
    eval_samples: _PosInt = Field(4, description="S samples per member for the periodic validation.")
    checkpoint_every_steps: _PosInt = 500
    keep_checkpoints: _PosInt = 3
    log_every_steps: _PosInt = 50
    shuffle_buffer: _PosInt = 4096
    cache_featurized: bool = Field(
        False, description="Keep the first epoch's featurized batches in memory and replay them reshuffled (batch "
                           "members stay together): no parsing after epoch 1, what a fast GPU needs "
                           "(docs/benchmarks.md, input pipeline).")
    mixed_precision: bool | Literal["float32", "mixed_bfloat16", "mixed_float16"] = Field(
        False, description="16-bit layer compute (variables, loss, NLL and KL stay float32): true = bfloat16 where "
                           "the hardware has it (CPUs, GPUs >= compute capability 8.0), else float16 with loss "
                           "scaling; or a Keras policy name (model.ehr.mixed_precision).")
    seed: _Int = 0

    @pydantic.model_validator(mode="after")
    def _plateau_needs_validation(self) -> TrainConfig:
        if self.lr_schedule == "plateau" and not self.eval_every_steps:
            raise ValueError("lr_schedule 'plateau' decays on validation NLL: set eval_every_steps > 0")
        return self


# The scikit-learn baselines (model.ehr.baselines): here, so `ehr-eval --help` lists them
# without importing TensorFlow, which the baselines' featurizer needs.
BASELINE_KINDS = ("logistic", "gbm")


class EvalConfig(ConfigModel):
    """Evaluation and export settings."""

    num_samples: Annotated[int, Field(strict=True, ge=1, le=MAX_SAMPLES)] = Field(
        25, description="S samples of every member (the paper evaluates with 25).")
    batch_size: _PosInt = Field(64, description="Examples per prediction call.")
    referral_rate: Annotated[float, Field(ge=0.0, le=1.0)] = Field(
        DEFAULT_REFERRAL_RATE, description="Fraction of cases referred to a clinician; threshold chosen on validation.")
    referral_measure: Literal["auto", "predictive_entropy", "mutual_information", "predictive_std"] = Field(
        "auto", description="Uncertainty that decides referral; 'auto': the one whose referral keeps "
        "the lowest Brier score of the kept cases (AURC) on the validation split, recorded in metrics.json; a named "
        "measure overrides that choice. Mutual information is the epistemic part (0 for one deterministic network, "
        "whose configs use predictive_entropy).")
    num_bins: _PosInt = Field(15, description="ECE bins (Table 7).")
    n_bootstrap: _PosInt = Field(1000, description="Bootstrap resamples for the confidence intervals.")
    seed: _Int = Field(0, description="Sampling seed of the final evaluation.")


class ExperimentConfig(ExperimentBase):
    """One training run: ``name`` plus the three sections."""

    name: str = Field("ehr", min_length=1)
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()

    @classmethod
    def parse(cls, data: Any, source: str = "<dict>") -> ExperimentConfig:
        """See ExperimentBase.parse."""
        return parse_config(data, source)


def parse_config(data: Any, source: str = "<dict>") -> ExperimentConfig:
    """Validates already-parsed YAML/JSON data; raises ConfigError naming each bad key."""
    return yaml_config.validate(ExperimentConfig, data, source, "experiment config")


def load_config(path: str | os.PathLike[str]) -> ExperimentConfig:
    """Reads and validates a YAML experiment config."""
    return yaml_config.load(ExperimentConfig, path, "experiment config")
