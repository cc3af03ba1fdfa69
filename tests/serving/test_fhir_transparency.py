"""FHIR AI transparency of the RiskAssessment, over real HTTP: the guide's codes, the Provenance, and every
extension of the answer checked against the StructureDefinition the service ships and serves.

The extension check reads the StructureDefinitions' differentials (fixed urls, value types, slice
cardinalities), which fhir.resources does not: it validates the resources' structure only.
"""
from __future__ import annotations

import json
import sqlite3

import httpx
import pytest
from fhir.resources.R4B.capabilitystatement import CapabilityStatement
from fhir.resources.R4B.riskassessment import RiskAssessment
from fhir.resources.R4B.structuredefinition import StructureDefinition

from model.export.load import read_export
from serving.api import fhir_answers
from serving.api.app import create_app
from serving.inference.served_model import ServedModel
from serving.monitoring.outcome_store import STORE_FILE, issued_at
from serving.settings import make_settings
from tests.support.serving_fixtures import ThreadedServer

KEY = "fhir-transparency-key-0123456789"
HEADERS = {"X-API-Key": KEY, "Content-Type": "application/fhir+json"}
OLD = "urn:ehr-uncertainty:fhir:extension:"


def bundle(events: int = 2) -> dict:
    """One patient, one emergency encounter, a few creatinine results (LOINC 2160-0)."""
    patient = {"resourceType": "Patient", "id": "p1", "gender": "female", "birthDate": "2080-05-17"}
    encounter = {"resourceType": "Encounter", "id": "e1", "status": "in-progress",
                 "class": {"system": "http://terminology.hl7.org/CodeSystem/v3-ActCode", "code": "EMER"},
                 "subject": {"reference": "Patient/p1"}, "period": {"start": "2150-03-01T08:30:00Z"}}
    observations = [{"resourceType": "Observation", "id": f"o{i}", "status": "final",
                     "code": {"coding": [{"system": "http://loinc.org", "code": "2160-0"}]},
                     "subject": {"reference": "Patient/p1"}, "encounter": {"reference": "Encounter/e1"},
                     "effectiveDateTime": f"2150-03-01T{9 + i:02d}:00:00Z",
                     "valueQuantity": {"value": 1.1 + i, "unit": "mg/dL", "system": "http://unitsofmeasure.org",
                                       "code": "mg/dL"}} for i in range(events)]
    return {"resourceType": "Bundle", "type": "collection",
            "entry": [{"resource": r} for r in (patient, encounter, *observations)]}


@pytest.fixture(scope="module")
def outcome_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("fhir-outcomes")


@pytest.fixture(scope="module")
def server(fixture_export, outcome_dir):
    # No warm-up: the answer's shape is under test, and a loaded machine would spend the start-up timeout on it.
    # Outcomes kept: the answer then carries its prediction identifier.
    settings = make_settings(api_keys=[KEY], model_dir=fixture_export, max_wait_ms=1.0, warmup=False,
                             outcome_dir=outcome_dir)
    with ThreadedServer(create_app(settings, ServedModel.load(fixture_export))) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=30.0) as c:
        yield c


@pytest.fixture(scope="module")
def answer(client) -> dict:
    r = client.post("/fhir/r4/$predict-mortality", content=json.dumps(bundle()), headers=HEADERS,
                    params={"seed": 3})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture(scope="module")
def definitions(client) -> dict[str, dict]:
    """The served StructureDefinitions by canonical URL, each read through the CapabilityStatement's list."""
    statement = client.get("/fhir/r4/metadata").json()
    CapabilityStatement.model_validate(statement)
    urls = statement["rest"][0]["resource"][0]["supportedProfile"]
    out = {}
    for url in urls:
        assert url.startswith(fhir_answers.CANONICAL_BASE)  # one documented base
        r = client.get(f"/fhir/r4/StructureDefinition/{url.rsplit('/', 1)[1]}")  # open, like /metadata
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/fhir+json")
        StructureDefinition.model_validate(r.json())
        assert r.json()["url"] == url
        out[url] = r.json()
    return out


def test_the_answer_is_tagged_and_its_provenance_names_the_model(answer, fixture_export):
    RiskAssessment.model_validate(answer)
    export = read_export(fixture_export)
    assert answer["meta"]["security"] == [{"system": "http://terminology.hl7.org/CodeSystem/v3-ObservationValue",
                                           "code": "AIAST", "display": "Artificial Intelligence asserted"}]
    contained = {r["resourceType"]: r for r in answer["contained"]}
    device, provenance = contained["Device"], contained["Provenance"]
    assert provenance["target"] == [{"reference": "#"}]  # the RiskAssessment that contains it
    [agent] = provenance["agent"]
    assert agent["who"]["reference"] == f"#{device['id']}" == answer["performer"]["reference"]
    assert agent["type"]["coding"][0]["code"] == "author"
    assert device["deviceName"][0]["name"] == export.card.name
    assert [v["value"] for v in device["version"]][:2] == [export.card.version, export.checksum]


def test_the_identifier_is_the_prediction_id_and_takes_its_outcome(answer, client, outcome_dir):
    [identifier] = answer["identifier"]
    assert identifier["system"] == fhir_answers.EXTENSION + "prediction-id"
    pid = identifier["value"]
    assert issued_at(pid) is not None  # 32 hex digits: the answer's time and 80 random bits
    keyed = {"X-API-Key": KEY}
    r = client.post("/v1/outcomes", json={"prediction_id": pid, "outcome": 1}, headers=keyed)
    assert r.status_code == 200 and r.json() == {"prediction_id": pid, "stored": True}, r.text
    assert client.post("/v1/outcomes", json={"prediction_id": pid, "outcome": 1},
                       headers=keyed).json()["stored"] is False
    # Matched to the probability the RiskAssessment stated.
    with sqlite3.connect(outcome_dir / STORE_FILE) as db:
        row = db.execute("SELECT probability, outcome FROM predictions WHERE prediction_id = ?", (pid,)).fetchone()
    assert row == (answer["prediction"][0]["probabilityDecimal"], 1)


def test_qualitative_risk_and_confidence_come_from_the_interval(answer):
    [prediction] = answer["prediction"]
    uncertainty = next(e for e in prediction["extension"] if e["url"] == OLD + "prediction-uncertainty")
    parts = {e["url"]: e.get("valueDecimal") for e in uncertainty["extension"]}
    lower, upper, threshold = parts["interval-lower"], parts["interval-upper"], parts["decision-threshold"]
    [confidence] = [e for e in prediction["extension"] if e["url"] == fhir_answers.AI_CONFIDENCE]
    low, high = confidence["valueRange"]["low"], confidence["valueRange"]["high"]
    assert (low["code"], low["system"]) == ("%", "http://unitsofmeasure.org")
    assert low["value"] == pytest.approx(100 * lower) and high["value"] == pytest.approx(100 * upper)
    expected = "high" if lower > threshold else "low" if upper <= threshold else "moderate"
    [coding] = prediction["qualitativeRisk"]["coding"]
    assert (coding["system"], coding["code"]) == ("http://terminology.hl7.org/CodeSystem/risk-probability", expected)


def _value_key(extension: dict) -> list[str]:
    return [k for k in extension if k.startswith("value")]


def _check(extension: dict, differential: list[dict], where: str) -> list[str]:
    """Problems of one extension against its StructureDefinition's differential (fixed urls, types, slices)."""
    elements = {e["id"]: e for e in differential}
    problems = []
    value = elements.get("Extension.value[x]", {})
    if value.get("max") == "0":  # complex: only the declared sub-extensions, each within its cardinality
        if _value_key(extension):
            problems.append(f"{where}: a complex extension has a value")
        slices = {e["sliceName"]: e for e in differential if e.get("sliceName")}
        subs = extension.get("extension", [])
        for sub in subs:
            if sub["url"] not in slices:
                problems.append(f"{where}: undeclared sub-extension {sub['url']!r}")
                continue
            [type_] = elements[f"Extension.extension:{sub['url']}.value[x]"]["type"]
            if _value_key(sub) != ["value" + type_["code"][0].upper() + type_["code"][1:]]:
                problems.append(f"{where}.{sub['url']}: {_value_key(sub)} is not {type_['code']}")
        for name, element in slices.items():
            n = sum(s["url"] == name for s in subs)
            if n < element["min"] or (element["max"] != "*" and n > int(element["max"])):
                problems.append(f"{where}: {n} {name!r}, allowed {element['min']}..{element['max']}")
    else:
        [type_] = value["type"]
        if extension.get("extension") or _value_key(extension) != ["value" + type_["code"][0].upper()
                                                                     + type_["code"][1:]]:
            problems.append(f"{where}: {_value_key(extension)} is not {type_['code']}")
    return problems


def test_every_extension_has_a_served_definition_it_conforms_to(answer, definitions):
    [prediction] = answer["prediction"]
    found = [("RiskAssessment", e) for e in answer["extension"]] + [("RiskAssessment.prediction", e)
                                                                     for e in prediction["extension"]]
    ours = [(context, e) for context, e in found if e["url"].startswith(fhir_answers.CANONICAL_BASE)]
    old = [e for _, e in found if e["url"].startswith(OLD)]
    # The urn: copies stay for the deprecation period, each beside its canonical twin.
    assert sorted(e["url"][len(OLD):] for e in old) == sorted(e["url"].rsplit("/", 1)[1] for _, e in ours)
    assert {e["url"] for _, e in ours} >= {fhir_answers.CANONICAL_BASE + n for n in
                                          ("prediction-uncertainty", "referral", "events", "calibration")}
    assert all(e["url"].startswith((OLD, fhir_answers.CANONICAL_BASE, fhir_answers.AI_CONFIDENCE)) for _, e in found)
    problems = []
    for context, e in ours:
        definition = definitions[e["url"]]
        assert [c["expression"] for c in definition["context"]] == [context], e["url"]
        assert next(x for x in definition["differential"]["element"] if x["id"] == "Extension.url")["fixedUri"] == \
            e["url"]
        problems += _check(e, definition["differential"]["element"], e["url"].rsplit("/", 1)[1])
    assert not problems


def test_the_extension_check_catches_a_wrong_type_and_an_undeclared_part(answer, definitions):
    url = fhir_answers.CANONICAL_BASE + "referral"
    [referral] = [e for e in answer["prediction"][0]["extension"] if e["url"] == url]
    bad = {**referral, "extension": [*referral["extension"], {"url": "colour", "valueString": "red"}]}
    bad["extension"][0] = {"url": "refer", "valueString": "yes"}
    elements = definitions[url]["differential"]["element"]
    assert len(_check(bad, elements, "referral")) == 2 and not _check(referral, elements, "referral")


def test_definitions_are_open_and_an_unknown_one_is_an_operation_outcome(client):
    r = client.get("/fhir/r4/StructureDefinition/no-such-thing")
    assert r.status_code == 404 and r.json()["resourceType"] == "OperationOutcome"
    assert client.post("/fhir/r4/$predict-mortality", content=json.dumps(bundle())).status_code == 401
