"""The experiment configuration of the image models: pydantic models loaded from ``configs/image_*.yaml``.

A file starts with ``task: image`` (that is how ``ehr-train`` / ``ehr-eval`` tell it from an
EHR config). Every section rejects unknown keys, so a typo fails loudly, naming the key.

The posterior is not re-declared here: the ``model.posterior`` section is a
``PosteriorConfig`` (a pydantic model itself), so the image models and the layer factory
share one definition of every rank-1 hyperparameter. Importing this module does not load
TensorFlow.
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from ehr_base import yaml_config
from ehr_base.yaml_config import ConfigModel
from model.export_layout import MAX_SAMPLES
from model.image.corruptions import CIFAR_C_CORRUPTIONS, CORRUPTIONS, SEVERITIES
from model.layers.posterior import WEIGHT_POSTERIOR_METHODS, PosteriorConfig
from model.fit.experiment import ExperimentBase

_Int = Annotated[int, Field(strict=True)]
_PosInt = Annotated[int, Field(strict=True, gt=0)]
_NonNegInt = Annotated[int, Field(strict=True, ge=0)]
_PosFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]
_NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
_Fraction = Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)]

DATASETS = {"digits": 10, "cifar10": 10, "cifar100": 100}  # name -> number of classes


class DataConfig(ConfigModel):
    """Which images, how they are split and augmented, and which corruptions evaluate them."""

    dataset: Literal["digits", "cifar10", "cifar100"] = "digits"
    data_dir: str | None = Field(
        None, description="CIFAR python-pickle folder (data_batch_* / test_batch, or train / test); "
                          "not used for digits. The CLI's --data overrides it.")
    validation_fraction: _Fraction = Field(
        0.1, description="Share of the training images held out for validation (stratified, fixed).")
    test_fraction: Annotated[float, Field(gt=0.0, lt=1.0)] = Field(
        0.25, description="digits only: share of all 1797 images in the test split (CIFAR has its own).")
    split_seed: _Int = Field(0, description="Seed of the stratified splits.")
    augment_flip: bool = Field(True, description="Random horizontal flips (the paper's CIFAR augmentation).")
    augment_crop_padding: _NonNegInt = Field(
        4, description="Zero-pad by this many pixels, then crop back at random (4 for CIFAR; 0 = off).")
    shuffle_buffer: _PosInt = 50000
    corruptions: tuple[str, ...] = Field(
        tuple(CORRUPTIONS), description="Corruptions of the shifted evaluation: any of the 8 computed ones, or with "
                                        "corrupted_dir any of the CIFAR-10-C release's 19 files.")
    severities: tuple[int, ...] = SEVERITIES
    corrupted_dir: str | None = Field(
        None, description="Folder of real CIFAR-10-C / CIFAR-100-C .npy files; when set they replace the "
                          "corruptions computed here from the clean test set.")
    corruption_seed: _Int = 0

    @pydantic.field_validator("corruptions")
    @classmethod
    def _known_corruptions(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        unknown = [c for c in value if c not in CORRUPTIONS and c not in CIFAR_C_CORRUPTIONS]
        if unknown:
            raise ValueError(f"unknown corruptions {unknown}; expected some of {list(CIFAR_C_CORRUPTIONS)}")
        if len(set(value)) != len(value):
            raise ValueError("corruptions are listed twice")
        return value

    @pydantic.field_validator("severities")
    @classmethod
    def _known_severities(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if not value or any(s not in SEVERITIES for s in value) or len(set(value)) != len(value):
            raise ValueError(f"severities must be distinct values among {SEVERITIES}")
        return value

    @pydantic.model_validator(mode="after")
    def _computable(self) -> DataConfig:
        if self.corrupted_dir is None:
            missing = [c for c in self.corruptions if c not in CORRUPTIONS]
            if missing:
                raise ValueError(f"corruptions {missing} are only in the CIFAR-10-C files: set corrupted_dir "
                                 f"(computed here: {list(CORRUPTIONS)})")
        return self

    @property
    def num_classes(self) -> int:
        """Number of classes of the dataset."""
        return DATASETS[self.dataset]


# Basic blocks per stage of the ResNet-style model, by depth (He et al. 2016, Table 1).
RESNET_BLOCKS = {10: (1, 1, 1, 1), 18: (2, 2, 2, 2), 34: (3, 4, 6, 3)}


class ImageModelConfig(ConfigModel):
    """Architecture and posterior of an image model (see docs/image_models.md)."""

    architecture: Literal["wide_resnet", "resnet", "mlp"] = "wide_resnet"
    depth: _PosInt = Field(28, description="wide_resnet: 6n + 4 (28 = WRN-28); resnet: 10, 18 or 34; "
                                           "mlp: number of hidden dense layers.")
    width: _PosInt = Field(10, description="Channel multiplier: the first stage has 16 * width filters; "
                                           "mlp: units of every hidden layer.")
    posterior: PosteriorConfig = PosteriorConfig()
    batch_norm: Literal["shared", "per_member"] = Field(
        "shared", description="shared: one batch norm over the tiled batch; per_member: one per ensemble member.")
    batch_norm_momentum: Annotated[float, Field(gt=0.0, lt=1.0)] = 0.9
    mc_dropout_rate: _Fraction = Field(
        0.0, description="> 0 with posterior.method 'deterministic' = MC dropout: dropout on the input of every "
                         "layer but the first, also at prediction time.")

    @pydantic.model_validator(mode="after")
    def _consistent(self) -> ImageModelConfig:
        if self.architecture == "wide_resnet" and (self.depth < 10 or (self.depth - 4) % 6):
            raise ValueError(f"wide_resnet depth must be 6n + 4 with n >= 1 (10, 16, 22, 28, ...), got {self.depth}")
        if self.architecture == "resnet" and self.depth not in RESNET_BLOCKS:
            raise ValueError(f"resnet depth must be one of {sorted(RESNET_BLOCKS)}, got {self.depth}")
        method = self.posterior.method
        if method == "deterministic" and self.posterior.ensemble_size != 1:
            # K identical copies of one network would only repeat the same prediction K times.
            raise ValueError("posterior.ensemble_size must be 1 for method 'deterministic'")
        if method == "bella" and self.batch_norm != "shared":
            # The base's (frozen) batch norms are shared; per-member norms would be new, untrained weights.
            raise ValueError("posterior.method 'bella' adapts a base with shared batch norms: use batch_norm 'shared'")
        if self.mc_dropout_rate > 0 and method != "deterministic":
            raise ValueError("mc_dropout_rate > 0 is the MC-dropout baseline: use posterior.method 'deterministic'")
        return self

    @property
    def method_name(self) -> str:
        """Row name of the tables: deterministic, mc_dropout, batchensemble, rank1_normal, rank1_cauchy,
        mean_field, ktied_normal_k<k>, bella_ensemble, bella_svgd."""
        method = self.posterior.method
        if method == "rank1":
            return f"rank1_{self.posterior.distribution}"
        if method == "ktied_normal":
            return f"ktied_normal_k{self.posterior.ktied_rank}"
        if method == "bella":
            return f"bella_{self.posterior.particle_update}"
        if method == "deterministic" and self.mc_dropout_rate > 0:
            return "mc_dropout"
        return method

    @property
    def stochastic(self) -> bool:
        """Whether two forward passes of one member differ (then S > 1 samples are worth drawing)."""
        return self.posterior.method in ("rank1", *WEIGHT_POSTERIOR_METHODS) or self.mc_dropout_rate > 0


class ImageTrainConfig(ConfigModel):
    """Optimisation of one run (the CIFAR configs follow the paper's Table 5)."""

    batch_size: _PosInt = Field(64, description="B examples per step; the model sees B*K rows.")
    epochs: _PosFloat = 250.0
    max_steps: _PosInt | None = Field(None, description="Stop after this many steps instead of `epochs` epochs.")
    optimizer: Literal["sgd", "adam"] = "sgd"
    learning_rate: _PosFloat = Field(0.1, description="Peak learning rate (after warm-up).")
    momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = Field(0.9, description="SGD momentum (Nesterov).")
    lr_warmup_epochs: _NonNegFloat = Field(0.0, description="Linear warm-up from 0 over these epochs.")
    lr_decay_epochs: tuple[_PosFloat, ...] = Field((), description="Epochs at which the rate is multiplied by "
                                                                     "lr_decay_ratio.")
    lr_decay_ratio: Annotated[float, Field(gt=0.0, le=1.0)] = 0.2
    fast_weight_lr_multiplier: _PosFloat = Field(
        1.0, description="Learning-rate factor of the rank-1 factors (alpha/gamma) and their posteriors.")
    clip_norm: _PosFloat | None = Field(None, description="Global-norm gradient clipping (None = off).")
    kl_scale: _NonNegFloat = Field(1.0, description="Weight of KL / N_train in the loss (1 = the ELBO).")
    kl_annealing_epochs: _NonNegFloat = Field(
        200.0, description="KL weight rises linearly from 0 to kl_scale over these epochs (0 = off).")
    eval_every_steps: _NonNegInt = Field(
        0, description="Validation every N steps and at the last step (0 = none: the last step is evaluated). "
                       "The checkpoint with the best validation NLL is the one evaluated.")
    early_stopping_patience: _NonNegInt = Field(
        0, description="Stop after this many validations in a row without a better validation NLL (0 = never).")
    checkpoint_every_steps: _PosInt = 1000
    keep_checkpoints: _PosInt = 3
    log_every_steps: _PosInt = 50
    seed: _Int = 0

    @pydantic.field_validator("lr_decay_epochs")
    @classmethod
    def _increasing(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if any(b <= a for a, b in zip(value, value[1:])):
            raise ValueError("lr_decay_epochs must be strictly increasing")
        return value


class ImageEvalConfig(ConfigModel):
    """Final evaluation settings."""

    num_samples: Annotated[int, Field(strict=True, ge=1, le=MAX_SAMPLES)] = Field(
        1, description="S samples of every member (the paper's image tables use 1; Table 8 also 4 and 25). "
                       "Forced to 1 for methods without sampling.")
    batch_size: _PosInt = Field(256, description="Examples per prediction call (the model sees S*K times more rows).")
    num_bins: _PosInt = Field(15, description="ECE bins.")
    seed: _Int = Field(0, description="Sampling seed of the final evaluation.")


# Mirrors model.ehr.config's ExperimentConfig, parse_config and load_config: each task keeps
# entry points typed with its own config, and the shared work is in yaml_config.
class ImageExperimentConfig(ExperimentBase):
    """One image training run: ``task: image``, a name and four sections."""

    task: Literal["image"]
    name: str = Field("image", min_length=1)
    data: DataConfig = DataConfig()
    model: ImageModelConfig = ImageModelConfig()
    train: ImageTrainConfig = ImageTrainConfig()
    eval: ImageEvalConfig = ImageEvalConfig()

    @classmethod
    def parse(cls, data: Any, source: str = "<dict>") -> ImageExperimentConfig:
        """See ExperimentBase.parse."""
        return parse_config(data, source)


def parse_config(data: Any, source: str = "<dict>") -> ImageExperimentConfig:
    """Validates already-parsed YAML/JSON data; raises ConfigError naming each bad key."""
    return yaml_config.validate(ImageExperimentConfig, data, source, "image config")


def load_config(path: str | os.PathLike[str]) -> ImageExperimentConfig:
    """Reads and validates a YAML image config."""
    return yaml_config.load(ImageExperimentConfig, path, "image config")


def is_image_config(data: Any) -> bool:
    """Whether parsed YAML/JSON data is an image config (it says ``task: image``)."""
    return isinstance(data, dict) and data.get("task") == "image"
