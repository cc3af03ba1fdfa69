"""New data against the population a model learnt from: the reference an export carries, and the report.

The statistics and their comparison live in the data layer (``ehr_pipeline.shift.population``,
``ehr_pipeline.shift``); this module ties them to models:

* ``reference_profile``: the training split of a data folder, with the model's mutual
  information on the validation split, as training's export writes it (reference_profile.json);
  ``reference_from_data`` makes one on the fly for an export that has none (``--reference-data``).
* ``current_profile``: new data (serialized examples, their units.json) binned on the reference,
  in the model's vocabulary, with the model's mutual information when it scored them.
* ``run_shift``: the report of a data folder against an export, for ``ehr-analyze shift`` (the folder
  checked against its manifest and the model's schema version first: ``ehr_pipeline.contract.integrity``);
  ``ehr-eval`` builds the current profile from the predictions it already made.
* ``write_outputs``: shift.json, shift.md and shift.png.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ehr_pipeline import shift
from ehr_pipeline.contract import integrity
from ehr_pipeline.shift import Profile, population

log = logging.getLogger(__name__)

SHIFT_JSON = "shift.json"
SHIFT_MD = "shift.md"
SHIFT_PNG = "shift.png"
# Exit code of a command whose shift report reached its --fail-on level (2 is a usage error).
EXIT_SHIFT = 3
FAIL_ON = ("severe", "moderate", "never")
SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class ShiftResult:
    """A report with the two profiles it compared."""

    report: shift.ShiftReport
    reference: Profile
    current: Profile

    def fails(self, fail_on: str) -> bool:
        """True when the report's level reaches `fail_on` ('never' never does)."""
        return fail_on != "never" and self.report.at_least(fail_on)


def _vocabulary(files: Any) -> set[str]:
    from model.export.load import vocabulary_ranks

    return set(vocabulary_ranks({"sources": files.vocabulary}, files.path("vocabulary.json")))


def reference_profile(files: Any, *, validation_mi: np.ndarray | None = None, samples: int | None = None) -> Profile:
    """The reference of a model trained on `files` (model.training.inputs.DataFiles): its training split, in its vocabulary.

    validation_mi: the model's mutual information on the validation split (nats), estimated with
    `samples` samples per member.
    """
    vocabulary = _vocabulary(files)
    profile = population.profile_of_data(files.data_dir, ["train"], vocabulary=vocabulary, keep=vocabulary,
                                         description=f"training split of {files.data_dir}")
    if validation_mi is not None:
        profile = profile.with_mutual_information(np.asarray(validation_mi), samples)
    return profile


def reference_from_data(data_dir: str | os.PathLike[str], model: Any | None, *, samples: int, seed: int = 0,
                        batch_size: int = 64, progress: bool = False) -> Profile:
    """A reference made now from the data folder a model was trained on; model (LoadedExport) adds validation MI."""
    from model.evaluation import metrics
    from model.export.predict import predict_probs
    from model.training.inputs import load_data_files, read_split

    files = load_data_files(data_dir)
    mi = None
    if model is not None:
        records, _, _ = read_split(files, "validation")
        probs = predict_probs(model, records, samples, seed, batch_size=batch_size, progress=progress)
        mi = metrics.mutual_information(probs)
    return reference_profile(files, validation_mi=mi, samples=samples if mi is not None else None)


def current_profile(export: Any, reference: Profile, records: Sequence[bytes], data_dir: str | os.PathLike[str],
                    *, mutual_information: np.ndarray | None = None, samples: int | None = None,
                    description: str = "", canonical: Mapping[str, str] | None = None) -> Profile:
    """New data's profile: `records` of `data_dir` (whose units.json says what their values were converted to;
    `canonical` instead, when the records were converted since)."""
    counts, written = population.data_units(data_dir)
    canonical = written if canonical is None else canonical
    admissions = population.admissions_from_examples(records, mutual_information)
    return Profile.build(admissions, vocabulary=export.vocabulary, bins_from=reference, units=counts,
                         canonical=canonical, mi_samples=samples if mutual_information is not None else None,
                         description=description or str(data_dir))


def compare(export: Any, reference: Profile, current: Profile) -> shift.ShiftReport:
    """shift.compare with the export's LOINC codes (unit hints use the analyte's molar mass)."""
    return shift.compare(reference, current, loinc=export.harmoniser.loinc, converter=export.harmoniser.converter)


def run_shift(model_dir: str | os.PathLike[str], data_dir: str | os.PathLike[str], *,
              splits: Sequence[str] = SPLITS, use_model: bool = True, samples: int | None = None, seed: int = 0,
              batch_size: int = 64, reference_data: str | os.PathLike[str] | None = None,
              progress: bool = False) -> ShiftResult:
    """The shift report of `splits` of a data folder against an export (its reference, or one from reference_data)."""
    from model.evaluation import metrics
    from model.export.load import REFERENCE_PROFILE, load_export, read_export
    from model.export.predict import predict_probs

    export = read_export(model_dir)
    if export.reference is None and reference_data is None:
        raise ValueError(f"{model_dir} has no {REFERENCE_PROFILE} (exported before the shift report existed): "
                         "pass --reference-data with the data folder it was trained on")
    models = {str(model_dir): export.schema_version}
    integrity.verify_folder(data_dir, splits, models=models)
    if reference_data is not None:
        integrity.verify_folder(reference_data, ("train", "validation"), models=models)
    loaded = load_export(model_dir) if use_model else None
    records: list[bytes] = []
    for split in splits:
        try:
            records += population.read_records(data_dir, split)
        except FileNotFoundError:
            log.warning("%s has no %s split: left out", data_dir, split)
    if not records:
        raise FileNotFoundError(f"{data_dir}: no examples in the splits {list(splits)}")
    if reference_data is not None:
        _check_training_data(export, reference_data)
        reference = reference_from_data(reference_data, loaded, samples=samples or 25, seed=seed,
                                        batch_size=batch_size, progress=progress)
    else:
        reference = export.reference
    mi = None
    s = samples or reference.mi_samples or 25
    if loaded is not None and reference.mutual_information is not None:
        log.info("scoring %d admissions (S = %d) for the model's mutual information", len(records), s)
        mi = metrics.mutual_information(predict_probs(loaded, records, s, seed, batch_size=batch_size,
                                                      progress=progress))
    current = current_profile(export, reference, records, data_dir, mutual_information=mi, samples=s,
                              description=f"{', '.join(splits)} of {data_dir}")
    return ShiftResult(compare(export, reference, current), reference, current)


def _check_training_data(export: Any, data_dir: str | os.PathLike[str]) -> None:
    from model.export.write import data_manifest_sha256

    if export.card_raw.get("data_manifest_sha256") not in (None, data_manifest_sha256(data_dir)):
        log.warning("%s is not the data %s was trained on (data manifest checksum differs): the reference "
                    "describes it, not the model's training data", data_dir, export.directory)


def write_outputs(out_dir: str | os.PathLike[str], result: ShiftResult,
                  extra: dict[str, Any] | None = None) -> dict[str, pathlib.Path]:
    """Writes shift.json (report and the new data's profile), shift.md and shift.png; returns their paths."""
    from model.evaluation.plots import shift_plot

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {**result.report.to_json(), "current_profile": result.current.to_json(), **(extra or {})}
    paths = {"json": out / SHIFT_JSON, "markdown": out / SHIFT_MD, "plot": out / SHIFT_PNG}
    paths["json"].write_text(json.dumps(doc, indent=2, sort_keys=True, allow_nan=False) + "\n", encoding="utf-8")
    paths["markdown"].write_text(result.report.markdown(), encoding="utf-8")
    shift_plot(result.report, paths["plot"])
    return paths
