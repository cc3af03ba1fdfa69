"""The Open Inference Protocol v2 (/v2) against a real ``ehr-serve`` process, driven by Triton's own client.

tritonclient[http] (test requirements) speaks the protocol as Triton's users do: server and model
readiness, metadata, infer with JSON tensors and with the binary-data extension. The reference for
every number is /v1/predict on the same server, with the same admission and seed: both roads must
reach the model with the same record (the noise is keyed by seed and record bytes), so the samples
agree exactly. Protocol error shapes and the record checks are pinned with plain httpx. The server keeps
outcomes, so every answer also carries the ``prediction_id`` tensor that /v1/outcomes takes.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import sqlite3

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from ehr_pipeline.contract import protos, spec
from model.export.load import read_export
from serving.inference.encoding import encode
from serving.monitoring.outcome_store import STORE_FILE
from serving.schemas import PredictRequest
from serving.tools.server_process import ServerProcess
from tests.support.paths import REPO_ROOT

pytestmark = pytest.mark.slow

KEY = "oip-test-key-0123456789abcdef"
HEADERS = {"X-API-Key": KEY}
SEED, SAMPLES, K = 11, 4, 2
ADMIT = dt.datetime(2150, 3, 1, 8, 30)


def admission(code: str = "50912", value: float = 1.4, hours: int = 1) -> dict:
    """A /v1/predict body."""
    return {"patient": {"gender": "F", "age_years": 67.5},
            "admission": {"admit_time": ADMIT.isoformat(), "admission_type": "EMERGENCY"},
            "events": [{"time": (ADMIT + dt.timedelta(hours=hours)).isoformat(), "source": "lab", "code": code,
                        "value": value},
                       {"time": (ADMIT + dt.timedelta(hours=2)).isoformat(), "source": "chart", "code": "220045",
                        "value": 112}]}


@pytest.fixture(scope="module")
def export(fixture_export):
    return read_export(fixture_export)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("oip")


@pytest.fixture(scope="module")
def server(fixture_export, folder):
    args = ["--model", str(fixture_export), "--max-wait-ms", "1", "--outcome-dir", str(folder / "outcomes")]
    with ServerProcess(args, env={"EHR_API_KEYS": KEY}, log_path=folder / "server.log", cwd=REPO_ROOT) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def triton_client(server):
    c = triton.InferenceServerClient(server.base_url.removeprefix("http://"))
    yield c
    c.close()


def v1_samples(client: httpx.Client, body: dict) -> dict:
    r = client.post("/v1/predict", params={"seed": SEED, "num_samples": SAMPLES, "include_samples": True},
                    json=body, headers=HEADERS)
    assert r.status_code == 200, r.text
    return r.json()


def test_tritonclient_reads_health_metadata_and_readiness(triton_client, export):
    name, version = export.card.name, export.card.version
    assert triton_client.is_server_live() and triton_client.is_server_ready()  # open, like /healthz
    assert triton_client.is_model_ready(name, headers=HEADERS)
    assert triton_client.is_model_ready(name, version, headers=HEADERS)
    assert not triton_client.is_model_ready("another-model", headers=HEADERS)
    assert not triton_client.is_model_ready(name, headers={"X-API-Key": "wrong-key-0123456789"})
    server = triton_client.get_server_metadata(headers=HEADERS)
    assert "binary_tensor_data" in server["extensions"]
    meta = triton_client.get_model_metadata(name, version, headers=HEADERS)
    assert meta["name"] == name and meta["versions"] == [version]
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("admission_json", "BYTES"),
                                                                      ("sequence_example", "BYTES")]
    outputs = {o["name"]: (o["datatype"], o["shape"]) for o in meta["outputs"]}
    assert outputs["sampled_probabilities"] == ("FP64", [-1, -1, K]) and outputs["refer"] == ("BOOL", [-1])
    assert outputs["prediction_id"] == ("BYTES", [-1])  # this server keeps outcomes
    with pytest.raises(InferenceServerException, match="not served here"):
        triton_client.get_model_metadata("another-model", headers=HEADERS)


def _infer(triton_client, export, tensor_name: str, elements: list[bytes], *, binary: bool,
           extra_outputs: tuple[str, ...] = ()):
    tensor = triton.InferInput(tensor_name, [len(elements)], "BYTES")
    tensor.set_data_from_numpy(np.array(elements, dtype=object), binary_data=binary)
    outputs = None if binary else [triton.InferRequestedOutput(n, binary_data=False)
                                   for n in ("probability", "sampled_probabilities", "refer", "interval_lower",
                                             "interval_upper", "predictive_entropy", "mutual_information",
                                             *extra_outputs)]
    # A copy: tritonclient writes its Inference-Header-Content-Length (an int) into the dict it is given.
    return triton_client.infer(export.card.name, [tensor], outputs=outputs, headers=dict(HEADERS),
                               parameters={"seed": SEED, "num_samples": SAMPLES}, request_id="req-1")


@pytest.mark.parametrize("binary", [False, True], ids=["json-tensors", "binary-extension"])
def test_tritonclient_infer_equals_v1_for_the_same_admissions_and_seed(triton_client, client, export, binary):
    bodies = [admission(), admission("50971", 4.1, hours=3)]
    result = _infer(triton_client, export, "admission_json", [json.dumps(b).encode() for b in bodies], binary=binary)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == (
        export.card.name, export.card.version, "req-1")
    samples = result.as_numpy("sampled_probabilities")
    assert samples.shape == (2, SAMPLES, K)
    for i, body in enumerate(bodies):
        ref = v1_samples(client, body)
        np.testing.assert_array_equal(samples[i].reshape(-1), ref["samples"])
        assert result.as_numpy("probability")[i] == ref["probability"]
        assert result.as_numpy("refer")[i] == ref["refer"]
        assert (result.as_numpy("interval_lower")[i], result.as_numpy("interval_upper")[i]) == (
            ref["interval"]["lower"], ref["interval"]["upper"])
        assert result.as_numpy("predictive_entropy")[i] == ref["predictive_entropy"]
        assert result.as_numpy("mutual_information")[i] == ref["epistemic"]


@pytest.mark.parametrize("binary", [False, True], ids=["base64-json", "binary-extension"])
def test_a_serialized_record_scores_as_its_admission_does(triton_client, client, export, binary):
    body = admission()
    record = encode(PredictRequest.model_validate(body), export).example  # the bytes a TF Serving user sends
    element = record if binary else base64.b64encode(record)
    result = _infer(triton_client, export, "sequence_example", [element], binary=binary)
    np.testing.assert_array_equal(result.as_numpy("sampled_probabilities")[0].reshape(-1),
                                  v1_samples(client, body)["samples"])


@pytest.mark.parametrize("binary", [False, True], ids=["json-tensors", "binary-extension"])
def test_every_admission_gets_a_prediction_id_that_takes_its_outcome(triton_client, client, export, folder, binary):
    bodies = [admission(), admission("50971", 4.1, hours=3)]
    record = encode(PredictRequest.model_validate(bodies[0]), export).example
    by_json = _infer(triton_client, export, "admission_json", [json.dumps(b).encode() for b in bodies],
                     binary=binary, extra_outputs=("prediction_id",))
    by_record = _infer(triton_client, export, "sequence_example", [record if binary else base64.b64encode(record)],
                       binary=binary, extra_outputs=("prediction_id",))
    # tritonclient gives a JSON BYTES element as str, a binary one as bytes.
    ids = [v.decode() if isinstance(v, bytes) else v
           for v in (*by_json.as_numpy("prediction_id"), *by_record.as_numpy("prediction_id"))]
    assert by_json.as_numpy("prediction_id").shape == (2,) and by_record.as_numpy("prediction_id").shape == (1,)
    assert len(set(ids)) == 3 and all(len(i) == 32 for i in ids)
    for pid, outcome in zip(ids, (1, 0, 1)):
        r = client.post("/v1/outcomes", json={"prediction_id": pid, "outcome": outcome}, headers=HEADERS)
        assert r.status_code == 200 and r.json() == {"prediction_id": pid, "stored": True}, r.text
    # Each identifier keys the probability its answer gave, whichever input carried the admission; the
    # admissions themselves are not kept (no --outcome-keep-admissions).
    answered = [*by_json.as_numpy("probability"), *by_record.as_numpy("probability")]
    with sqlite3.connect(folder / "outcomes" / STORE_FILE) as db:
        rows = [db.execute("SELECT probability, outcome, admission FROM predictions WHERE prediction_id = ?",
                           (pid,)).fetchone() for pid in ids]
    assert rows == [(float(p), y, None) for p, y in zip(answered, (1, 0, 1))]


def _record_without(export, feature: str) -> bytes:
    proto = protos.SequenceExample.FromString(encode(PredictRequest.model_validate(admission()), export).example)
    del proto.context.feature[feature]
    return proto.SerializeToString()


def _post_record(client, export, record: bytes, **parameters) -> httpx.Response:
    return client.post(f"/v2/models/{export.card.name}/infer", headers=HEADERS, json={
        "parameters": parameters, "inputs": [{"name": "sequence_example", "shape": [1], "datatype": "BYTES",
                                              "data": [base64.b64encode(record).decode()]}]})


def test_records_are_checked_against_the_exports_contract_before_the_model(client, export):
    good = encode(PredictRequest.model_validate(admission()), export).example
    assert _post_record(client, export, good, schema_version=spec.SCHEMA_VERSION).status_code == 200
    cases = {
        "schema_version 2": _post_record(client, export, good, schema_version=2),
        "missing ['age_years']": _post_record(client, export, _record_without(export, spec.AGE_YEARS)),
        "not a serialized": _post_record(client, export, b"\xff\x00 not a record"),
    }
    proto = protos.SequenceExample.FromString(good)
    proto.feature_lists.feature_list[spec.BAG_CODES].feature[0].bytes_list.value[0] = b"pharmacy:42"
    cases["no source of the model's vocabulary"] = _post_record(client, export, proto.SerializeToString())
    proto = protos.SequenceExample.FromString(good)
    proto.context.feature[spec.NUM_BAGS].int64_list.value[0] += 1
    cases["steps, num_bags says"] = _post_record(client, export, proto.SerializeToString())
    for expected, r in cases.items():
        assert r.status_code == 400 and expected in r.json()["error"], (expected, r.text)
        assert set(r.json()) == {"error"}


def test_protocol_errors_have_the_protocols_shape(client, export):
    name = export.card.name
    infer = f"/v2/models/{name}/infer"
    one = {"inputs": [{"name": "admission_json", "shape": [1], "datatype": "BYTES", "data": [json.dumps(admission())]}]}
    cases = [
        (401, client.post(infer, json=one)),  # refused before the body is read
        (401, client.get(f"/v2/models/{name}")),
        (404, client.post(f"/v2/models/{name}/versions/9.9.9/infer", json=one, headers=HEADERS)),
        (400, client.post(infer, content=b"{not json", headers=HEADERS)),
        (400, client.post(infer, json={"inputs": [{**one["inputs"][0], "shape": [2]}]}, headers=HEADERS)),
        (400, client.post(infer, json={**one, "outputs": [{"name": "risk"}]}, headers=HEADERS)),
        (400, client.post(infer, json={**one, "parameters": {"num_samples": 10**6}}, headers=HEADERS)),
        (400, client.post(infer, json={"inputs": [{**one["inputs"][0], "data": [json.dumps(
            {**admission(), "patient": {"gender": "X", "age_years": 50}})]}]}, headers=HEADERS)),
    ]
    for status, r in cases:
        assert r.status_code == status and set(r.json()) == {"error"}, (status, r.text)
    assert "patient.gender" in cases[-1][1].json()["error"] and '"X"' not in cases[-1][1].json()["error"]
    ok = client.post(f"/v2/models/{name}/versions/{export.card.version}/infer", json=one, headers=HEADERS)
    assert ok.status_code == 200 and ok.json()["model_version"] == export.card.version
    assert [o["name"] for o in ok.json()["outputs"]][0] == "probability"
    metrics = client.get("/metrics", headers=HEADERS).text
    assert 'route="/v2/models/{name}/infer"' in metrics
