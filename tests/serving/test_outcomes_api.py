"""Outcomes when they arrive, on a real uvicorn server: every answer names its prediction, POST /v1/outcomes
takes the outcome (authenticated, idempotent, clear 4xx), /v1/monitor and /metrics report realized beside
expected performance, a restart keeps everything and the retention period deletes old rows."""
from __future__ import annotations

import json
import sqlite3
import time

import httpx
import numpy as np
import pytest

from model.evaluation.statistics import metrics
from serving.api.app import create_app
from serving.inference.served_model import ServedModel
from serving.monitoring.outcome_store import STORE_FILE
from serving.settings import make_settings
from tests.support.ehr_testdata import admission_requests
from tests.support.serving_fixtures import ThreadedServer

KEY = "test-key-outcomes-0123456789"
HEADERS = {"X-API-Key": KEY}
PARAMS = {"num_samples": 2, "seed": 0}


@pytest.fixture(scope="module")
def export_dir(tiny_export):
    return tiny_export(ensemble_size=2)


@pytest.fixture(scope="module")
def predictor(export_dir):
    return ServedModel.load(export_dir)


def _server(export_dir, predictor, folder, **kwargs) -> ThreadedServer:
    settings = make_settings(api_keys=[KEY], model_dir=export_dir, warmup=False, monitor_refresh_s=0,
                             outcome_dir=folder, **kwargs)
    return ThreadedServer(create_app(settings, predictor))


def _predict(client: httpx.Client, n: int, seed: int) -> list[dict]:
    r = client.post("/v1/predict/batch", json={"patients": admission_requests(n, seed=seed)}, params=PARAMS,
                    headers=HEADERS)
    assert r.status_code == 200, r.text[:300]
    return r.json()["predictions"]


def _gauge(text: str, line_start: str) -> float:
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(line_start)))


@pytest.mark.slow
def test_outcomes_are_matched_to_their_predictions_and_survive_a_restart(export_dir, predictor, tmp_path):
    folder = tmp_path / "outcomes"
    with _server(export_dir, predictor, folder) as server, \
            httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        single = client.post("/v1/predict", json=admission_requests(1, seed=3)[0], params=PARAMS, headers=HEADERS)
        assert single.status_code == 200 and len(single.json()["prediction_id"]) == 32
        answers = _predict(client, 30, seed=4)
        ids = [a["prediction_id"] for a in answers]
        assert len(set(ids)) == 30
        outcomes = [1 if a["probability"] > 0.5 else 0 for a in answers[:20]]
        outcomes[0] = 1 - outcomes[0]
        for pid, y in zip(ids, outcomes):
            r = client.post("/v1/outcomes", json={"prediction_id": pid, "outcome": y}, headers=HEADERS)
            assert r.json() == {"prediction_id": pid, "stored": True}
        # Idempotent; a different outcome, an unknown id and a missing key are refused, saying why.
        again = client.post("/v1/outcomes", json={"prediction_id": ids[0], "outcome": outcomes[0]}, headers=HEADERS)
        assert again.status_code == 200 and again.json()["stored"] is False
        conflict = client.post("/v1/outcomes", json={"prediction_id": ids[0], "outcome": 1 - outcomes[0]},
                               headers=HEADERS)
        assert conflict.status_code == 409 and "already has outcome" in conflict.json()["detail"]
        unknown = client.post("/v1/outcomes", json={"prediction_id": "0" * 32, "outcome": 1}, headers=HEADERS)
        assert unknown.status_code in (404, 410)
        assert client.post("/v1/outcomes", json={"prediction_id": "f" * 32, "outcome": 1},
                           headers=HEADERS).status_code == 404
        assert client.post("/v1/outcomes", json={"prediction_id": ids[1], "outcome": 2},
                           headers=HEADERS).status_code == 422
        assert client.post("/v1/outcomes", json={"prediction_id": ids[1], "outcome": 1}).status_code == 401
        first = client.get("/v1/monitor", headers=HEADERS).json()["outcomes"]
    # Realized: the metrics of the predictions these 20 outcomes belong to, recomputed here from the answers.
    p = np.array([a["probability"] for a in answers[:20]])
    y = np.array(outcomes, dtype=float)
    assert first["predictions"] == 31 and first["outcomes"] == 20 and first["matched"] == 20
    realized = first["realized"]["metrics"]
    assert realized["brier"]["value"] == pytest.approx(float(metrics.brier(p, y)), rel=1e-5)
    assert realized["observed_expected"]["value"] == pytest.approx(y.sum() / p.sum(), rel=1e-5)
    # 20 outcomes: before the O/E test's first look; the closed test names an ehr-adapt method all the same.
    assert first["alarm"]["fires"] is False and "first O/E test looks at 100" in first["alarm"]["words"]
    assert first["update"]["method"] in ("none", "recalibrate-intercept", "recalibrate")
    assert "ehr-adapt --method" in first["update"]["words"]
    expected = first["expected"]["metrics"]["brier"]
    assert expected["lower"] <= expected["estimate"] <= expected["upper"] and first["expected"]["n"] == 20

    # A new server on the same folder: every prediction and outcome is still there, and still matched.
    with _server(export_dir, predictor, folder) as server, \
            httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        late = client.post("/v1/outcomes", json={"prediction_id": ids[25], "outcome": 0}, headers=HEADERS)
        assert late.json()["stored"] is True
        assert client.post("/v1/outcomes", json={"prediction_id": ids[0], "outcome": outcomes[0]},
                           headers=HEADERS).json()["stored"] is False
        after = client.get("/v1/monitor", headers=HEADERS).json()["outcomes"]
        scrape = client.get("/metrics", headers=HEADERS).text
    assert after["predictions"] == 31 and after["outcomes"] == 21 and after["matched"] == 21
    assert _gauge(scrape, 'ehr_outcomes{kind="outcomes"}') == 21.0
    assert _gauge(scrape, 'ehr_outcome_performance{kind="realized",metric="brier"}') == pytest.approx(
        after["realized"]["metrics"]["brier"]["value"], rel=1e-6)


@pytest.mark.slow
def test_rows_past_retention_are_deleted_and_their_outcomes_refused_as_expired(export_dir, predictor, tmp_path):
    folder = tmp_path / "outcomes"
    retention_days = 1.0 / 86400.0  # one second
    with _server(export_dir, predictor, folder, outcome_retention_days=retention_days) as server, \
            httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        ids = [a["prediction_id"] for a in _predict(client, 3, seed=5)]
        time.sleep(1.5)
        expired = client.post("/v1/outcomes", json={"prediction_id": ids[0], "outcome": 1}, headers=HEADERS)
        assert expired.status_code == 410 and "retention" in expired.json()["detail"]
    # Start-up deletes what is past retention: the file no longer holds those rows.
    with _server(export_dir, predictor, folder, outcome_retention_days=retention_days):
        with sqlite3.connect(folder / STORE_FILE) as db:
            assert db.execute("SELECT COUNT(*) FROM predictions").fetchone() == (0,)


@pytest.mark.slow
def test_without_an_outcome_dir_nothing_is_kept_and_outcomes_are_404(export_dir, predictor, tmp_path):
    settings = make_settings(api_keys=[KEY], model_dir=export_dir, warmup=False)
    with ThreadedServer(create_app(settings, predictor)) as server, \
            httpx.Client(base_url=server.base_url, timeout=60.0) as client:
        [answer] = _predict(client, 1, seed=6)
        assert answer["prediction_id"] is None
        r = client.post("/v1/outcomes", json={"prediction_id": "0" * 32, "outcome": 1}, headers=HEADERS)
        assert r.status_code == 404 and "--outcome-dir" in r.json()["detail"]
        assert client.get("/v1/monitor", headers=HEADERS).json()["outcomes"] is None
        # The Open Inference Protocol's answers and metadata have no prediction_id output either.
        name = predictor.export.card.name
        one = {"inputs": [{"name": "admission_json", "shape": [1], "datatype": "BYTES",
                           "data": [json.dumps(admission_requests(1, seed=6)[0])]}]}
        infer = client.post(f"/v2/models/{name}/infer", json=one, headers=HEADERS)
        assert infer.status_code == 200 and "prediction_id" not in [o["name"] for o in infer.json()["outputs"]]
        meta = client.get(f"/v2/models/{name}", headers=HEADERS).json()
        assert "prediction_id" not in [o["name"] for o in meta["outputs"]]
        asked = client.post(f"/v2/models/{name}/infer", json={**one, "outputs": [{"name": "prediction_id"}]},
                            headers=HEADERS)
        assert asked.status_code == 400 and "keeps no outcomes" in asked.json()["error"]
