"""The prediction service over real HTTP: a real uvicorn server on 127.0.0.1, no mocks.

The model is a real export written by model.export.write around a tiny UNTRAINED rank-1 model
(serving.tools.tiny_export.write_tiny_model_export, through the session's tiny_export factory): the real
featurizer, architecture, seeded stateless sampling and SavedModel, with meaningless random weights.
"""
from __future__ import annotations

import concurrent.futures
import copy
import datetime as dt
import hashlib
import json
import logging
import math
import re
import time

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings as hyp_settings, strategies as st

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from ehr_pipeline.contract import PipelineConfig, spec
from ehr_pipeline.encode import ages, bagging, seqex, units
from model.evaluation.statistics import metrics as model_metrics
from model.export_layout import BFLOAT16_MEAN_TOLERANCE, BFLOAT16_SAMPLE_TOLERANCE
from serving.inference import precision
from serving.api.app import create_app
from serving.inference.encoding import encode
from serving.inference.served_model import ServedModel
from serving.settings import make_settings
from serving.tools.tiny_export import TINY_MODEL_NAME
from tests.support.json_mutation import mutate_json
from tests.support.serving_fixtures import ThreadedServer, write_fixture_export

KEY = "test-key-serving-0123456789"
OTHER_KEY = "second-key-serving-abcdefghij"
HEADERS = {"X-API-Key": KEY}
K = 2
MAX_EVENTS = 40
MAX_PATIENTS = 4
MAX_BODY = 48 * 1024
ADMIT = dt.datetime(2150, 3, 1, 8, 30)


@pytest.fixture(scope="module")
def export_dir(tiny_export):
    return tiny_export(ensemble_size=K)


@pytest.fixture(scope="module")
def predictor(export_dir):
    return ServedModel.load(export_dir)


@pytest.fixture(scope="module")
def server(export_dir, predictor):
    settings = make_settings(api_keys=[KEY, OTHER_KEY], model_dir=export_dir, max_events=MAX_EVENTS,
                             max_patients=MAX_PATIENTS, max_body_bytes=MAX_BODY, max_wait_ms=40.0, max_batch=32)
    with ThreadedServer(create_app(settings, predictor)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
        yield c


def iso(t: dt.datetime) -> str:
    return t.isoformat()


def body(events=None, **overrides) -> dict:
    """A valid single-patient request; keyword arguments replace top-level fields."""
    req = {
        "id": "case-1",
        "patient": {"gender": "F", "date_of_birth": "2080-05-17"},
        "admission": {"admit_time": iso(ADMIT), "admission_type": "EMERGENCY"},
        "events": events if events is not None else [
            {"time": iso(ADMIT + dt.timedelta(hours=1)), "source": "lab", "code": "50912", "value": 1.4,
             "unit": "mg/dL"},
            {"time": iso(ADMIT + dt.timedelta(hours=2)), "source": "chart", "code": "220045", "value": 112},
            {"time": iso(ADMIT + dt.timedelta(hours=3)), "source": "lab", "code": "NOT-IN-VOCAB"},
            {"time": iso(ADMIT - dt.timedelta(days=400)), "source": "diagnosis", "code": "4019"},
            {"time": iso(ADMIT + dt.timedelta(days=3)), "source": "lab", "code": "50912", "value": 2.0},
        ],
    }
    req.update(overrides)
    return req


def locs(response: httpx.Response) -> list[list]:
    return [d["loc"] for d in response.json()["detail"]]


def scrape(client: httpx.Client) -> dict[str, float]:
    """/metrics as {'name{labels}': value}."""
    out = {}
    for line in client.get("/metrics", headers=HEADERS).text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


# ------------------------------------------------------------------------------- basics


def test_health_ready_and_openapi(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/predict", "/v1/predict/batch", "/v1/model", "/healthz", "/readyz", "/metrics"} <= set(paths)


def test_docs_load_nothing_from_outside_the_service(client):
    # A hospital network often has no internet: a page that fetches a CDN's script is blank there.
    page = client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert not re.findall(r"(?:https?:)?//[\w.-]+", page.text), "an external URL in /docs"
    loaded = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert len(loaded) == 3 and all(u.startswith("/docs/assets/") for u in loaded), loaded
    kinds = {}
    for url in loaded:
        r = client.get(url)
        assert r.status_code == 200 and len(r.content) > 1000, url
        kinds[url.rsplit(".", 1)[1]] = r
    assert b"SwaggerUIBundle" in kinds["js"].content and kinds["png"].content.startswith(b"\x89PNG")
    # The stylesheet's images are inline: no url() that leaves the page.
    assert all(u.strip("\"'").startswith("data:") for u in re.findall(r"url\(([^)]*)\)", kinds["css"].text))
    assert '"validatorUrl": null' in page.text  # no badge from validator.swagger.io
    # ReDoc (a CDN script and Google Fonts) and the OAuth redirect page are not served; nor the package's other files.
    for path in ("/redoc", "/docs/oauth2-redirect", "/docs/assets/swagger-editor-bundle.js",
                 "/docs/assets/..%2f..%2fcore.py"):
        assert client.get(path).status_code == 404, path
    assert client.get("/openapi.json").status_code == 200


def test_predict_returns_uncertainty_from_model_metrics(client, export_dir):
    r = client.post("/v1/predict", json=body(), headers=HEADERS, params={"include_samples": "true", "seed": 7})
    assert r.status_code == 200, r.text
    out = r.json()
    probs = np.array([out["samples"]])
    assert probs.shape == (1, 25 * K) and out["num_samples"] == 25 and out["ensemble_size"] == K
    assert out["probability"] == pytest.approx(model_metrics.predictive_mean(probs)[0])
    assert out["std"] == pytest.approx(model_metrics.predictive_std(probs)[0])
    assert out["predictive_entropy"] == pytest.approx(model_metrics.predictive_entropy(probs)[0])
    assert out["aleatoric"] == pytest.approx(model_metrics.expected_entropy(probs)[0])
    assert out["epistemic"] == pytest.approx(model_metrics.mutual_information(probs)[0])
    assert out["member_probabilities"] == pytest.approx(model_metrics.member_means(probs, K, 25)[0].tolist())
    assert out["interval"]["lower"] <= out["probability"] <= out["interval"]["upper"]
    side = (probs[0] > 0.5) != (out["probability"] > 0.5)
    assert out["samples_across_threshold"] == pytest.approx(side.mean())
    # Referral: the stored rule (mutual information > 0.001, chosen to refer 20 %).
    stored = json.loads((export_dir / "metrics.json").read_text())["referral"]
    assert out["referral"] == {**stored, "refer": out["refer"], "value": pytest.approx(out["epistemic"])}
    assert out["refer"] == (out["epistemic"] > stored["threshold"])
    # Events: the one 3 days after admission is at/after the default prediction time (admit + 1 day).
    assert out["events"] == {"received": 5, "used": 4,
                             "ignored": {"at_or_after_trigger": 1, "older_than_max_bags": 0},
                             # mg/dL is the model's unit; the two values without a unit are taken to be in it
                             "values": {**dict.fromkeys(units.OUTCOMES, 0), "same_unit": 1, "no_unit": 2}}
    assert out["out_of_vocabulary"] == {"count": 1, "codes": ["lab:NOT-IN-VOCAB"]}
    assert out["prediction_time"] == "2150-03-02T08:30:00Z"
    # The tiny export's metrics.json names no count: a trained export's numbers are its held-out test split's.
    assert out["calibration"] == {"split": "test", "held_out": True, "admissions": None,
                                  "source": "the held-out test split", "ece": 0.05, "nll": 0.31}
    manifest_sha = hashlib.sha256((export_dir / "manifest.json").read_bytes()).hexdigest()
    assert out["model"] == {"name": TINY_MODEL_NAME, "version": ehr_base.__version__, "checksum": manifest_sha,
                            "precision": "float32", "selected_by": "default"}
    assert out["id"] == "case-1" and r.headers["x-request-id"] == out["request_id"]


def test_service_feeds_the_model_exactly_what_the_pipeline_would(client, predictor):
    """No training/serving skew: same bags, age and proto as ehr_pipeline builds, so the same samples."""
    req = body()
    out = client.post("/v1/predict", json=req, headers=HEADERS,
                      params={"include_samples": "true", "seed": 11, "num_samples": 4}).json()
    cfg = PipelineConfig()
    admit = int(ADMIT.replace(tzinfo=dt.timezone.utc).timestamp())
    trigger = admit + cfg.trigger_offset_seconds
    times = np.array([int(dt.datetime.fromisoformat(e["time"]).replace(tzinfo=dt.timezone.utc).timestamp())
                      for e in req["events"]], dtype=np.int64)
    codes = np.array([spec.format_code(e["source"], e["code"]) for e in req["events"]], dtype=object)
    values = np.array([e.get("value", np.nan) for e in req["events"]], dtype=np.float64)
    bags = bagging.bag_events(times, codes, values, trigger, cfg.bagging)
    dob = int(dt.datetime(2080, 5, 17, tzinfo=dt.timezone.utc).timestamp())
    context = {spec.SUBJECT_ID: 0, spec.HADM_ID: 0, spec.LABEL: spec.LABEL_UNKNOWN, spec.TRIGGER_TIME: trigger,
               spec.ADMIT_OFFSET: trigger - admit, spec.AGE_YEARS: float(ages.cap_age(ages.age_years(dob, admit))), spec.GENDER: "F",
               spec.ADMISSION_TYPE: "EMERGENCY", spec.ETHNICITY: spec.NOT_RECORDED, spec.INSURANCE: spec.NOT_RECORDED}
    example = seqex.make_sequence_example(context, bags).SerializeToString()
    expected = predictor.forward([example], 4, 11)[0]
    np.testing.assert_allclose(out["samples"], expected, rtol=1e-6)
    assert out["age_years"] == pytest.approx(context[spec.AGE_YEARS])


def test_padded_codes_and_event_order_change_nothing(client):
    """Codes are trimmed as the job trims them, and the answer does not depend on the event order."""
    params = {"include_samples": "true", "seed": 5, "num_samples": 3}
    plain = client.post("/v1/predict", json=body(), headers=HEADERS, params=params).json()
    events = [{**e, "code": f" {e['code']}\u00a0\t"} for e in body()["events"]][::-1]
    padded = client.post("/v1/predict", json=body(events=events), headers=HEADERS, params=params).json()
    assert padded["samples"] == plain["samples"]
    assert padded["out_of_vocabulary"] == plain["out_of_vocabulary"] == {"count": 1, "codes": ["lab:NOT-IN-VOCAB"]}


def test_seed_reproduces_and_no_seed_draws_fresh_samples(client):
    params = {"include_samples": "true", "num_samples": 5}
    a = client.post("/v1/predict", json=body(), headers=HEADERS, params={**params, "seed": 3}).json()
    b = client.post("/v1/predict", json=body(), headers=HEADERS, params={**params, "seed": 3}).json()
    c = client.post("/v1/predict", json=body(), headers=HEADERS, params=params).json()
    assert a["samples"] == b["samples"] and len(a["samples"]) == 5 * K
    assert c["samples"] != a["samples"]


def test_age_instead_of_dob_explicit_prediction_time_and_warnings(client):
    req = body(events=[], patient={"gender": "M", "age_years": 120.0},
               prediction_time=iso(ADMIT + dt.timedelta(hours=6)))
    out = client.post("/v1/predict", json=req, headers=HEADERS).json()
    assert out["age_years"] == 90.0  # capped like the training data
    assert out["prediction_time"] == "2150-03-01T14:30:00Z"
    assert out["events"]["received"] == 0 and out["events"]["used"] == 0
    assert any("trained for" in w for w in out["warnings"]) and any("no events" in w for w in out["warnings"])
    young = client.post("/v1/predict", json=body(patient={"gender": "F", "age_years": 12.0}), headers=HEADERS)
    assert any("minimum" in w for w in young.json()["warnings"])


def test_timezone_offsets_are_converted_to_utc(client):
    req = body(events=[], admission={"admit_time": "2150-03-01T10:30:00+02:00", "admission_type": "URGENT"})
    assert client.post("/v1/predict", json=req, headers=HEADERS).json()["prediction_time"] == "2150-03-02T08:30:00Z"


def test_model_info(client):
    r = client.get("/v1/model", headers=HEADERS)
    assert r.status_code == 200
    info = r.json()
    assert info["model_card"]["ensemble_size"] == K and info["model"]["name"] == TINY_MODEL_NAME
    assert info["metrics"]["referral"]["measure"] == "mutual_information"
    assert info["pipeline_config"]["trigger_offset_seconds"] == 86400
    assert info["limits"]["max_events"] == MAX_EVENTS and info["vocabulary_size"] == 11


# ------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("mutate, loc", [
    (lambda b: b.pop("patient"), ["body", "patient"]),
    (lambda b: b["patient"].update(age_years=50.0), ["body", "patient"]),  # both dob and age
    (lambda b: b["patient"].pop("date_of_birth"), ["body", "patient"]),  # neither
    (lambda b: b["patient"].update(gender="X"), ["body", "patient", "gender"]),
    (lambda b: b["events"][0].update(source="radiology"), ["body", "events", 0, "source"]),
    (lambda b: b["events"][1].update(code=""), ["body", "events", 1, "code"]),
    (lambda b: b["events"][1].update(code="   "), ["body", "events", 1, "code"]),
    (lambda b: b["events"][1].update(code=50912), ["body", "events", 1, "code"]),
    (lambda b: b["events"][0].update(time=1700000000), ["body", "events", 0, "time"]),
    (lambda b: b["events"][0].update(time="yesterday"), ["body", "events", 0, "time"]),
    (lambda b: b["events"][0].update(value="1.5"), ["body", "events", 0, "value"]),
    (lambda b: b["events"][0].update(colour="red"), ["body", "events", 0, "colour"]),
    (lambda b: b.update(admision={}), ["body", "admision"]),
    (lambda b: b.update(prediction_time=iso(ADMIT - dt.timedelta(seconds=1))), ["body", "prediction_time"]),
    (lambda b: b["patient"].update(date_of_birth="2151-01-01"), ["body", "patient", "date_of_birth"]),
    (lambda b: b["admission"].update(admit_time="9999-12-31T12:00:00"), ["body", "admission", "admit_time"]),
    # An offset that moves the time past year 9999 in UTC, and control characters in a code.
    (lambda b: b.update(prediction_time="9999-12-31T23:00:00-05:00"), ["body", "prediction_time"]),
    (lambda b: b["events"][1].update(code="\u0000"), ["body", "events", 1, "code"]),
    (lambda b: b["events"][1].update(code="50912\u0000"), ["body", "events", 1, "code"]),
    (lambda b: b["events"][1].update(code="509\t12"), ["body", "events", 1, "code"]),
    # Types the training split never held: their one-hot slot never trained (serving.inference.admission_type).
    (lambda b: b["admission"].update(admission_type="NEWBORN"), ["body", "admission", "admission_type"]),
    (lambda b: b["admission"].update(admission_type="UNKNOWN"), ["body", "admission", "admission_type"]),
    (lambda b: b["admission"].update(admission_type="emergency"), ["body", "admission", "admission_type"]),
])
def test_invalid_requests_are_422_naming_the_field(client, mutate, loc):
    b = copy.deepcopy(body())
    mutate(b)
    r = client.post("/v1/predict", json=b, headers=HEADERS)
    assert r.status_code == 422, r.text
    assert any(l[:len(loc)] == loc for l in locs(r)), locs(r)
    assert all(set(d) == {"loc", "msg", "type"} for d in r.json()["detail"])  # no 'input': data not echoed


@pytest.mark.parametrize("content, content_type", [
    (b'{"patient": ', "application/json"),  # truncated JSON
    (b"[" * 50000 + b"]" * 50000, "application/json"),  # nesting deep enough to break a recursive parser
    (b'{"patient": NaN}', "application/json"),
    (b"", "application/json"),
    (b"\xff\xfe\x00garbage", "application/json"),
    (json.dumps(body()).encode(), "text/plain"),
    (b"[]", "application/json"),
])
def test_malformed_bodies_are_4xx_not_500(client, content, content_type):
    r = client.post("/v1/predict", content=content, headers={**HEADERS, "content-type": content_type})
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert "detail" in r.json()


BODY_ROUTES = ["/v1/predict", "/v1/predict/batch", "/fhir/r4/$predict-mortality", "/cds-services/mortality-risk"]


@pytest.mark.parametrize("route", BODY_ROUTES)
@pytest.mark.parametrize("content", [b"{not json", b'{"patients": [', b"", b"\xff\xfe{}", b"[" * 20000])
def test_a_body_that_is_not_json_is_400_on_every_route(client, route, content):
    r = client.post(route, content=content, headers={**HEADERS, "content-type": "application/json"})
    assert r.status_code == 400, (r.status_code, r.text[:200])
    if route.startswith("/fhir/"):  # FHIR clients read OperationOutcomes, whatever the status
        assert r.json()["resourceType"] == "OperationOutcome"
    else:
        assert isinstance(r.json()["detail"], str) and r.json()["request_id"] == r.headers["x-request-id"]


@pytest.mark.parametrize("route", BODY_ROUTES[:3])
def test_json_of_the_wrong_shape_is_422(client, route):
    # Parsed, so not malformed: the schema (or FHIR) refuses it, naming where.
    r = client.post(route, json=[], headers=HEADERS)
    assert r.status_code == 422, (r.status_code, r.text[:200])


def test_the_schema_documents_400_where_a_body_is_read(client):
    paths = client.get("/openapi.json").json()["paths"]
    for route in BODY_ROUTES:
        template = route.replace("mortality-risk", "{service_id}") if route.startswith("/cds") else route
        assert "400" in paths[template]["post"]["responses"], route


def test_non_finite_and_surrogate_values_are_rejected(client):
    raw = json.dumps(body()).replace('"value": 1.4', '"value": NaN')
    r = client.post("/v1/predict", content=raw, headers={**HEADERS, "content-type": "application/json"})
    assert r.status_code == 422 and ["body", "events", 0, "value"] in locs(r)
    raw = json.dumps(body()).replace('"50912"', '"\\ud800"', 1)  # a lone surrogate: valid JSON, not UTF-8
    r = client.post("/v1/predict", content=raw, headers={**HEADERS, "content-type": "application/json"})
    assert r.status_code == 422 and ["body", "events", 0, "code"] in locs(r)


@pytest.mark.parametrize("params, status", [
    ({"num_samples": 0}, 422), ({"num_samples": 101}, 422), ({"num_samples": "many"}, 422),
    ({"seed": -1}, 422), ({"seed": 2**64}, 422), ({"num_samples": 100}, 200), ({"num_samples": 1}, 200),
])
def test_query_limits(client, params, status):
    r = client.post("/v1/predict", json=body(), headers=HEADERS, params=params)
    assert r.status_code == status, r.text
    if status == 422:
        assert locs(r)[0][0] == "query" and locs(r)[0][1] in params
    else:
        assert len(r.json()["member_probabilities"]) == K and r.json()["num_samples"] == params["num_samples"]


def test_unknown_route_and_method_are_json_4xx(client):
    assert client.get("/v2/predict", headers=HEADERS).status_code == 404
    assert client.get("/v1/predict", headers=HEADERS).status_code == 405


# ------------------------------------------------------------------------------- auth


def test_auth(client):
    assert client.post("/v1/predict", json=body()).status_code == 401
    r = client.post("/v1/predict", json=body(), headers={"X-API-Key": KEY + "x"})
    assert r.status_code == 401 and r.json()["detail"] == "invalid API key" and "www-authenticate" in r.headers
    assert client.post("/v1/predict", json=body(), headers={"X-API-Key": ""}).status_code == 401
    assert client.post("/v1/predict", json=body(), headers={"Authorization": "Bearer nope"}).status_code == 401
    assert client.get("/v1/model").status_code == 401
    assert client.post("/v1/predict", json=body(), headers={"X-API-Key": OTHER_KEY}).status_code == 200
    assert client.post("/v1/predict", json=body(), headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    # Health and metrics stay open for probes and scrapers; they hold no patient data.
    assert client.get("/healthz").status_code == 200 and client.get("/metrics", headers=HEADERS).status_code == 200


def test_no_auth_server_on_loopback_needs_no_key(export_dir, predictor):
    settings = make_settings(model_dir=export_dir, no_auth=True, host="127.0.0.1", warmup=False)
    with ThreadedServer(create_app(settings, predictor)) as srv:
        r = httpx.post(f"{srv.base_url}/v1/predict", json=body(), timeout=30)
        assert r.status_code == 200, r.text


def test_precision_auto_is_the_default_and_serves_what_it_measured(export_dir, caplog):
    settings = make_settings(model_dir=export_dir, no_auth=True, host="127.0.0.1", max_batch=2)
    assert settings.precision == "auto"
    # The app loads the export itself; auto's timing (the first bfloat16 passes) can take ~10 s on a busy CPU.
    with caplog.at_level(logging.INFO, logger="serving.app"), \
            ThreadedServer(create_app(settings), startup_timeout_s=180) as srv:
        info = httpx.get(f"{srv.base_url}/v1/model", timeout=30).json()
        answer = httpx.post(f"{srv.base_url}/v1/predict", params={"seed": 7}, json=body(), timeout=30).json()
    chosen = info["precision"]
    assert chosen["requested"] == "auto" and chosen["float32_ms"] > 0 and chosen["bfloat16_ms"] > 0
    assert 0 < chosen["max_sample_diff"] <= BFLOAT16_SAMPLE_TOLERANCE  # the two signatures did run
    # Served: what the rule says for what was measured, and every answer names it.
    assert (chosen["served"], chosen["reason"]) == precision.decide(
        chosen["float32_ms"], chosen["bfloat16_ms"], chosen["max_mean_diff"], chosen["max_sample_diff"])
    assert answer["model"]["precision"] == info["model"]["precision"] == chosen["served"]
    line = f"precision: serving {chosen['served']} (--precision auto): {chosen['reason']}"
    assert caplog.text.index(line) < caplog.text.index("model warmed up; ready")


@pytest.mark.parametrize("offset, served, why", [
    (None, "float32", "no bfloat16 signature"),  # an export from before the bfloat16 signature
    (2 * BFLOAT16_MEAN_TOLERANCE, "float32", "beyond the tolerance"),  # however fast it is
])
def test_precision_auto_keeps_float32_without_a_bfloat16_signature_in_tolerance(tmp_path, fixture_export, offset,
                                                                               served, why):
    # Without an offset the export is the session's fixture export (K = 2, no bfloat16 signature).
    export = fixture_export if offset is None else \
        write_fixture_export(tmp_path / "export", ensemble_size=2, bfloat16_offset=offset)
    model = ServedModel.load(export, "auto")
    assert model.precision == "float32" and model.choice.requested == "auto"
    examples = [encode(r, model.export).example for r in precision.timing_requests(model.export)]
    choice = model.choose_precision(examples, 5)
    assert choice.served == model.precision == served and why in choice.reason
    if offset is not None:
        assert choice.max_mean_diff == pytest.approx(offset, rel=1e-3) and choice.bfloat16_ms > 0


def test_precision_rule_serves_bfloat16_only_when_clearly_faster_and_in_tolerance():
    ok = (BFLOAT16_MEAN_TOLERANCE / 2, BFLOAT16_SAMPLE_TOLERANCE / 2)
    assert precision.decide(60.0, 45.0, *ok)[0] == "bfloat16"
    assert precision.decide(60.0, 60.0 * precision.SPEED_MARGIN, *ok)[0] == "bfloat16"
    assert precision.decide(60.0, 57.0, *ok)[0] == "float32"  # 5 % faster: within the noise of a shared CPU
    assert precision.decide(62.0, 76.0, *ok)[0] == "float32"  # slower (AVX-512 bfloat16 without AMX)
    assert precision.decide(60.0, 20.0, 2 * BFLOAT16_MEAN_TOLERANCE, 0.0)[0] == "float32"
    assert precision.decide(60.0, 20.0, 0.0, 2 * BFLOAT16_SAMPLE_TOLERANCE)[0] == "float32"
    assert precision.fixed("bfloat16") == precision.PrecisionChoice("bfloat16", "bfloat16", "--precision bfloat16")


def test_bfloat16_warm_up_compiles_every_batch_size_before_ready_and_every_answer_names_it(export_dir, client,
                                                                                           caplog):
    # One bfloat16 server for both claims (its load and warm-up are most of the cost).
    # bfloat16's fused step compiles per batch shape: the warm-up runs 1 .. max_batch admissions, each
    # with and without a padded bag. max_batch 2: sizes 1 and 2 are every case of the loop (a size alone
    # and one beside others), and each further size is two more compilations.
    settings = make_settings(model_dir=export_dir, no_auth=True, host="127.0.0.1", max_batch=2,
                             precision="bfloat16")
    with caplog.at_level(logging.INFO, logger="serving.app"), \
            ThreadedServer(create_app(settings, ServedModel.load(export_dir, "bfloat16"))) as srv:
        deadline = time.monotonic() + 60
        while httpx.get(f"{srv.base_url}/readyz", timeout=30).status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.post(f"{srv.base_url}/v1/predict", json=body(), timeout=30).status_code == 200
        fast = httpx.post(f"{srv.base_url}/v1/predict", params={"seed": 7}, json=body(), timeout=30).json()
        info = httpx.get(f"{srv.base_url}/v1/model", timeout=30).json()
    compiled = caplog.text.index(
        f"bfloat16 step compiled for batches of 1-2 admissions at num_samples={settings.default_num_samples}")
    assert compiled < caplog.text.index("model warmed up; ready")
    exact = client.post("/v1/predict", params={"seed": 7}, json=body(), headers={"X-API-Key": KEY}).json()
    assert fast["model"]["precision"] == info["model"]["precision"] == "bfloat16"
    assert exact["model"]["precision"] == "float32"
    assert abs(fast["probability"] - exact["probability"]) <= BFLOAT16_MEAN_TOLERANCE  # docs/serving.md


# ------------------------------------------------------------------------------- limits


def test_body_over_the_limit_is_413(client):
    big = body(id="x" * 100, events=[{"time": iso(ADMIT), "source": "lab", "code": "c" * 120}] * 400)
    r = client.post("/v1/predict", json=big, headers=HEADERS)
    assert r.status_code == 413 and str(MAX_BODY) in r.json()["detail"]

    def chunks():  # no Content-Length: the limit must hold for streamed bodies too
        yield b'{"id": "'
        for _ in range(MAX_BODY // 1000 + 2):
            yield b"y" * 1000
        yield b'"}'

    r = client.post("/v1/predict", content=chunks(), headers={**HEADERS, "content-type": "application/json"})
    assert r.status_code == 413


def test_too_many_events_and_patients_are_422_naming_the_field(client):
    ev = {"time": iso(ADMIT), "source": "lab", "code": "1"}
    r = client.post("/v1/predict", json=body(events=[ev] * (MAX_EVENTS + 1)), headers=HEADERS)
    assert r.status_code == 422 and locs(r) == [["body", "events"]] and str(MAX_EVENTS) in r.text
    r = client.post("/v1/predict/batch", json={"patients": [body(events=[])] * (MAX_PATIENTS + 1)}, headers=HEADERS)
    assert r.status_code == 422 and locs(r) == [["body", "patients"]]
    r = client.post("/v1/predict/batch", json={"patients": [body(events=[]), body(events=[ev] * (MAX_EVENTS + 1))]},
                    headers=HEADERS)
    assert r.status_code == 422 and locs(r) == [["body", "patients", 1, "events"]]
    assert client.post("/v1/predict/batch", json={"patients": []}, headers=HEADERS).status_code == 422


# ------------------------------------------------------------------------------- batch


def test_batch_answers_in_order(client):
    patients = [body(id=f"p{i}", events=body()["events"][: i + 1]) for i in range(MAX_PATIENTS)]
    r = client.post("/v1/predict/batch", json={"patients": patients}, headers=HEADERS, params={"num_samples": 3})
    assert r.status_code == 200, r.text
    out = r.json()
    assert [p["id"] for p in out["predictions"]] == [f"p{i}" for i in range(MAX_PATIENTS)]
    assert [p["events"]["received"] for p in out["predictions"]] == [1, 2, 3, 4]
    assert out["num_samples"] == 3 and out["ensemble_size"] == K and out["model"]["name"] == TINY_MODEL_NAME
    bad = [body(), body(prediction_time=iso(ADMIT - dt.timedelta(days=1)))]
    r = client.post("/v1/predict/batch", json={"patients": bad}, headers=HEADERS)
    assert r.status_code == 422 and locs(r) == [["body", "patients", 1, "prediction_time"]]


def test_batch_of_known_and_unknown_admission_types_answers_each_as_alone(client):
    """Unknown types are drawn type by type in other passes: each answer must still be its own."""
    patients = [body(id="known"), body(id="unknown-1", admission={"admit_time": iso(ADMIT)}),
                body(id="urgent", admission={"admit_time": iso(ADMIT), "admission_type": "URGENT"}),
                body(id="unknown-2", events=body()["events"][:2], admission={"admit_time": iso(ADMIT)})]
    params = {"num_samples": 7, "seed": 3, "include_samples": True}
    batch = client.post("/v1/predict/batch", json={"patients": patients}, headers=HEADERS, params=params)
    assert batch.status_code == 200, batch.text
    for patient, answer in zip(patients, batch.json()["predictions"]):
        alone = client.post("/v1/predict", json=patient, headers=HEADERS, params=params).json()
        assert answer["id"] == patient["id"] and answer["samples"] == pytest.approx(alone["samples"], abs=1e-6)
        assert answer["warnings"] == alone["warnings"]
        assert len(answer["samples"]) == 7 * K
        unknown = [w for w in answer["warnings"] if w.startswith("admission type unknown")]
        assert len(unknown) == patient["id"].startswith("unknown")
    # EMERGENCY 16, ELECTIVE 3, URGENT 1 in training: 7 samples -> 5.6, 1.05, 0.35 -> 6, 1, 0.
    assert "samples per member of 7: EMERGENCY 6, ELECTIVE 1)" in unknown[0]


@pytest.mark.parametrize("counts, num_samples, expected", [
    ({"EMERGENCY": 16, "ELECTIVE": 3, "URGENT": 1}, 25, [("EMERGENCY", 20), ("ELECTIVE", 4), ("URGENT", 1)]),
    ({"EMERGENCY": 16, "ELECTIVE": 3, "URGENT": 1}, 1, [("EMERGENCY", 1)]),  # one sample: the most frequent
    ({"ELECTIVE": 1, "URGENT": 1}, 1, [("ELECTIVE", 1)]),  # a tie: by name
    ({"B": 1, "A": 1, "C": 1}, 4, [("A", 2), ("B", 1), ("C", 1)]),
])
def test_samples_are_split_among_training_types_by_largest_remainder(counts, num_samples, expected):
    from serving.inference.admission_type import allocate

    assert allocate(counts, num_samples) == expected


@hyp_settings(max_examples=200, deadline=None)
@given(counts=st.dictionaries(st.sampled_from(["ELECTIVE", "EMERGENCY", "URGENT", "NEWBORN", "OTHER"]),
                              st.integers(1, 10_000), min_size=1), num_samples=st.integers(1, 100))
def test_sample_allocation_keeps_the_budget_and_the_training_shares(counts, num_samples):
    from serving.inference.admission_type import allocate

    got = dict(allocate(counts, num_samples))
    assert sum(got.values()) == num_samples and all(n > 0 for n in got.values())
    total = sum(counts.values())
    for t, c in counts.items():
        exact = num_samples * c / total
        assert math.floor(exact) <= got.get(t, 0) <= math.ceil(exact), (t, exact, got)
    # A larger remainder is never rounded down while a smaller one is rounded up.
    rest = {t: num_samples * c / total - math.floor(num_samples * c / total) for t, c in counts.items()}
    up = [t for t in counts if got.get(t, 0) > math.floor(num_samples * counts[t] / total)]
    down = [t for t in counts if t not in up]
    assert all(rest[u] >= rest[d] for u in up for d in down)


def test_an_export_without_training_types_needs_the_type(fixture_export):
    """Exports made before admission_types.json: a known type is used as before, an unknown one refused."""
    from model.export.load import read_export
    from serving.inference import admission_type
    from serving.schemas import InputError, PredictRequest

    export = read_export(fixture_export)
    assert export.admission_types == {}
    admission_type.check(PredictRequest.model_validate(body()), export, ("body",))
    with pytest.raises(InputError) as err:
        admission_type.check(PredictRequest.model_validate(body(admission={"admit_time": iso(ADMIT)})), export,
                             ("body",))
    assert err.value.loc == ("body", "admission", "admission_type") and "admission_types.json" in err.value.msg


def test_concurrent_requests_are_merged_into_shared_forward_passes(client, server):
    before = scrape(client)
    n = 24

    def one(i):
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            return c.post("/v1/predict", json=body(id=f"c{i}"), headers=HEADERS, params={"num_samples": 10})

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        responses = list(pool.map(one, range(n)))
    assert all(r.status_code == 200 for r in responses)
    assert sorted(r.json()["id"] for r in responses) == sorted(f"c{i}" for i in range(n))
    after = scrape(client)
    passes = after["ehr_model_batch_size_count"] - before.get("ehr_model_batch_size_count", 0)
    examples = after["ehr_model_batch_size_sum"] - before.get("ehr_model_batch_size_sum", 0)
    assert examples == n
    assert passes < n, f"{n} concurrent requests took {passes} forward passes: nothing was merged"
    assert after['ehr_model_batch_size_bucket{le="1.0"}'] - before.get('ehr_model_batch_size_bucket{le="1.0"}', 0) < n


def test_values_far_outside_the_training_range_are_answered_with_a_counted_warning(client):
    before = scrape(client).get('ehr_input_warnings_total{kind="value_out_of_range"}', 0)
    for value, far in [(1.4, False), (1e308, True), (-1e300, True), (1.1 + 0.6 * 10.5, True)]:
        events = [{"time": iso(ADMIT + dt.timedelta(hours=1)), "source": "lab", "code": "50912", "value": value}]
        r = client.post("/v1/predict", json=body(events=events), headers=HEADERS)
        assert r.status_code == 200, r.text
        warned = [w for w in r.json()["warnings"] if "training standard deviations" in w]
        assert bool(warned) is far, (value, r.json()["warnings"])
    # lab:50912 was trained on mean 1.1, std 0.6 and clip_z 10 (the tiny export's numeric_stats.json).
    assert scrape(client)['ehr_input_warnings_total{kind="value_out_of_range"}'] - before == 3


def test_a_unit_the_training_data_could_not_use_either_is_counted_without_a_warning(client):
    # input:225798 trained on 'dose' (190 values) and 'mg' (4, set aside in training): an 'mg' value is
    # no news, a 'grams' value is (the tiny export's units.json).
    def answer(unit):
        events = [{"time": iso(ADMIT + dt.timedelta(hours=1)), "source": "input", "code": "225798", "value": 500.0,
                   "unit": unit}]
        r = client.post("/v1/predict", json=body(events=events), headers=HEADERS)
        assert r.status_code == 200, r.text
        return r.json()

    for unit, warned in (("mg", False), ("grams", True), ("dose", False)):
        out = answer(unit)
        assert any("cannot be converted" in w for w in out["warnings"]) is warned, (unit, out["warnings"])
        assert out["events"]["values"]["not_convertible"] == (0 if unit == "dose" else 1)


def test_ambiguous_placeholder_and_implausible_units_are_not_used_each_with_a_counted_warning(client):
    # lab:50912 (creatinine) was trained in mg/dL with a median of 1.0 (the tiny export's units.json).
    cases = [
        ("MU/L", 1.2, "unit_ambiguous", "1 value(s) of lab:50912 in 'MU/L' were not converted to 'mg/dL', the unit "
         "the model was trained on: 'MU/L' reads as 'MU/L' or 'mU/L' depending on its letter case, which this "
         "spelling does not show: not used"),
        ("N/A", 1.2, "unit_placeholder", "1 value(s) of lab:50912 came with 'N/A', a placeholder rather than a unit, "
         "where the model was trained on 'mg/dL': not used"),
        # 1.2 ng/mL is 1.2e-4 mg/dL: a unit field that does not describe its value (1.2 mg/dL).
        ("ng/mL", 1.2, "conversion_implausible", "1 value(s) of lab:50912 in 'ng/mL' were not converted to 'mg/dL', "
         "the unit the model was trained on: once converted, its values (median about 1.19) would lie at "
         "0.000119 times the code's training median (1 mg/dL), outside the plausible 0.001 to 1000 times: not used"),
    ]
    for unit, value, kind, message in cases:
        before = scrape(client).get(f'ehr_input_warnings_total{{kind="{kind}"}}', 0)
        events = [{"time": iso(ADMIT + dt.timedelta(hours=1)), "source": "lab", "code": "50912", "value": value,
                   "unit": unit}]
        r = client.post("/v1/predict", json=body(events=events), headers=HEADERS)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["warnings"][0] == message, out["warnings"]
        outcome = {v: k for k, v in units.NOT_USED.items()}[kind]
        assert out["events"]["values"][outcome] == 1 and sum(out["events"]["values"].values()) == 1
        assert scrape(client)[f'ehr_input_warnings_total{{kind="{kind}"}}'] - before == 1
    # The same creatinine in g/L (0.012 g/L is 1.2 mg/dL) lands near the training median and is used.
    events = [{"time": iso(ADMIT + dt.timedelta(hours=1)), "source": "lab", "code": "50912", "value": 0.012,
               "unit": "g/L"}]
    out = client.post("/v1/predict", json=body(events=events), headers=HEADERS).json()
    assert out["events"]["values"][units.CONVERTED] == 1 and not [w for w in out["warnings"] if "50912" in w]


# ------------------------------------------------------------------------------- metrics


def test_metrics_endpoint_is_prometheus_text(client):
    client.post("/v1/predict", json=body(), headers=HEADERS)
    client.post("/v1/predict", json=body())  # 401
    r = client.get("/metrics", headers=HEADERS)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name, kind in [("ehr_http_requests_total", "counter"), ("ehr_http_request_duration_seconds", "histogram"),
                       ("ehr_http_errors_total", "counter"), ("ehr_model_batch_size", "histogram")]:
        assert f"# TYPE {name} {kind}" in text
    m = scrape(client)
    assert m['ehr_http_requests_total{method="POST",route="/v1/predict",status="200"}'] >= 1
    assert m['ehr_http_requests_total{method="POST",route="/v1/predict",status="401"}'] >= 1
    assert m['ehr_http_errors_total{kind="client",route="/v1/predict"}'] >= 1
    assert m["ehr_ready"] == 1 and m["ehr_predictions_total"] >= 1
    assert m['ehr_events_ignored_total{reason="at_or_after_trigger"}'] >= 1
    buckets = [v for k, v in m.items()
               if k.startswith("ehr_http_request_duration_seconds_bucket{") and 'route="/v1/predict"' in k]
    assert len(buckets) == 14  # 13 bounds and +Inf
    assert buckets == sorted(buckets) and buckets[-1] == m['ehr_http_request_duration_seconds_count{route="/v1/predict"}']
    # Every sample line is "name{labels} value": the format Prometheus parses.
    sample = re.compile(r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? \S+$')
    assert all(sample.match(line) for line in text.splitlines() if line and not line.startswith("#"))


# ------------------------------------------------------------------------------- fuzz


def _from_schema(schema: dict, defs: dict) -> st.SearchStrategy:
    """A hypothesis strategy for (most of) the JSON Schema dialect FastAPI writes into /openapi.json."""
    if "$ref" in schema:
        return st.deferred(lambda: _from_schema(defs[schema["$ref"].rsplit("/", 1)[1]], defs))
    if "anyOf" in schema:
        return st.one_of([_from_schema(s, defs) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if "const" in schema:
        return st.just(schema["const"])
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties", {})
        required = set(schema.get("required", []))
        return st.fixed_dictionaries(
            {k: _from_schema(v, defs) for k, v in props.items() if k in required},
            optional={k: _from_schema(v, defs) for k, v in props.items() if k not in required})
    if kind == "array":
        return st.lists(_from_schema(schema.get("items", {}), defs), min_size=schema.get("minItems", 0),
                        max_size=min(schema.get("maxItems", 6), 6))
    if kind == "string":
        if schema.get("format") == "date-time":
            tz = st.none() | st.builds(dt.timezone, st.timedeltas(-dt.timedelta(hours=23), dt.timedelta(hours=23)))
            return st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=tz).map(
                lambda t: t.isoformat())
        if schema.get("format") == "date":
            return st.dates().map(lambda d: d.isoformat())
        return st.text(min_size=schema.get("minLength", 0), max_size=min(schema.get("maxLength", 20), 20))
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "integer":
        return st.integers(schema.get("minimum"), schema.get("maximum"))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    return st.nothing()




@pytest.fixture(scope="module")
def request_strategy(client):
    components = client.get("/openapi.json").json()["components"]["schemas"]
    return _from_schema(components["PredictRequest"], components)


def test_fuzz_predict_schema_never_5xx(client, request_strategy):
    """Schema-shaped requests, some mutated, with random query values: always an answer, never a 5xx."""
    query = st.fixed_dictionaries({}, optional={
        "num_samples": st.integers(-5, 200) | st.text(max_size=4),
        "seed": st.integers(-2, 2**64) | st.text(max_size=4),
        "include_samples": st.sampled_from(["true", "false", "maybe"]),
    })

    @hyp_settings(max_examples=120, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data):
        doc = data.draw(request_strategy)
        if data.draw(st.booleans()):
            doc = mutate_json(doc, data.draw)
        params = data.draw(query)
        route = data.draw(st.sampled_from(["/v1/predict", "/v1/predict/batch"]))
        payload = {"patients": [doc]} if route.endswith("batch") and data.draw(st.booleans()) else doc
        r = client.post(route, json=payload, headers=HEADERS, params=params)
        assert r.status_code < 500, (r.status_code, r.text[:300], payload, params)
        if r.status_code == 200:
            out = r.json()
            preds = out.get("predictions", [out])
            assert all(0.0 <= p["probability"] <= 1.0 and math.isfinite(p["epistemic"]) for p in preds)
        else:
            assert r.json()["detail"]

    run()
    # Health: the server answers normally after the fuzz.
    assert client.post("/v1/predict", json=body(), headers=HEADERS).status_code == 200
