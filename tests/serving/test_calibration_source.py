"""Every answer's calibration names the admissions its numbers come from, alike in REST, FHIR and CDS Hooks.

Two real servers on 127.0.0.1: the session's tiny trained rank-1 export, whose metrics.json holds its
data's held-out test split, and that export recalibrated by ehr-adapt at a 'site' (its own admissions
relabelled, tests/support/adapt_data.py; method recalibrate with 3 samples: nothing is trained), whose
numbers are the local admissions the update was fitted on. What each answer must say is recounted
from the data folders, and the adapted export's NLL recomputed from its own predictions of the site.
"""
from __future__ import annotations

import json
import shutil

import httpx
import numpy as np
import pytest

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from model import data_folder
from model.adapt.config import AdaptConfig
from model.adapt.run_update import run_update
from model.export.load import load_export, read_export, write_manifest
from model.export.predict import predict_probs
from serving.api.app import create_app
from serving.api.fhir_answers import EXTENSION
from serving.inference.served_model import ServedModel
from serving.inference.prediction import calibration
from serving.settings import make_settings
from tests.support.adapt_data import relabelled_copy
from tests.support.serving_fixtures import ThreadedServer

KEY = "test-key-calibration-0123456789"
HEADERS = {"X-API-Key": KEY}
ADAPT = AdaptConfig(method="recalibrate", samples=3)
# No events and no admission type: any export answers it (averaged over its training types).
BUNDLE = {"resourceType": "Bundle", "type": "collection", "entry": [
    {"resource": {"resourceType": "Patient", "id": "p", "gender": "female", "birthDate": "2080-05-17"}},
    {"resource": {"resourceType": "Encounter", "id": "e", "status": "in-progress", "class": {"code": "IMP"},
                  "subject": {"reference": "Patient/p"}, "period": {"start": "2150-03-01T08:30:00Z"}}}]}


@pytest.fixture(scope="module")
def site(trained_rank1, tmp_path_factory):
    """The model's own admissions, four in five dying: the site the update is fitted on."""
    return relabelled_copy(trained_rank1["data"], tmp_path_factory.mktemp("calibration") / "site", death_rate=0.8,
                           seed=1)


@pytest.fixture(scope="module")
def exports(trained_rank1, site, tmp_path_factory):
    adapted = run_update(trained_rank1["export"], site, tmp_path_factory.mktemp("adapted") / "export", ADAPT)
    return {"trained": trained_rank1["export"], "adapted": adapted.export_dir}


@pytest.fixture(scope="module")
def clients(exports):
    with (ThreadedServer(_app(exports["trained"])) as trained, ThreadedServer(_app(exports["adapted"])) as adapted,
          httpx.Client(base_url=trained.base_url, timeout=60.0) as a, httpx.Client(base_url=adapted.base_url,
                                                                                   timeout=60.0) as b):
        yield {"trained": a, "adapted": b}


def _app(export_dir):
    settings = make_settings(api_keys=[KEY], model_dir=export_dir, warmup=False, monitor_window=0)
    return create_app(settings, ServedModel.load(export_dir))


def _expected(kind: str, trained_rank1, site, exports) -> dict:
    """What the answer must say, from the data folders (and metrics.json for the trained model's own numbers)."""
    if kind == "trained":
        n = len(data_folder.read_split(data_folder.load_data_files(trained_rank1["data"]), "test").labels)
        test = json.loads((exports["trained"] / "metrics.json").read_text())["test"]
        return {"split": "test", "held_out": True, "admissions": n, "source": f"the held-out test split ({n} admissions)",
                "ece": test["ece"], "nll": test["nll"]}
    local = data_folder.read_split(data_folder.load_data_files(site), ADAPT.split)
    probs = predict_probs(load_export(exports["adapted"]), local.records, ADAPT.samples, ADAPT.seed)
    mean, labels = np.clip(probs.astype(np.float64).mean(axis=1), 1e-7, 1 - 1e-7), np.asarray(local.labels)
    nll = float(-np.mean(labels * np.log(mean) + (1 - labels) * np.log1p(-mean)))
    n = len(labels)
    return {"split": ADAPT.split, "held_out": False, "admissions": n, "nll": pytest.approx(nll, rel=1e-4),
            "source": f"the {n} local admissions ({ADAPT.split} split) the update was fitted on: in-sample, "
                      "not held out"}


@pytest.mark.parametrize("kind", ["trained", "adapted"])
def test_rest_fhir_and_cds_name_the_admissions_the_calibration_was_measured_on(kind, clients, trained_rank1, site,
                                                                               exports):
    expected = _expected(kind, trained_rank1, site, exports)
    client = clients[kind]
    body = {"patient": {"gender": "F", "date_of_birth": "2080-05-17"}, "admission": {"admit_time": "2150-03-01T08:30:00"},
            "events": []}
    r = client.post("/v1/predict", json=body, headers=HEADERS, params={"num_samples": 2, "seed": 1})
    assert r.status_code == 200, r.text
    rest = r.json()["calibration"]
    assert {k: rest[k] for k in expected} == expected
    batch = client.post("/v1/predict/batch", json={"patients": [body]}, headers=HEADERS, params={"num_samples": 2})
    assert batch.json()["calibration"] == rest

    r = client.post("/fhir/r4/$predict-mortality", content=json.dumps(BUNDLE), params={"num_samples": 2},
                    headers={**HEADERS, "Content-Type": "application/fhir+json"})
    assert r.status_code == 200, r.text
    [extension] = [e for e in r.json()["extension"] if e["url"].startswith(EXTENSION) and "calibration" in e["url"]]
    assert extension["url"] == EXTENSION + "calibration"
    values = {e["url"]: next(v for k, v in e.items() if k.startswith("value")) for e in extension["extension"]}
    assert values == {"split": rest["split"], "held-out": rest["held_out"], "admissions": rest["admissions"],
                      "source": rest["source"], "ece": rest["ece"], "nll": rest["nll"]}

    call = {"hook": "patient-view", "hookInstance": "c0ffee", "context": {"patientId": "p"},
            "prefetch": {"patient": BUNDLE["entry"][0]["resource"], "encounter": BUNDLE["entry"][1]["resource"]}}
    r = client.post("/cds-services/mortality-risk", json=call, headers=HEADERS)
    assert r.status_code == 200, r.text
    [card] = r.json()["cards"]
    assert f"**Calibration on {expected['source']}:** ECE {rest['ece']:.3f}, NLL {rest['nll']:.3f}." in card["detail"]
    assert ("held-out" in card["detail"].lower()) == expected["held_out"]


def test_an_update_written_before_metrics_said_so_is_read_as_in_sample(exports, site, tmp_path):
    # Until metrics.json said "held_out", only "on" did (in words); adaptation.json tells the reader.
    old = tmp_path / "export"
    shutil.copytree(exports["adapted"], old)
    metrics = json.loads((old / "metrics.json").read_text())
    for field in ("split", "held_out", "n"):
        del metrics["test"][field]
    (old / "metrics.json").write_text(json.dumps(metrics))
    (old / "manifest.json").unlink()
    write_manifest(old)
    n = len(data_folder.read_split(data_folder.load_data_files(site), ADAPT.split).labels)
    got = calibration(read_export(old))
    assert (got.split, got.held_out, got.admissions) == (ADAPT.split, False, n)
    assert got == calibration(read_export(exports["adapted"]))
