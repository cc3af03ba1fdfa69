"""No training/serving skew: raw events sent to the service score exactly like the Beam job's record."""
from __future__ import annotations

import pathlib

import httpx
import numpy as np
import pytest

from ehr_pipeline.contract import PipelineConfig, layout, spec, tfrecord
from ehr_pipeline.encode import seqex
from ehr_pipeline.job import run_job
from serving.demo import build_request, first_test_admission
from serving.server_process import ServerProcess


@pytest.fixture(scope="module")
def demo_export(demo_dir, tmp_path_factory, tiny_export):
    base = tmp_path_factory.mktemp("skew")
    data = base / "data"
    config = PipelineConfig.model_validate({"num_shards": {"train": 1, "validation": 1, "test": 1},
                                            "vocab": {"min_count": 1}})
    run_job(str(demo_dir), str(data), config)
    vocab = layout.read_json(str(data / layout.VOCABULARY))["sources"]
    raw_codes = {s: [c.split(":", 1)[1] for c in codes] for s, codes in vocab.items()}
    # The job's own units and lab LOINC codes, as a model trained on this data carries them: values
    # the job converted (fentanyl in mg to the demo's more common mcg; urobilinogen in Ehrlich units,
    # which its LOINC code makes mg) are converted by the service alike.
    export = tiny_export(ensemble_size=2, vocabulary=raw_codes, pipeline=config,
                         units=layout.read_json(str(data / layout.UNITS)),
                         lab_loinc=layout.read_json(str(data / layout.LAB_LOINC))["codes"])
    return data, export


def test_service_scores_raw_events_like_the_job_record(demo_export, demo_dir, tmp_path):
    from model.export.predict import predict_probs

    data, export = demo_export
    subject_id, hadm_id = first_test_admission(data)
    record = next(r for p in sorted(data.glob(spec.split_file_pattern("test")))
                  for r in tfrecord.read_records(open(p, "rb"))
                  if seqex.sequence_example_to_dict(r)[spec.HADM_ID] == hadm_id)
    expected = predict_probs(str(export), [record], num_samples=5, seed=7)[0]

    body = build_request(pathlib.Path(demo_dir), subject_id, hadm_id)
    with ServerProcess(["--model", str(export), "--no-auth", "--log-level", "warning"],
                       log_path=tmp_path / "server.log") as server:
        resp = httpx.post(f"{server.base_url}/v1/predict", json=body,
                          params={"num_samples": 5, "seed": 7, "include_samples": "true"}, timeout=60)
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["events"]["ignored"]["at_or_after_trigger"] > 0  # the request had later events too
    np.testing.assert_allclose(answer["samples"], expected, rtol=0, atol=1e-6)
    assert answer["probability"] == pytest.approx(float(np.mean(expected)), abs=1e-6)
