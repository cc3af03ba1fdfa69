"""The service watches its population: GET /v1/monitor and the ehr_shift_* gauges on a real server.

The export's reference is its training folder's profile (against_reference.reference_profile); the
streams are fresh draws of the same population sent as requests, once as recorded (site A), once
with creatinine in umol/L and its unit, once with creatinine in umol/L as bare numbers.
Target: the monitor flags an SI-unit stream within 200 requests and stays quiet on a site-A stream.
A code whose training values are all one value (as the demo's PEEP setting, always 5; here chart:211 of the
session's reference export) must
leave /v1/monitor and /metrics answering 200, and a monitor whose report fails is logged and
counted, never a 500.
"""
from __future__ import annotations

import dataclasses
import logging

import httpx
import pytest

from serving.api.app import create_app
from serving.inference.served_model import ServedModel
from serving.settings import make_settings
from tests.support.ehr_testdata import admission_requests, write_data_dir
from tests.support.serving_fixtures import ThreadedServer

CREATININE = "lab:50912"
CONSTANT = "chart:211"  # one value (5) in every training admission of reference_export that has it, as PEEP on the demo
UMOL_PER_MG_DL = 88.4  # creatinine, published SI factor (umol/L per mg/dL)
STEP = 50  # requests per batch call; the monitor is read after each
PARAMS = {"num_samples": 2, "seed": 0}


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory, tiny_export):
    from model.data_folder import load_data_files
    from model.evaluation import against_reference

    base = tmp_path_factory.mktemp("monitor")
    files = load_data_files(write_data_dir(base / "data", units={CREATININE: "mg/dL", "lab:50813": "mmol/L"}))
    reference = against_reference.reference_profile(files)
    vocabulary = {s: [c.split(":", 1)[1] for c in codes] for s, codes in files.vocabulary.items()}
    return tiny_export(vocabulary=vocabulary, reference=reference, lab_loinc={"2160-0": ["50912"], "32693-4": ["50813"]})


# Each export loaded once for the module's streams (a load verifies every checksum and reads the SavedModel,
# seconds); every stream's app still starts its own batcher and monitor, so no window is shared.
@pytest.fixture(scope="module")
def model(export_dir) -> ServedModel:
    return ServedModel.load(export_dir)


@pytest.fixture(scope="module")
def reference_model(reference_export) -> ServedModel:
    return ServedModel.load(reference_export)


def _stream(model: ServedModel, bodies: list[dict]) -> list[dict]:
    """The /v1/monitor answers after every STEP requests of `bodies`, on a fresh server of `model`."""
    # monitor_refresh_s 0: each answer is the report of every request sent so far.
    settings = make_settings(model_dir=model.export.directory, no_auth=True, host="127.0.0.1", warmup=False,
                             monitor_window=500, monitor_refresh_s=0)
    answers = []
    with ThreadedServer(create_app(settings, model)) as server, \
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
def test_a_stream_from_the_training_population_raises_nothing(model):
    answers = _stream(model, admission_requests(200, seed=21, units={CREATININE: "mg/dL"}))
    assert [a["admissions"] for a in answers] == [50, 100, 150, 200]
    assert [a["level"] for a in answers] == ["none"] * 4, answers[-1]["findings"]
    assert answers[-1]["summary"]["tests"] >= 10
    assert _gauge(answers[-1]["metrics"], "ehr_shift_level") == 0.0


def test_the_window_carries_the_performance_expected_before_outcomes_whatever_samples_each_request_asked(model):
    settings = make_settings(model_dir=model.export.directory, no_auth=True, host="127.0.0.1", warmup=False,
                             monitor_window=500, monitor_refresh_s=0)
    bodies = admission_requests(60, seed=24, units={CREATININE: "mg/dL"})
    with ThreadedServer(create_app(settings, model)) as server, \
            httpx.Client(base_url=server.base_url, timeout=120.0) as client:
        assert client.get("/v1/monitor").json()["performance_estimate"] is None  # nothing answered yet
        # Two widths of sampled probabilities in one window: 2 and 5 samples per member.
        for start, samples in ((0, 2), (30, 5)):
            r = client.post("/v1/predict/batch", json={"patients": bodies[start:start + 30]},
                            params={"num_samples": samples, "seed": 0})
            assert r.status_code == 200, r.text[:300]
        answer = client.get("/v1/monitor").json()
        metrics = client.get("/metrics").text
    estimate = answer["performance_estimate"]
    assert estimate["n"] == 60 and estimate["level"] == 0.9
    for name in ("auc_roc", "auc_pr", "brier", "observed_expected"):
        row = estimate["metrics"][name]
        assert row["lower"] <= row["estimate"] <= row["upper"], (name, row)
        assert _gauge(metrics, f'ehr_window_expected_performance{{bound="estimate",metric="{name}"}}') == \
            pytest.approx(row["estimate"])
    # Outcomes drawn from the model's own probabilities: as many deaths as it expects, on average.
    assert estimate["metrics"]["observed_expected"]["estimate"] == pytest.approx(1.0, abs=0.1)
    assert [row["threshold"] for row in estimate["net_benefit"]]

@pytest.mark.slow
def test_creatinine_sent_in_umol_per_litre_with_its_unit_is_flagged_as_converted(model):
    answers = _stream(model, admission_requests(200, seed=22, scale={CREATININE: UMOL_PER_MG_DL},
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
def test_creatinine_sent_in_umol_per_litre_without_a_unit_is_named_severe_within_200_requests(model):
    answers = _stream(model, admission_requests(200, seed=23, scale={CREATININE: UMOL_PER_MG_DL}))
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


def _with_constant(bodies: list[dict], value: float) -> list[dict]:
    """The bodies with every CONSTANT event sent at `value` (the code keeps its training frequency)."""
    for body in bodies:
        for event in body["events"]:
            if f"{event['source']}:{event['code']}" == CONSTANT:
                event["value"] = value
    return bodies


@pytest.mark.slow
@pytest.mark.parametrize("value, level", [(5.0, "none"), (10.0, "severe")])
def test_a_code_constant_in_training_keeps_monitor_and_metrics_answering(reference_model, value, level):
    # The session's reference export: its training folder records CONSTANT at 5.0 in every admission that has it.
    answers = _stream(reference_model, _with_constant(admission_requests(100, seed=31), value))
    last = answers[-1]
    assert last["level"] == level, last["findings"]
    assert _gauge(last["metrics"], "ehr_shift_level") == {"none": 0.0, "severe": 2.0}[level]
    assert "ehr_monitor_errors_total" in last["metrics"] and 'stage="report"' not in last["metrics"]
    if value != 5.0:
        [moved] = [f for f in last["findings"] if f["subject"] == CONSTANT]
        assert moved["message"].startswith(f"{CONSTANT} values are ~2x the training median"), moved["message"]


def test_a_report_that_fails_is_logged_counted_and_answered_not_a_500(fixture_export, caplog):
    from fastapi.testclient import TestClient

    from ehr_pipeline import shift
    from ehr_pipeline.shift import Distribution, Profile
    from serving.monitoring.monitor import LEVEL_ERROR, Monitor

    settings = make_settings(model_dir=fixture_export, no_auth=True, host="127.0.0.1", warmup=False)
    app = create_app(settings, ServedModel.load(fixture_export))
    body = {"patients": admission_requests(3, seed=1)}
    with TestClient(app) as client:
        # A reference whose lab events per admission have more counts than bins: a state no
        # validated file reaches, standing in for any fault of the statistics on the window's data.
        lab = Distribution(30, 3.0, 3.0, 3.0, 3.0, (1.0,), (10, 10, 10))
        broken = dataclasses.replace(Profile.build([]), n=30, events={"lab": lab})
        export = dataclasses.replace(app.state.predictor.export, reference=broken)
        app.state.monitor = Monitor(export, 10, app.state.metrics, shift.Thresholds(min_admissions=2))
        assert client.post("/v1/predict/batch", json=body).status_code == 200
        with caplog.at_level(logging.ERROR, logger="serving.monitoring.monitor"):
            scrape = client.get("/metrics")
            answer = client.get("/v1/monitor")
        assert (scrape.status_code, answer.status_code) == (200, 200)
        assert answer.json()["level"] == "error" and answer.json()["error"].startswith(
            "the population monitor could not report (ValueError: ")
        assert _gauge(scrape.text, "ehr_shift_level") == LEVEL_ERROR
        assert _gauge(scrape.text, 'ehr_monitor_errors_total{stage="report"}') == 1.0
        assert "ehr_http_requests_total" in scrape.text  # every other metric still there
        # Logged once for that window (with the traceback), not once per scrape.
        assert len([r for r in caplog.records if r.exc_info]) == 1
        assert client.post("/v1/predict/batch", json=body).status_code == 200  # a new window state: tried again
        assert _gauge(client.get("/metrics").text, 'ehr_monitor_errors_total{stage="report"}') == 2.0
