"""Writes the export directory MODEL_DIR/ (its layout and reader: model.export.load).

``write_export`` saves an in-memory model, ``write_ensemble_export`` joins several exports of
one data folder into a deep ensemble, ``write_updated_export`` writes a model updated at a new
site (model.adapt) beside its parent's side files; all write the side files and the manifest last, in
a staging folder that takes MODEL_DIR's place only once complete (ehr_pipeline.contract.output_folder):
an earlier export is replaced only when the caller says so, and no other folder ever is.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import pathlib
import shutil
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import tensorflow as tf

import ehr_base
from ehr_pipeline.contract import layout, output_folder
from ehr_pipeline.shift import Profile
from model.export_layout import (ADAPTATION, ADMISSION_TYPES_FILE, FORMAT_VERSION, METRICS, MODEL_CARD, PIPELINE_CONFIG, REFERENCE_PROFILE,
                            SAVED_MODEL_DIR, SIGNATURE, SIGNATURES, json_ready)
from model.data_folder import admission_type_counts
from model.export.load import ExportError, LoadedExport, load_export, read_export, write_manifest
from model.export.predict import INPUT_SIGNATURE, Predictor, assert_stateless

INTENDED_USE = (
    "Research on predictive uncertainty: in-hospital mortality risk of adult ICU admissions from the "
    "first 24 hours of MIMIC-III-style records, with per-case uncertainty to refer uncertain cases to a "
    "clinician. Not a medical device; not for clinical decisions.")
LIMITATIONS = (
    "Trained on one hospital's retrospective data (or a synthetic release): expect calibration and "
    "discrimination to degrade on other populations, coding practices or time periods. Codes unseen in "
    "training share per-source out-of-vocabulary vectors. Uncertainty estimates are approximate "
    "(variational posterior, S Monte-Carlo samples); referral thresholds were chosen on the validation split.")


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.write_text(json.dumps(json_ready(obj), indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")


def _finish(tmp: pathlib.Path, source_dir: str | os.PathLike[str], card: dict, metrics_doc: dict,
            pipeline_config: Mapping[str, Any], reference: Profile | None = None) -> None:
    """Writes the side files (vocabulary/statistics copied from source_dir) and the manifest into tmp."""
    for name in (layout.VOCABULARY, layout.NUMERIC_STATS):
        shutil.copyfile(os.path.join(source_dir, name), tmp / name)
    # The LOINC lab bridge and the training units travel with the model (data folders made
    # before they existed have none: FHIR labs then need local codes, and units go unchecked).
    # A model trained on MEDS data also carries the code map its codes were read with: the
    # service reads the MEDS codes of its requests with it.
    for name in (layout.LAB_LOINC, layout.UNITS, layout.MEDS_CODES):
        if os.path.exists(os.path.join(source_dir, name)):
            shutil.copyfile(os.path.join(source_dir, name), tmp / name)
    # The training split's admission types: the service averages the model over them when a
    # request does not know its type. An ensemble's source is an export that carries them.
    if os.path.exists(os.path.join(source_dir, ADMISSION_TYPES_FILE)):
        shutil.copyfile(os.path.join(source_dir, ADMISSION_TYPES_FILE), tmp / ADMISSION_TYPES_FILE)
    elif counts := admission_type_counts(source_dir, "train"):
        _write_json(tmp / ADMISSION_TYPES_FILE, {"split": "train", "counts": counts})
    if reference is not None:
        _write_json(tmp / REFERENCE_PROFILE, reference.to_json())
    _write_json(tmp / PIPELINE_CONFIG, dict(pipeline_config))
    _write_json(tmp / METRICS, metrics_doc)
    _write_json(tmp / MODEL_CARD, card)
    write_manifest(tmp)


def _with_time_inputs(card: Mapping[str, Any], time_inputs: Sequence[str]) -> dict:
    """The card with "time_inputs": what the SavedModel reads, so a reader need not trace it (model.export.load)."""
    return {**card, "time_inputs": list(dict.fromkeys(time_inputs))}


@contextlib.contextmanager
def _staged(export_dir: pathlib.Path, command: str, overwrite: bool, inputs: Sequence[Any] = ()
            ) -> Iterator[pathlib.Path]:
    """The export's staging folder: moved into place whole once complete, removed on failure (output_folder)."""
    with output_folder.staged(export_dir, kind=output_folder.MODEL_EXPORT, command=command, overwrite=overwrite,
                              inputs=[str(i) for i in inputs]) as staging:
        yield pathlib.Path(staging)


def model_card(*, name: str, method: str, ensemble_size: int, data_sha256: str, metrics_doc: Mapping[str, Any],
               config: Mapping[str, Any] | None = None, num_parameters: int | None = None,
               members: Sequence[str] | None = None, base: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The model card dict (fields: model.export.load's docstring); base: the adapted run of a Bella model (its checksum)."""
    card = {
        "name": name,
        "version": ehr_base.__version__,
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
                 pipeline_config: Mapping[str, Any], card: dict, metrics_doc: dict,
                 reference: Profile | None = None, overwrite: bool = False,
                 command: str = "ehr-train") -> pathlib.Path:
    """Writes MODEL_DIR/ for an in-memory predictor; reference: the training population (model.evaluation.against_reference).

    An earlier export in MODEL_DIR is replaced (whole, once the new one is complete) only with ``overwrite``.
    """
    export_dir = pathlib.Path(export_dir)
    card = _with_time_inputs(card, predictor.module.featurizer.time_inputs)
    with _staged(export_dir, command, overwrite, [data_dir]) as tmp:
        module = predictor.module
        tf.saved_model.save(module, str(tmp / SAVED_MODEL_DIR), signatures=module.signatures())
        _finish(tmp, data_dir, card, metrics_doc, pipeline_config, reference)
    return export_dir


def write_updated_export(export_dir: str | os.PathLike[str], parent: str | os.PathLike[str], *,
                         predictor: Predictor | None, adaptation: Mapping[str, Any], card: dict, metrics_doc: dict,
                         reference: Profile | None, overwrite: bool = False,
                         data_dir: str | os.PathLike[str] | None = None) -> pathlib.Path:
    """Writes MODEL_DIR/ for a model updated at a new site (model.adapt): the parent's side files and either its
    SavedModel (predictor None: a recalibration, applied from adaptation.json) or the updated network's.

    MODEL_DIR may not be, hold or lie inside the parent or the local data folder ``data_dir``; an earlier
    export there is replaced only with ``overwrite``.
    """
    export_dir, parent = pathlib.Path(export_dir), pathlib.Path(parent)
    if export_dir.resolve() == parent.resolve():
        raise ExportError(f"{export_dir}: the updated export must not replace its parent")
    card = _with_time_inputs(card, read_export(parent).time_inputs if predictor is None
                             else predictor.module.featurizer.time_inputs)
    with _staged(export_dir, "ehr-adapt", overwrite, [parent, *([data_dir] if data_dir else [])]) as tmp:
        if predictor is None:
            shutil.copytree(parent / SAVED_MODEL_DIR, tmp / SAVED_MODEL_DIR)
        else:
            tf.saved_model.save(predictor.module, str(tmp / SAVED_MODEL_DIR),
                                signatures=predictor.module.signatures())
        _write_json(tmp / ADAPTATION, dict(adaptation))
        pipeline_raw = json.loads((parent / PIPELINE_CONFIG).read_text(encoding="utf-8"))
        _finish(tmp, parent, card, metrics_doc, pipeline_raw, reference)
    return export_dir


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
                          card: dict, metrics_doc: dict, reference: Profile | None = None,
                          overwrite: bool = False, data_dir: str | os.PathLike[str] | None = None,
                          members: Sequence[LoadedExport] | None = None) -> pathlib.Path:
    """Writes MODEL_DIR/ for a deep ensemble of exports made on the same data (same vocabulary/statistics).

    reference: the ensemble's reference profile (the members' population with the ensemble's own
    validation mutual information); None writes none. MODEL_DIR may not be, hold or lie inside a member
    or ``data_dir``; an earlier export there is replaced only with ``overwrite``. members: the exports of
    member_dirs, in order, where the caller has loaded them already (a load reads a whole SavedModel).
    """
    if members is not None and [pathlib.Path(e.path) for e in members] != [pathlib.Path(d) for d in member_dirs]:
        raise ValueError("members must be the loaded exports of member_dirs, in the same order")
    loaded = list(members) if members is not None else [load_export(d) for d in member_dirs]
    digests = {(e.manifest["files"][layout.VOCABULARY], e.manifest["files"][layout.NUMERIC_STATS]) for e in loaded}
    if len(digests) != 1:
        raise ExportError("ensemble members were trained on different vocabularies/statistics")
    # The ensemble's signature calls each member's SavedModel, past LoadedExport's recalibration.
    recalibrated = sorted(str(e.path) for e in loaded
                          if e.files.adaptation is not None and not e.files.adaptation.recalibration.is_identity)
    if recalibrated:
        raise ExportError(f"ensemble members {recalibrated} are recalibrated exports (adaptation.json): "
                          "an ensemble export cannot carry their recalibration; join their parents instead")
    export_dir = pathlib.Path(export_dir)
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
    inputs = [*member_dirs, *([data_dir] if data_dir else [])]
    card = _with_time_inputs(card, [t for e in loaded for t in e.files.time_inputs])
    with _staged(export_dir, "ehr-eval --export-ensemble", overwrite, inputs) as tmp:
        tf.saved_model.save(module, str(tmp / SAVED_MODEL_DIR), signatures=signatures)
        _finish(tmp, loaded[0].path, card, metrics_doc, loaded[0].files.pipeline_raw, reference)
    return export_dir
