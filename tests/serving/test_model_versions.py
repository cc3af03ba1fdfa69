"""Several versions of the model side by side, on one real server: a model repository of three versions (two
copies of the session's fixture export and a third whose export was tampered with), a 90/10 traffic split.

The server is started once for the module from the ehr-serve flags themselves; every answer must name the
version that made it, the version each admission gets must be the one an independent SHA-256 of its key picks,
the same admission must get that version again, /metrics must count the requests per version, and the broken
version must be skipped with one log line and answer not ready, while the two others serve.
"""
from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil

import httpx
import pytest

from serving.api.app import create_app
from serving.cli import build_parser, settings_from_args
from tests.support.serving_fixtures import ThreadedServer

pytestmark = pytest.mark.slow

KEY = "versions-test-key-0123456789abcdef"
HEADERS = {"X-API-Key": KEY}
NAME = "mortality"


def admission(age: float, hours: int = 1) -> dict:
    """A /v1/predict body; distinct ages are distinct admissions."""
    return {"patient": {"gender": "F", "age_years": age},
            "admission": {"admit_time": "2150-03-01T08:30:00", "admission_type": "EMERGENCY"},
            "events": [{"time": f"2150-03-01T{8 + hours:02d}:45:00", "source": "lab", "code": "50912",
                        "value": 1.4}]}


def expected_version(age: float) -> str:
    """The split's version for an admission, computed apart from the service: SHA-256 of its documented key."""
    key = f"F|age={age!r}|2150-03-01T08:30:00+00:00"
    return "1" if int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100 < 90 else "2"


# The first ages that go to each version (both versions answer some; a few dozen requests in all).
AGES = [40.0 + i for i in range(60)]
TO_1 = [a for a in AGES if expected_version(a) == "1"][:6]
TO_2 = [a for a in AGES if expected_version(a) == "2"][:3]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def repository(fixture_export, tmp_path_factory):
    root = tmp_path_factory.mktemp("repository")
    for version in ("1", "2", "3"):
        shutil.copytree(fixture_export, root / NAME / version)
    with open(root / NAME / "3" / "metrics.json", "a", encoding="utf-8") as f:
        f.write(" ")  # no longer what manifest.json's SHA-256 says
    return root


@pytest.fixture(scope="module")
def served(repository):
    """(server, log lines of the versions' loading)."""
    args = build_parser().parse_args(["--model-repository", str(repository), "--traffic-split", "1=90,2=10",
                                      "--precision", "float32", "--max-wait-ms", "1", "--open-metrics"])
    settings = settings_from_args(args, env={"EHR_API_KEYS": KEY})
    lines = _Lines()
    logger = logging.getLogger("serving.inference.model_versions")
    logger.addHandler(lines)
    try:
        with ThreadedServer(create_app(settings)) as srv:
            yield srv, lines.lines
    finally:
        logger.removeHandler(lines)


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].base_url, timeout=60.0, headers=HEADERS) as c:
        yield c


@pytest.fixture(scope="module")
def answered(client) -> dict[float, list[dict]]:
    """Each admission sent twice (the second time with a later event): age -> the two answers' model."""
    out = {}
    for age in TO_1 + TO_2:
        out[age] = []
        for hours in (1, 3):
            r = client.post("/v1/predict", json=admission(age, hours), params={"seed": 1, "num_samples": 2})
            assert r.status_code == 200, r.text
            out[age].append(r.json()["model"])
    return out


def test_every_answer_names_the_version_the_split_gives_its_admission_and_again_the_second_time(answered):
    assert TO_1 and TO_2
    for age, models in answered.items():
        assert [(m["name"], m["version"], m["selected_by"]) for m in models] == \
            [(NAME, expected_version(age), "split")] * 2, age


def test_metrics_count_the_requests_per_version_and_show_the_split(answered, client):
    text = client.get("/metrics").text

    def value(metric: str, **labels) -> float:
        inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        m = re.search(rf"^{metric}{{{re.escape(inner)}}} (\S+)$", text, re.M)
        assert m, (metric, labels)
        return float(m.group(1))

    requests = "ehr_model_version_requests_total"
    assert value(requests, name=NAME, selected_by="split", version="1") == 2 * len(TO_1)
    assert value(requests, name=NAME, selected_by="split", version="2") == 2 * len(TO_2)
    share = "ehr_model_version_share_percent"
    assert (value(share, name=NAME, version="1"), value(share, name=NAME, version="2")) == (90, 10)
    ready = "ehr_model_version_ready"
    assert [value(ready, name=NAME, version=v) for v in "123"] == [1, 1, 0]


def test_the_broken_version_is_skipped_with_one_line_naming_its_folder_and_why(served, repository, client):
    _, lines = served
    skipped = [line for line in lines if "skipped" in line]
    assert len(skipped) == 1
    assert str(repository / NAME / "3") in skipped[0] and "metrics.json" in skipped[0] and "\n" not in skipped[0]
    r = client.get(f"/v2/models/{NAME}/versions/3/ready")
    assert r.status_code == 503 and r.json()["ready"] is False and "metrics.json" in r.json()["reason"]
    assert [client.get(f"/v2/models/{NAME}/versions/{v}/ready").status_code for v in "12"] == [200, 200]
    r = client.post(f"/v2/models/{NAME}/versions/3/infer", json={"inputs": []})
    assert r.status_code == 503 and "did not load" in r.json()["error"]
    states = {s["version"]: s for s in client.get("/v1/model").json()["versions"]}
    assert (states["3"]["state"], states["2"]["default"], states["1"]["share_percent"]) == ("failed", True, 90)
    assert "metrics.json" in states["3"]["reason"]


def _infer(client: httpx.Client, path: str, age: float) -> dict:
    tensor = {"name": "admission_json", "shape": [1], "datatype": "BYTES", "data": [json.dumps(admission(age))]}
    r = client.post(path, json={"inputs": [tensor], "parameters": {"seed": 1, "num_samples": 2}})
    assert r.status_code == 200, r.text
    return r.json()


def test_oip_answers_name_the_version_the_split_or_the_route_chose(client):
    meta = client.get(f"/v2/models/{NAME}").json()
    assert (meta["name"], meta["versions"]) == (NAME, ["1", "2"])
    age = TO_1[0]  # version 1, not the default (2): only the split can have chosen it
    split = _infer(client, f"/v2/models/{NAME}/infer", age)
    assert (split["model_name"], split["model_version"], split["parameters"]["selected_by"]) == (NAME, "1", "split")
    named = _infer(client, f"/v2/models/{NAME}/versions/2/infer", age)
    assert (named["model_version"], named["parameters"]["selected_by"]) == ("2", "request")
    # Two copies of one export: the same record and seed give the same samples whichever version answers.
    assert split["outputs"][0]["data"] == named["outputs"][0]["data"]
    assert client.get(f"/v2/models/{NAME}/versions/7/ready").status_code == 404


def fhir_key_version(birth_date: str) -> str:
    """The split's version for the FHIR admission below (a female patient admitted 2150-03-01 08:30 UTC)."""
    key = f"F|{birth_date}|2150-03-01T08:30:00+00:00"
    return "1" if int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") % 100 < 90 else "2"


def test_a_fhir_answer_and_its_provenance_name_the_version_the_split_gave_its_admission(client):
    # Version 1: not the default (2, the highest that loaded), so only the split can have chosen it.
    born = next(d for d in (f"2080-05-{day:02d}" for day in range(1, 29)) if fhir_key_version(d) == "1")
    bundle = {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in (
        {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": born},
        {"resourceType": "Encounter", "id": "e1", "status": "in-progress",
         "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "EMER"},
         "subject": {"reference": "Patient/p1"}, "period": {"start": "2150-03-01T08:30:00Z"}})]}
    r = client.post("/fhir/r4/$predict-mortality", content=json.dumps(bundle), params={"seed": 3},
                    headers={"Content-Type": "application/fhir+json"})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["method"]["coding"][0]["version"] == "1" and answer["method"]["coding"][0]["code"] == NAME
    [device] = [c for c in answer["contained"] if c["resourceType"] == "Device"]
    assert device["version"][0]["value"] == "1"
