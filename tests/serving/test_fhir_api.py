"""FHIR R4 and CDS Hooks over real HTTP (a real uvicorn server on 127.0.0.1), on the real MIMIC-III demo.

The reference for every FHIR answer is independent of the FHIR code: the Beam job's own event
extraction (``events.extract`` + ``filter_to_cohort``, the job's canonical order) sent to
/v1/predict. The model is a tiny UNTRAINED rank-1 export through the real exporter of the session's
demo job output (tests/conftest.py demo_tiny_export): its vocabulary, units and lab_loinc.json (the
demo's D_LABITEMS bridge) are the job's; probabilities mean nothing, the code path is the real one.
"""
from __future__ import annotations

import copy
import datetime as dt
import json

import httpx
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings as hyp_settings, strategies as st

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from ehr_pipeline.contract import PipelineConfig, splits
from ehr_pipeline.encode.bagging import canonical_permutation
from ehr_pipeline.fhir import codes, convert
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.mimic import events as ev
from ehr_pipeline.reader import locate_table, read_table
from serving.api.app import create_app
from serving.api.fhir_answers import EXTENSION
from serving.inference.served_model import ServedModel
from serving.settings import make_settings
from tests.support.serving_fixtures import ThreadedServer
from tests.support.json_mutation import mutate_json  # replace, delete or add one node

KEY = "test-key-fhir-0123456789abcdef"
HEADERS = {"X-API-Key": KEY}
FHIR_HEADERS = {**HEADERS, "Content-Type": "application/fhir+json"}
OPERATION = "/fhir/r4/$predict-mortality"
K = 2
SEED = 5
SAMPLES = 4


def _iso(seconds: int) -> str:
    return (dt.datetime(1970, 1, 1) + dt.timedelta(seconds=int(seconds))).isoformat()


@pytest.fixture(scope="module")
def demo_release(demo_dir):
    return convert.load_release(demo_dir)


@pytest.fixture(scope="module")
def reference(demo_dir, demo_release):
    """Per demo TEST admission: the /v1/predict body built from the Beam job's own event extraction."""
    cfg = PipelineConfig()
    coh = cohort_mod.build_cohort(demo_release.admissions.select(list(cohort_mod.ADMISSION_COLUMNS)),
                                  demo_release.patients, trigger_offset_seconds=cfg.trigger_offset_seconds)
    test_rows = [r for r in coh.table.to_pylist()
                 if splits.assign_split(r["SUBJECT_ID"], cfg.splits.model_dump(), cfg.split_salt) == "test"]
    index = pa.Table.from_pylist(test_rows).select(["SUBJECT_ID", "HADM_ID", "trigger_time"])
    per_hadm: dict[int, list] = {r["HADM_ID"]: [] for r in test_rows}
    for table, (_, columns) in ev.EXTRACTORS.items():
        path = locate_table(demo_dir, table)
        if path is None:
            continue
        block, _ = read_table(path, table, columns=columns)
        extracted, _ = ev.extract(table, block, coh.discharges)
        kept, _ = ev.filter_to_cohort(extracted, index)
        for hadm, times, codes_, values, units_ in ev.split_by_admission(kept):
            per_hadm[hadm].append((times, codes_, values, units_))
    dob = dict(zip(demo_release.patients.column("SUBJECT_ID").to_pylist(),
                   demo_release.patients.column("DOB").to_pylist()))
    out = {}
    for row in test_rows:
        parts = per_hadm[row["HADM_ID"]]
        times, codes_, values, units_ = (np.concatenate([p[i] for p in parts]) for i in range(4)) if parts else \
            (np.zeros(0, np.int64), np.zeros(0, object), np.zeros(0), np.zeros(0, object))
        order = canonical_permutation(times, codes_, values)
        events = []
        for t, c, v, u in zip(times[order], codes_[order], values[order], units_[order]):
            source, code = c.split(":", 1)
            events.append({"time": _iso(t), "source": source, "code": code,
                           **({} if np.isnan(v) else {"value": float(v)}), **({"unit": u} if u else {})})
        out[row["HADM_ID"]] = {
            "patient": {"gender": row["gender"], "date_of_birth": _iso(dob[row["SUBJECT_ID"]])[:10]},
            "admission": {"admit_time": _iso(row["ADMITTIME"]), "admission_type": row["admission_type"],
                          # the job's previous discharge, as a client holding the stay's history sends it
                          "previous_discharge_time": None if row["previous_discharge_seconds"] < 0
                          else _iso(row["trigger_time"] - row["previous_discharge_seconds"])},
            "events": events,
        }
    return out


@pytest.fixture(scope="module")
def export_dir(demo_tiny_export):
    return demo_tiny_export  # K = 2: the demo job's vocabulary, units and lab LOINC bridge (tests/conftest.py)


@pytest.fixture(scope="module")
def server(export_dir):
    settings = make_settings(api_keys=[KEY], model_dir=export_dir, max_wait_ms=1.0, max_events=5000)
    # A generous start-up limit: the warm-up pass is slow on a loaded 2-core machine.
    with ThreadedServer(create_app(settings, ServedModel.load(export_dir)), startup_timeout_s=300.0) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.base_url, timeout=60.0) as c:
        yield c


def _predict_fhir(client, bundle, **params):
    return client.post(OPERATION, content=json.dumps(bundle), headers=FHIR_HEADERS,
                       params={"seed": SEED, "num_samples": SAMPLES, **params})


def _ext(resource: dict, name: str) -> list[dict]:
    return [e for e in resource.get("extension", []) if e["url"] == EXTENSION + name]


def _sub(ext: dict, url: str) -> list:
    return [next(v for k, v in e.items() if k.startswith("value")) for e in ext["extension"] if e["url"] == url]


# ------------------------------------------------------------------------------- equivalence


@pytest.mark.slow
def test_bundle_and_v1_events_give_the_same_probability_on_every_demo_test_admission(client, reference,
                                                                                     demo_release):
    """Target: the converter's Bundle and the job's own events agree to 1e-6 (same seed) on every test admission."""
    from fhir.resources.R4B.bundle import Bundle
    from fhir.resources.R4B.riskassessment import RiskAssessment

    assert len(reference) >= 10
    for hadm, body in reference.items():
        bundle = convert.admission_bundle(demo_release, hadm)
        Bundle.model_validate(bundle)  # every Bundle the converter writes is valid R4
        fhir = _predict_fhir(client, bundle)
        assert fhir.status_code == 200, (hadm, fhir.text[:500])
        assert fhir.headers["content-type"].startswith("application/fhir+json")
        v1 = client.post("/v1/predict", json=body, headers=HEADERS,
                         params={"seed": SEED, "num_samples": SAMPLES}).json()
        risk = fhir.json()
        RiskAssessment.model_validate(risk)
        [prediction] = risk["prediction"]
        assert abs(prediction["probabilityDecimal"] - v1["probability"]) <= 1e-6, hadm
        [uncertainty] = _ext(prediction, "prediction-uncertainty")
        assert _sub(uncertainty, "member-probability") == pytest.approx(v1["member_probabilities"], abs=1e-6)
        assert _sub(uncertainty, "epistemic") == pytest.approx([v1["epistemic"]], abs=1e-9)
        [events] = _ext(risk, "events")
        assert _sub(events, "used") == [v1["events"]["used"]], hadm
        assert risk["occurrenceDateTime"] == v1["prediction_time"]
        # The demo's own units never warn: every value is in (a spelling of) its training unit.
        assert not [n for n in risk.get("note", []) if "unit" in n["text"]], (hadm, risk.get("note"))


@pytest.mark.slow
def test_loinc_only_labs_map_back_through_the_exported_bridge(client, reference, demo_release, export_dir,
                                                              demo_dir):
    """Labs coded with LOINC alone go through the export's lab_loinc.json to the item the model knows best.

    Reference: the job's events with each lab ITEMID that has a LOINC code replaced by the
    bridge's choice, computed here from D_LABITEMS and vocabulary.json's order (the first of the
    LOINC code's items in the model's lab list), then put back in the job's order.
    """
    lab_list = [c.split(":", 1)[1] for c in json.loads((export_dir / "vocabulary.json").read_text())["sources"]["lab"]]
    rank = {c: i for i, c in enumerate(lab_list)}
    items_of: dict[str, list[str]] = {}
    for row in read_table(locate_table(demo_dir, "D_LABITEMS"), "D_LABITEMS")[0].to_pylist():
        if (row["LOINC_CODE"] or "").strip():
            items_of.setdefault(row["LOINC_CODE"].strip(), []).append(str(row["ITEMID"]))
    chosen = {item: min(items, key=lambda c: (rank.get(c, len(rank)), int(c)))
              for items in items_of.values() for item in items}
    moved = 0
    for hadm, body in reference.items():
        events = [{**e, "code": chosen.get(e["code"], e["code"])} if e["source"] == "lab" else e
                  for e in body["events"]]
        moved += sum(a != b for a, b in zip(events, body["events"]))
        times = np.array([dt.datetime.fromisoformat(e["time"] + "+00:00").timestamp() for e in events], np.int64)
        full = np.array([f"{e['source']}:{e['code']}" for e in events], object)
        values = np.array([e.get("value", np.nan) for e in events], np.float64)
        order = canonical_permutation(times, full, values)
        expected = {**body, "events": [events[i] for i in order]}
        bundle = convert.admission_bundle(demo_release, hadm, local_lab_codes=False)
        fhir = _predict_fhir(client, bundle)
        assert fhir.status_code == 200, fhir.text[:300]
        v1 = client.post("/v1/predict", json=expected, headers=HEADERS,
                         params={"seed": SEED, "num_samples": SAMPLES}).json()
        assert abs(fhir.json()["prediction"][0]["probabilityDecimal"] - v1["probability"]) <= 1e-6, hadm
    assert moved > 0  # some labs really did land on another item of their LOINC code


# ------------------------------------------------------------------------------- answers and errors


@pytest.fixture(scope="module")
def small_bundle(demo_release, reference):
    """A converted test admission cut to its first 60 resources (fast to send many times)."""
    hadm = min(reference, key=lambda h: len(reference[h]["events"]))
    bundle = convert.admission_bundle(demo_release, hadm)
    bundle["entry"] = bundle["entry"][:60]
    return bundle


def test_risk_assessment_carries_model_basis_and_unmapped_codes(client, small_bundle):
    from fhir.resources.R4B.riskassessment import RiskAssessment

    bundle = copy.deepcopy(small_bundle)
    patient = bundle["entry"][0]["resource"]["id"]
    bundle["entry"].append({"resource": {
        "resourceType": "Condition", "id": "icd10", "subject": {"reference": f"Patient/{patient}"},
        "code": {"coding": [{"system": codes.ICD10CM, "code": "I10"}]}, "recordedDate": "2100-01-01"}})
    bundle["entry"].append({"resource": {"resourceType": "Observation", "id": "void", "status": "entered-in-error",
                                         "code": {"text": "x"}}})
    r = _predict_fhir(client, bundle)
    assert r.status_code == 200, r.text[:500]
    risk = r.json()
    RiskAssessment.model_validate(risk)
    info = client.get("/v1/model", headers=HEADERS).json()["model"]
    assert risk["method"]["coding"][0]["code"] == info["name"] and info["checksum"] in risk["method"]["text"]
    assert risk["subject"]["reference"] == f"Patient/{patient}" and risk["status"] == "final"
    assert risk["prediction"][0]["outcome"]["coding"][0] == codes.DEATH_OUTCOME
    assert [e["valueCoding"] for e in _ext(risk, "unmapped-code")] == [{"system": codes.ICD10CM, "code": "I10"}]
    skipped = {_sub(e, "reason")[0]: _sub(e, "count")[0] for e in _ext(risk, "resources-skipped")}
    assert skipped["void_status"] == 1 and skipped["unmapped_code"] == 1
    assert "Condition/icd10" not in [b["reference"] for b in risk["basis"]]
    assert r.headers["x-request-id"] == risk["id"]


def _with_creatinine(bundle: dict, value: float | None, unit: str | None, loinc: str = "2160-0") -> dict:
    out = copy.deepcopy(bundle)
    patient = out["entry"][0]["resource"]["id"]
    start = next(e["resource"]["period"]["start"] for e in out["entry"]
                 if e["resource"]["resourceType"] == "Encounter")
    obs = {"resourceType": "Observation", "id": "creatinine", "status": "final",
           "code": {"coding": [{"system": codes.LOINC, "code": loinc}]},
           "subject": {"reference": f"Patient/{patient}"}, "effectiveDateTime": start}
    if value is not None:
        obs["valueQuantity"] = {"value": value, **({"system": codes.UCUM, "code": unit} if unit else {})}
    out["entry"].append({"resource": obs})
    return out


def test_a_value_in_another_unit_is_converted_and_one_that_cannot_be_is_not_used(client, small_bundle):
    """Creatinine 1.7 mg/dL, 150.3 umol/L and the same under its SI LOINC code: one answer; mmol/mol: a warning."""
    def answer(value, unit, loinc="2160-0"):
        r = _predict_fhir(client, _with_creatinine(small_bundle, value, unit, loinc))
        assert r.status_code == 200, r.text[:300]
        return r.json()

    mg = answer(1.7, "mg/dL")
    p_mg = mg["prediction"][0]["probabilityDecimal"]
    for value, unit, loinc in ((1.7 * 10000 / 113.12, "umol/L", "2160-0"), (1.7 * 10000 / 113.12, "umol/L", "14682-9")):
        si = answer(value, unit, loinc)
        assert si["prediction"][0]["probabilityDecimal"] == pytest.approx(p_mg, abs=1e-6)
        assert not [n for n in si.get("note", []) if "unit" in n["text"]]
    odd = answer(1.7, "mmol/mol")
    without_value = answer(None, None)
    assert odd["prediction"][0]["probabilityDecimal"] == pytest.approx(
        without_value["prediction"][0]["probabilityDecimal"], abs=1e-6)  # the event counts, its value does not
    first = odd["note"][0]["text"]  # the unit problem comes before every other note
    assert "mmol/mol" in first and "mg/dL" in first and "not used" in first


@pytest.mark.parametrize("mutate, expression", [
    (lambda b: b.update(resourceType="Patient"), "Bundle"),
    (lambda b: b.pop("type"), "Bundle.type"),
    (lambda b: b["entry"][1]["resource"]["period"].update(start="yesterday"), "Bundle.entry[1].resource.period.start"),
    (lambda b: b["entry"][2]["resource"].update(status=None, colour="red"), "Bundle.entry[2].resource"),
    (lambda b: b["entry"][2]["resource"].update(resourceType="Nope"), "Bundle.entry[2].resource"),
    (lambda b: b["entry"][0]["resource"].pop("birthDate"), "Bundle.entry[0].resource.birthDate"),
    (lambda b: b["entry"].pop(0), "Bundle.entry"),  # no Patient
])
def test_invalid_fhir_is_422_operation_outcome_naming_the_element(client, small_bundle, mutate, expression):
    from fhir.resources.R4B.operationoutcome import OperationOutcome

    bundle = copy.deepcopy(small_bundle)
    mutate(bundle)
    r = _predict_fhir(client, bundle)
    assert r.status_code == 422, r.text[:300]
    outcome = r.json()
    OperationOutcome.model_validate(outcome)
    assert any(x.startswith(expression) for i in outcome["issue"] for x in i["expression"]), outcome


@pytest.mark.parametrize("content, status", [
    (b"{", 400), (b"", 400), (b'{"resourceType": "Bundle", "type": NaN}', 400), (b"\xff\xfe", 400),
    (b"[" * 50000 + b"]" * 50000, 400),
    (b"[]", 422),  # JSON, so not malformed: not a Bundle
])
def test_unparseable_bodies_are_operation_outcomes(client, content, status):
    # FHIR's rule, and the service's on every route: 400 when the body cannot be parsed, 422 when it can.
    r = client.post(OPERATION, content=content, headers=FHIR_HEADERS)
    assert r.status_code == status and r.json()["resourceType"] == "OperationOutcome"


def test_same_auth_limits_and_metrics_as_v1(client, small_bundle, server):
    assert client.post(OPERATION, content=json.dumps(small_bundle)).status_code == 401
    assert client.get("/cds-services").status_code == 401
    r = client.post(OPERATION, content=json.dumps(small_bundle), headers=FHIR_HEADERS, params={"num_samples": 101})
    assert r.status_code == 422 and r.json()["resourceType"] == "OperationOutcome"
    big = b'{"resourceType": "Bundle", "type": "collection", "id": "' + b"x" * (4 << 20) + b'"}'
    assert client.post(OPERATION, content=big, headers=FHIR_HEADERS).status_code == 413
    metrics = client.get("/metrics", headers=HEADERS).text
    assert f'ehr_http_requests_total{{method="POST",route="/fhir/r4/$predict-mortality",status="401"}}' in metrics
    assert 'method="GET",route="/cds-services",status="401"' in metrics


# ------------------------------------------------------------------------------- whose record, which admission


@pytest.mark.parametrize("where, subject", [
    ("Observation", {"reference": "Patient/subject-99999"}),
    ("Observation", {"identifier": {"system": codes.MIMIC_SUBJECT_ID, "value": "99999"}}),
    ("Observation", {"reference": "urn:uuid:9d3c0f52-1111-4e1e-8c2b-7c1d2e3f4a5b"}),
    ("Encounter", {"reference": "Patient/subject-99999"}),
])
def test_a_bundle_with_another_patients_resource_is_refused_naming_it(client, small_bundle, where, subject):
    from fhir.resources.R4B.operationoutcome import OperationOutcome

    bundle = copy.deepcopy(small_bundle)
    i = next(i for i, e in enumerate(bundle["entry"]) if e["resource"]["resourceType"] == where)
    bundle["entry"][i]["resource"]["subject"] = subject
    r = _predict_fhir(client, bundle)
    assert r.status_code == 422, r.text[:300]
    outcome = r.json()
    OperationOutcome.model_validate(outcome)
    [issue] = outcome["issue"]
    patient = bundle["entry"][0]["resource"]["id"]
    assert issue["expression"] == [f"Bundle.entry[{i}].resource.subject"] and issue["code"] == "business-rule"
    assert f"the Bundle's Patient is Patient/{patient}" in issue["diagnostics"]
    assert ("99999" in issue["diagnostics"]) or ("urn:uuid:9d3c" in issue["diagnostics"])
    assert _predict_fhir(client, small_bundle).status_code == 200  # the same Bundle, one patient's: answered


def _without_admission_type(bundle: dict) -> dict:
    """The Bundle as many EHR exports write it: the Encounter states no priority, no type, class IMP."""
    out = copy.deepcopy(bundle)
    for e in out["entry"]:
        if e["resource"]["resourceType"] == "Encounter":
            e["resource"].pop("priority", None)
            e["resource"].pop("type", None)
    return out


@pytest.mark.slow
def test_an_encounter_without_admission_type_gets_the_risk_averaged_over_the_training_types(
        client, reference, demo_release, server):
    """The answer equals the independent mixture: /v1 samples per known type, in the training shares."""
    hadm = min(reference, key=lambda h: len(reference[h]["events"]))
    bundle = _without_admission_type(convert.admission_bundle(demo_release, hadm))
    r = _predict_fhir(client, bundle, num_samples=25)
    assert r.status_code == 200, r.text[:500]
    risk = r.json()
    notes = [n["text"] for n in risk["note"]]
    assert any(n.startswith(f"Encounter/hadm-{hadm}: no admission type") for n in notes), notes
    assert any(n.startswith("admission type unknown") and "EMERGENCY 80%" in n for n in notes), notes
    # The export's training split holds EMERGENCY 16, ELECTIVE 3, URGENT 1 (serving_fixtures): of
    # 25 samples per member that is 20, 3.75, 1.25 -> 20, 4, 1 by the largest remainders.
    samples = []
    for kind, n in (("EMERGENCY", 20), ("ELECTIVE", 4), ("URGENT", 1)):
        body = {**reference[hadm], "admission": {**reference[hadm]["admission"], "admission_type": kind}}
        v1 = client.post("/v1/predict", json=body, headers=HEADERS,
                         params={"seed": SEED, "num_samples": n, "include_samples": True})
        assert v1.status_code == 200, v1.text[:300]
        samples += v1.json()["samples"]
    [prediction] = risk["prediction"]
    assert len(samples) == 25 * K
    assert abs(prediction["probabilityDecimal"] - float(np.mean(samples))) <= 1e-6
    # /v1 with the type left out (or null) answers the same, with the warning and its metric.
    unknown = {**reference[hadm], "admission": {"admit_time": reference[hadm]["admission"]["admit_time"]}}
    for body in (unknown, {**unknown, "admission": {**unknown["admission"], "admission_type": None}}):
        v1 = client.post("/v1/predict", json=body, headers=HEADERS,
                         params={"seed": SEED, "num_samples": 25, "include_samples": True}).json()
        assert v1["samples"] == pytest.approx(samples, abs=1e-6)
        assert sum(w.startswith("admission type unknown") for w in v1["warnings"]) == 1
    metrics = client.get("/metrics", headers=HEADERS).text
    assert 'ehr_input_warnings_total{kind="admission_type_unknown"}' in metrics
    # A CDS Hooks call on the same records gets its card, the warning in its detail.
    card = client.post("/cds-services/mortality-risk", json=_hook_call(bundle), headers=HEADERS)
    assert card.status_code == 200, card.text[:300]
    assert "admission type unknown" in card.json()["cards"][0]["detail"]


def test_an_admission_type_the_training_never_held_is_refused(client, reference):
    hadm = min(reference)
    body = {**reference[hadm], "admission": {**reference[hadm]["admission"], "admission_type": "NEWBORN"}}
    r = client.post("/v1/predict", json=body, headers=HEADERS, params={"num_samples": 2})
    assert r.status_code == 422
    [error] = r.json()["detail"]
    assert error["loc"] == ["body", "admission", "admission_type"] and "EMERGENCY, ELECTIVE, URGENT" in error["msg"]


# ------------------------------------------------------------------------------- CDS Hooks


def _check_discovery(doc: dict) -> None:
    """The CDS Hooks 2.0 discovery shape: services[] with hook, id, description, optional title and prefetch."""
    assert set(doc) == {"services"} and doc["services"]
    for s in doc["services"]:
        assert {"hook", "id", "description"} <= set(s) <= {"hook", "id", "title", "description", "prefetch",
                                                             "usageRequirements", "extension"}
        assert all(isinstance(s[k], str) and s[k] for k in ("hook", "id", "description"))
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.get("prefetch", {}).items())


def _check_card(c: dict) -> None:
    """A CDS Hooks 2.0 card: summary < 140 chars, indicator, source.label; optional detail, uuid, url."""
    assert {"summary", "indicator", "source"} <= set(c)
    assert isinstance(c["summary"], str) and 0 < len(c["summary"]) < 140
    assert c["indicator"] in ("info", "warning", "critical")
    assert isinstance(c["source"]["label"], str) and c["source"]["label"]
    assert isinstance(c.get("detail", ""), str)


def _search(resources: list[dict]) -> dict:
    return {"resourceType": "Bundle", "type": "searchset", "entry": [{"resource": r} for r in resources]}


def _hook_call(bundle: dict, hook: str = "patient-view", drop: tuple = ()) -> dict:
    """A hook call whose prefetch answers the discovery templates from a converted Bundle."""
    res = [e["resource"] for e in bundle["entry"]]
    by_type = lambda t: [r for r in res if r["resourceType"] == t]  # noqa: E731
    encounter = max(by_type("Encounter"), key=lambda e: e["period"]["start"])
    prefetch = {"patient": by_type("Patient")[0], "encounter": encounter,
                "encounters": _search(by_type("Encounter")), "observations": _search(by_type("Observation")),
                "medicationRequests": _search(by_type("MedicationRequest")),
                "medicationAdministrations": _search(by_type("MedicationAdministration")),
                "conditions": _search(by_type("Condition")), "procedures": _search(by_type("Procedure"))}
    context = {"userId": "Practitioner/1", "patientId": prefetch["patient"]["id"], "encounterId": encounter["id"]}
    for key in drop:
        prefetch[key] = None
    return {"hook": hook, "hookInstance": "d1577c69-dfbe-44ad-ba6d-3e05e953b2ea", "context": context,
            "prefetch": prefetch}


def test_cds_discovery_and_cards_follow_the_spec(client, small_bundle):
    discovery = client.get("/cds-services", headers=HEADERS).json()
    _check_discovery(discovery)
    hooks = {s["hook"]: s["id"] for s in discovery["services"]}
    assert set(hooks) == {"patient-view", "encounter-start"}
    for hook, service in hooks.items():
        r = client.post(f"/cds-services/{service}", json=_hook_call(small_bundle, hook), headers=HEADERS)
        assert r.status_code == 200, r.text[:300]
        [card] = r.json()["cards"]
        _check_card(card)
        assert card["summary"].startswith("In-hospital mortality risk ") and "(95%: " in card["summary"]
        # The tiny export's metrics.json names no count: its numbers are its held-out test split's.
        assert "epistemic" in card["detail"] and "**Calibration on the held-out test split:**" in card["detail"]


def test_cds_missing_prefetch_is_412_and_malformed_calls_400(client, small_bundle):
    service = "mortality-risk"
    r = client.post(f"/cds-services/{service}", json=_hook_call(small_bundle, drop=("patient",)), headers=HEADERS)
    assert r.status_code == 412 and "patient" in r.json()["detail"]
    call = _hook_call(small_bundle)
    call.pop("prefetch")
    call["fhirServer"] = "https://ehr.example/fhir"
    assert client.post(f"/cds-services/{service}", json=call, headers=HEADERS).status_code == 412
    assert client.post(f"/cds-services/{service}", json=_hook_call(small_bundle, "order-sign"),
                       headers=HEADERS).status_code == 400
    assert client.post(f"/cds-services/{service}", content=b"{", headers=HEADERS).status_code == 400
    assert client.post("/cds-services/nope", json=_hook_call(small_bundle), headers=HEADERS).status_code == 404


def test_cds_context_naming_another_patient_or_encounter_is_refused(client, small_bundle):
    from fhir.resources.R4B.operationoutcome import OperationOutcome

    service = "/cds-services/mortality-risk"
    patient = small_bundle["entry"][0]["resource"]["id"]
    call = _hook_call(small_bundle)
    call["context"]["patientId"] = "subject-99999"
    r = client.post(service, json=call, headers=HEADERS)
    assert r.status_code == 422, r.text[:300]
    OperationOutcome.model_validate(r.json())
    [issue] = r.json()["issue"]
    assert issue["expression"] == ["context.patientId"]
    assert "'subject-99999'" in issue["diagnostics"] and f"Patient/{patient}" in issue["diagnostics"]

    call = _hook_call(small_bundle)
    encounter = call["context"]["encounterId"]
    call["context"]["encounterId"] = "hadm-1"
    [issue] = client.post(service, json=call, headers=HEADERS).json()["issue"]
    assert issue["expression"] == ["context.encounterId"] and f"Encounter/{encounter}" in issue["diagnostics"]

    # The prefetched Encounter (or any prefetched record) of another patient: named where the call holds it.
    call = _hook_call(small_bundle)
    call["prefetch"]["encounter"] = {**call["prefetch"]["encounter"], "subject": {"reference": "Patient/subject-99999"}}
    r = client.post(service, json=call, headers=HEADERS)
    assert r.status_code == 422, r.text[:300]
    [issue] = r.json()["issue"]
    assert issue["expression"] == ["prefetch.encounter.subject"], issue
    assert "'Patient/subject-99999'" in issue["diagnostics"] and f"Patient/{patient}" in issue["diagnostics"]
    call = _hook_call(small_bundle)
    call["prefetch"]["observations"]["entry"][1]["resource"]["subject"] = {"reference": "Patient/subject-99999"}
    [issue] = client.post(service, json=call, headers=HEADERS).json()["issue"]
    assert issue["expression"] == ["prefetch.observations.entry[1].resource.subject"], issue


def test_cds_references_to_the_fhir_server_resolve_to_the_prefetch(client, small_bundle):
    """With fhirServer, absolute references to it name the prefetched resources; another server's do not."""
    server = "https://ehr.example/fhir"
    patient = small_bundle["entry"][0]["resource"]["id"]
    call = _hook_call(small_bundle)
    call["fhirServer"] = server
    for entry in call["prefetch"]["observations"]["entry"]:
        entry["resource"]["subject"] = {"reference": f"{server}/Patient/{patient}"}
    r = client.post("/cds-services/mortality-risk", json=call, headers=HEADERS)
    assert r.status_code == 200, r.text[:300]
    call["fhirServer"] = "https://other.example/fhir"
    assert client.post("/cds-services/mortality-risk", json=call, headers=HEADERS).status_code == 422


def test_card_indicator_follows_threshold_and_referral():
    from serving.api.fhir_answers import card_indicator, card_summary
    from serving.schemas import EventCounts, Interval, OutOfVocabulary, PatientPrediction, Referral

    def prediction(p: float, refer: bool) -> PatientPrediction:
        return PatientPrediction(
            probability=p, std=0.01, interval=Interval(lower=max(p - 0.08, 0), upper=min(p + 0.08, 1)),
            predictive_entropy=0.5, aleatoric=0.4, epistemic=0.1, member_probabilities=[p], decision_threshold=0.5,
            predicted_positive=p > 0.5, samples_across_threshold=0.0, refer=refer,
            referral=Referral(refer=refer, measure="mutual_information", value=0.1, threshold=0.05, rate=0.2),
            events=EventCounts(received=0, used=0, ignored={}), out_of_vocabulary=OutOfVocabulary(count=0, codes=[]),
            prediction_time=dt.datetime(2150, 1, 1), age_years=60.0)

    assert card_indicator(prediction(0.9, False)) == "critical"
    assert card_indicator(prediction(0.2, True)) == "warning"
    assert card_indicator(prediction(0.2, False)) == "info"
    assert card_summary(prediction(0.23, False)) == "In-hospital mortality risk 23% (95%: 15-31%)"


# ------------------------------------------------------------------------------- fuzz


def test_fuzz_fhir_and_cds_never_5xx(client, small_bundle):
    """Mutated Bundles and hook calls: always an answer, never a 5xx; every 422 is a valid OperationOutcome."""
    from fhir.resources.R4B.operationoutcome import OperationOutcome

    base = copy.deepcopy(small_bundle)
    base["entry"] = base["entry"][:12]
    call = _hook_call(base)

    @hyp_settings(max_examples=60, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def run(data):
        if data.draw(st.booleans()):
            doc = mutate_json(copy.deepcopy(base), data.draw)
            r = client.post(OPERATION, content=json.dumps(doc), headers=FHIR_HEADERS, params={"num_samples": 2})
            if r.status_code == 422:
                OperationOutcome.model_validate(r.json())
        else:
            doc = mutate_json(copy.deepcopy(call), data.draw)
            r = client.post("/cds-services/mortality-risk", content=json.dumps(doc), headers=HEADERS)
        assert r.status_code < 500, (r.status_code, r.text[:300])

    run()


def test_schemathesis_finds_no_5xx_on_the_fhir_and_cds_routes(server):
    """schemathesis generates calls from /openapi.json (valid and invalid ones) for every new route: never a 5xx."""
    import schemathesis
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{server.base_url}/openapi.json").include(
        path_regex=r"^/(fhir/r4/|cds-services)")
    # the Bundle, the CDS Hooks discovery and call, the CapabilityStatement and the StructureDefinitions
    assert len([op for op in schema.get_all_operations()]) == 5
    strategy = schema.as_strategy(GenerationMode.POSITIVE) | schema.as_strategy(GenerationMode.NEGATIVE)

    @hyp_settings(max_examples=150, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
    @given(case=strategy)
    def run(case):
        response = case.call(base_url=server.base_url, headers=HEADERS, timeout=60)
        assert response.status_code < 500, (case.method, case.path, response.status_code, response.text[:300])

    run()
