"""A site's labelled admissions as an update reads them: checked, put in the model's units, drawn and split.

The local data folder is the Beam job's output for the site's own records, prepared with the
model's units (``ehr-pipeline run --units-from MODEL_DIR``); it is checked against its manifest
and its units against the model's exactly as ehr-eval checks data it scores. Every record of the
split is used or counted by reason (unlabelled, not drawn): the counts go into adaptation.json.

Or the service's outcome store (``ehr-adapt --outcomes``): the encoded admissions the service kept
(--outcome-keep-admissions) with the outcomes that arrived for them, those the export's model
version answered, read by ``model.adapt.outcome_file``. The service encoded them in the model's
units, so no unit plan applies; every row is used or counted by reason as well.
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os

import numpy as np

from ehr_pipeline.contract import integrity
from ehr_pipeline.shift import population
from model import data_folder
from model.adapt.outcome_file import OutcomeFileError, read_kept_admissions
from model.adapt.rebuild import AdaptError
from model.evaluation import unit_check
from model.export.load import LoadedExport

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LocalSample:
    """Labelled admissions of a site (serialized records in the model's units, labels 0/1, ids)."""

    records: list[bytes]
    labels: np.ndarray  # int64 [N]
    hadm_ids: np.ndarray  # int64 [N]

    @property
    def n(self) -> int:
        """Admissions."""
        return len(self.records)

    @property
    def events(self) -> int:
        """Deaths among them."""
        return int(self.labels.sum())

    def take(self, index: np.ndarray) -> LocalSample:
        """The admissions at `index`, in that order."""
        return LocalSample([self.records[i] for i in index], self.labels[index], self.hadm_ids[index])


@dataclasses.dataclass(frozen=True)
class LocalData:
    """The drawn sample and what happened to every record of the split."""

    sample: LocalSample
    data_dir: str
    split: str
    manifest_sha256: str  # the data folder's; from an outcome store, sha256 of the admissions and outcomes used
    counts: dict[str, int]  # read, then counts by reason (unlabelled or the store's), not_drawn, used
    units: dict[str, dict[str, int]]  # units.json "codes": rows per code and unit as written at the site
    canonical: dict[str, str]  # code -> the unit the sample's values are in (the model's where converted)


def read_local(loaded: LoadedExport, data_dir: str | os.PathLike[str], split: str, *, sample_size: int | None,
               seed: int) -> LocalData:
    """The split's labelled admissions (all, or `sample_size` drawn at random with `seed`) in the model's units."""
    data_dir = os.fspath(data_dir)
    integrity.verify_folder(data_dir, [split], models={str(loaded.path): loaded.files.schema_version})
    plan = unit_check.plan_units([loaded], data_dir)
    split_records = data_folder.read_split(data_folder.load_data_files(data_dir), split)
    labels = np.asarray(split_records.labels, np.int64)
    labelled = np.flatnonzero((labels == 0) | (labels == 1))
    counts = {"read": len(labels), "unlabelled": int(len(labels) - len(labelled))}
    if counts["unlabelled"]:
        log.warning("%s split %s: %d admission(s) without a 0/1 outcome are not used", data_dir, split,
                    counts["unlabelled"])
    chosen = _draw(labelled, sample_size, seed, f"{data_dir}: split {split!r}", counts)
    records = plan.convert([split_records.records[i] for i in chosen])
    sample = _checked(LocalSample(records, labels[chosen], np.asarray(split_records.hadm_ids, np.int64)[chosen]),
                      f"{data_dir}: the {len(chosen)} admissions drawn from split {split!r}")
    log.info("%s split %s: %d admissions read, %d used (%d deaths), %d unlabelled, %d not drawn", data_dir, split,
             counts["read"], sample.n, sample.events, counts["unlabelled"], counts["not_drawn"])
    written, _ = population.data_units(data_dir)
    return LocalData(sample, data_dir, split, data_folder.manifest_sha256(data_dir), counts, written,
                     dict(plan.canonical))


OUTCOME_SPLIT = "outcome-store"  # the split a LocalData read from the service's outcome store names


def read_outcomes(loaded: LoadedExport, outcome_dir: str | os.PathLike[str], *, sample_size: int | None,
                  seed: int) -> LocalData:
    """The outcome store's kept admissions answered by this export (its checksum), with their outcomes (all, or
    `sample_size` drawn with `seed`); AdaptError when the store holds none of them."""
    outcome_dir = os.fspath(outcome_dir)
    version = loaded.files.card.version
    try:
        kept = read_kept_admissions(outcome_dir, loaded.files.checksum)
    except OutcomeFileError as err:
        raise AdaptError(str(err)) from None
    labels = np.asarray(kept.outcomes, np.int64)
    counts = {k: v for k, v in kept.counts.items() if k != "used"}
    for reason in ("without_outcome", "admission_not_kept", "other_model", "model_not_recorded"):
        if counts[reason]:
            log.warning("%s: %d prediction(s) not used: %s", outcome_dir, counts[reason], reason.replace("_", " "))
    chosen = _draw(np.arange(len(labels)), sample_size, seed, f"{outcome_dir}: the outcome store", counts)
    # The store holds no admission numbers (the service writes them as 0): a row's place stands in for one.
    sample = _checked(LocalSample([kept.records[i] for i in chosen], labels[chosen], chosen.astype(np.int64)),
                      f"{outcome_dir}: the {len(chosen)} kept admissions of model version {version}")
    digest = hashlib.sha256()
    for record, label in zip(sample.records, sample.labels):
        digest.update(len(record).to_bytes(8, "little") + record + bytes([int(label)]))
    log.info("%s: %d predictions read, %d used (%d deaths), %d not drawn", outcome_dir, counts["read"], sample.n,
             sample.events, counts["not_drawn"])
    # The service converted every value to the model's units before encoding: the units it was written in are
    # not kept, and the sample's are the export's own.
    return LocalData(sample, outcome_dir, OUTCOME_SPLIT, digest.hexdigest(), counts, {}, dict(loaded.files.units))


def _draw(candidates: np.ndarray, sample_size: int | None, seed: int, where: str, counts: dict[str, int]) -> np.ndarray:
    """All candidates, or `sample_size` of them drawn with `seed` (sorted); counts not_drawn and used."""
    if sample_size is not None and sample_size > len(candidates):
        raise AdaptError(f"{where} has {len(candidates)} labelled admissions, fewer than the {sample_size} asked for")
    chosen = candidates if sample_size is None else np.sort(
        np.random.default_rng(seed).choice(candidates, size=sample_size, replace=False))
    counts["not_drawn"] = int(len(candidates) - len(chosen))
    counts["used"] = int(len(chosen))
    return chosen


def _checked(sample: LocalSample, where: str) -> LocalSample:
    """The sample, or AdaptError when it lacks deaths or survivors."""
    if sample.events == 0 or sample.events == sample.n:
        raise AdaptError(f"{where} have {sample.events} deaths: an update needs both outcomes")
    return sample


def split_for_validation(sample: LocalSample, fraction: float, seed: int) -> tuple[LocalSample, LocalSample]:
    """(fit, validation): `fraction` of each outcome held out (at least one death and one survivor each)."""
    rng = np.random.default_rng(seed + 1)
    fit, held = [], []
    for outcome in (0, 1):
        index = rng.permutation(np.flatnonzero(sample.labels == outcome))
        if len(index) < 2:
            raise AdaptError(f"an update with a validation part needs at least 2 admissions of each outcome, "
                             f"got {len(index)} with outcome {outcome}")
        k = min(len(index) - 1, max(1, int(round(fraction * len(index)))))
        held.append(index[:k])
        fit.append(index[k:])
    return sample.take(np.sort(np.concatenate(fit))), sample.take(np.sort(np.concatenate(held)))
