"""The updated export: the parent plus the update, a record of how it was made, a new reference population.

adaptation.json records the parent (its checksum and name), the method and what it chose, the
local data (folder checksum, split, admissions and deaths used, every record counted by reason)
and the recalibration the predictor applies. The model card is the parent's with a new name,
date and summary, and "parent"; metrics.json keeps the parent's referral measure and rate with
the threshold re-chosen on the local admissions (their metrics are in-sample, and say so in
"held_out": false, "split" and "n", which the service's calibration block repeats); the
reference profile is the local admissions' population, what the site's monitor should compare
its next patients with.
"""
from __future__ import annotations

import datetime
import os
import pathlib
from typing import Any

import numpy as np

from ehr_pipeline.shift import Profile, population
from model.adapt.config import AdaptConfig
from model.adapt.local_data import LocalData
from model.adapt.update import Update
from model.evaluation import evaluate
from model.evaluation.statistics import metrics
from model.export.load import LoadedExport
from model.export.predict import Predictor
from model.export.write import write_updated_export


def adaptation_record(loaded: LoadedExport, local: LocalData, update: Update, config: AdaptConfig) -> dict[str, Any]:
    """adaptation.json: parent, method, local data, the stored recalibration and the method's own record."""
    intercept, slope = update.recalibration
    return {
        "method": update.method,
        "parent_checksum": loaded.files.checksum,
        "parent_name": loaded.files.card.name,
        "n": local.sample.n,
        "events": local.sample.events,
        "recalibration": {"intercept": float(intercept), "slope": float(slope)},
        "weights_updated": update.network is not None,
        "local_data": {"manifest_sha256": local.manifest_sha256, "split": local.split, "records": local.counts,
                       "sample_seed": config.seed, "sample_size": config.sample_size},
        "settings": config.model_dump(),
        **update.record,
    }


def _metrics_document(loaded: LoadedExport, local: LocalData, update: Update, config: AdaptConfig) -> dict:
    parent = loaded.files.metrics
    scores = metrics.scalar_metrics(metrics.predictive_mean(update.probs), local.sample.labels)
    measure, rate = parent.referral.measure, parent.referral.rate
    threshold = evaluate.referral_threshold(update.probs, rate, measure)
    return {
        # Not a test split: the admissions the update was fitted on. Said in fields, so that a reader (the
        # service's calibration block) cannot present these numbers as held out.
        "test": {**scores, "split": local.split, "held_out": False, "n": local.sample.n,
                 "on": f"the {local.sample.n} local admissions the update used (in-sample)"},
        "referral": {"measure": measure, "rate": rate, "threshold": threshold,
                     "chosen_on_validation": {"configured": True, "kept_from_parent": True,
                                              "threshold_on": "the local admissions the update used"}},
        "decision_threshold": parent.decision_threshold,
    }


def _reference(loaded: LoadedExport, local: LocalData, update: Update, config: AdaptConfig) -> Profile:
    """The local admissions' population in the model's vocabulary, with the updated model's mutual information."""
    vocabulary = loaded.files.vocabulary
    profile = Profile.build(population.admissions_from_examples(local.sample.records), vocabulary=vocabulary,
                            units=local.units, canonical=local.canonical, keep=vocabulary,
                            description=f"split {local.split} of {local.data_dir} ({local.sample.n} admissions "
                                        f"an update by {update.method} used)")
    return profile.with_mutual_information(np.asarray(metrics.mutual_information(update.probs)), config.samples)


def write_update(out_dir: str | os.PathLike[str], loaded: LoadedExport, local: LocalData, update: Update,
                 config: AdaptConfig, *, overwrite: bool = False) -> pathlib.Path:
    """Writes the updated export to out_dir (loadable by model.export.load like any other); replaces one only with overwrite."""
    metrics_doc = _metrics_document(loaded, local, update, config)
    card = dict(loaded.model_card)
    card.update({
        "name": f"{loaded.files.card.name}+{update.method}",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "metrics_summary": metrics_doc["test"],
        "parent": {"checksum": loaded.files.checksum, "name": loaded.files.card.name},
    })
    predictor = None if update.network is None else (
        update.predictor or Predictor(update.network.featurizer, update.network.model))
    return write_updated_export(out_dir, loaded.path, predictor=predictor,
                                adaptation=adaptation_record(loaded, local, update, config), card=card,
                                metrics_doc=metrics_doc, reference=_reference(loaded, local, update, config),
                                overwrite=overwrite, data_dir=local.data_dir)
