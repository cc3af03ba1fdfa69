"""One MIMIC-III admission -> a FHIR R4 Bundle (type collection), for users and tests.

The Bundle holds the Patient, the admission's Encounter and the patient's earlier ones (their
diagnoses are history), and every event row of the patient up to the admission's discharge,
written as a hospital would send it: labs as Observations with LOINC codings where
D_LABITEMS has them, outputs and chart values as Observations, prescriptions as
MedicationRequests (authoredOn = the dated STARTDATE), inputs as MedicationAdministrations,
ICD-9-CM diagnoses and procedures as Conditions and Procedures of their Encounter. Rows the
job drops for an error flag are written with status entered-in-error. Codes without a
standard system use the local MIMIC code system (``codes.MIMIC_PREFIX``). Times are UTC.
Nothing derived from the outcome (death times, discharge status) is written, except that an
Encounter's period.end is the effective discharge the job uses (later of discharge and death).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import pathlib
import re
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline.encode import units
from ehr_pipeline.fhir import codes
from ehr_pipeline.fhir.mapping import iso_utc
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.reader import TableReader, locate_table, read_table

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_NAMESPACE = uuid.UUID("6f1c2d4e-8f3a-5b6c-9d0e-1a2b3c4d5e6f")  # fullUrls are uuid5 of the resource id
_FHIR_CODE = re.compile(r"^[^\s]+( [^\s]+)*$")  # FHIR's 'code' type: no leading, trailing or double blanks

# Columns the converter reads per event table (beyond SUBJECT_ID, HADM_ID, ROW_ID).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "LABEVENTS": ("ITEMID", "CHARTTIME", "VALUE", "VALUENUM", "VALUEUOM"),
    "CHARTEVENTS": ("ITEMID", "CHARTTIME", "VALUE", "VALUENUM", "VALUEUOM", "ERROR"),
    "OUTPUTEVENTS": ("ITEMID", "CHARTTIME", "VALUE", "VALUEUOM", "ISERROR"),
    "INPUTEVENTS_CV": ("ITEMID", "CHARTTIME", "AMOUNT", "AMOUNTUOM"),
    "INPUTEVENTS_MV": ("ITEMID", "STARTTIME", "ENDTIME", "AMOUNT", "AMOUNTUOM", "STATUSDESCRIPTION"),
    "PRESCRIPTIONS": ("STARTDATE", "FORMULARY_DRUG_CD", "DRUG"),
    "DIAGNOSES_ICD": ("ICD9_CODE",),
    "PROCEDURES_ICD": ("ICD9_CODE",),
}


class ConvertError(ValueError):
    """The admission cannot be converted (unknown HADM_ID, no patient row); the message says which."""


@dataclasses.dataclass
class Release:
    """The tables of one MIMIC-III release that the converter reads, loaded once."""

    admissions: pa.Table
    patients: pa.Table
    discharges: pa.Table  # cohort.DISCHARGES_SCHEMA: effective discharge per HADM_ID
    lab_loinc: dict[str, list[str]]  # codes.lab_loinc_bridge of D_LABITEMS ({} without it)
    events: dict[str, pa.Table]  # table name -> rows (only tables present)


def load_release(mimic_dir: str | pathlib.Path, subject_ids: set[int] | None = None) -> Release:
    """Reads ADMISSIONS, PATIENTS, D_LABITEMS and the event tables (rows of `subject_ids` only, when given)."""
    admissions, _ = read_table(locate_table(mimic_dir, "ADMISSIONS"), "ADMISSIONS")
    patients, _ = read_table(locate_table(mimic_dir, "PATIENTS"), "PATIENTS", columns=cohort_mod.PATIENT_COLUMNS)
    built = cohort_mod.build_cohort(admissions.select(list(cohort_mod.ADMISSION_COLUMNS)), patients)
    d_lab = locate_table(mimic_dir, "D_LABITEMS")
    bridge = {}
    if d_lab is not None:
        labitems, _ = read_table(d_lab, "D_LABITEMS", columns=("ITEMID", "LOINC_CODE"))
        bridge = codes.lab_loinc_bridge(labitems.to_pylist())
    tables = {}
    for name, columns in TABLE_COLUMNS.items():
        path = locate_table(mimic_dir, name)
        if path is None:
            continue
        reader = TableReader(path, name, columns=("ROW_ID", "SUBJECT_ID", "HADM_ID") + columns)
        wanted = None if subject_ids is None else pa.array(sorted(subject_ids), pa.int64())
        batches = [b if wanted is None else b.filter(pc.is_in(b.column("SUBJECT_ID"), wanted)) for b in reader]
        tables[name] = pa.Table.from_batches(batches, schema=reader.arrow_schema)
    return Release(admissions, patients, built.discharges, bridge, tables)


def _date(seconds: int) -> str:
    return (EPOCH + dt.timedelta(seconds=int(seconds))).strftime("%Y-%m-%d")


def _quantity(value: float | None, mimic_unit: str | None, converter: units.Converter) -> dict[str, Any] | None:
    if value is None or not math.isfinite(value):
        return None
    out: dict[str, Any] = {"value": value}
    if mimic_unit and mimic_unit.strip():
        out["unit"] = mimic_unit.strip()
        ucum = converter.ucum(mimic_unit)
        if ucum is not None:
            out["system"], out["code"] = codes.UCUM, ucum
    return out


def _code(value: Any) -> str | None:
    text = None if value is None else str(value).strip()
    return text if text and _FHIR_CODE.match(text) else None


class _Writer:
    def __init__(self, release: Release, hadm_id: int, local_lab_codes: bool):
        self.release = release
        self.local_lab_codes = local_lab_codes
        self.converter = units.Converter()
        adm = release.admissions
        rows = adm.filter(pc.equal(adm.column("HADM_ID"), hadm_id)).to_pylist()
        if len(rows) != 1:
            raise ConvertError(f"HADM_ID {hadm_id}: {len(rows)} ADMISSIONS rows (expected exactly 1)")
        self.target = rows[0]
        self.subject = int(self.target["SUBJECT_ID"])
        pat = release.patients
        patients = pat.filter(pc.equal(pat.column("SUBJECT_ID"), self.subject)).to_pylist()
        if len(patients) != 1:
            raise ConvertError(f"SUBJECT_ID {self.subject}: {len(patients)} PATIENTS rows (expected exactly 1)")
        self.patient_row = patients[0]
        discharges = dict(zip(release.discharges.column("HADM_ID").to_pylist(),
                              release.discharges.column("DISCHTIME").to_pylist()))
        mine = adm.filter(pc.equal(adm.column("SUBJECT_ID"), self.subject)).to_pylist()
        # The admission and the ones before it; later admissions are the future.
        self.encounters = sorted((r for r in mine if r["ADMITTIME"] is not None
                                  and r["ADMITTIME"] <= self.target["ADMITTIME"]), key=lambda r: r["ADMITTIME"])
        self.hadm_ids = {int(r["HADM_ID"]) for r in self.encounters}
        self.end = {int(r["HADM_ID"]): discharges.get(int(r["HADM_ID"])) for r in self.encounters}
        self.horizon = self.end.get(hadm_id) or self.target["DISCHTIME"]
        self.item_loinc = codes.itemid_loinc(release.lab_loinc)
        self.patient_ref = f"Patient/subject-{self.subject}"

    def entry(self, resource: dict[str, Any]) -> dict[str, Any]:
        full = f"urn:uuid:{uuid.uuid5(_NAMESPACE, resource['resourceType'] + '/' + resource['id'])}"
        return {"fullUrl": full, "resource": resource}

    def encounter_ref(self, hadm: Any) -> dict[str, str] | None:
        return {"reference": f"Encounter/hadm-{int(hadm)}"} if hadm is not None and int(hadm) in self.hadm_ids \
            else None

    def rows(self, table: str, time_column: str | None) -> Iterator[dict[str, Any]]:
        """The subject's rows of a table, from its admissions so far or outpatient, up to the discharge."""
        data = self.release.events.get(table)
        if data is None:
            return
        data = data.filter(pc.equal(data.column("SUBJECT_ID"), self.subject))
        for row in data.to_pylist():
            hadm = row["HADM_ID"]
            if hadm is not None and int(hadm) not in self.hadm_ids:
                continue
            if hadm is None and time_column and (row[time_column] is None or row[time_column] > self.horizon):
                continue
            yield row

    def patient(self) -> dict[str, Any]:
        p = self.patient_row
        return {"resourceType": "Patient", "id": f"subject-{self.subject}",
                "identifier": [{"system": codes.MIMIC_SUBJECT_ID, "value": str(self.subject)}],
                "gender": codes.GENDER_TO_FHIR.get(str(p["GENDER"] or "").strip().upper(), "unknown"),
                "birthDate": _date(p["DOB"])}

    def encounter(self, row: Mapping[str, Any]) -> dict[str, Any]:
        hadm = int(row["HADM_ID"])
        kind = (row.get("ADMISSION_TYPE") or "").strip()
        out: dict[str, Any] = {
            "resourceType": "Encounter", "id": f"hadm-{hadm}",
            "identifier": [{"system": codes.MIMIC_HADM_ID, "value": str(hadm)}],
            "status": "finished",
            "class": {"system": codes.ACT_CODE, "code": "IMP", "display": "inpatient encounter"},
            "subject": {"reference": self.patient_ref},
            "period": {"start": iso_utc(row["ADMITTIME"]),
                       **({"end": iso_utc(self.end[hadm])} if self.end[hadm] else {})},
        }
        if _code(kind):
            out["type"] = [{"coding": [{"system": codes.MIMIC_ADMISSION_TYPE, "code": kind}], "text": kind}]
        if kind in codes.PRIORITY_FROM_ADMISSION_TYPE:
            out["priority"] = {"coding": [{"system": codes.ACT_PRIORITY,
                                           "code": codes.PRIORITY_FROM_ADMISSION_TYPE[kind]}]}
        return out

    def observation(self, rid: str, source: str, row: Mapping[str, Any], *, value_column: str, unit_column: str,
                    error: bool, category: str | None) -> dict[str, Any] | None:
        item = _code(row["ITEMID"])
        if item is None:
            return None  # no code, no Observation (Observation.code is required); the job drops it too
        codings = []
        loinc = self.item_loinc.get(item) if source == "lab" else None
        if loinc is not None:
            codings.append({"system": codes.LOINC, "code": loinc})
        if loinc is None or self.local_lab_codes:
            codings.insert(0, {"system": codes.mimic_system(source), "code": item})
        out: dict[str, Any] = {"resourceType": "Observation", "id": rid,
                               "status": "entered-in-error" if error else "final",
                               "code": {"coding": codings}, "subject": {"reference": self.patient_ref}}
        if category:
            out["category"] = [{"coding": [{"system": codes.OBSERVATION_CATEGORY, "code": category}]}]
        enc = self.encounter_ref(row["HADM_ID"])
        if enc:
            out["encounter"] = enc
        if row["CHARTTIME"] is not None:
            out["effectiveDateTime"] = iso_utc(row["CHARTTIME"])
        quantity = _quantity(row[value_column], row.get(unit_column), self.converter)
        if quantity is not None:
            out["valueQuantity"] = quantity
        elif (row.get("VALUE") or "").strip() and isinstance(row.get("VALUE"), str):
            out["valueString"] = row["VALUE"].strip()
        return out

    def resources(self) -> Iterator[dict[str, Any]]:
        yield self.patient()
        for row in self.encounters:
            yield self.encounter(row)
        for row in self.rows("LABEVENTS", "CHARTTIME"):
            obs = self.observation(f"lab-{row['ROW_ID']}", "lab", row, value_column="VALUENUM",
                                   unit_column="VALUEUOM", error=False, category="laboratory")
            if obs:
                yield obs
        for row in self.rows("CHARTEVENTS", "CHARTTIME"):
            obs = self.observation(f"chart-{row['ROW_ID']}", "chart", row, value_column="VALUENUM",
                                   unit_column="VALUEUOM", error=row["ERROR"] == 1, category="vital-signs")
            if obs:
                yield obs
        for row in self.rows("OUTPUTEVENTS", "CHARTTIME"):
            obs = self.observation(f"output-{row['ROW_ID']}", "output", row, value_column="VALUE",
                                   unit_column="VALUEUOM", error=row["ISERROR"] == 1, category=None)
            if obs:
                yield obs
        for table, prefix in (("INPUTEVENTS_CV", "inputcv"), ("INPUTEVENTS_MV", "inputmv")):
            for row in self.rows(table, "CHARTTIME" if table.endswith("CV") else "ENDTIME"):
                admin = self.administration(f"{prefix}-{row['ROW_ID']}", row)
                if admin:
                    yield admin
        for row in self.rows("PRESCRIPTIONS", "STARTDATE"):
            req = self.prescription(f"rx-{row['ROW_ID']}", row)
            if req:
                yield req
        for table, kind in (("DIAGNOSES_ICD", "Condition"), ("PROCEDURES_ICD", "Procedure")):
            for row in self.rows(table, None):
                billed = self.billing(kind, row)
                if billed:
                    yield billed

    def administration(self, rid: str, row: Mapping[str, Any]) -> dict[str, Any] | None:
        item = _code(row["ITEMID"])
        start, end = row.get("STARTTIME"), row.get("ENDTIME", row.get("CHARTTIME"))
        if item is None or end is None:
            return None  # medication[x] and effective[x] are required; the job drops these rows too
        rewritten = (row.get("STATUSDESCRIPTION") or "") == "Rewritten"
        out: dict[str, Any] = {
            "resourceType": "MedicationAdministration", "id": rid,
            "status": "entered-in-error" if rewritten else "completed",
            "medicationCodeableConcept": {"coding": [{"system": codes.mimic_system("input"), "code": item}]},
            "subject": {"reference": self.patient_ref},
        }
        enc = self.encounter_ref(row["HADM_ID"])
        if enc:
            out["context"] = enc
        if "STARTTIME" in row:
            out["effectivePeriod"] = {**({"start": iso_utc(start)} if start is not None else {}), "end": iso_utc(end)}
        else:
            out["effectiveDateTime"] = iso_utc(end)
        dose = _quantity(row["AMOUNT"], row.get("AMOUNTUOM"), self.converter)
        if dose is not None:
            out["dosage"] = {"dose": dose}
        return out

    def prescription(self, rid: str, row: Mapping[str, Any]) -> dict[str, Any] | None:
        formulary = _code(row["FORMULARY_DRUG_CD"])
        name = (row["DRUG"] or "").strip()
        if formulary is None and not name:
            return None  # nothing names the drug; the job counts it as missing_code
        concept: dict[str, Any] = {}
        if formulary is not None:
            concept["coding"] = [{"system": codes.mimic_system("prescription"), "code": formulary}]
        if name:
            concept["text"] = name
        out: dict[str, Any] = {"resourceType": "MedicationRequest", "id": rid, "status": "completed",
                               "intent": "order", "medicationCodeableConcept": concept,
                               "subject": {"reference": self.patient_ref}}
        enc = self.encounter_ref(row["HADM_ID"])
        if enc:
            out["encounter"] = enc
        if row["STARTDATE"] is not None:
            out["authoredOn"] = _date(row["STARTDATE"])  # a date: MIMIC's STARTDATE has no time
        return out

    def billing(self, kind: str, row: Mapping[str, Any]) -> dict[str, Any] | None:
        icd9 = _code(row["ICD9_CODE"])
        if icd9 is None:
            return None
        coding = {"system": codes.ICD9CM, "code": codes.icd9_dotted(icd9, procedure=kind == "Procedure")}
        out: dict[str, Any] = {"resourceType": kind, "id": f"{kind.lower()}-{row['ROW_ID']}",
                               "code": {"coding": [coding]}, "subject": {"reference": self.patient_ref},
                               "encounter": {"reference": f"Encounter/hadm-{int(row['HADM_ID'])}"}}
        if kind == "Procedure":
            out["status"] = "completed"
        else:
            out["category"] = [{"coding": [{"system": "http://terminology.hl7.org/CodeSystem/condition-category",
                                             "code": "encounter-diagnosis"}]}]
        return out


def admission_bundle(release: Release, hadm_id: int, local_lab_codes: bool = True) -> dict[str, Any]:
    """The FHIR R4 Bundle (JSON-ready dict) of one admission; local_lab_codes=False: LOINC alone where labs have it."""
    writer = _Writer(release, int(hadm_id), local_lab_codes)
    entries = [writer.entry(r) for r in writer.resources()]
    return {"resourceType": "Bundle", "id": f"hadm-{int(hadm_id)}", "type": "collection", "entry": entries}


def main(mimic_dir: str, hadm_id: int, out: str, local_lab_codes: bool = True) -> int:
    """`ehr-pipeline to-fhir`: writes the Bundle of one admission; exit code 0, or 2 with one line on error."""
    import json
    import logging
    import sys

    log = logging.getLogger(__name__)
    admissions, _ = read_table(locate_table(mimic_dir, "ADMISSIONS"), "ADMISSIONS", columns=("SUBJECT_ID", "HADM_ID"))
    subjects = admissions.filter(pc.equal(admissions.column("HADM_ID"), hadm_id)).column("SUBJECT_ID").to_pylist()
    try:
        # Only the patient's rows are kept while the tables stream by: the full release fits too.
        bundle = admission_bundle(load_release(mimic_dir, set(subjects)), hadm_id, local_lab_codes)
    except ConvertError as err:
        print(f"ehr-pipeline to-fhir: {mimic_dir}: {err}", file=sys.stderr)
        return 2
    text = json.dumps(bundle, indent=1, allow_nan=False) + "\n"
    if out == "-":
        sys.stdout.write(text)
    else:
        pathlib.Path(out).write_text(text, encoding="utf-8")
    kinds: dict[str, int] = {}
    for entry in bundle["entry"]:
        kinds[entry["resource"]["resourceType"]] = kinds.get(entry["resource"]["resourceType"], 0) + 1
    log.info("HADM_ID %d -> %d resources %s -> %s", hadm_id, len(bundle["entry"]), kinds, out)
    return 0
