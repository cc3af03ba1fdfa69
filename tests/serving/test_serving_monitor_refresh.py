"""The monitor's report is made at most every --monitor-refresh-s, never while a scrape waits behind another.

Under load every prediction changes the window, and a report per scrape made /metrics queue
(p50 2.2 s with 8 clients): the report is now served until it is monitor_refresh_s old, then made
again in the background while callers get the last one at once; its age is a gauge and
/v1/monitor's ``age_s``. These tests run a real app (its lifespan, routes and monitor) and read
the window size each answer reports: the admissions the report was made of.
"""
from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from serving.api.app import create_app
from serving.inference.served_model import ServedModel
from serving.settings import Settings, make_settings
from tests.support.ehr_testdata import admission_requests

PARAMS = {"num_samples": 2, "seed": 0}


@pytest.fixture(scope="module")
def export_dir(reference_export):
    return reference_export  # an export with a reference, so its monitor reports


@pytest.fixture(scope="module")
def model(export_dir) -> ServedModel:
    # Loaded once for the module (a load verifies every checksum and reads the SavedModel, seconds); each
    # test's app still starts its own batcher and monitor, so no window or report is shared.
    return ServedModel.load(export_dir)


def _client(model: ServedModel, refresh_s: float) -> TestClient:
    settings = make_settings(model_dir=model.export.directory, no_auth=True, host="127.0.0.1", warmup=False,
                             monitor_window=100, monitor_refresh_s=refresh_s)
    return TestClient(create_app(settings, model))


def _send(client: TestClient, n: int, seed: int) -> None:
    r = client.post("/v1/predict/batch", json={"patients": admission_requests(n, seed=seed)}, params=PARAMS)
    assert r.status_code == 200, r.text[:300]


def _gauge(text: str, name: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


def _report_of_3_then_4_more(client: TestClient) -> None:
    """A report made of 3 admissions, then 4 more sent and the 0.2 s refresh age passed: the report is old."""
    _send(client, 3, seed=1)
    assert client.get("/v1/monitor").json()["admissions"] == 3
    _send(client, 4, seed=2)
    time.sleep(0.3)


def test_the_default_refresh_is_a_setting_with_its_help():
    field = Settings.model_fields["monitor_refresh_s"]
    assert field.default == 10.0 and "seconds" in field.description


def test_a_young_report_is_served_as_it_is_while_admissions_keep_coming(model):
    with _client(model, refresh_s=3600) as client:
        _send(client, 3, seed=1)
        first = client.get("/v1/monitor").json()  # the first report: made while it waits
        assert first["admissions"] == 3 and 0 <= first["age_s"] < 60
        _send(client, 4, seed=2)
        again = client.get("/v1/monitor").json()
        assert again["admissions"] == 3 and again["age_s"] >= first["age_s"]  # the same report, older
        scrape = client.get("/metrics").text
        assert _gauge(scrape, "ehr_shift_window_admissions") == 3
        assert _gauge(scrape, "ehr_shift_report_age_seconds") >= again["age_s"]


def test_refresh_zero_makes_the_report_of_every_window(model):
    with _client(model, refresh_s=0) as client:
        _send(client, 3, seed=1)
        assert client.get("/v1/monitor").json()["admissions"] == 3
        _send(client, 4, seed=2)
        assert client.get("/v1/monitor").json()["admissions"] == 7


def test_an_old_report_is_answered_at_once_and_made_again_in_the_background(model):
    with _client(model, refresh_s=0.2) as client:
        _report_of_3_then_4_more(client)
        assert client.get("/v1/monitor").json()["admissions"] == 3  # the last one, while the next is made
        deadline = time.monotonic() + 60
        while client.get("/v1/monitor").json()["admissions"] != 7:
            assert time.monotonic() < deadline, "the background report never came"
            time.sleep(0.1)


def test_a_caller_never_waits_for_a_report_another_is_making(model):
    with _client(model, refresh_s=0.2) as client:
        _report_of_3_then_4_more(client)
        monitor = client.app.state.monitor
        monitor._compute.acquire()  # a report of the window in the making elsewhere
        try:
            t0 = time.monotonic()
            scrape = client.get("/metrics")
            answer = client.get("/v1/monitor").json()
            waited = time.monotonic() - t0
        finally:
            monitor._compute.release()
        assert scrape.status_code == 200 and answer["admissions"] == 3
        assert waited < 30  # it would wait forever behind a lock nobody releases
