"""The pipeline configuration: pydantic models, loaded from YAML (``configs/pipeline.yaml``).

Every model rejects unknown keys, so a typo fails loudly instead of silently running
with a default. Models are frozen: a config is a value, passed explicitly, never global.
The whole config is written into the run manifest (``to_dict``), so a data set can always
be traced back to the exact settings that produced it.

Importing this module is cheap (no TensorFlow, no Beam): the service loads it too.
"""
from __future__ import annotations

import math
import os
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from ehr_base import yaml_config
from ehr_base.yaml_config import StrictConfigModel
from ehr_pipeline.contract import spec

# Strict: YAML `1.5` must not quietly become the integer 1, nor `true` the integer 1.
_StrictInt = Annotated[int, Field(strict=True)]
_Fraction = Annotated[float, Field(strict=True, ge=0.0, le=1.0)]
_Source = Literal[spec.SOURCES]  # type: ignore[valid-type]  # Literal over the spec's tuple
_SPLIT_SUM_TOLERANCE = 1e-9  # 0.8 + 0.1 + 0.1 is not exactly 1.0 in binary floating point


class BaggingConfig(StrictConfigModel):
    """How one admission's events become time bags (see ``bagging.bag_events``)."""

    bagging_time_precision: _StrictInt = Field(
        86400, gt=0, description="Width of one time bag, seconds.")
    bagging_aggregate_older_than: _StrictInt = Field(
        -1, ge=-1,
        description="Events more than this many seconds before the trigger collapse into "
                    "one history bag (the oldest bag); -1 turns the history bag off.")
    max_bags: _StrictInt = Field(
        30, gt=0,
        description="Most bags per admission; the newest are kept. The history bag counts "
                    "as a bag, so it is the first to go.")


class SplitsConfig(StrictConfigModel):
    """Fractions of patients per split; a patient's admissions all land in one split."""

    train: _Fraction = 0.8
    validation: _Fraction = 0.1
    test: _Fraction = 0.1

    @pydantic.model_validator(mode="after")
    def _sums_to_one(self) -> SplitsConfig:
        total = self.train + self.validation + self.test
        if not math.isclose(total, 1.0, rel_tol=0.0, abs_tol=_SPLIT_SUM_TOLERANCE):
            raise ValueError(f"train + validation + test must sum to 1, got {total!r}")
        return self


# One source of truth for split names: the fields of SplitsConfig (file names use them).
SPLIT_NAMES: tuple[str, ...] = tuple(SplitsConfig.model_fields)


class ShardsConfig(StrictConfigModel):
    """Number of TFRecord files written per split."""

    train: _StrictInt = Field(8, gt=0)
    validation: _StrictInt = Field(1, gt=0)
    test: _StrictInt = Field(1, gt=0)


class VocabConfig(StrictConfigModel):
    """Which codes get their own vocabulary entry; the rest share an out-of-vocabulary id."""

    min_count: _StrictInt = Field(
        5, gt=0,
        description="A code needs at least this many training-split admissions containing it.")
    max_size_per_source: _StrictInt = Field(
        10000, gt=0, description="Most codes kept per source, most frequent first.")


class NumericConfig(StrictConfigModel):
    """Normalisation of numeric values (z-scores from training-split statistics)."""

    clip_z: float = Field(10.0, gt=0.0, description="z-scores are clipped to [-clip_z, clip_z].")


class PipelineConfig(StrictConfigModel):
    """Everything the Beam job needs besides its input and output paths."""

    trigger_offset_seconds: _StrictInt = Field(
        86400, ge=0,
        description="Prediction time = admission time + this many seconds; events at or "
                    "after it are never used.")
    min_age_years: float = Field(18.0, ge=0.0, description="Younger patients are excluded, years.")
    bagging: BaggingConfig = BaggingConfig()
    splits: SplitsConfig = SplitsConfig()
    split_salt: str = Field(
        "ehr-uncertainty-v1", min_length=1,
        description="Salt of the subject-id hash that assigns splits; change it to re-draw.")
    vocab: VocabConfig = VocabConfig()
    numeric: NumericConfig = NumericConfig()
    num_shards: ShardsConfig = ShardsConfig()
    sources: Annotated[tuple[_Source, ...], Field(strict=False, min_length=1)] = spec.SOURCES

    @pydantic.field_validator("sources")
    @classmethod
    def _no_duplicate_sources(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        twice = sorted({s for s in value if value.count(s) > 1})
        if twice:
            raise ValueError(f"sources listed more than once: {twice}")
        return value

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every setting, for the run manifest."""
        return self.model_dump(mode="json")


def parse_pipeline_config(data: Any, source: str = "<dict>") -> PipelineConfig:
    """Validates already-parsed YAML/JSON data; raises ConfigError naming each bad field."""
    return yaml_config.validate(PipelineConfig, data, source, "pipeline config")


def load_pipeline_config(path: str | os.PathLike[str] | None = None) -> PipelineConfig:
    """Reads a YAML pipeline config; None gives the defaults."""
    if path is None:
        return PipelineConfig()
    return yaml_config.load(PipelineConfig, path, "pipeline config")
