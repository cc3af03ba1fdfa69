"""The FHIR mapping without a server: code tables, validation errors, resource rules."""
from __future__ import annotations

import csv
import datetime as dt
import gzip

import pytest

from ehr_pipeline.contract import PipelineConfig, spec
from ehr_pipeline.fhir import codes, convert
from ehr_pipeline.fhir.mapping import FhirInputError, ModelCodes, map_bundle, read_bundle
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.reader import locate_table, read_table


# ------------------------------------------------------------------------------- code tables


def test_lab_bridge_equals_a_plain_read_of_d_labitems(demo_dir):
    from ehr_pipeline.reader import locate_table, read_table

    with gzip.open(demo_dir / "D_LABITEMS.csv.gz", "rt", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["LOINC_CODE"].strip()]
    expected: dict[str, set] = {}
    for r in rows:
        expected.setdefault(r["LOINC_CODE"].strip(), set()).add(r["ITEMID"])
    table, _ = read_table(locate_table(demo_dir, "D_LABITEMS"), "D_LABITEMS")
    bridge = codes.lab_loinc_bridge(table.to_pylist())
    assert {k: set(v) for k, v in bridge.items()} == expected
    assert sum(len(v) for v in bridge.values()) == len(rows) == 585  # NOTES: 585 of 753 items carry LOINC


@pytest.mark.parametrize("mimic, dotted, procedure", [
    ("4019", "401.9", False), ("V4581", "V45.81", False), ("E8497", "E849.7", False), ("042", "042", False),
    ("9604", "96.04", True), ("966", "96.6", True), ("38", "38", True)])
def test_icd9_dots_round_trip(mimic, dotted, procedure):
    assert codes.icd9_dotted(mimic, procedure) == dotted
    assert codes.icd9_undotted(dotted) == mimic


def test_resolve_prefers_the_most_frequent_known_item():
    vocab = {"lab:50811": 7, "lab:51222": 2}
    assert codes.resolve(["50811", "51222"], "lab", vocab) == "51222"
    assert codes.resolve(["1", "2"], "lab", vocab) == "1"  # none known: the table's first (out of vocabulary)
    assert codes.resolve([], "lab", vocab) is None
    temperature = {"chart:223762": 0, "chart:223761": 1}
    assert codes.vital_sign_items("8310-5", "[degF]", temperature) == ("223761", "678")
    assert codes.vital_sign_items("8310-5", "Cel", temperature) == ("223762", "676")
    # The model knows only the Fahrenheit item: a Celsius value goes there (and is converted).
    assert codes.vital_sign_items("8310-5", "Cel", {"chart:678": 0}) == ("223761", "678")
    assert codes.vital_sign_items("8310-5", "K", {}) == ("223762", "676")  # nothing known: the first row
    assert codes.vital_sign_items("0000-0", "K", temperature) == ()


def test_lab_loinc_of_another_property_reaches_the_same_analyte():
    bridge = {"2160-0": ("50912",), "2345-7": ("50931",)}
    assert codes.lab_items("2160-0", bridge) == ("50912",)
    assert codes.lab_items("14682-9", bridge) == ("50912",)  # creatinine [Moles/volume]: umol/L sites
    assert codes.lab_items("14749-6", bridge) == ("50931",)  # glucose [Moles/volume]
    assert codes.lab_items("0000-0", bridge) == ()


def test_vital_sign_items_exist_in_d_items(demo_dir):
    with gzip.open(demo_dir / "D_ITEMS.csv.gz", "rt", newline="") as f:
        chart = {r["ITEMID"] for r in csv.DictReader(f) if r["LINKSTO"] == "chartevents"}
    assert {i for v in codes.VITAL_SIGNS for i in v.itemids} <= chart


# ------------------------------------------------------------------------------- validation


def _bundle(*resources, patient=None, encounter=None):
    patient = patient or {"resourceType": "Patient", "id": "p", "gender": "female", "birthDate": "2080-05-17"}
    encounter = encounter or {"resourceType": "Encounter", "id": "e", "status": "in-progress",
                              "class": {"system": codes.ACT_CODE, "code": "IMP"},
                              "priority": {"coding": [{"system": codes.ACT_PRIORITY, "code": "EM"}]},
                              "subject": {"reference": "Patient/p"},
                              "period": {"start": "2150-03-01T08:30:00Z"}}
    entries = [patient, encounter, *resources]
    return {"resourceType": "Bundle", "type": "collection", "entry": [{"resource": r} for r in entries]}


def _obs(rid, coding, value=None, unit=None, when="2150-03-01T10:00:00Z", status="final", **extra):
    out = {"resourceType": "Observation", "id": rid, "status": status, "code": {"coding": [coding]},
           "subject": {"reference": "Patient/p"}, "effectiveDateTime": when, **extra}
    if value is not None:
        out["valueQuantity"] = {"value": value, **({"system": codes.UCUM, "code": unit} if unit else {})}
    return out


MODEL = ModelCodes(vocabulary={"lab:50912": 0, "lab:51222": 1, "chart:220045": 0, "chart:211": 1},
                   lab_loinc={"2160-0": ("50912",), "718-7": ("50811", "51222")})


def _map(*resources, **kw):
    return map_bundle(read_bundle(_bundle(*resources, **kw)), MODEL)


@pytest.mark.parametrize("document, expression", [
    ({"resourceType": "Patient"}, "Bundle"),
    ([], "Bundle"),
    ({"resourceType": "Bundle", "type": "collection", "entry": [{"resource": {"resourceType": 5}}]},
     "Bundle.entry[0].resource"),
    ({"resourceType": "Bundle", "type": "collection", "entry": [{"resource": {"resourceType": "Nope"}}]},
     "Bundle.entry[0].resource"),
    ({"resourceType": "Bundle", "type": "collection",
      "entry": [{"resource": {"resourceType": "Encounter", "status": "x", "class": {"code": "IMP"},
                              "period": {"start": "2150-03-01T08:30:00"}}}]},  # a time needs an offset
     "Bundle.entry[0].resource.period.start"),
])
def test_invalid_fhir_names_the_element(document, expression):
    with pytest.raises(FhirInputError) as err:
        read_bundle(document)
    assert [i[0] for i in err.value.issues][0] == expression


def test_admission_fields_come_from_patient_and_encounter():
    m = _map()
    assert (m.gender, m.birth_date, m.admission_type) == ("F", dt.date(2080, 5, 17), "EMERGENCY")
    assert m.admit_time == dt.datetime(2150, 3, 1, 8, 30, tzinfo=dt.timezone.utc)
    assert (m.patient_reference, m.encounter_reference) == ("Patient/p", "Encounter/e")


@pytest.mark.parametrize("extra, expected", [
    ({}, None),  # no priority, class IMP, no type: common in real exports
    ({"priority": {"coding": [{"system": codes.ACT_PRIORITY, "code": "R"}]}}, None),  # routine: no MIMIC type
    ({"priority": {"coding": [{"system": codes.ACT_PRIORITY, "code": "EL"}]}}, "ELECTIVE"),
    ({"class": {"system": codes.ACT_CODE, "code": "EMER"}}, "EMERGENCY"),
    ({"type": [{"coding": [{"system": codes.MIMIC_ADMISSION_TYPE, "code": "URGENT"}]}],
      "priority": {"coding": [{"system": codes.ACT_PRIORITY, "code": "EM"}]}}, "URGENT"),  # the MIMIC coding first
])
def test_admission_type_from_the_encounter_or_unknown_with_a_warning(extra, expected):
    enc = {"resourceType": "Encounter", "id": "e", "status": "finished", "class": {"code": "IMP"},
           "subject": {"reference": "Patient/p"}, "period": {"start": "2150-03-01T08:30:00Z"}, **extra}
    m = _map(encounter=enc)
    assert m.admission_type == expected
    unknown = [w for w in m.warnings if "no admission type" in w]
    assert len(unknown) == (expected is None) and all(w.startswith("Encounter/e:") for w in unknown)


def test_partial_birth_date_is_an_error():
    with pytest.raises(FhirInputError, match="birth date"):
        _map(patient={"resourceType": "Patient", "id": "p", "birthDate": "2080"})


def test_codes_units_and_statuses():
    m = _map(
        _obs("a", {"system": codes.LOINC, "code": "2160-0"}, 1.4, "mg/dL"),  # lab via the bridge
        _obs("b", {"system": codes.LOINC, "code": "718-7"}, 9.0, "g/dL"),  # shared code: the known item
        _obs("c", {"system": codes.LOINC, "code": "8867-4"}, 88, "/min"),  # vital sign table
        _obs("d", {"system": codes.LOINC, "code": "8310-5"}, 310, "K"),  # vital sign in a foreign unit
        _obs("e", {"system": codes.mimic_system("chart"), "code": "211"}, 90),  # local code: unchanged
        _obs("f", {"system": codes.LOINC, "code": "0000-0"}, 1),  # nothing maps it
        _obs("g", {"system": codes.mimic_system("lab"), "code": "50912"}, 2, status="entered-in-error"),
        _obs("h", {"system": codes.mimic_system("lab"), "code": "50912"}, 3, when="2150-03"),
        _obs("i", {"system": codes.LOINC, "code": "2160-0"}, 97.0, "umol/L"),  # another unit: the service converts
        _obs("j", {"system": codes.LOINC, "code": "14682-9"}, 88.0, "umol/L"),  # creatinine by its SI LOINC code
    )
    got = {(e["source"], e["code"], e.get("value"), e.get("unit")) for e in m.events}
    assert got == {("lab", "50912", 1.4, "mg/dL"), ("lab", "51222", 9.0, "g/dL"), ("chart", "220045", 88.0, "/min"),
                   ("chart", "223762", 310.0, "K"), ("chart", "211", 90.0, None), ("lab", "50912", 97.0, "umol/L"),
                   ("lab", "50912", 88.0, "umol/L")}
    assert m.unmapped == [{"reference": "Observation/f", "system": codes.LOINC, "code": "0000-0"}]
    assert m.skipped == {"imprecise_time": 1, "unmapped_code": 1, "void_status": 1}
    # Units are the service's to convert (units.Harmoniser, as in the job): the mapping only passes them on.
    assert m.warnings == []
    assert sorted(m.basis) == ["Observation/a", "Observation/b", "Observation/c", "Observation/d", "Observation/e",
                               "Observation/i", "Observation/j"]


def test_billing_codes_are_known_at_their_encounters_discharge():
    prior = {"resourceType": "Encounter", "id": "old", "status": "finished", "class": {"code": "IMP"},
             "period": {"start": "2149-01-01T00:00:00Z", "end": "2149-01-05T12:00:00Z"}}
    def dx(rid, enc, code):
        return {"resourceType": "Condition", "id": rid, "subject": {"reference": "Patient/p"},
                "encounter": {"reference": f"Encounter/{enc}"},
                "code": {"coding": [{"system": codes.ICD9CM, "code": code}]}}

    m = _map(prior, dx("c1", "old", "401.9"), dx("c2", "e", "428.0"),
             {"resourceType": "Procedure", "id": "p1", "status": "completed", "subject": {"reference": "Patient/p"},
              "encounter": {"reference": "Encounter/old"}, "code": {"coding": [{"system": codes.ICD9CM,
                                                                               "code": "96.04"}]}},
             {"resourceType": "Condition", "id": "c3", "subject": {"reference": "Patient/p"},
              "code": {"coding": [{"system": codes.ICD10CM, "code": "I10"}]}})
    assert {(e["source"], e["code"], e["time"]) for e in m.events} == {
        ("diagnosis", "4019", "2149-01-05T12:00:00Z"), ("procedure", "9604", "2149-01-05T12:00:00Z")}
    assert m.skipped == {"known_at_discharge": 1, "unmapped_code": 1}  # the current stay's code; ICD-10
    assert m.encounter_reference == "Encounter/e"  # the latest-starting encounter is predicted


def test_medications_follow_the_job_rules():
    m = _map(
        {"resourceType": "MedicationRequest", "id": "r1", "status": "active", "intent": "order",
         "subject": {"reference": "Patient/p"}, "authoredOn": "2150-03-01T09:00:00Z",
         "medicationCodeableConcept": {"coding": [{"system": codes.mimic_system("prescription"), "code": "VANC1"}],
                                       "text": "Vancomycin"}},
        {"resourceType": "MedicationRequest", "id": "r2", "status": "cancelled", "intent": "order",
         "subject": {"reference": "Patient/p"}, "authoredOn": "2150-03-01",
         "medicationCodeableConcept": {"text": "Heparin"}},
        {"resourceType": "MedicationAdministration", "id": "a1", "status": "completed",
         "subject": {"reference": "Patient/p"},
         "effectivePeriod": {"start": "2150-03-01T09:00:00Z", "end": "2150-03-01T11:00:00Z"},
         "medicationCodeableConcept": {"coding": [{"system": codes.mimic_system("input"), "code": "225158"}]},
         "dosage": {"dose": {"value": 250, "unit": "mL"}}},
    )
    assert m.events == [
        {"time": "2150-03-01T11:00:00Z", "source": "input", "code": "225158", "value": 250.0, "unit": "mL"},
        {"time": "2150-03-01T23:59:59Z", "source": "prescription", "code": "VANC1"},  # the end of its day
    ]
    assert m.skipped == {"void_status": 1}


# ------------------------------------------------------------------------------- one patient per Bundle

PATIENT_URL = "urn:uuid:0b6a3d4e-2f0c-4f5e-9a1b-5c7d8e9f0a1b"
PATIENT_ID = {"system": codes.MIMIC_SUBJECT_ID, "value": "10006"}


def _one_patient_bundle(subject, *, holder_url=None, patient_url=PATIENT_URL, where="subject", kind="Observation",
                        more=()):
    """Patient p (fullUrl patient_url, one identifier), Encounter e, and one lab whose `where` is `subject`."""
    lab = _obs("lab", {"system": codes.mimic_system("lab"), "code": "50912"}, 1.4)
    lab.pop("subject")
    if kind != "Observation":  # a resource type the model does not read, holding the element in question
        lab = {"resourceType": kind, "id": "x", "clinicalStatus": {"coding": [{"code": "active"}]}}
    if subject is not None:
        lab[where] = subject
    bundle = _bundle(lab, *more, patient={"resourceType": "Patient", "id": "p", "gender": "female",
                                          "birthDate": "2080-05-17", "identifier": [PATIENT_ID]})
    bundle["entry"][0]["fullUrl"] = patient_url
    if holder_url:
        bundle["entry"][2]["fullUrl"] = holder_url
    return bundle


@pytest.mark.parametrize("subject, kw", [
    ({"reference": "Patient/p"}, {}),
    ({"reference": "Patient/p/_history/3"}, {}),  # another version of the same Patient
    ({"reference": PATIENT_URL}, {}),  # the Patient entry's fullUrl
    ({"reference": "http://ehr.example/fhir/Patient/p"}, {"patient_url": "http://ehr.example/fhir/Patient/p"}),
    ({"reference": "Patient/p"}, {"patient_url": "http://ehr.example/fhir/Patient/p",
                                  "holder_url": "http://ehr.example/fhir/Observation/lab"}),  # same server
    ({"reference": "Patient/p", "type": "Patient", "identifier": PATIENT_ID}, {}),
    ({"identifier": PATIENT_ID}, {}),  # a logical reference the Patient carries
    ({"display": "the patient"}, {}),  # names no one: not compared (names are never read)
    (None, {}),  # no subject: inside the Patient's Bundle it is the Patient's
])
def test_references_to_the_bundles_patient_are_used(subject, kw):
    m = map_bundle(read_bundle(_one_patient_bundle(subject, **kw)), MODEL)
    assert m.event_references == ["Observation/lab"] and [e["value"] for e in m.events] == [1.4]


@pytest.mark.parametrize("subject, kw, said", [
    ({"reference": "Patient/q"}, {}, "'Patient/q'"),
    ({"reference": "Patient/q/_history/1"}, {}, "'Patient/q/_history/1'"),
    ({"reference": "urn:uuid:9d3c0f52-1111-4e1e-8c2b-7c1d2e3f4a5b"}, {}, "not the Patient's fullUrl"),
    # An absolute URL is the entry with that fullUrl; this Patient has none on that server.
    ({"reference": "http://ehr.example/fhir/Patient/p"}, {}, "'http://ehr.example/fhir/Patient/p'"),
    ({"reference": "http://ehr.example/fhir/Patient/q"}, {"patient_url": "http://ehr.example/fhir/Patient/p"},
     "not the Patient's fullUrl"),
    ({"reference": "Patient/p"}, {"patient_url": "http://a.example/fhir/Patient/p",
                                  "holder_url": "http://b.example/fhir/Observation/lab"}, "on the server"),
    ({"identifier": {"system": codes.MIMIC_SUBJECT_ID, "value": "99999"}}, {}, "identifier"),
    ({"identifier": {"value": "10006"}}, {}, "identifier"),  # the same value in no system is not the same
    ({"reference": "Patient/p", "identifier": {"system": codes.MIMIC_SUBJECT_ID, "value": "99999"}}, {}, "99999"),
    ({"reference": "Group/ward-7"}, {}, "'Group/ward-7'"),
    ({"reference": "Patient/p", "type": "Group"}, {}, "names a Group"),
    ({"reference": "#p2"}, {}, "contained"),
    ({"reference": "Patient?identifier=10006"}, {}, "not a Patient reference"),
])
def test_a_resource_of_anyone_else_refuses_the_bundle(subject, kw, said):
    with pytest.raises(FhirInputError) as err:
        map_bundle(read_bundle(_one_patient_bundle(subject, **kw)), MODEL)
    [(where, message, code)] = err.value.issues
    assert (where, code) == ("Bundle.entry[2].resource.subject", "business-rule")
    assert said in message and "the Bundle's Patient is Patient/p" in message


def test_every_element_naming_someone_else_is_listed_encounter_and_unread_types_included():
    other = {"reference": "Patient/q"}
    bundle = _one_patient_bundle(other, kind="AllergyIntolerance", where="patient",
                                 more=[_obs("lab2", {"system": codes.mimic_system("lab"), "code": "50912"}, 9.9)])
    bundle["entry"][3]["resource"]["subject"] = other
    bundle["entry"][1]["resource"]["subject"] = other  # the Encounter itself
    with pytest.raises(FhirInputError) as err:
        map_bundle(read_bundle(bundle), MODEL)
    assert [i[0] for i in err.value.issues] == ["Bundle.entry[1].resource.subject", "Bundle.entry[2].resource.patient",
                                                "Bundle.entry[3].resource.subject"]
    assert err.value.issues[1][1].startswith("AllergyIntolerance.patient names 'Patient/q'")


def test_events_leave_in_the_jobs_canonical_order():
    m = _map(_obs("b", {"system": codes.mimic_system("lab"), "code": "50912"}, 2.0),
             _obs("a", {"system": codes.mimic_system("lab"), "code": "50912"}, 1.0),
             _obs("c", {"system": codes.mimic_system("lab"), "code": "50811"}, 5.0))
    assert [(e["code"], e["value"]) for e in m.events] == [("50811", 5.0), ("50912", 1.0), ("50912", 2.0)]
    assert m.event_references == ["Observation/c", "Observation/a", "Observation/b"]


def test_request_ids_become_valid_fhir_ids():
    from fhir.resources.R4B.riskassessment import RiskAssessment

    from serving.api.fhir_answers import fhir_id

    for given in ("5f0c9a", "bed_12:retry-1", "x" * 80):
        RiskAssessment.model_validate({"resourceType": "RiskAssessment", "status": "final", "id": fhir_id(given),
                                       "subject": {"reference": "Patient/p"}})
    assert fhir_id("bed_12:retry-1") == "bed-12-retry-1"


def _stay(rid, start, end=None):
    return {"resourceType": "Encounter", "id": rid, "status": "finished", "class": {"code": "IMP"},
            "period": {"start": start, **({"end": end} if end else {})}}


def test_the_previous_discharge_is_the_latest_earlier_encounters_end_by_the_jobs_rule():
    m = _map(_stay("a", "2149-01-01T00:00:00Z", "2149-01-05T12:00:00Z"),
             _stay("b", "2149-06-01T00:00:00Z"),  # no period.end: skipped
             _stay("c", "2150-02-27T00:00:00Z", "2150-03-02T00:00:00Z"))  # ends after e began: skipped
    assert m.previous_discharge_time == dt.datetime(2149, 1, 5, 12, tzinfo=dt.timezone.utc)
    assert sum("earlier Encounter" in w for w in m.warnings) == 2
    assert _map().previous_discharge_time is None  # one Encounter: no previous admission


def test_bundles_of_the_demo_give_the_jobs_previous_discharge(demo_dir):
    """Every demo admission of a subject with several stays: the converted Bundle's previous discharge is the cohort's."""
    admissions, _ = read_table(locate_table(demo_dir, "ADMISSIONS"), "ADMISSIONS")
    patients, _ = read_table(locate_table(demo_dir, "PATIENTS"), "PATIENTS", columns=cohort_mod.PATIENT_COLUMNS)
    coh = cohort_mod.build_cohort(admissions.select(list(cohort_mod.ADMISSION_COLUMNS)), patients,
                                  trigger_offset_seconds=PipelineConfig().trigger_offset_seconds)
    # Patient and Encounters only (no event tables): the Encounters' periods are what the rule reads.
    release = convert.Release(admissions, patients, coh.discharges, {}, {})
    rows = coh.table.to_pylist()
    stays = {}
    for r in release.admissions.to_pylist():
        stays[r["SUBJECT_ID"]] = stays.get(r["SUBJECT_ID"], 0) + 1
    several = [r for r in rows if stays[r["SUBJECT_ID"]] > 1]
    with_previous = 0
    for r in several:
        mapped = map_bundle(read_bundle(convert.admission_bundle(release, r["HADM_ID"])), ModelCodes({}, {}))
        previous = mapped.previous_discharge_time
        got = spec.NO_PREVIOUS_DISCHARGE if previous is None else \
            r["trigger_time"] - int(previous.timestamp())
        assert got == r["previous_discharge_seconds"], r["HADM_ID"]
        with_previous += previous is not None
    assert with_previous >= 5 and with_previous == coh.previous_discharge_counts["with_previous_discharge"]
