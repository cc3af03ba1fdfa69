"""The export directory MODEL_DIR/ that the prediction service loads (format_version 1), and its one reader.

Layout (the contract with serving/):
  saved_model/          tf.saved_model, signature "serving_default":
                          examples   tf.string [N]  serialized SequenceExamples as the Beam job writes them
                          num_samples tf.int32 scalar S in [1, MAX_SAMPLES]
                          seed       tf.int64 scalar
                        -> {"probs": float32 [N, S*K]}, sample-major (column s*K + k).
                        Parsing, vocabulary lookup and z-scoring run inside; sampling is stateless,
                        keyed by (seed, example), so a prediction never depends on the batch.
                        A second signature "serving_bfloat16" takes the same inputs and draws the
                        same noise with the LSTM's matmuls in bfloat16 (faster on some CPUs, slower
                        on others; probabilities within BFLOAT16_*_TOLERANCE of float32's).
  model_card.json       name, version, method, ensemble_size, created, data manifest checksum,
                        intended use, limitations, metrics summary (+ config, parameters;
                        a Bella model adds "base": the adapted run's checkpoint and its SHA-256)
  pipeline_config.json  the pipeline config the data was made with (trigger offset, bagging, ...)
  vocabulary.json, numeric_stats.json   copied from the data folder
  lab_loinc.json        (optional) LOINC -> lab ITEMIDs from D_LABITEMS, copied from the data folder
  units.json            (optional) units each numeric code's values came in, copied from the data folder
  admission_types.json  (optional) {"split": "train", "counts": {admission_type: examples}}: the training
                        split's admission types, which the service averages over when a request's is unknown
  meds_codes.json       (optional) the MEDS code map of a model trained on MEDS data: requests speak MEDS codes
  reference_profile.json (optional) the training population in numbers (ehr_pipeline.shift.population.Profile:
                        case mix, per-code value distributions, out-of-vocabulary shares, units, the
                        validation split's mutual information): what the shift report and the service's
                        monitor compare new data with
  metrics.json          {"test": {...}, "referral": {measure, rate, threshold, chosen_on_validation},
                        "decision_threshold": 0.5}; an updated export's "test" says its numbers are in-sample
                        ("split", "held_out": false, "n": the local admissions the update was fitted on)
  adaptation.json       (optional) a model updated at a new site by ehr-adapt (model.adapt): its parent's
                        checksum and name, the method, the local admissions and events used, whether the
                        network's weights changed ("weights_updated"), and
                        "recalibration": {"intercept": a, "slope": b}, which ``LoadedExport`` applies to every
                        sampled logit (p -> sigmoid(a + b * logit(p))): the one place serving and ehr-eval share
  manifest.json         {"files": {relative_path: sha256}, "format_version": 1}

``load_export`` verifies every checksum, validates the JSON side files (``read_export``) and
loads the SavedModel; ehr-eval and the service both read exports through it. Writing lives
in ``model.export.write``. This module imports no TensorFlow until a SavedModel is loaded, so
the service and the command lines can import the contract's constants at start-up.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pydantic
from pydantic import BaseModel, ConfigDict, Field

from ehr_base.yaml_config import ConfigError
from ehr_pipeline.contract import config as pipeline_config
from ehr_pipeline.contract import layout, output_folder, spec
from ehr_pipeline.encode import units as units_mod
from ehr_pipeline.meds import code_map as meds_codes_mod
from ehr_pipeline.shift import Profile
from model import export_layout
from model.export_layout import (ADAPTATION, ADMISSION_TYPES_FILE, DECISION_THRESHOLD, FORMAT_VERSION, MANIFEST, METRICS, MODEL_CARD,
                            OUTPUT, PIPELINE_CONFIG, PRECISIONS, REFERENCE_PROFILE, SAVED_MODEL_DIR, SIGNATURE,
                            SIGNATURE_INPUTS, SIGNATURES)

logger = logging.getLogger(__name__)



class ExportError(RuntimeError):
    """An export directory that is incomplete, altered or of an unknown format; the message names the file."""


# ------------------------------------------------------------------------ JSON side files


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")  # exporters may add fields; we read what we need


class ModelCard(_Loose):
    """The fields of model_card.json that readers rely on."""

    name: str = Field(min_length=1)
    version: str = Field(min_length=1)
    method: str = Field(min_length=1)
    ensemble_size: int = Field(ge=1)
    created: str | None = None
    # The time inputs the model reads (model.ehr.inputs.TIME_INPUTS; a deep ensemble's: those any member
    # reads). None: not recorded, an export made before they existed, which reads none of them (its
    # SavedModel parses only the features it was made with, so newer records give it the same answers).
    time_inputs: tuple[str, ...] | None = None


class HeldOutMetrics(_Loose):
    """metrics.json 'test': the export's calibration and the admissions it was measured on (other metrics pass through).

    A trained or ensemble export's come from its data folder's held-out test split; an updated one's
    (ehr-adapt) from the local admissions the update was fitted on: in-sample, "held_out": false.
    """

    ece: float | None = None
    nll: float | None = None
    # None where metrics.json does not say (written before it did): serving.inference.prediction.calibration
    # reads those.
    split: str | None = None
    held_out: bool | None = None
    n: int | None = Field(None, ge=0)


class ReferralPolicy(_Loose):
    """metrics.json 'referral': refer when `measure` > `threshold` (None: -inf, refer every case)."""

    measure: str
    rate: float = Field(ge=0.0, le=1.0)
    threshold: float | None
    # How the measure was picked: {"loss", "aurc": {measure: AURC on validation}, "absent": [...], "n"} when the
    # training config said "auto"; {"configured": True, ...} when it named one; absent in older exports.
    chosen_on_validation: dict[str, Any] | None = None

    def describe(self) -> str:
        """One line for the service's log: the rule, and whether validation chose its measure."""
        rule = f"refer when {self.measure} > {self.threshold} (at most {self.rate:.0%} on validation)"
        choice = self.chosen_on_validation
        if choice is None:
            return (rule + "; this export predates the choice on validation: its measure is the one its training "
                           "config named")
        if choice.get("configured"):
            return rule + "; measure named by the training config (an explicit override of the choice on validation)"
        ranked = ", ".join(f"{k} {v:.4f}" for k, v in sorted(choice.get("aurc", {}).items(), key=lambda kv: kv[1]))
        return rule + f"; measure chosen on validation by the {choice.get('loss')} AURC ({ranked})"

    @pydantic.field_validator("measure")
    @classmethod
    def _known_measure(cls, value: str) -> str:
        if value not in export_layout.UNCERTAINTY_MEASURES:
            raise ValueError(f"must be one of {export_layout.UNCERTAINTY_MEASURES}")
        return value


class ExportMetrics(_Loose):
    """metrics.json as readers need it."""

    test: HeldOutMetrics
    referral: ReferralPolicy
    decision_threshold: float = Field(DECISION_THRESHOLD, gt=0.0, lt=1.0)


class Recalibration(BaseModel):
    """p -> sigmoid(intercept + slope * logit(p)) on every sampled probability; (0, 1) is the identity."""

    model_config = ConfigDict(extra="forbid")
    intercept: float = Field(0.0, allow_inf_nan=False)
    slope: float = Field(1.0, allow_inf_nan=False)

    @property
    def is_identity(self) -> bool:
        """Whether applying it changes nothing (the export's probabilities pass through untouched)."""
        return self.intercept == 0.0 and self.slope == 1.0

    def apply(self, probs: np.ndarray) -> np.ndarray:
        """Recalibrated probabilities, float32, same shape: each sample's logit moved, so the spread survives."""
        if self.is_identity:
            return probs
        p = np.asarray(probs, np.float64)
        # float32 probabilities cannot tell logits above ~16.6 apart (1 - p < 6e-8): they are read as that.
        p = np.clip(p, np.finfo(np.float64).tiny, 1.0 - np.finfo(np.float32).epsneg)
        logit = np.log(p) - np.log1p(-p)
        return (1.0 / (1.0 + np.exp(-(self.intercept + self.slope * logit)))).astype(np.float32)


class Adaptation(_Loose):
    """adaptation.json: how an export was updated at a new site (ehr-adapt; other fields pass through)."""

    method: str = Field(min_length=1)
    parent_checksum: str = Field(min_length=1)  # the parent export's Export.checksum
    parent_name: str = Field(min_length=1)  # its model card's name
    n: int = Field(ge=1)  # local admissions the update used
    events: int = Field(ge=0)  # deaths among them
    recalibration: Recalibration = Recalibration()
    weights_updated: bool  # the SavedModel is a new network (else the parent's, with the recalibration on top)

    def summary(self) -> dict[str, Any]:
        """What a report says about the update: parent, method (and the closed test's choice), data, what moved."""
        closed = self.model_extra.get("closed_test") if self.model_extra else None
        return {"method": self.method, "chosen": closed.get("step") if isinstance(closed, dict) else None,
                "parent_name": self.parent_name, "parent_checksum": self.parent_checksum, "n": self.n,
                "events": self.events, "weights_updated": self.weights_updated,
                "recalibration": self.recalibration.model_dump()}


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
    # 'source:code' -> the unit its training values were converted to (units.json "canonical"):
    # request values in another unit are converted to it, or not used (ehr_pipeline.encode.units).
    units: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # 'source:code' -> the units its training values were written in (units.json "codes"), convertible or not.
    unit_census: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # 'source:code' -> training median |value| in its canonical unit (units.json "medians"): a request's
    # conversion that lands values far from it is not used (ehr_pipeline.encode.magnitudes). {} before medians existed.
    unit_medians: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # Training mean and standard deviation per numeric code, and the |z| where the model caps
    # values: a request value beyond it is answered with a warning.
    value_stats: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    clip_z: float | None = None
    # Training examples per admission type (admission_types.json); {} for exports made before it.
    admission_types: Mapping[str, int] = dataclasses.field(default_factory=dict)
    # A model trained on MEDS data (ehr-pipeline run --meds-dir): the code map that turns its requests'
    # MEDS codes ('LAB//50912//mg/dL') into the model's ('lab:50912', unit mg/dL). None: codes are 'source:code'.
    meds_codes: meds_codes_mod.MedsCodes | None = None

    @functools.cached_property
    def meds_mapper(self) -> meds_codes_mod.CodeMapper | None:
        """Reads request codes with the export's MEDS code map; one per export, its cache shared."""
        return None if self.meds_codes is None else meds_codes_mod.CodeMapper(self.meds_codes)
    # The training population (reference_profile.json): None for exports made before it existed.
    reference: Profile | None = None
    # The schema_version of the records the model was trained on (vocabulary.json, copied from its
    # data folder): data of another version is refused before it is read (ehr_pipeline.contract.integrity).
    schema_version: int | None = None
    # An export updated at a new site (adaptation.json, model.adapt); None for a trained one.
    adaptation: Adaptation | None = None

    @property
    def ensemble_size(self) -> int:
        """K, the number of ensemble members."""
        return self.card.ensemble_size

    @property
    def time_inputs(self) -> tuple[str, ...]:
        """The time inputs the model reads; () for an export that does not record them (made before they existed)."""
        return tuple(self.card.time_inputs or ())

    @functools.cached_property
    def harmoniser(self) -> units_mod.Harmoniser:
        """Moves request values to the training units; one per export, so its conversion cache is shared."""
        loinc = {f"lab{spec.CODE_SEPARATOR}{item}": code for code, items in self.lab_loinc.items() for item in items}
        return units_mod.Harmoniser(self.units, loinc, seen=self.unit_census, medians=self.unit_medians)


def _read_json(directory: pathlib.Path, name: str) -> Any:
    try:
        return json.loads((directory / name).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as err:
        raise ExportError(f"{directory / name}: cannot read: {err}") from None
    except json.JSONDecodeError as err:
        raise ExportError(f"{directory / name}: not valid JSON: {err}") from None


def _validate(model: type[BaseModel], data: Any, where: pathlib.Path) -> Any:
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '<top>'}: {e['msg']}" for e in err.errors())
        raise ExportError(f"{where}: {problems}") from None


def vocabulary_ranks(data: Any, where: pathlib.Path | str) -> dict[str, int]:
    """'source:code' -> rank in its source's list, from {"sources": {source: [codes]}} or {source: [codes]}."""
    by_source = data.get("sources", data) if isinstance(data, dict) else None
    if not isinstance(by_source, dict):
        raise ExportError(f"{where}: expected {{source: [codes]}} (optionally under 'sources')")
    codes: dict[str, int] = {}
    for source, items in by_source.items():
        if source not in spec.SOURCES:
            continue  # other keys (sizes, special tokens) are the exporter's business
        if not isinstance(items, list) or not all(isinstance(c, str) for c in items):
            raise ExportError(f"{where}: sources.{source} must be a list of code strings")
        prefix = f"{source}{spec.CODE_SEPARATOR}"
        # The pipeline stores full 'source:code' strings; accept bare codes too.
        for rank, c in enumerate(items):
            codes.setdefault(c if c.startswith(prefix) else prefix + c, rank)
    return codes


def _lab_loinc(directory: pathlib.Path) -> dict[str, tuple[str, ...]]:
    """LOINC -> lab ITEMIDs from lab_loinc.json ({"codes": {loinc: [itemids]}}); {} when the export has none."""
    if not (directory / layout.LAB_LOINC).exists():
        logger.info("%s has no %s: FHIR lab Observations need local MIMIC codes", directory, layout.LAB_LOINC)
        return {}
    data = _read_json(directory, layout.LAB_LOINC)
    bridge = data.get("codes") if isinstance(data, dict) else None
    if not isinstance(bridge, dict) or not all(
            isinstance(v, list) and all(isinstance(c, str) for c in v) for v in bridge.values()):
        raise ExportError(f"{directory / layout.LAB_LOINC}: expected {{\"codes\": {{loinc: [itemid strings]}}}}")
    return {str(k): tuple(v) for k, v in bridge.items()}


def _units(directory: pathlib.Path) -> tuple[dict[str, str], dict[str, tuple[str, ...]], dict[str, float]]:
    """(canonical unit, units as written, training median), each by 'source:code', from units.json; empty without one.

    Without one, values go unchecked.
    """
    if not (directory / layout.UNITS).exists():
        return {}, {}, {}
    data = _read_json(directory, layout.UNITS)
    by_code = data.get("codes") if isinstance(data, dict) else None
    if not isinstance(by_code, dict) or not all(isinstance(v, dict) for v in by_code.values()):
        raise ExportError(f"{directory / layout.UNITS}: expected {{\"codes\": {{code: {{unit: rows}}}}}}")
    counts, canonical = units_mod.read_units_file(data)
    census = {code: tuple(sorted(written)) for code, written in counts.items()}
    # Data folders made before values were harmonised have no "canonical": their values were
    # used as written, mostly in each code's most common unit, which the same rule recovers.
    try:
        medians = units_mod.read_medians(data)
    except (AttributeError, TypeError, ValueError):
        raise ExportError(f"{directory / layout.UNITS}: expected \"medians\": {{code: number}}") from None
    return canonical or units_mod.canonical_units(counts, units_mod.Converter()), census, medians


def _admission_types(directory: pathlib.Path) -> dict[str, int]:
    """Training examples per admission type from admission_types.json; {} when the export has none."""
    if not (directory / ADMISSION_TYPES_FILE).exists():
        return {}
    data = _read_json(directory, ADMISSION_TYPES_FILE)
    counts = data.get("counts") if isinstance(data, dict) else None
    if not isinstance(counts, dict) or not counts or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in counts.items()):
        raise ExportError(f"{directory / ADMISSION_TYPES_FILE}: expected {{\"counts\": {{admission_type: examples > 0}}}}")
    return dict(counts)


# A range warning needs a training distribution to be outside of: the z-scores of a code seen with
# a handful of values (the demo has codes with 3) say nothing about a new value.
RANGE_MIN_VALUES = 30


def _value_stats(data: Any, where: pathlib.Path) -> tuple[dict[str, tuple[float, float]], float | None]:
    """{code: (mean, std)} of codes with at least RANGE_MIN_VALUES training values, and clip_z, from numeric_stats.json.

    ({} and None when it has none.) A statistic without its count ("n") is kept: older data folders.
    """
    if not isinstance(data, dict) or not data.get("codes") or data.get("clip_z") is None:
        return {}, None  # nothing to compare with: no range warnings
    try:
        stats = {str(c): (float(v["mean"]), float(v["std"])) for c, v in data["codes"].items()
                 if int(v.get("n", RANGE_MIN_VALUES)) >= RANGE_MIN_VALUES}
        clip_z = float(data["clip_z"])
    except (KeyError, TypeError, ValueError) as err:
        raise ExportError(f"{where}: expected clip_z and codes {{code: {{mean, std}}}}: {err}") from None
    return stats, clip_z


def _reference(directory: pathlib.Path) -> Profile | None:
    """The reference profile; None when the export has none (made before the shift report existed)."""
    if not (directory / REFERENCE_PROFILE).exists():
        return None
    try:
        return Profile.from_json(_read_json(directory, REFERENCE_PROFILE))
    except ValueError as err:
        raise ExportError(f"{directory / REFERENCE_PROFILE}: {err}") from None


def read_export(export_dir: str | os.PathLike[str]) -> Export:
    """Reads and validates the JSON side files of an export (checksums: verify_export; the model: load_export)."""
    directory = pathlib.Path(export_dir)
    if not directory.is_dir():
        raise ExportError(f"{directory}: model directory does not exist or is not a directory")
    checksum = layout.sha256_of(str(directory / MANIFEST))
    card_raw = _read_json(directory, MODEL_CARD)
    card = _validate(ModelCard, card_raw, directory / MODEL_CARD)
    pipeline_raw = _read_json(directory, PIPELINE_CONFIG)
    try:
        pipeline = pipeline_config.parse_pipeline_config(pipeline_raw, str(directory / PIPELINE_CONFIG))
    except ConfigError as err:
        raise ExportError(str(err)) from None
    vocabulary_doc = _read_json(directory, layout.VOCABULARY)
    ranks = vocabulary_ranks(vocabulary_doc, directory / layout.VOCABULARY)
    metrics_raw = _read_json(directory, METRICS)
    metrics = _validate(ExportMetrics, metrics_raw, directory / METRICS)
    value_stats, clip_z = _value_stats(_read_json(directory, layout.NUMERIC_STATS),
                                       directory / layout.NUMERIC_STATS)
    canonical, census, medians = _units(directory)
    return Export(directory=directory, checksum=checksum, card=card, card_raw=card_raw, pipeline=pipeline,
                  pipeline_raw=pipeline_raw, vocabulary=frozenset(ranks), metrics=metrics, metrics_raw=metrics_raw,
                  lab_loinc=_lab_loinc(directory), vocabulary_rank=ranks, units=canonical, unit_census=census,
                  unit_medians=medians,
                  value_stats=value_stats, clip_z=clip_z, admission_types=_admission_types(directory),
                  meds_codes=_meds_codes(directory), reference=_reference(directory),
                  schema_version=_schema_version(vocabulary_doc, directory / layout.VOCABULARY),
                  adaptation=_adaptation(directory))


def _adaptation(directory: pathlib.Path) -> Adaptation | None:
    """adaptation.json of an updated export; None for one that was trained, not updated."""
    if not (directory / ADAPTATION).exists():
        return None
    return _validate(Adaptation, _read_json(directory, ADAPTATION), directory / ADAPTATION)


def _schema_version(doc: Any, where: pathlib.Path) -> int | None:
    """vocabulary.json's schema_version (that of the model's training records); None when it does not say."""
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if version is not None and (not isinstance(version, int) or isinstance(version, bool)):
        raise ExportError(f"{where}: schema_version must be an integer, got {version!r}")
    return version


def _meds_codes(directory: pathlib.Path) -> meds_codes_mod.MedsCodes | None:
    """The MEDS code map of meds_codes.json, or None for a model trained on MIMIC-III CSVs."""
    if not (directory / layout.MEDS_CODES).exists():
        return None
    try:
        return meds_codes_mod.parse_meds_codes(_read_json(directory, layout.MEDS_CODES).get("codes"),
                                               str(directory / layout.MEDS_CODES))
    except (ConfigError, AttributeError) as err:
        raise ExportError(str(err)) from None


# ------------------------------------------------------------------------ checksums


def write_manifest(root: str | os.PathLike[str]) -> dict[str, str]:
    """Writes manifest.json with the SHA-256 of every other file under root; returns that map."""
    root = pathlib.Path(root)
    files = {p.relative_to(root).as_posix(): layout.sha256_of(str(p))
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}
    document = {"files": files, "format_version": FORMAT_VERSION}
    (root / MANIFEST).write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return files


def verify_export(export_dir: str | os.PathLike[str]) -> dict:
    """Checks manifest.json against every file; returns the manifest or raises ExportError naming the file."""
    root = pathlib.Path(export_dir)
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise ExportError(f"{root}: missing {MANIFEST} (not an export directory?)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ExportError(f"{manifest_path}: not valid JSON: {err}") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ExportError(f"{manifest_path}: format_version {manifest.get('format_version')!r}, "
                          f"this code reads {FORMAT_VERSION}")
    files = manifest.get("files") or {}
    for required in (MODEL_CARD, METRICS, PIPELINE_CONFIG, layout.VOCABULARY, layout.NUMERIC_STATS,
                     f"{SAVED_MODEL_DIR}/saved_model.pb"):
        if required not in files:
            raise ExportError(f"{root}: {MANIFEST} does not list {required}")
    for rel, digest in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            raise ExportError(f"{root}: {rel} is missing")
        if layout.sha256_of(str(path)) != digest:
            raise ExportError(f"{root}: {rel} does not match its checksum in {MANIFEST} (altered or corrupt)")
    # The folder's output marker (which command wrote it, ehr_pipeline.contract.output_folder) is written after
    # the manifest; every other file must be one the manifest pins.
    extra = [p.relative_to(root).as_posix() for p in root.rglob("*")
             if p.is_file() and p.relative_to(root).as_posix() not in {*files, MANIFEST, output_folder.MARKER}]
    if extra:
        raise ExportError(f"{root}: files not in {MANIFEST}: {sorted(extra)[:5]}")
    return manifest


# ------------------------------------------------------------------------ the model


class LoadedExport:
    """A verified export: its side files (``files``) and SavedModel; (examples, S, seed) -> probs [N, S*K]."""

    def __init__(self, files: Export, manifest: dict, saved_model: Any, precision: str = "float32"):
        self.files = files
        self.manifest = manifest
        self.saved_model = saved_model
        self.precision = precision
        self.signature = saved_model.signatures[SIGNATURES[precision]]

    def with_precision(self, precision: str) -> LoadedExport:
        """The same loaded export answering through the signature of `precision` (nothing is reloaded)."""
        if precision not in SIGNATURES:
            raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
        if precision == self.precision:
            return self
        where = self.path / SAVED_MODEL_DIR
        name = SIGNATURES[precision]
        if name not in self.saved_model.signatures:
            raise ExportError(f"{self.path}: {SAVED_MODEL_DIR} has no {name!r} signature (precision {precision}); "
                              "exports older than the bfloat16 signature serve float32 only")
        other = LoadedExport(self.files, self.manifest, self.saved_model, precision)
        _check_signature(other.signature, where, name)
        return other

    @property
    def path(self) -> pathlib.Path:
        """The export directory."""
        return self.files.directory

    @property
    def model_card(self) -> Mapping[str, Any]:
        """model_card.json as written (every field, not only the validated ones)."""
        return self.files.card_raw

    @property
    def metrics(self) -> Mapping[str, Any]:
        """metrics.json as written."""
        return self.files.metrics_raw

    @property
    def ensemble_size(self) -> int:
        """K, the number of ensemble members."""
        return self.files.ensemble_size

    def __call__(self, examples, num_samples: int, seed: int) -> np.ndarray:
        """Probabilities [N, S*K] of the SavedModel, recalibrated when the export was updated (adaptation.json)."""
        import tensorflow as tf

        out = self.signature(examples=tf.convert_to_tensor(examples, tf.string),
                             num_samples=tf.constant(num_samples, tf.int32), seed=tf.constant(seed, tf.int64))
        probs = out[OUTPUT].numpy()
        # The one place a stored update is applied: ehr-eval, the service and ehr-adapt all call this.
        adaptation = self.files.adaptation
        return probs if adaptation is None else adaptation.recalibration.apply(probs)


def _check_signature(signature: Any, where: pathlib.Path, name: str) -> None:
    """Raises ExportError unless the signature takes SIGNATURE_INPUTS and returns OUTPUT."""
    inputs = set(signature.structured_input_signature[1])
    if inputs != set(SIGNATURE_INPUTS):
        raise ExportError(f"{where}: signature '{name}' takes {sorted(inputs)}, expected {sorted(SIGNATURE_INPUTS)}")
    if OUTPUT not in signature.structured_outputs:
        raise ExportError(f"{where}: signature '{name}' returns {sorted(signature.structured_outputs)}, "
                          f"expected '{OUTPUT}'")


def check_export(export_dir: str | os.PathLike[str]) -> tuple[dict, Export]:
    """load_export's checks without its SavedModel: (manifest, side files), or the ExportError load_export raises."""
    root = pathlib.Path(export_dir)
    if not root.is_dir():  # before importing TensorFlow: the commonest mistake fails at once
        raise ExportError(f"{root}: model directory does not exist or is not a directory")
    return verify_export(root), read_export(root)


def load_export(export_dir: str | os.PathLike[str], precision: str = "float32") -> LoadedExport:
    """Verifies every checksum, validates the JSON side files, then loads the SavedModel (imports TensorFlow).

    precision picks the signature: "float32" (exact) or "bfloat16" (faster LSTM matmuls).
    """
    if precision not in SIGNATURES:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    root = pathlib.Path(export_dir)
    manifest, files = check_export(root)
    import tensorflow as tf

    where = root / SAVED_MODEL_DIR
    try:
        saved = tf.saved_model.load(str(where))
    except Exception as err:  # TF raises many types for a bad SavedModel; all mean the same here
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ExportError(f"{root}: cannot load the export: {type(err).__name__}: {first_line}") from None
    if SIGNATURE not in saved.signatures:
        raise ExportError(f"{root}: {SAVED_MODEL_DIR} has no {SIGNATURE!r} signature")
    exact = LoadedExport(files, manifest, saved, "float32")
    _check_signature(exact.signature, where, SIGNATURE)
    return exact.with_precision(precision)
