"""The road one lab event takes from a REST request to its answer, read off a real request.

Every project function that runs while the service answers one /v1/predict request (after a
warm-up) is recorded with a profiler; the modules they live in are the road. The test pins
which modules those are, so a new hop, or a second copy of a conversion, shows up here.
"""
from __future__ import annotations

import datetime as dt
import pathlib
import sys
import threading

import pytest

from serving.api.app import create_app
from serving.inference.served_model import ServedModel
from serving.settings import make_settings
from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
# The modules that convert the request's data, each once: JSON -> validated request (schemas) ->
# events in seconds (encoding, ages) -> the job's own hop (admission: encode_admission) -> values in
# the training units (units, which reads each unit string with unit_strings) -> bags (bagging) ->
# SequenceExample (the spec's AdmissionContext, written by seqex) -> SavedModel call (predictor,
# predict, export) -> uncertainty summary (metrics) -> prediction (prediction, the use case every
# predict route calls) -> response (routes); the admission type is checked against the training
# types (admission_type), which also average an unknown one.
DATA_MODULES = {"serving/schemas.py", "serving/inference/encoding.py", "ehr_pipeline/encode/ages.py",
                "ehr_pipeline/encode/admission.py", "ehr_pipeline/encode/units.py",
                "ehr_pipeline/encode/unit_strings.py", "ehr_pipeline/encode/bagging.py",
                "ehr_pipeline/contract/spec.py", "ehr_pipeline/encode/seqex.py",
                "serving/inference/served_model.py", "model/export/predict.py", "model/export/load.py",
                "model/evaluation/statistics/metrics.py", "serving/inference/prediction.py", "serving/api/routes.py",
                "serving/inference/admission_type.py"}
# The population monitor keeps a summary of each answered admission (the job's own summary of its
# records) for the shift report; it reads the bags, it changes nothing the model sees. It summarises
# only when the export carries a reference to compare with, so the road's export carries one.
MONITOR = {"ehr_pipeline/shift/population.py", "serving/monitoring/monitor.py"}
# Plumbing that never touches the data: middleware, API keys, dependency injection, the choice of the model
# version that answers (model_versions: the admission's routing key; the split is only read when there is one),
# micro-batching.
PLUMBING = {"serving/api/middleware.py", "serving/api/auth.py", "serving/api/dependencies.py",
            "serving/inference/model_versions.py", "serving/inference/batching.py"}


@pytest.fixture(scope="module")
def road(reference_export) -> dict[str, set[str]]:
    from fastapi.testclient import TestClient

    export = reference_export  # the monitor-refresh and soak tests' export: its training folder's profile
    app = create_app(make_settings(model_dir=export, no_auth=True, host="127.0.0.1", warmup=False),
                     ServedModel.load(export))
    admit = dt.datetime(2150, 1, 1)
    request = {"patient": {"gender": "F", "date_of_birth": "2080-05-17"},
               "admission": {"admit_time": admit.isoformat(), "admission_type": "EMERGENCY"},
               "events": [{"time": (admit + dt.timedelta(hours=1)).isoformat(), "source": "lab", "code": "50912",
                           "value": 1.4}]}
    seen: dict[str, set[str]] = {}
    recording = threading.Event()
    project = tuple(str(ROOT / package) for package in ("ehr_pipeline", "model", "serving"))

    def profile(frame, event, arg):
        if event == "call" and recording.is_set() and frame.f_code.co_filename.startswith(project):
            module = pathlib.Path(frame.f_code.co_filename).relative_to(ROOT).as_posix()
            seen.setdefault(module, set()).add(frame.f_code.co_name)

    # Threads too: the route runs in the event loop's thread, the model call in a worker.
    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        with TestClient(app) as client:
            assert client.post("/v1/predict", json=request).status_code == 200  # warm-up
            recording.set()
            response = client.post("/v1/predict", json=request)
            recording.clear()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    assert response.status_code == 200
    return seen


def test_a_lab_event_reaches_the_answer_through_the_modules_that_convert_it(road):
    # Measured: 23 modules, 16 of them touching the data (encode_admission, the hop the job takes too, among them).
    assert set(road) <= DATA_MODULES | PLUMBING | MONITOR, sorted(set(road) - DATA_MODULES - PLUMBING - MONITOR)
    assert DATA_MODULES <= set(road), sorted(DATA_MODULES - set(road))


def test_the_service_bags_with_the_jobs_bagging_function_and_spec(road):
    # One source of truth for training and serving: the request is bagged and serialized by the
    # same functions the Beam job calls, through the one hop both take.
    assert "encode_admission" in road["ehr_pipeline/encode/admission.py"]
    assert "bag_events" in road["ehr_pipeline/encode/bagging.py"]
    assert "__post_init__" in road["ehr_pipeline/contract/spec.py"]  # AdmissionContext checks the context
    assert "serialize" in road["ehr_pipeline/encode/seqex.py"]
    assert "predict_probs" in road["model/export/predict.py"]
    # The monitor summarises the admission with the function that summarises the job's records.
    assert "admission_from_entries" in road["ehr_pipeline/shift/population.py"]
