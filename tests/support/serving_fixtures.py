"""Test and benchmark fixtures of the service (not shipped): a fixture export and an in-process server.

``write_fixture_export`` writes a SMALL REAL export directory (manifest, JSON files and a
tf.saved_model with the exact ``serving_default`` signature of the export layout) whose
model is a TEST FIXTURE, NOT A CLINICAL MODEL: a seeded stochastic function of the event
counts and the age. It exists so the service can be tested end to end (parsing, bagging,
SavedModel call, uncertainty summaries, checksums) without training anything. Its model
card says so in its name and method.

Its tiny UNTRAINED counterpart through the real exporter, ``serving.tools.tiny_export.write_tiny_model_export``,
is in the package because bench/service/service_latency.py and docs/serving.md use it too.

``ThreadedServer`` runs a real uvicorn server for an app built by create_app in a background
thread; ``serving.tools.server_process.ServerProcess`` runs the CLI in a process.
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
from serving.tools.tiny_export import DEFAULT_VOCABULARY, FIXTURE_UNITS

FIXTURE_NAME = "TEST-FIXTURE-not-a-clinical-model"
FIXTURE_METHOD = "test-fixture: seeded noise around a function of event counts"
FIXTURE_LAB_LOINC = {"codes": {"2160-0": ["50912"], "2823-3": ["50971"]}}


def write_manifest(directory: str | os.PathLike) -> dict[str, str]:
    """Writes manifest.json listing the SHA-256 of every other file under directory; returns the map."""
    from model.export.load import write_manifest as export_manifest

    return export_manifest(directory)


def _fixture_module(ensemble_size: int, output_scale: float, bfloat16_offset: float | None = None):
    """A tf.Module whose serving_default has the export layout's signature (fixture maths)."""
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
            # Noise keyed by (seed, fingerprint of the example), as the export layout requires:
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

    from model.export_layout import SIGNATURES

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


class ThreadedServer:
    """A real uvicorn server for `app` on 127.0.0.1 and a free port, run in a background thread."""

    # 300 s, not 30: TensorFlow's warm-up pass took longer than 30 s with the suite on 2 busy cores (a
    # module's shared server then errored every test that used it); a healthy start returns far sooner.
    def __init__(self, app: Any, *, startup_timeout_s: float = 300.0, wait_ready: bool = True):
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
