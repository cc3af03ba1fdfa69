"""Test and benchmark fixtures of the service (not shipped): a fixture export and an in-process server.

``write_fixture_export`` writes a SMALL REAL export directory (manifest, JSON files and a
tf.saved_model with the exact ``serving_default`` signature of the export contract) whose
model is a TEST FIXTURE, NOT A CLINICAL MODEL: a seeded stochastic function of the event
counts and the age. It exists so the service can be tested end to end (parsing, bagging,
SavedModel call, uncertainty summaries, checksums) without training anything. Its model
card says so in its name and method.

``write_tiny_model_export`` writes the same kind of directory through the real exporter
(``model.export.write.write_export``) around a tiny UNTRAINED rank-1 model: the real featurizer,
architecture and seeded sampling, meaningless weights.

``ThreadedServer`` runs a real uvicorn server for an app built by create_app in a background
thread; ``serving.server_process.ServerProcess`` runs the CLI in a process.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ehr_pipeline.contract import PipelineConfig, spec, tf_parse
from ehr_pipeline.encode import seqex

FIXTURE_NAME = "TEST-FIXTURE-not-a-clinical-model"
FIXTURE_METHOD = "test-fixture: seeded noise around a function of event counts"
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
FIXTURE_LAB_LOINC = {"codes": {"2160-0": ["50912"], "2823-3": ["50971"]}}


def write_manifest(directory: str | os.PathLike) -> dict[str, str]:
    """Writes manifest.json listing the SHA-256 of every other file under directory; returns the map."""
    from model.export.load import write_manifest as export_manifest

    return export_manifest(directory)


def _fixture_module(ensemble_size: int, output_scale: float, bfloat16_offset: float | None = None):
    """A tf.Module whose serving_default has the export contract's signature (fixture maths)."""
    import tensorflow as tf

    class FixtureModel(tf.Module):
        """TEST FIXTURE, NOT A CLINICAL MODEL: logit = f(event count, age) + member bias + seeded noise."""

        def __init__(self) -> None:
            super().__init__()
            self.member_bias = tf.Variable(tf.linspace(-0.4, 0.4, ensemble_size), trainable=False)

        @tf.function(input_signature=[
            tf.TensorSpec([None], tf.string, name="examples"),
            tf.TensorSpec([], tf.int32, name="num_samples"),
            tf.TensorSpec([], tf.int64, name="seed"),
        ])
        def serve(self, examples, num_samples, seed):
            parsed = tf_parse.parse_sequence_examples(examples)
            counts = tf.cast(parsed[spec.BAG_COUNTS], tf.float32)
            total = tf.reduce_sum(tf.reduce_sum(counts, axis=-1), axis=-1)  # events per admission
            age = parsed[spec.AGE_YEARS]
            logit = -1.5 + 0.6 * tf.math.log1p(total) + 0.03 * (age - 60.0)
            n = tf.shape(examples)[0]
            # Noise keyed by (seed, fingerprint of the example), as the export contract requires:
            # an example's samples never depend on which other examples share the call.
            keys = tf.bitcast(tf.fingerprint(examples), tf.int64)
            noise = tf.map_fn(
                lambda key: tf.random.stateless_normal(tf.stack([num_samples, ensemble_size]),
                                                       seed=tf.stack([seed, key])),
                keys, fn_output_signature=tf.TensorSpec([None, ensemble_size], tf.float32))
            logits = logit[:, None, None] + tf.cast(self.member_bias, tf.float32)[None, None, :] + 0.7 * noise
            probs = tf.reshape(tf.sigmoid(logits), tf.stack([n, num_samples * ensemble_size])) * output_scale
            return {"probs": probs}

        @tf.function(input_signature=[
            tf.TensorSpec([None], tf.string, name="examples"),
            tf.TensorSpec([], tf.int32, name="num_samples"),
            tf.TensorSpec([], tf.int64, name="seed"),
        ])
        def serve_shifted(self, examples, num_samples, seed):
            # A "bfloat16" signature that moves every probability by bfloat16_offset (towards 0.5).
            probs = self.serve(examples, num_samples, seed)["probs"]
            return {"probs": probs + tf.where(probs < 0.5, 1.0, -1.0) * (bfloat16_offset or 0.0)}

    return FixtureModel()


def write_fixture_export(
    directory: str | os.PathLike,
    *,
    ensemble_size: int = 3,
    vocabulary: Mapping[str, Sequence[str]] | None = None,
    pipeline: PipelineConfig | None = None,
    referral: Mapping[str, Any] | None = None,
    version: str = "0.0.1",
    output_scale: float = 1.0,
    bfloat16_offset: float | None = None,
) -> pathlib.Path:
    """Writes a fixture export (TEST FIXTURE model, real SavedModel) under directory; returns its path.

    output_scale != 1 multiplies every probability, making a deliberately BROKEN model (values
    outside [0, 1]) for tests of how the service handles a model failure. Without bfloat16_offset
    the export has no bfloat16 signature (as exports before it); with it, its "serving_bfloat16"
    answers the float32 probabilities moved by that much (a bfloat16 path out of tolerance).
    """
    import tensorflow as tf

    from model.export_contract import SIGNATURES

    root = pathlib.Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    module = _fixture_module(ensemble_size, output_scale, bfloat16_offset)
    signatures = {SIGNATURES["float32"]: module.serve}
    if bfloat16_offset is not None:
        signatures[SIGNATURES["bfloat16"]] = module.serve_shifted
    tf.saved_model.save(module, str(root / "saved_model"), signatures=signatures)
    vocab = DEFAULT_VOCABULARY if vocabulary is None else vocabulary
    documents = {
        "model_card.json": {
            "name": FIXTURE_NAME, "version": version, "method": FIXTURE_METHOD, "ensemble_size": ensemble_size,
            "created": "2024-06-01T00:00:00Z", "intended_use": "tests of the serving layer only",
        },
        "pipeline_config.json": (pipeline or PipelineConfig()).to_dict(),
        "vocabulary.json": {"sources": {s: [spec.format_code(s, c) for c in codes] for s, codes in vocab.items()}},
        "numeric_stats.json": {},
        "units.json": FIXTURE_UNITS,
        "lab_loinc.json": FIXTURE_LAB_LOINC,
        "metrics.json": {
            "test": {"ece": 0.031, "nll": 0.254, "auc_pr": 0.41, "auc_roc": 0.83},
            "referral": dict(referral or {"measure": "predictive_entropy", "rate": 0.2, "threshold": 0.6}),
            "decision_threshold": 0.5,
        },
    }
    for name, doc in documents.items():
        (root / name).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    write_manifest(root)
    return root


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
    import tempfile

    from model.export import write as export_writer
    from model.export.predict import Predictor
    from model import data_folder
    from model.training import inputs
    from model.training.config import ModelConfig
    from model.training.ehr_model import build_model

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
    import numpy as np

    from ehr_pipeline.contract import tfrecord
    from ehr_pipeline.encode import bagging

    bags = bagging.bag_events(np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0), 86_400,
                              PipelineConfig().bagging)
    records = [seqex.make_sequence_example({
        spec.SUBJECT_ID: n, spec.HADM_ID: n, spec.LABEL: 0, spec.TRIGGER_TIME: 86_400, spec.ADMIT_OFFSET: 86_400,
        spec.AGE_YEARS: 60.0, spec.GENDER: "F", spec.ADMISSION_TYPE: kind, spec.ETHNICITY: spec.NOT_RECORDED,
        spec.INSURANCE: spec.NOT_RECORDED}, bags).SerializeToString()
        for n, kind in enumerate(k for k, count in admission_types.items() for _ in range(count))]
    with open(data_dir / spec.shard_file_name("train", 0, 1), "wb") as f:
        tfrecord.write_records(f, records)


class ThreadedServer:
    """A real uvicorn server for `app` on 127.0.0.1 and a free port, run in a background thread."""

    def __init__(self, app: Any, *, startup_timeout_s: float = 30.0, wait_ready: bool = True):
        import uvicorn

        self.config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", access_log=False,
                                     lifespan="on")
        self.server = uvicorn.Server(self.config)
        self.startup_timeout_s = startup_timeout_s
        self.wait_ready = wait_ready
        self.base_url = ""
        self._thread: Any = None

    def start(self) -> ThreadedServer:
        """Starts serving; returns once the socket listens (and /readyz is 200 when wait_ready)."""
        import threading

        import httpx

        # uvicorn installs signal handlers only in the main thread, so a thread is safe here.
        self._thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start (see the log above)")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        while self.wait_ready:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/readyz", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("server never became ready")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        """Asks uvicorn to shut down gracefully and waits for the thread."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=15)

    def __enter__(self) -> ThreadedServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
