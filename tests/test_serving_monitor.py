"""The service watches its population: GET /v1/monitor and the ehr_shift_* gauges on a real server.

The export's reference is its training folder's profile (shift_report.reference_profile); the
streams are fresh draws of the same population sent as requests, once as recorded (site A), once
with creatinine in umol/L and its unit, once with creatinine in umol/L as bare numbers.
Target: the monitor flags an SI-unit stream within 200 requests and stays quiet on a site-A stream.
"""
from __future__ import annotations

import httpx
import pytest

from ehr_testdata import admission_requests, write_data_dir
from serving.app import create_app
from serving.predictor import ServedModel
from serving.settings import make_settings
from tests.serving_fixtures import ThreadedServer, write_tiny_model_export

CREATININE = "lab:50912"
UMOL_PER_MG_DL = 88.4  # creatinine, published SI factor (umol/L per mg/dL)
STEP = 50  # requests per batch call; the monitor is read after each
PARAMS = {"num_samples": 2, "seed": 0}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    from model.evaluation import shift_report
    from model.training.inputs import load_data_files

    base = tmp_path_factory.mktemp("monitor")
    files = load_data_files(write_data_dir(base / "data", units={CREATININE: "mg/dL", "lab:50813": "mmol/L"}))
    reference = shift_report.reference_profile(files)
    vocabulary = {s: [c.split(":", 1)[1] for c in codes] for s, codes in files.vocabulary.items()}
    return write_tiny_model_export(base / "export", vocabulary=vocabulary, reference=reference,
                                   lab_loinc={"2160-0": ["50912"], "32693-4": ["50813"]})


def _stream(export_dir, bodies: list[dict]) -> list[dict]:
    """The /v1/monitor answers after every STEP requests of `bodies`, on a fresh server."""
    settings = make_settings(model_dir=export_dir, no_auth=True, host="127.0.0.1", warmup=False, monitor_window=500)
    answers = []
    with ThreadedServer(create_app(settings, ServedModel.load(export_dir))) as server, \
            httpx.Client(base_url=server.base_url, timeout=120.0) as client:
        for start in range(0, len(bodies), STEP):
            r = client.post("/v1/predict/batch", json={"patients": bodies[start:start + STEP]}, params=PARAMS)
            assert r.status_code == 200, r.text[:300]
            answers.append(client.get("/v1/monitor").json())
        answers[-1]["metrics"] = client.get("/metrics").text
    return answers


def _gauge(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


@pytest.mark.slow
def test_a_stream_from_the_training_population_raises_nothing(export_dir):
    answers = _stream(export_dir, admission_requests(200, seed=21, units={CREATININE: "mg/dL"}))
    assert [a["admissions"] for a in answers] == [50, 100, 150, 200]
    assert [a["level"] for a in answers] == ["none"] * 4, answers[-1]["findings"]
    assert answers[-1]["summary"]["tests"] >= 10
    assert _gauge(answers[-1]["metrics"], "ehr_shift_level") == 0.0


@pytest.mark.slow
def test_creatinine_sent_in_umol_per_litre_with_its_unit_is_flagged_as_converted(export_dir):
    answers = _stream(export_dir, admission_requests(200, seed=22, scale={CREATININE: UMOL_PER_MG_DL},
                                                     units={CREATININE: "umol/L"}))
    first = next(i for i, a in enumerate(answers) if a["level"] != "none")
    last = answers[-1]
    assert last["level"] == "moderate", last["findings"]
    [converted] = [f for f in last["findings"] if f["subject"] == CREATININE]
    assert converted["kind"] == "units_converted" and "umol/L" in converted["message"]
    # Converted at the door: its values look like training's, so no value shift is reported.
    assert not [f for f in last["findings"] if f["kind"] == "value_shift"]
    assert (first + 1) * STEP <= 200
    assert _gauge(last["metrics"], "ehr_shift_level") == 1.0
    assert _gauge(last["metrics"], 'ehr_shift_values_share{outcome="converted"}') > 0.9


@pytest.mark.slow
def test_creatinine_sent_in_umol_per_litre_without_a_unit_is_named_severe_within_200_requests(export_dir):
    answers = _stream(export_dir, admission_requests(200, seed=23, scale={CREATININE: UMOL_PER_MG_DL}))
    first = next(i for i, a in enumerate(answers) if a["level"] == "severe")
    assert (first + 1) * STEP <= 200
    [shifted] = [f for f in answers[-1]["findings"] if f["subject"] == CREATININE]
    assert shifted["kind"] == "value_shift" and shifted["severity"] == "severe"
    assert shifted["message"].endswith("likely umol/L labelled as mg/dL"), shifted["message"]
    assert 80 < shifted["numbers"]["ratio"] < 97
    assert _gauge(answers[-1]["metrics"], "ehr_shift_level") == 2.0
    assert _gauge(answers[-1]["metrics"], "ehr_shift_worst_psi") > 1.0


def test_an_export_without_a_reference_answers_unavailable(fixture_export):
    from fastapi.testclient import TestClient

    settings = make_settings(model_dir=fixture_export, no_auth=True, host="127.0.0.1", warmup=False)
    with TestClient(create_app(settings, ServedModel.load(fixture_export))) as client:
        body = admission_requests(1, seed=1)[0]
        assert client.post("/v1/predict", json=body).status_code == 200
        answer = client.get("/v1/monitor").json()
        assert (answer["level"], answer["findings"]) == ("unavailable", [])
        assert _gauge(client.get("/metrics").text, "ehr_shift_level") == -1.0
