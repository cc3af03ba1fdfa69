"""The export directory MODEL_DIR/ that the prediction service loads (format_version 1).

Layout (the contract with serving/):
  saved_model/          tf.saved_model, signature "serving_default":
                          examples   tf.string [N]  serialized SequenceExamples as the Beam job writes them
                          num_samples tf.int32 scalar S in [1, 100]
                          seed       tf.int64 scalar
                        -> {"probs": float32 [N, S*K]}, sample-major (column s*K + k).
                        Parsing, vocabulary lookup and z-scoring run inside; sampling is stateless,
                        keyed by (seed, example), so a prediction never depends on the batch.
                        A second signature "serving_bfloat16" takes the same inputs and draws the
                        same noise with the LSTM's matmuls in bfloat16 (faster on CPUs with
                        bfloat16 units; probabilities within the tolerance the tests pin).
  model_card.json       name, version, method, ensemble_size, created, data manifest checksum,
                        intended use, limitations, metrics summary (+ config, parameters;
                        a Bella model adds "base": the adapted run's checkpoint and its SHA-256)
  pipeline_config.json  the pipeline config the data was made with (trigger offset, bagging, ...)
  vocabulary.json, numeric_stats.json   copied from the data folder
  lab_loinc.json        (optional) LOINC -> lab ITEMIDs from D_LABITEMS, copied from the data folder
  units.json            (optional) units each numeric code's values came in, copied from the data folder
  metrics.json          {"test": {...}, "referral": {measure, rate, threshold}, "decision_threshold": 0.5}
  manifest.json         {"files": {relative_path: sha256}, "format_version": 1}

``load_export`` verifies every checksum before anything is used.
"""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import shutil
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import ehr_pipeline
from ehr_pipeline import outputs
from model.metrics import json_ready
from model.predict import INPUT_SIGNATURE, PRECISIONS, SIGNATURE, SIGNATURES, Predictor, assert_stateless

FORMAT_VERSION = 1
SAVED_MODEL_DIR = "saved_model"
MODEL_CARD = "model_card.json"
PIPELINE_CONFIG = "pipeline_config.json"
METRICS = "metrics.json"
MANIFEST = "manifest.json"
DECISION_THRESHOLD = 0.5
INTENDED_USE = (
    "Research on predictive uncertainty: in-hospital mortality risk of adult ICU admissions from the "
    "first 24 hours of MIMIC-III-style records, with per-case uncertainty to refer uncertain cases to a "
    "clinician. Not a medical device; not for clinical decisions.")
LIMITATIONS = (
    "Trained on one hospital's retrospective data (or a synthetic release): expect calibration and "
    "discrimination to degrade on other populations, coding practices or time periods. Codes unseen in "
    "training share per-source out-of-vocabulary vectors. Uncertainty estimates are approximate "
    "(variational posterior, S Monte-Carlo samples); referral thresholds were chosen on the validation split.")


class ExportError(RuntimeError):
    """An export directory that is incomplete, altered or of an unknown format."""


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.write_text(json.dumps(json_ready(obj), indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")


def _sha256(path: pathlib.Path) -> str:
    return outputs.sha256_of(str(path))


def write_manifest(root: str | os.PathLike[str]) -> dict[str, str]:
    """Writes manifest.json with the SHA-256 of every other file under root; returns that map."""
    root = pathlib.Path(root)
    files = {p.relative_to(root).as_posix(): _sha256(p)
             for p in sorted(root.rglob("*")) if p.is_file() and p.name != MANIFEST}
    _write_json(root / MANIFEST, {"files": files, "format_version": FORMAT_VERSION})
    return files


def metrics_document(test_report: Mapping[str, Any], *, measure: str, rate: float, threshold: float) -> dict:
    """metrics.json: the test summary, the referral rule chosen on validation and the decision threshold."""
    from model.evaluate import summary

    return {"test": summary(test_report), "referral": {"measure": measure, "rate": rate, "threshold": threshold},
            "decision_threshold": DECISION_THRESHOLD}


def _finish(tmp: pathlib.Path, export_dir: pathlib.Path, source_dir: str | os.PathLike[str], card: dict,
            metrics_doc: dict, pipeline_config: Mapping[str, Any]) -> pathlib.Path:
    """Writes the side files (vocabulary/statistics copied from source_dir) and the manifest, then moves tmp."""
    for name in (outputs.VOCABULARY, outputs.NUMERIC_STATS):
        shutil.copyfile(os.path.join(source_dir, name), tmp / name)
    # The LOINC lab bridge and the training units travel with the model (data folders made
    # before they existed have none: FHIR labs then need local codes, and units go unchecked).
    for name in (outputs.LAB_LOINC, outputs.UNITS):
        if os.path.exists(os.path.join(source_dir, name)):
            shutil.copyfile(os.path.join(source_dir, name), tmp / name)
    _write_json(tmp / PIPELINE_CONFIG, dict(pipeline_config))
    _write_json(tmp / METRICS, metrics_doc)
    _write_json(tmp / MODEL_CARD, card)
    write_manifest(tmp)
    # Replace a previous export only once the new one is complete.
    if export_dir.exists():
        shutil.rmtree(export_dir)
    tmp.rename(export_dir)
    return export_dir


def _new_tmp(export_dir: pathlib.Path) -> pathlib.Path:
    tmp = export_dir.with_name(export_dir.name + ".inprogress")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def data_manifest_sha256(data_dir: str | os.PathLike[str]) -> str:
    """SHA-256 of a data folder's manifest.json: identifies the data a model was trained on."""
    return outputs.sha256_of(os.path.join(os.fspath(data_dir), outputs.MANIFEST))


def model_card(*, name: str, method: str, ensemble_size: int, data_sha256: str, metrics_doc: Mapping[str, Any],
               config: Mapping[str, Any] | None = None, num_parameters: int | None = None,
               members: Sequence[str] | None = None, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The model card dict (see the module docstring); base: the adapted run of a Bella model (its checksum)."""
    card = {
        "name": name,
        "version": ehr_pipeline.__version__,
        "format_version": FORMAT_VERSION,
        "method": method,
        "ensemble_size": int(ensemble_size),
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "data_manifest_sha256": data_sha256,
        "intended_use": INTENDED_USE,
        "limitations": LIMITATIONS,
        "metrics_summary": metrics_doc.get("test", {}),
        "signature": {"name": SIGNATURE, "precisions": dict(SIGNATURES),
                      "inputs": {"examples": "string [N]", "num_samples": "int32 []", "seed": "int64 []"},
                      "outputs": {"probs": "float32 [N, num_samples * ensemble_size], column s*K + k"}},
    }
    if config is not None:
        card["config"] = dict(config)
    if num_parameters is not None:
        card["num_parameters"] = int(num_parameters)
    if members is not None:
        card["members"] = list(members)
    if base is not None:
        card["base"] = dict(base)
    return card


def write_export(export_dir: str | os.PathLike[str], predictor: Predictor, *, data_dir: str,
                 pipeline_config: Mapping[str, Any], card: dict, metrics_doc: dict) -> pathlib.Path:
    """Writes MODEL_DIR/ for an in-memory predictor (a trained model with its featurizer)."""
    export_dir = pathlib.Path(export_dir)
    tmp = _new_tmp(export_dir)
    module = predictor.module
    tf.saved_model.save(module, str(tmp / SAVED_MODEL_DIR), signatures=module.signatures())
    return _finish(tmp, export_dir, data_dir, card, metrics_doc, pipeline_config)


class _EnsembleModule(tf.Module):
    """Several exported models behind one signature: members side by side along K."""

    def __init__(self, members: Sequence[Any], sizes: Sequence[int]):
        super().__init__(name="ehr_ensemble")
        self.members = list(members)  # loaded SavedModels: tracked, so their variables are re-saved
        self.sizes = [int(k) for k in sizes]
        self.ensemble_size = int(sum(self.sizes))

    def _serve(self, examples, num_samples, seed, signature: str):
        n = tf.shape(examples)[0]
        parts = []
        for member, k in zip(self.members, self.sizes):
            probs = member.signatures[signature](examples=examples, num_samples=num_samples, seed=seed)["probs"]
            parts.append(tf.reshape(probs, [n, num_samples, k]))
        return {"probs": tf.reshape(tf.concat(parts, axis=2), [n, num_samples * self.ensemble_size])}

    @tf.function(input_signature=INPUT_SIGNATURE, autograph=False)
    def serve(self, examples, num_samples, seed):
        """{"probs": [N, S*K_total]}: each member's [N, S, K_m] joined along K."""
        return self._serve(examples, num_samples, seed, SIGNATURES["float32"])

    @tf.function(input_signature=INPUT_SIGNATURE, autograph=False)
    def serve_bfloat16(self, examples, num_samples, seed):
        """As serve, through each member's bfloat16 signature."""
        return self._serve(examples, num_samples, seed, SIGNATURES["bfloat16"])


def write_ensemble_export(export_dir: str | os.PathLike[str], member_dirs: Sequence[str | os.PathLike[str]], *,
                          card: dict, metrics_doc: dict) -> pathlib.Path:
    """Writes MODEL_DIR/ for a deep ensemble of exports made on the same data (same vocabulary/statistics)."""
    loaded = [load_export(d) for d in member_dirs]
    digests = {(e.manifest["files"][outputs.VOCABULARY], e.manifest["files"][outputs.NUMERIC_STATS]) for e in loaded}
    if len(digests) != 1:
        raise ExportError("ensemble members were trained on different vocabularies/statistics")
    export_dir = pathlib.Path(export_dir)
    tmp = _new_tmp(export_dir)
    missing = sorted({str(e.path) for e in loaded for name in SIGNATURES.values()
                      if name not in e.saved_model.signatures})
    if missing:
        raise ExportError(f"ensemble members {missing} lack a signature of {sorted(SIGNATURES.values())}: "
                          "re-export them with this version")
    module = _EnsembleModule([e.saved_model for e in loaded], [e.ensemble_size for e in loaded])
    signatures = {}
    for fn, name in ((module.serve, SIGNATURES["float32"]), (module.serve_bfloat16, SIGNATURES["bfloat16"])):
        signatures[name] = fn.get_concrete_function()
        assert_stateless(signatures[name])
    tf.saved_model.save(module, str(tmp / SAVED_MODEL_DIR), signatures=signatures)
    pipeline_config = json.loads((loaded[0].path / PIPELINE_CONFIG).read_text(encoding="utf-8"))
    return _finish(tmp, export_dir, loaded[0].path, card, metrics_doc, pipeline_config)


class LoadedExport:
    """A verified export: callable like a Predictor, (examples, S, seed) -> probs [N, S*K]."""

    def __init__(self, path: pathlib.Path, manifest: dict, model_card: dict, metrics: dict, saved_model: Any,
                 precision: str = "float32"):
        self.path = path
        self.manifest = manifest
        self.model_card = model_card
        self.metrics = metrics
        self.saved_model = saved_model
        self.precision = precision
        self.signature = saved_model.signatures[SIGNATURES[precision]]
        self.ensemble_size = int(model_card["ensemble_size"])

    def __call__(self, examples, num_samples: int, seed: int) -> np.ndarray:
        out = self.signature(examples=tf.convert_to_tensor(examples, tf.string),
                             num_samples=tf.constant(num_samples, tf.int32), seed=tf.constant(seed, tf.int64))
        return out["probs"].numpy()


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
    for required in (MODEL_CARD, METRICS, PIPELINE_CONFIG, outputs.VOCABULARY, outputs.NUMERIC_STATS,
                     f"{SAVED_MODEL_DIR}/saved_model.pb"):
        if required not in files:
            raise ExportError(f"{root}: {MANIFEST} does not list {required}")
    for rel, digest in sorted(files.items()):
        path = root / rel
        if not path.is_file():
            raise ExportError(f"{root}: {rel} is missing")
        if _sha256(path) != digest:
            raise ExportError(f"{root}: {rel} does not match its checksum in {MANIFEST} (altered or corrupt)")
    extra = [p.relative_to(root).as_posix() for p in root.rglob("*")
             if p.is_file() and p.name != MANIFEST and p.relative_to(root).as_posix() not in files]
    if extra:
        raise ExportError(f"{root}: files not in {MANIFEST}: {sorted(extra)[:5]}")
    return manifest


def load_export(export_dir: str | os.PathLike[str], precision: str = "float32") -> LoadedExport:
    """Verifies every checksum, then loads the SavedModel and the JSON side files.

    precision picks the signature: "float32" (exact) or "bfloat16" (faster LSTM matmuls).
    """
    if precision not in SIGNATURES:
        raise ValueError(f"precision {precision!r}: expected one of {PRECISIONS}")
    root = pathlib.Path(export_dir)
    manifest = verify_export(root)
    card = json.loads((root / MODEL_CARD).read_text(encoding="utf-8"))
    metrics_doc = json.loads((root / METRICS).read_text(encoding="utf-8"))
    saved = tf.saved_model.load(str(root / SAVED_MODEL_DIR))
    name = SIGNATURES[precision]
    if name not in saved.signatures:
        raise ExportError(f"{root}: {SAVED_MODEL_DIR} has no {name!r} signature (precision {precision}); "
                          "exports older than the bfloat16 signature serve float32 only")
    return LoadedExport(root, manifest, card, metrics_doc, saved, precision)
