"""A site's labelled admissions as an update reads them: checked, put in the model's units, drawn and split.

The local data folder is the Beam job's output for the site's own records, prepared with the
model's units (``ehr-pipeline run --units-from MODEL_DIR``); it is checked against its manifest
and its units against the model's exactly as ehr-eval checks data it scores. Every record of the
split is used or counted by reason (unlabelled, not drawn): the counts go into adaptation.json.
"""
from __future__ import annotations

import dataclasses
import logging
import os

import numpy as np

from ehr_pipeline.contract import integrity
from ehr_pipeline.shift import population
from model import data_folder
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
    manifest_sha256: str
    counts: dict[str, int]  # read, unlabelled, not_drawn, used
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
    if sample_size is not None and sample_size > len(labelled):
        raise AdaptError(f"{data_dir}: split {split!r} has {len(labelled)} labelled admissions, fewer than the "
                         f"{sample_size} asked for")
    chosen = labelled if sample_size is None else np.sort(
        np.random.default_rng(seed).choice(labelled, size=sample_size, replace=False))
    counts["not_drawn"] = int(len(labelled) - len(chosen))
    counts["used"] = int(len(chosen))
    records = plan.convert([split_records.records[i] for i in chosen])
    sample = LocalSample(records, labels[chosen], np.asarray(split_records.hadm_ids, np.int64)[chosen])
    if sample.events == 0 or sample.events == sample.n:
        raise AdaptError(f"{data_dir}: the {sample.n} admissions drawn from split {split!r} have "
                         f"{sample.events} deaths: an update needs both outcomes")
    log.info("%s split %s: %d admissions read, %d used (%d deaths), %d unlabelled, %d not drawn", data_dir, split,
             counts["read"], sample.n, sample.events, counts["unlabelled"], counts["not_drawn"])
    written, _ = population.data_units(data_dir)
    return LocalData(sample, data_dir, split, data_folder.manifest_sha256(data_dir), counts, written,
                     dict(plan.canonical))


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
