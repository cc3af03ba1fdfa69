"""The exported model: verify and read an export directory, run its SavedModel, summarise samples.

Start-up fails here, with a message naming the file, when the directory is missing, a file
is absent or is not what manifest.json's SHA-256 says (checked by the exporter's own
``model.export.load_export``: one verifier for the format), the SavedModel does not load or
has the wrong signature, or a JSON file does not hold what the service needs.

Every uncertainty number comes from ``model.metrics`` (never re-implemented here), so the
service reports exactly the quantities the evaluation reported.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ehr_pipeline import config as pipeline_config
from ehr_pipeline import outputs, spec
from ehr_pipeline.outputs import sha256_of
from model import metrics as model_metrics

logger = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MODEL_CARD = "model_card.json"
PIPELINE_CONFIG = "pipeline_config.json"
VOCABULARY = "vocabulary.json"
METRICS = "metrics.json"
LAB_LOINC = "lab_loinc.json"  # optional: exports made before the FHIR mapping have none
UNITS = "units.json"  # optional, as LAB_LOINC
SAVED_MODEL = "saved_model"
SIGNATURE = "serving_default"
# Precision -> signature name; mirrors model.predict.SIGNATURES, which this module must not
# import at start-up (TensorFlow). tests/test_serving_predictor.py pins the two equal.
SIGNATURES = {"float32": SIGNATURE, "bfloat16": "serving_bfloat16"}
SIGNATURE_INPUTS = ("examples", "num_samples", "seed")
OUTPUT = "probs"
INTERVAL_LEVEL = 0.95


class ModelDirError(RuntimeError):
    """The export directory cannot be served; the message names the file and the problem."""


# ------------------------------------------------------------------------ export files


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")  # exporters may add fields; we read what we need


class ModelCard(_Loose):
    """The fields of model_card.json the service relies on."""

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    method: str = Field(min_length=1)
    ensemble_size: int = Field(ge=1)
    created: str | None = None


class HeldOutMetrics(_Loose):
    """metrics.json 'test': held-out calibration (other metrics pass through to /v1/model)."""

    ece: float | None = None
    nll: float | None = None


class ReferralPolicy(_Loose):
    """metrics.json 'referral': refer when `measure` > `threshold` (None: -inf, refer every case)."""

    measure: str
    rate: float = Field(ge=0.0, le=1.0)
    threshold: float | None

    @pydantic.field_validator("measure")
    @classmethod
    def _known_measure(cls, value: str) -> str:
        if value not in model_metrics.UNCERTAINTY_MEASURES:
            raise ValueError(f"must be one of {model_metrics.UNCERTAINTY_MEASURES}")
        return value


class ExportMetrics(_Loose):
    """metrics.json as the service needs it."""

    test: HeldOutMetrics
    referral: ReferralPolicy
    decision_threshold: float = Field(0.5, gt=0.0, lt=1.0)


@dataclasses.dataclass(frozen=True)
class Export:
    """Everything read from an export directory except the SavedModel itself."""

    directory: pathlib.Path
    checksum: str  # SHA-256 of manifest.json: identifies every file of the export at once
    card: ModelCard
    card_raw: Mapping[str, Any]
    pipeline: pipeline_config.PipelineConfig
    pipeline_raw: Mapping[str, Any]
    vocabulary: frozenset[str]  # "source:code"
    metrics: ExportMetrics
    metrics_raw: Mapping[str, Any]
    lab_loinc: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)  # LOINC -> ITEMIDs
    # 'source:code' -> its position in vocabulary.json's list (most frequent in training first).
    vocabulary_rank: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # 'source:code' -> the UCUM units its training values came in (MIMIC's spellings translated).
    units: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    # Training mean and standard deviation per numeric code, and the |z| where the model caps
    # values: a request value beyond it is answered with a warning.
    value_stats: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    clip_z: float | None = None

    @property
    def ensemble_size(self) -> int:
        """K, the number of ensemble members."""
        return self.card.ensemble_size


def _read_json(directory: pathlib.Path, name: str) -> Any:
    try:
        return json.loads((directory / name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ModelDirError(f"{directory / name}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise ModelDirError(f"{directory / name}: not valid JSON: {err}") from None


def _validate(model: type[BaseModel], data: Any, where: pathlib.Path) -> Any:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}" for e in err.errors())
        raise ModelDirError(f"{where}: {problems}") from None


def _vocabulary(data: Any, where: pathlib.Path) -> dict[str, int]:
    """'source:code' -> rank in its source's list, from {"sources": {source: [codes]}} or {source: [codes]}."""
    by_source = data.get("sources", data) if isinstance(data, dict) else None
    if not isinstance(by_source, dict):
        raise ModelDirError(f"{where}: expected {{source: [codes]}} (optionally under 'sources')")
    codes: dict[str, int] = {}
    for source, items in by_source.items():
        if source not in spec.SOURCES:
            continue  # other keys (sizes, special tokens) are the exporter's business
        if not isinstance(items, list) or not all(isinstance(c, str) for c in items):
            raise ModelDirError(f"{where}: sources.{source} must be a list of code strings")
        prefix = f"{source}{spec.CODE_SEPARATOR}"
        # The pipeline stores full 'source:code' strings; accept bare codes too.
        for rank, c in enumerate(items):
            codes.setdefault(c if c.startswith(prefix) else prefix + c, rank)
    return codes


def _lab_loinc(directory: pathlib.Path) -> dict[str, tuple[str, ...]]:
    """LOINC -> lab ITEMIDs from lab_loinc.json ({"codes": {loinc: [itemids]}}); {} when the export has none."""
    if not (directory / LAB_LOINC).exists():
        logger.info("%s has no %s: FHIR lab Observations need local MIMIC codes", directory, LAB_LOINC)
        return {}
    data = _read_json(directory, LAB_LOINC)
    bridge = data.get("codes") if isinstance(data, dict) else None
    if not isinstance(bridge, dict) or not all(
            isinstance(v, list) and all(isinstance(c, str) for c in v) for v in bridge.values()):
        raise ModelDirError(f"{directory / LAB_LOINC}: expected {{\"codes\": {{loinc: [itemid strings]}}}}")
    return {str(k): tuple(v) for k, v in bridge.items()}


def _units(directory: pathlib.Path) -> dict[str, frozenset[str]]:
    """'source:code' -> UCUM units from units.json ({"codes": {code: {unit: rows}}}); {} when the export has none."""
    from ehr_pipeline.fhir.codes import ucum

    if not (directory / UNITS).exists():
        return {}
    data = _read_json(directory, UNITS)
    by_code = data.get("codes") if isinstance(data, dict) else None
    if not isinstance(by_code, dict) or not all(isinstance(v, dict) for v in by_code.values()):
        raise ModelDirError(f"{directory / UNITS}: expected {{\"codes\": {{code: {{unit: rows}}}}}}")
    # A unit without a UCUM code stays as written: a FHIR value can still match it as text.
    return {code: frozenset(ucum(u) or u for u in units) for code, units in by_code.items()}


def read_export(model_dir: str | pathlib.Path) -> Export:
    """Reads and validates the JSON side files of an export (checksums: model.export.verify_export)."""
    directory = pathlib.Path(model_dir)
    if not directory.is_dir():
        raise ModelDirError(f"{directory}: model directory does not exist or is not a directory")
    checksum = sha256_of(str(directory / MANIFEST))
    card_raw = _read_json(directory, MODEL_CARD)
    card = _validate(ModelCard, card_raw, directory / MODEL_CARD)
    pipeline_raw = _read_json(directory, PIPELINE_CONFIG)
    try:
        pipeline = pipeline_config.parse_pipeline_config(pipeline_raw, str(directory / PIPELINE_CONFIG))
    except pipeline_config.ConfigError as err:
        raise ModelDirError(str(err)) from None
    ranks = _vocabulary(_read_json(directory, VOCABULARY), directory / VOCABULARY)
    vocabulary = frozenset(ranks)
    metrics_raw = _read_json(directory, METRICS)
    metrics = _validate(ExportMetrics, metrics_raw, directory / METRICS)
    value_stats, clip_z = _value_stats(_read_json(directory, outputs.NUMERIC_STATS), directory / outputs.NUMERIC_STATS)
    return Export(directory=directory, checksum=checksum, card=card, card_raw=card_raw, pipeline=pipeline,
                  pipeline_raw=pipeline_raw, vocabulary=vocabulary, metrics=metrics, metrics_raw=metrics_raw,
                  lab_loinc=_lab_loinc(directory), vocabulary_rank=ranks, units=_units(directory),
                  value_stats=value_stats, clip_z=clip_z)


def _value_stats(data: Any, where: pathlib.Path) -> tuple[dict[str, tuple[float, float]], float | None]:
    """{code: (mean, std)} and clip_z from numeric_stats.json ({} and None when it has none)."""
    if not isinstance(data, dict) or not data.get("codes") or data.get("clip_z") is None:
        return {}, None  # nothing to compare with: no range warnings
    try:
        stats = {str(c): (float(v["mean"]), float(v["std"])) for c, v in data["codes"].items()}
        clip_z = float(data["clip_z"])
    except (KeyError, TypeError, ValueError) as err:
        raise ModelDirError(f"{where}: expected clip_z and codes {{code: {{mean, std}}}}: {err}") from None
    return stats, clip_z


# ------------------------------------------------------------------------ the model


class Predictor:
    """A verified export plus its loaded SavedModel signature; forward() is thread-safe."""

    def __init__(self, export: Export, loaded: Any):
        self.export = export
        self._loaded = loaded  # model.export.LoadedExport: holds the SavedModel and its variables

    @property
    def precision(self) -> str:
        """Operand precision of the LSTM's matmuls in the signature in use ("float32" or "bfloat16")."""
        return self._loaded.precision

    @classmethod
    def load(cls, model_dir: str | pathlib.Path, precision: str = "float32") -> Predictor:
        """Verifies every checksum (model.export.load_export), loads the SavedModel, validates the side files.

        precision "bfloat16" serves the export's bfloat16 signature (faster; probabilities within
        the tolerance docs/serving.md states), "float32" the exact one.
        """
        directory = pathlib.Path(model_dir)
        if not directory.is_dir():  # before importing TensorFlow: the commonest mistake fails at once
            raise ModelDirError(f"{directory}: model directory does not exist or is not a directory")
        # The exporter owns the export format, so its loader is the one checksum verifier.
        from model.export import ExportError, load_export  # imports TensorFlow

        path = directory / SAVED_MODEL
        try:
            loaded = load_export(directory, precision)
        except ExportError as err:
            raise ModelDirError(str(err)) from None
        except Exception as err:  # TF raises many types for a bad SavedModel; all mean the same here
            first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
            raise ModelDirError(f"{directory}: cannot load the export: {type(err).__name__}: {first_line}") from None
        export = read_export(directory)
        if loaded.ensemble_size != export.ensemble_size:
            raise ModelDirError(f"{directory / MODEL_CARD}: ensemble_size disagrees with the loaded export")
        signature = loaded.signature
        name = SIGNATURES[precision]
        inputs = set(signature.structured_input_signature[1])
        if inputs != set(SIGNATURE_INPUTS):
            raise ModelDirError(f"{path}: signature '{name}' takes {sorted(inputs)}, "
                                f"expected {sorted(SIGNATURE_INPUTS)}")
        if OUTPUT not in signature.structured_outputs:
            raise ModelDirError(f"{path}: signature '{name}' returns {sorted(signature.structured_outputs)}, "
                                f"expected '{OUTPUT}'")
        logger.info("loaded model %s %s (K=%d, %s matmuls) from %s", export.card.name, export.card.version,
                    export.ensemble_size, precision, export.directory)
        return cls(export, loaded)

    def forward(self, examples: Sequence[bytes], num_samples: int, seed: int) -> np.ndarray:
        """Sampled probabilities [N, num_samples * K] (float64, sample-major) for serialized SequenceExamples."""
        from model.predict import predict_probs  # the same call ehr-eval makes: same numbers for a seed

        out = predict_probs(self._loaded, list(examples), num_samples, seed,
                            batch_size=max(len(examples), 1)).astype(np.float64)
        expected = (len(examples), num_samples * self.export.ensemble_size)
        if out.shape != expected:
            raise RuntimeError(f"model returned probs of shape {out.shape}, expected {expected} "
                               f"(N, S*K with K = model_card ensemble_size)")
        if not np.all(np.isfinite(out)) or np.any((out < 0) | (out > 1)):
            raise RuntimeError("model returned probabilities outside [0, 1] or non-finite")
        return out


@dataclasses.dataclass(frozen=True)
class Summary:
    """Per-example summaries of an [N, S*K] probability matrix, each of shape [N] unless noted."""

    probability: np.ndarray
    std: np.ndarray
    lower: np.ndarray
    upper: np.ndarray
    predictive_entropy: np.ndarray
    aleatoric: np.ndarray
    epistemic: np.ndarray
    members: np.ndarray  # [N, K]
    predicted_positive: np.ndarray  # bool
    across_threshold: np.ndarray
    referral_value: np.ndarray
    refer: np.ndarray  # bool


def summarise(probs: np.ndarray, export: Export, num_samples: int) -> Summary:
    """Uncertainty summaries of sampled probabilities [N, S*K] (model.metrics definitions, nats)."""
    k = export.ensemble_size
    measures = model_metrics.uncertainties(probs)
    mean = model_metrics.predictive_mean(probs)
    tail = (1.0 - INTERVAL_LEVEL) / 2.0
    lower, upper = np.quantile(probs, [tail, 1.0 - tail], axis=1)
    threshold = export.metrics.decision_threshold
    positive = mean > threshold  # the strict '>' of model.metrics.accuracy
    across = np.mean((probs > threshold) != positive[:, None], axis=1)
    policy = export.metrics.referral
    referral_threshold = -math.inf if policy.threshold is None else policy.threshold
    value = measures[policy.measure]
    return Summary(
        probability=mean,
        std=measures["predictive_std"],
        lower=lower,
        upper=upper,
        predictive_entropy=measures["predictive_entropy"],
        aleatoric=model_metrics.expected_entropy(probs),
        epistemic=measures["mutual_information"],
        members=model_metrics.member_means(probs, k, num_samples),
        predicted_positive=positive,
        across_threshold=across,
        referral_value=value,
        refer=model_metrics.refer(value, referral_threshold),
    )
