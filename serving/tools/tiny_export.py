"""A tiny UNTRAINED export through the real exporter: to try the API, test the service, benchmark its overheads.

``write_tiny_model_export`` writes a real export directory (``model.export.write.write_export``)
around a tiny rank-1 model that was never trained: the real featurizer, architecture, stateless
seeded sampling and SavedModel, with random weights, so its probabilities mean nothing. Its model
card says so in its name. It lives in the package, not beside the tests, because bench/service/service_latency.py
and docs/serving.md use it as well as the test suite; it needs ``model``, so it sits in the top layer.
"""
from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ehr_pipeline.contract import PipelineConfig, spec, tfrecord
from ehr_pipeline.encode import bagging, seqex
from model import data_folder
from model.export import write as export_writer
from model.export.predict import Predictor
from model.ehr import inputs
from model.ehr.config import ModelConfig
from model.ehr.ehr_model import build_model

# The admission types of the tiny export's training split (MIMIC-III's adult shares, roughly).
DEFAULT_ADMISSION_TYPES = {"EMERGENCY": 16, "ELECTIVE": 3, "URGENT": 1}
DEFAULT_VOCABULARY = {
    "lab": ["50912", "50971", "51006", "50983"],
    "chart": ["220045", "220210", "220277"],
    "prescription": ["Vancomycin", "Heparin"],
    "diagnosis": ["4019", "42731"],
}
# The fixture's training units and lab LOINC codes, as the Beam job writes them (units.json,
# lab_loinc.json): creatinine in mg/dL, potassium in mEq/L, heart rate per minute.
FIXTURE_UNITS = {
    "codes": {"lab:50912": {"mg/dL": 900, "MG/DL": 3}, "lab:50971": {"mEq/L": 800}, "chart:220045": {"bpm": 5000},
              # MetaVision charts some antibiotics in doses and, now and then, in mg: not convertible.
              "input:225798": {"dose": 190, "mg": 4}},
    "canonical": {"lab:50912": "mg/dL", "lab:50971": "meq/L", "chart:220045": "/min", "input:225798": "dose"},
    # Training median |value| in the canonical unit: conversions landing 1000x away are not used.
    "medians": {"lab:50912": 1.0, "lab:50971": 4.0, "chart:220045": 85.0, "input:225798": 1.0},
}

TINY_MODEL_NAME = "TEST-FIXTURE-untrained-tiny-rank1"


def write_tiny_model_export(
    directory: str | os.PathLike,
    *,
    ensemble_size: int = 2,
    vocabulary: Mapping[str, Sequence[str]] | None = None,
    pipeline: PipelineConfig | None = None,
    referral: Mapping[str, Any] | None = None,
    lab_loinc: Mapping[str, Sequence[str]] | None = None,
    admission_types: Mapping[str, int] | None = None,
    units: Mapping[str, Any] | None = None,
    reference: Any = None,
) -> pathlib.Path:
    """Writes an export of a tiny UNTRAINED rank-1 model through the real exporter (model.export.write).

    units (a units.json document; default FIXTURE_UNITS) becomes the data folder's units.json: pass a
    job output's own to serve its codes in the units the job converted them to.
    reference: the population.Profile its reference_profile.json holds (None: none), as training
    writes it from its data folder.

    lab_loinc (LOINC -> lab ITEMIDs) becomes the data folder's lab_loinc.json, as the Beam job
    writes it from D_LABITEMS, and so reaches the export the way a trained model's does.
    admission_types (type -> examples, default DEFAULT_ADMISSION_TYPES) become a training split
    of event-less examples, which the exporter counts into admission_types.json.

    The architecture, featurizer, stateless seeded sampling and SavedModel are the real ones;
    the weights are random initialisations, so the probabilities mean nothing. It is a TEST
    FIXTURE for the serving path (and for benchmarks of its overheads), not a clinical model.
    """
    pipeline = pipeline or PipelineConfig()
    vocab = DEFAULT_VOCABULARY if vocabulary is None else vocabulary
    with tempfile.TemporaryDirectory(prefix="ehr-tiny-data-") as data:
        data_dir = pathlib.Path(data)
        # The three side files of a Beam job output folder that the featurizer reads.
        (data_dir / "vocabulary.json").write_text(json.dumps(
            {"sources": {s: [spec.format_code(s, c) for c in codes] for s, codes in vocab.items()}}))
        (data_dir / "numeric_stats.json").write_text(json.dumps(
            {"clip_z": 10.0, "codes": {"lab:50912": {"mean": 1.1, "std": 0.6, "n": 1000},
                       "chart:220045": {"mean": 88.0, "std": 17.0, "n": 1000}}}))
        (data_dir / "manifest.json").write_text(json.dumps({"config": pipeline.to_dict()}))
        if lab_loinc is not None:
            (data_dir / "lab_loinc.json").write_text(json.dumps({"codes": {k: list(v) for k, v in lab_loinc.items()}}))
        (data_dir / "units.json").write_text(json.dumps(FIXTURE_UNITS if units is None else units))
        _write_train_split(data_dir, DEFAULT_ADMISSION_TYPES if admission_types is None else admission_types)
        files = data_folder.load_data_files(data_dir)
        featurizer = inputs.Featurizer.from_data_files(files)
        config = ModelConfig(method="rank1", ensemble_size=ensemble_size, embedding_dim=8, rnn_dim=8,
                             hidden_layer_dim=8)
        model = build_model(config, featurizer.vocab_size)
        metrics_doc = {
            "test": {"ece": 0.05, "nll": 0.31, "auc_pr": None, "auc_roc": None},
            "referral": dict(referral or {"measure": "mutual_information", "rate": 0.2, "threshold": 0.001}),
            "decision_threshold": 0.5,
        }
        card = export_writer.model_card(
            name=TINY_MODEL_NAME, method="rank1_normal (untrained test fixture)", ensemble_size=ensemble_size,
            data_sha256=data_folder.manifest_sha256(data_dir), metrics_doc=metrics_doc,
            config={"model": config.model_dump(mode="json")})
        return export_writer.write_export(directory, Predictor(featurizer, model), data_dir=str(data_dir),
                                          pipeline_config=pipeline.to_dict(), card=card, metrics_doc=metrics_doc,
                                          reference=reference)


def _write_train_split(data_dir: pathlib.Path, admission_types: Mapping[str, int]) -> None:
    """A one-shard train split of event-less examples, `admission_types[t]` of type t."""
    bags = bagging.bag_events(np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0), 86_400,
                              PipelineConfig().bagging)
    records = [seqex.make_sequence_example({
        spec.SUBJECT_ID: n, spec.HADM_ID: n, spec.LABEL: 0, spec.TRIGGER_TIME: 86_400, spec.ADMIT_OFFSET: 86_400,
        spec.AGE_YEARS: 60.0, spec.GENDER: "F", spec.ADMISSION_TYPE: kind, spec.ETHNICITY: spec.NOT_RECORDED,
        spec.INSURANCE: spec.NOT_RECORDED}, bags).SerializeToString()
        for n, kind in enumerate(k for k, count in admission_types.items() for _ in range(count))]
    with open(data_dir / spec.shard_file_name("train", 0, 1), "wb") as f:
        tfrecord.write_records(f, records)
