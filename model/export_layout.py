"""The export directory's layout: its file names, format version, signatures and limits.

The bottom of ``model``: training writes these names, ``model.export.load`` reads them, the
service and the command lines check requests and flags against them. It imports nothing of the
project, and no TensorFlow, so any layer (and any ``--help``) can read it for free.

Layout of an export (``model.export.load`` describes each file's content):
  saved_model/ (SAVED_MODEL_DIR), model_card.json, pipeline_config.json, metrics.json,
  admission_types.json, reference_profile.json, adaptation.json (an updated model only), manifest.json,
  and the data folder's side files
  (vocabulary.json, numeric_stats.json, units.json, ...) under their names in
  ``ehr_pipeline.contract.layout``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

FORMAT_VERSION = 1
SAVED_MODEL_DIR = "saved_model"
MODEL_CARD = "model_card.json"
PIPELINE_CONFIG = "pipeline_config.json"
METRICS = "metrics.json"
MANIFEST = "manifest.json"
ADMISSION_TYPES_FILE = "admission_types.json"
REFERENCE_PROFILE = "reference_profile.json"
# An export updated at a new site (ehr-adapt) says how: its parent, the method, the local data
# and the recalibration a + b * logit that the predictor applies to every sampled logit.
ADAPTATION = "adaptation.json"
# A training run's folder keeps its export under this name (RUN_DIR/export/).
EXPORT_DIR = "export"

DECISION_THRESHOLD = 0.5
# Largest S (samples per member) a signature accepts; every evaluation and request limit uses it.
MAX_SAMPLES = 100
SIGNATURE = "serving_default"
# Inference precision -> exported signature. "bfloat16" runs the LSTM's matmuls with bfloat16
# operands (model.layers.rank1_lstm); tests bound how far that moves the probabilities.
SIGNATURES = {"float32": SIGNATURE, "bfloat16": "serving_bfloat16"}
PRECISIONS = tuple(SIGNATURES)
# How far the bfloat16 signature may move the float32 one's answers for the same examples and seed
# (docs/serving.md; measured on the trained demo model: 4.0e-4 and 4.7e-3): on the predictive mean
# (the service's "probability") and on any single sampled probability.
BFLOAT16_MEAN_TOLERANCE = 1e-3
BFLOAT16_SAMPLE_TOLERANCE = 1e-2
SIGNATURE_INPUTS = ("examples", "num_samples", "seed")
OUTPUT = "probs"

# The uncertainty measures a referral rule (metrics.json "referral") may name.
UNCERTAINTY_MEASURES: tuple[str, ...] = ("predictive_entropy", "mutual_information", "predictive_std")


def json_ready(obj: Any) -> Any:
    """Plain Python types for json.dumps(allow_nan=False): numpy scalars unwrapped, NaN/inf -> None."""
    if isinstance(obj, Mapping):
        return {str(k): json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, np.ndarray)):
        return [json_ready(v) for v in obj]
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        return float(obj) if np.isfinite(obj) else None
    return obj
