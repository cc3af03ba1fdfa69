"""An export's network rebuilt in memory, so its weights can be updated (finetune, bayes, revision, retrain).

Only the export is needed: its model card carries the experiment config, its side files the
vocabulary and statistics the featurizer was built from, and its SavedModel the trained weights
(``ServingModule.model_variables``, restored by name). The rebuilt network, behind a fresh
``Predictor``, answers what the export answers for the same examples, S and seed (a test pins
this), so an update starts exactly where the parent stands.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from ehr_pipeline.contract import layout
from model.data_folder import DataFiles
from model.export.load import LoadedExport
from model.ehr.config import ExperimentConfig, parse_config
from model.ehr.ehr_model import build_model
from model.ehr.inputs import Featurizer
from model.ehr.train import featurizer_for
from model.export_layout import MODEL_CARD


class AdaptError(ValueError):
    """An export or local data folder the update cannot use; the message names the file or field."""


@dataclasses.dataclass
class Rebuilt:
    """The parent's config, featurizer and network (weights restored, or fresh for a retrain)."""

    config: ExperimentConfig
    featurizer: Featurizer
    model: tf.keras.Model


def export_files(loaded: LoadedExport) -> DataFiles:
    """The export's copies of its data folder's side files, read as a data folder's (no splits)."""
    directory = str(loaded.path)
    vocabulary = layout.read_json(f"{directory}/{layout.VOCABULARY}").get("sources")
    stats = layout.read_json(f"{directory}/{layout.NUMERIC_STATS}").get("codes")
    return DataFiles(data_dir=directory, vocabulary=vocabulary, numeric_stats=stats,
                     clip_z=float(loaded.files.pipeline.numeric.clip_z), manifest={},
                     pipeline_config=dict(loaded.files.pipeline_raw))


def rebuild(loaded: LoadedExport, *, restore: bool = True) -> Rebuilt:
    """The export's network in memory: restore=True with its trained weights, False freshly initialised."""
    raw = loaded.model_card.get("config")
    if not isinstance(raw, dict):
        raise AdaptError(f"{loaded.path / MODEL_CARD}: no 'config': only exports written by ehr-train can have "
                         "their weights updated (the recalibration methods work on any export)")
    try:
        config = parse_config(raw, source=str(loaded.path / MODEL_CARD))
    except ValueError as err:
        raise AdaptError(str(err)) from None
    if config.model.method == "bella":
        raise AdaptError(f"{loaded.path / MODEL_CARD}: method 'bella' adapts a base run and cannot be rebuilt from "
                         "its export; use a recalibration method")
    featurizer = featurizer_for(export_files(loaded), config.model)
    model = build_model(config.model, featurizer.vocab_size, featurizer.window_aggregate_dim)
    if restore:
        restore_weights(model, loaded)
    return Rebuilt(config, featurizer, model)


def restore_weights(model: tf.keras.Model, loaded: LoadedExport) -> None:
    """Assigns the export's SavedModel variables to the rebuilt network's, matched by name and shape."""
    saved = getattr(loaded.saved_model, "model_variables", None)
    if saved is None:
        raise AdaptError(f"{loaded.path}: its SavedModel holds no single network (a deep ensemble export): "
                         "update its members, or use a recalibration method")
    by_name = {v.name: v for v in saved}
    mine = {v.name: v for v in model.variables}
    if set(by_name) != set(mine):
        extra, missing = sorted(set(by_name) - set(mine))[:3], sorted(set(mine) - set(by_name))[:3]
        raise AdaptError(f"{loaded.path}: its weights do not match the network its model card describes "
                         f"(only in the export: {extra}; only in the rebuilt network: {missing})")
    for name, variable in mine.items():
        value = by_name[name].numpy()
        if value.shape != tuple(variable.shape):
            raise AdaptError(f"{loaded.path}: weight {name} has shape {value.shape}, the network expects "
                             f"{tuple(variable.shape)}")
        variable.assign(value.astype(np.dtype(variable.dtype.as_numpy_dtype)))
