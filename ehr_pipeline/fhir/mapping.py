"""A FHIR R4 Bundle for one patient and encounter -> the admission and events the model reads.

``read_bundle`` validates a parsed JSON document with the pinned ``fhir.resources`` models
and raises ``FhirInputError`` naming the element (a FHIRPath expression) when it is not valid
FHIR. ``map_bundle`` then turns the resources into the service's request shape: patient
(gender, birthDate), admission (the encounter's period.start and admission type) and events
``{"time", "source", "code", "value", "unit"}`` whose ``time`` is when the information became
known, by the Beam job's own rule (``bagging.known_time``). Codes that cannot be mapped are
listed, resources that cannot be used are counted by reason, and nothing is dropped silently.
A Bundle is one patient's: a resource whose subject (or patient) is anyone else refuses the
whole Bundle (``patient_reference_problem``). Pure: no I/O, no service code.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pydantic

from ehr_pipeline.encode import bagging, previous_stay
from ehr_pipeline.fhir import codes

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)

# Resource types read; any other type in a Bundle is counted and ignored.
PATIENT, ENCOUNTER = "Patient", "Encounter"
OBSERVATION, MEDICATION_REQUEST, MEDICATION_ADMINISTRATION = (
    "Observation", "MedicationRequest", "MedicationAdministration")
CONDITION, PROCEDURE, MEDICATION = "Condition", "Procedure", "Medication"
READ_TYPES = (PATIENT, ENCOUNTER, OBSERVATION, MEDICATION_REQUEST, MEDICATION_ADMINISTRATION, CONDITION,
              PROCEDURE, MEDICATION)
# Statuses that say a record is void or never happened: such resources are counted, not used.
VOID_STATUS = frozenset({"entered-in-error", "cancelled", "not-done", "refuted", "registered", "draft"})

# Reasons a resource is not turned into an event (the answer counts them).
VOID = "void_status"
NO_TIME = "missing_time"
IMPRECISE_TIME = "imprecise_time"  # a year or year-month only
NO_CODE = "unmapped_code"
OTHER_TYPE = "unsupported_resource_type"

# The elements that say whose record a resource is (R4: `subject` on most clinical resources,
# `patient` on AllergyIntolerance, Immunization, Claim, ...).
PATIENT_ELEMENTS = ("subject", "patient")
# A FHIR id, a relative reference Type/id and a RESTful absolute URL [base]/Type/id, each with
# an optional /_history/version (a version of the same resource is the same patient).
_ID = r"[A-Za-z0-9\-.]{1,64}"
_HISTORY = rf"(?:/_history/{_ID})?"
_RELATIVE = re.compile(rf"^([A-Za-z]+)/({_ID}){_HISTORY}$")
_RESTFUL = re.compile(rf"^(https?://.+)/([A-Za-z]+)/({_ID}){_HISTORY}$")


class FhirInputError(ValueError):
    """A document that is not a valid FHIR Bundle, or lacks what a prediction needs; one issue per element."""

    def __init__(self, issues: Sequence[tuple[str, str, str]]):
        """issues: (FHIRPath expression, message, OperationOutcome issue code)."""
        self.issues = list(issues)
        super().__init__("; ".join(f"{e}: {m}" for e, m, _ in self.issues))


@dataclasses.dataclass(frozen=True)
class ModelCodes:
    """What the served model knows: its vocabulary ('source:code') and the LOINC lab bridge.

    Units are not the mapping's business: each event carries its unit as sent (the UCUM code
    when the Quantity has one), and the service moves every value to the model's units with
    the same ``units.Harmoniser`` as the Beam job.
    """

    vocabulary: Mapping[str, int]  # 'source:code' -> rank in its source, most frequent in training first
    lab_loinc: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class MappedAdmission:
    """A Bundle as the prediction service reads it, plus what happened to each resource."""

    patient_reference: str
    encounter_reference: str
    gender: str  # spec.GENDERS
    birth_date: dt.date
    admit_time: dt.datetime  # UTC
    admission_type: str | None  # None: the Encounter does not say (the service averages over the training types)
    # The previous admission's discharge (UTC): the latest period.end of the other Encounters at or before
    # admit_time (encode.previous_stay, the job's rule); None when no other Encounter gives one.
    previous_discharge_time: dt.datetime | None
    events: list[dict[str, Any]]  # the service's Event fields; time = when known (UTC ISO 8601)
    event_references: list[str]  # the resource each event came from, in event order
    basis: list[str]  # references of the resources that became events, each once
    unmapped: list[dict[str, str]]  # {"reference", "system", "code"} of codings nothing maps
    skipped: dict[str, int]  # reason -> resources not used
    warnings: list[str]


# ----------------------------------------------------------------------------- validation


def _path(loc: Sequence[str | int]) -> str:
    """A pydantic error location as a FHIRPath expression: ('entry', 2, 'resource', 'status') -> Bundle.entry[2]...."""
    out = "Bundle"
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part == "class_fhir":
            out += ".class"
        else:
            out += f".{part}"
    return out


def read_bundle(document: Any):
    """A parsed JSON document -> a validated fhir.resources R4B Bundle; FhirInputError naming each bad element."""
    from fhir.resources.R4B.bundle import Bundle

    if not isinstance(document, dict) or document.get("resourceType") != "Bundle":
        raise FhirInputError([("Bundle", "the body must be a FHIR Bundle resource (resourceType 'Bundle')",
                               "structure")])
    entries = document.get("entry")
    if isinstance(entries, list):
        from fhir.resources.R4B import get_fhir_model_class

        for i, entry in enumerate(entries):
            resource = entry.get("resource") if isinstance(entry, dict) else None
            kind = resource.get("resourceType") if isinstance(resource, dict) else None
            if resource is None:
                continue  # left to the model: an entry without a resource is valid FHIR
            where = f"Bundle.entry[{i}].resource"
            if not isinstance(kind, str):
                raise FhirInputError([(where, "a resource needs a resourceType string", "structure")])
            try:  # the models raise KeyError/TypeError for unknown types: say which one
                get_fhir_model_class(kind)
            except (KeyError, ValueError, TypeError, AttributeError):
                raise FhirInputError([(where, f"unknown resourceType {kind[:40]!r}", "structure")]) from None
    try:
        return Bundle.model_validate(document)
    except pydantic.ValidationError as err:
        issues = [(_path(e.get("loc", ())), str(e.get("msg", "invalid")), "invalid") for e in err.errors()]
        raise FhirInputError(issues[:20]) from None


# ----------------------------------------------------------------------------- helpers


def _seconds(value: dt.datetime) -> int:
    """Whole seconds since 1970 UTC (floor), as the service's own times."""
    if value.tzinfo is None or value.utcoffset() is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return (value - EPOCH) // dt.timedelta(seconds=1)


def _instant(value: Any) -> tuple[int | None, bool, bool]:
    """(seconds, date_only, imprecise) of a FHIR date/dateTime/instant as fhir.resources parses it."""
    if isinstance(value, dt.datetime):
        return _seconds(value), False, False
    if isinstance(value, dt.date):
        return _seconds(dt.datetime(value.year, value.month, value.day)), True, False
    if value is None:
        return None, False, False
    return None, False, True  # 'YYYY' or 'YYYY-MM': no day to place it on


def iso_utc(seconds: int) -> str:
    """An instant in whole seconds since 1970 as FHIR writes it in UTC ('2150-03-01T08:30:00Z')."""
    return (EPOCH + dt.timedelta(seconds=int(seconds))).strftime("%Y-%m-%dT%H:%M:%SZ")


def _ref(resource: Any, full_url: str | None) -> str:
    if getattr(resource, "id", None):
        return f"{resource.get_resource_type()}/{resource.id}"
    return full_url or resource.get_resource_type()


def _codings(concept: Any) -> list[Any]:
    return list(getattr(concept, "coding", None) or []) if concept is not None else []


def _status(resource: Any) -> str | None:
    status = getattr(resource, "status", None)
    verification = getattr(resource, "verificationStatus", None)
    if verification is not None:
        for c in _codings(verification):
            if c.code in VOID_STATUS:
                return c.code
    return status


def _float(value: Any) -> float | None:
    if value is None:
        return None
    number = float(value)
    return number if math.isfinite(number) else None


# ----------------------------------------------------------------------------- whose record


@dataclasses.dataclass(frozen=True)
class PatientIdentity:
    """How resources of a Bundle may name its Patient."""

    reference: str  # "Patient/{id}" (or the fullUrl when the Patient has no id), for messages
    id: str | None
    full_url: str | None
    identifiers: frozenset[tuple[str | None, str]]  # (system, value)


def _strip_history(url: str) -> str:
    return re.sub(rf"/_history/{_ID}$", "", url)


def patient_reference_problem(reference: Any, holder_full_url: str | None, patient: PatientIdentity) -> str | None:
    """Why a Reference does not name the Bundle's Patient; None when it does, or names no one (display only).

    FHIR's Bundle rules: an absolute reference (http(s), urn:uuid, urn:oid) names the entry
    with that fullUrl; a relative Patient/{id} names the Patient with that id, resolved against
    the base of the referring entry's RESTful fullUrl when both entries have one; a logical
    reference (identifier) names the Patient carrying that identifier (system and value).
    Anything else (a contained '#' resource, a Group, a search URL, another id) is someone
    else, or cannot be shown not to be.
    """
    kind = getattr(reference, "type", None)
    if kind and kind != PATIENT:
        return f"names a {kind[:40]}"
    target = getattr(reference, "reference", None)
    if target:
        shown = target[:120]
        if patient.full_url and _strip_history(target) == _strip_history(patient.full_url):
            pass
        elif target.startswith("#"):
            return f"names {shown!r}, a contained resource"
        elif target.startswith(("http://", "https://", "urn:")):
            return f"names {shown!r}, which is not the Patient's fullUrl"
        elif (m := _RELATIVE.match(target)) is None:
            return f"names {shown!r}, which is not a Patient reference"
        elif m.group(1) != PATIENT or m.group(2) != patient.id:
            return f"names {shown!r}"
        else:
            here = _RESTFUL.match(holder_full_url or "")
            there = _RESTFUL.match(patient.full_url or "")
            if here and there and here.group(1) != there.group(1):
                return f"names {shown!r} on the server {here.group(1)[:80]!r}"
    identifier = getattr(reference, "identifier", None)
    if identifier is not None and identifier.value is not None:
        if (identifier.system, identifier.value) not in patient.identifiers:
            return (f"names the patient with identifier {(identifier.system or '')[:80]}|{identifier.value[:40]}, "
                    "which the Patient does not carry")
    return None


# ----------------------------------------------------------------------------- mapping


class _Mapper:
    """State of one map_bundle call; one method per resource type."""

    def __init__(self, bundle: Any, model: ModelCodes, encounter_id: str | None):
        self.model = model
        self.requested_encounter = encounter_id
        self.by_ref: dict[str, Any] = {}
        self.items: list[tuple[int, str, Any]] = []  # (entry index, reference, resource)
        self.full_urls: dict[int, str | None] = {}  # entry index -> fullUrl
        for i, entry in enumerate(bundle.entry or []):
            resource = entry.resource
            if resource is None:
                continue
            ref = _ref(resource, entry.fullUrl)
            self.items.append((i, ref, resource))
            self.full_urls[i] = entry.fullUrl
            self.by_ref[ref] = resource
            if entry.fullUrl:
                self.by_ref[entry.fullUrl] = resource
        self.rows: list[tuple[str, int, bool, str, float | None, str | None, str]] = []
        self.unmapped: list[dict[str, str]] = []
        self.skipped: dict[str, int] = {}
        self.warnings: list[str] = []

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1

    def add(self, source: str, when: Any, code: str, value: float | None, unit: str | None, ref: str) -> bool:
        """Collects one event (True), or counts why it has no usable time (False)."""
        seconds, date_only, imprecise = _instant(when)
        if imprecise:
            self.skip(IMPRECISE_TIME)
        elif seconds is None:
            self.skip(NO_TIME)
        else:
            self.rows.append((source, seconds, date_only, code, value, unit, ref))
            return True
        return False

    def no_code(self, ref: str, concept: Any) -> None:
        self.skip(NO_CODE)
        codings = _codings(concept)
        if not codings:
            text = getattr(concept, "text", None) if concept is not None else None
            self.unmapped.append({"reference": ref, "system": "", "code": str(text or "")[:128]})
        for c in codings:
            self.unmapped.append({"reference": ref, "system": str(c.system or ""), "code": str(c.code or "")[:128]})

    # --- the patient and the encounter

    def patient(self) -> tuple[str, Any]:
        found = [(i, ref, r) for i, ref, r in self.items if r.get_resource_type() == PATIENT]
        if len(found) != 1:
            raise FhirInputError([("Bundle.entry", f"the Bundle must hold exactly one Patient, found {len(found)}",
                                   "required" if not found else "business-rule")])
        i, ref, resource = found[0]
        self.identity = PatientIdentity(
            reference=ref, id=resource.id, full_url=self.full_urls[i],
            identifiers=frozenset((x.system, x.value) for x in resource.identifier or [] if x.value is not None))
        return ref, resource

    def check_subjects(self) -> None:
        """Refuses the Bundle when any resource's subject / patient is not its Patient (one issue per element)."""
        issues = []
        whose = self.identity.reference + (f" (fullUrl {self.identity.full_url[:120]})"
                                           if self.identity.full_url and self.identity.full_url != self.identity.reference
                                           else "")
        for i, _, resource in self.items:
            if resource.get_resource_type() == PATIENT:
                continue
            for element in PATIENT_ELEMENTS:
                reference = getattr(resource, element, None)
                if reference is None or not hasattr(reference, "reference"):
                    continue  # absent, or an element of that name that is not a Reference
                problem = patient_reference_problem(reference, self.full_urls[i], self.identity)
                if problem:
                    issues.append((f"Bundle.entry[{i}].resource.{element}", f"{resource.get_resource_type()}.{element} "
                                   f"{problem}; the Bundle's Patient is {whose}: a Bundle holds one patient's "
                                   "records, so it is not answered (send another patient's in their own Bundle)",
                                   "business-rule"))
        if issues:
            raise FhirInputError(issues[:20])

    def encounter(self) -> tuple[int, str, Any]:
        found = [(i, ref, r) for i, ref, r in self.items if r.get_resource_type() == ENCOUNTER]
        if self.requested_encounter is not None:
            wanted = [f for f in found if f[2].id == self.requested_encounter or f[1] == self.requested_encounter]
            if not wanted:
                raise FhirInputError([("Bundle.entry", f"no Encounter with id {self.requested_encounter[:64]!r} "
                                                       "in the Bundle", "not-found")])
            return wanted[0]
        if not found:
            raise FhirInputError([("Bundle.entry", "the Bundle must hold the Encounter to predict for", "required")])
        # Earlier encounters are history (their diagnoses count once they ended): the latest is predicted.
        starts = [(_instant(r.period.start if r.period else None)[0], n) for n, (_, _, r) in enumerate(found)]
        if any(s is None for s, _ in starts) and len(found) > 1:
            i = next(found[n][0] for s, n in starts if s is None)
            raise FhirInputError([(f"Bundle.entry[{i}].resource.period.start", "with several Encounters each needs "
                                   "period.start (or name one with the encounter parameter)", "required")])
        return found[max(starts, key=lambda sn: (sn[0] or 0, sn[1]))[1]]

    def previous_discharge(self, encounter: Any, admit_s: int) -> dt.datetime | None:
        """The previous discharge among the Bundle's other Encounters (their period.end), by the job's rule."""
        others = [r for _, _, r in self.items if r.get_resource_type() == ENCOUNTER and r is not encounter]
        starts = [_instant(r.period.start if r.period else None)[0] for r in others]
        ends = [_instant(r.period.end if r.period else None)[0] for r in others]
        placed = [(s, e) for s, e in zip(starts, ends) if s is not None]  # one without a start is never earlier
        found = previous_stay.previous_discharges(
            [0], [admit_s], np.zeros(len(placed), np.int64), np.array([s for s, _ in placed], np.int64),
            np.array([e if e is not None else 0 for _, e in placed], np.int64),
            np.array([e is not None for _, e in placed], bool))
        for reason, what in ((found.skipped_no_discharge, "without period.end"),
                             (found.skipped_after_admit, "that ends after this admission began")):
            if reason[0]:
                self.warnings.append(f"{int(reason[0])} earlier Encounter(s) {what}: not read as the previous "
                                     "discharge")
        return EPOCH + dt.timedelta(seconds=int(found.time[0])) if found.found[0] else None

    def admission_type(self, ref: str, encounter: Any) -> str | None:
        """The MIMIC admission type the Encounter states; None, with a warning, when it states none."""
        for concept in getattr(encounter, "type", None) or []:
            for c in _codings(concept):
                if c.system == codes.MIMIC_ADMISSION_TYPE and c.code:
                    return c.code
        for c in _codings(getattr(encounter, "priority", None)):
            if c.system == codes.ACT_PRIORITY and c.code in codes.ADMISSION_TYPE_FROM_PRIORITY:
                return codes.ADMISSION_TYPE_FROM_PRIORITY[c.code]
        klass = getattr(encounter, "class_fhir", None)
        if klass is not None and klass.code == "EMER":
            return "EMERGENCY"
        # Common in real exports: the risk is still answered (averaged over the training types).
        self.warnings.append(f"{ref}: no admission type (Encounter.priority v3 ActPriority EM, EL or UR, class "
                             f"EMER, or a type coded in {codes.MIMIC_ADMISSION_TYPE})")
        return None

    # --- events

    def observation(self, ref: str, obs: Any) -> None:
        quantity = getattr(obs, "valueQuantity", None)
        ucum = quantity.code if quantity is not None and quantity.system == codes.UCUM else None
        unit = (ucum or (quantity.unit if quantity is not None else None)) or None
        value = _float(quantity.value) if quantity is not None else _float(getattr(obs, "valueInteger", None))
        source, code = None, None
        codings = _codings(obs.code)
        local = {c.system[len(codes.MIMIC_PREFIX):]: c.code for c in codings
                 if c.system and c.system.startswith(codes.MIMIC_PREFIX) and c.code}
        for s in ("lab", "chart", "output"):
            if s in local:
                source, code = s, local[s]
                break
        if source is None:
            for c in codings:
                if c.system != codes.LOINC or not c.code:
                    continue
                items = codes.vital_sign_items(c.code, ucum, self.model.vocabulary)
                if items:
                    source, code = "chart", codes.resolve(items, "chart", self.model.vocabulary)
                    break
                items = codes.lab_items(c.code, self.model.lab_loinc)
                if items:
                    source, code = "lab", codes.resolve(items, "lab", self.model.vocabulary)
                    break
        if source is None or code is None:
            self.no_code(ref, obs.code)
            return
        when = obs.effectiveDateTime or obs.effectiveInstant or (
            obs.effectivePeriod.end if obs.effectivePeriod is not None else None) or obs.issued
        self.add(source, when, code, value, unit, ref)

    def medication_concept(self, resource: Any) -> Any:
        concept = getattr(resource, "medicationCodeableConcept", None)
        reference = getattr(resource, "medicationReference", None)
        if concept is None and reference is not None:
            medication = self.by_ref.get(reference.reference or "")
            concept = getattr(medication, "code", None)
        return concept

    def medication_request(self, ref: str, request: Any) -> None:
        concept = self.medication_concept(request)
        code = None
        for system in (codes.mimic_system("prescription"), codes.MIMIC_DRUG_NAME):
            code = next((c.code for c in _codings(concept) if c.system == system and c.code), None)
            if code:
                break
        if code is None and concept is not None and concept.text:
            code = concept.text.strip() or None  # the free-text drug name, as MIMIC's DRUG column
        if code is None:
            self.no_code(ref, concept)
            return
        self.add("prescription", request.authoredOn, code, None, None, ref)

    def medication_administration(self, ref: str, admin: Any) -> None:
        concept = self.medication_concept(admin)
        code = next((c.code for c in _codings(concept) if c.system == codes.mimic_system("input") and c.code), None)
        if code is None:
            self.no_code(ref, concept)
            return
        dose = admin.dosage.dose if admin.dosage is not None else None
        value = _float(dose.value) if dose is not None else None
        ucum = dose.code if dose is not None and dose.system == codes.UCUM else None
        unit = (ucum or dose.unit) if dose is not None else None
        # An amount is only known once it has been given: the end of the period (MIMIC's ENDTIME).
        when = admin.effectivePeriod.end if admin.effectivePeriod is not None else admin.effectiveDateTime
        self.add("input", when, code, value, unit, ref)

    def coded_billing(self, ref: str, resource: Any, source: str, current: Any) -> None:
        icd9 = next((c.code for c in _codings(resource.code) if c.system == codes.ICD9CM and c.code), None)
        if icd9 is None:
            self.no_code(ref, resource.code)
            return
        encounter = self.by_ref.get(getattr(resource.encounter, "reference", None) or "") \
            if getattr(resource, "encounter", None) is not None else None
        if encounter is not None:
            end = encounter.period.end if encounter.period is not None else None
            if end is None and encounter is current:
                # Codes of the encounter being predicted are known at its discharge: still to come.
                self.skip("known_at_discharge")
                return
            when = end
        elif source == "diagnosis":
            when = resource.recordedDate
        else:
            when = resource.performedPeriod.end if resource.performedPeriod is not None else \
                resource.performedDateTime
        self.add(source, when, codes.icd9_undotted(icd9), None, None, ref)

    # --- all together

    def run(self) -> MappedAdmission:
        patient_ref, patient = self.patient()
        self.check_subjects()
        enc_index, encounter_ref, encounter = self.encounter()
        if patient.birthDate is None or not isinstance(patient.birthDate, dt.date):
            i = next(i for i, _, r in self.items if r is patient)
            raise FhirInputError([(f"Bundle.entry[{i}].resource.birthDate", "the model needs the full birth date "
                                   "(YYYY-MM-DD) to compute the age at admission", "required")])
        start = encounter.period.start if encounter.period is not None else None
        start_s, _, _ = _instant(start)
        if start_s is None or not isinstance(start, dt.datetime):
            raise FhirInputError([(f"Bundle.entry[{enc_index}].resource.period.start", "the encounter needs "
                                   "period.start as a date and time: the admission time", "required")])
        admission_type = self.admission_type(encounter_ref, encounter)
        handlers = {
            OBSERVATION: self.observation,
            MEDICATION_REQUEST: self.medication_request,
            MEDICATION_ADMINISTRATION: self.medication_administration,
            CONDITION: lambda ref, r: self.coded_billing(ref, r, "diagnosis", encounter),
            PROCEDURE: lambda ref, r: self.coded_billing(ref, r, "procedure", encounter),
        }
        for _, ref, resource in self.items:
            kind = resource.get_resource_type()
            if kind in (PATIENT, ENCOUNTER, MEDICATION):
                continue
            if kind not in handlers:
                self.skip(OTHER_TYPE)
            elif _status(resource) in VOID_STATUS:
                self.skip(VOID)
            else:
                handlers[kind](ref, resource)
        events, refs = self.stamp()
        return MappedAdmission(
            patient_reference=patient_ref, encounter_reference=encounter_ref,
            gender=codes.GENDER_FROM_FHIR.get(patient.gender or "", "U"), birth_date=patient.birthDate,
            admit_time=EPOCH + dt.timedelta(seconds=start_s), admission_type=admission_type,
            previous_discharge_time=self.previous_discharge(encounter, start_s), events=events,
            event_references=refs, basis=list(dict.fromkeys(refs)), unmapped=self.unmapped,
            skipped=dict(sorted(self.skipped.items())), warnings=self.warnings)

    def stamp(self) -> tuple[list[dict[str, Any]], list[str]]:
        """Applies each source's known-time rule (bagging.known_time) and lists the events in canonical order.

        Bagging does not depend on the order; the canonical one (time, code, value) makes the
        event list and its references the same however the Bundle ordered its entries.
        """
        known = np.zeros(len(self.rows), dtype=np.int64)
        sources = np.array([r[0] for r in self.rows], dtype=object)
        for source in sorted(set(sources.tolist())):
            at = np.flatnonzero(sources == source)
            recorded = np.array([self.rows[j][1] for j in at], dtype=np.int64)
            dated = np.array([self.rows[j][2] for j in at], dtype=bool)
            known[at] = bagging.known_time(source, recorded, dated)
        full_codes = np.array([f"{r[0]}:{r[3]}" for r in self.rows], dtype=object)
        values = np.array([np.nan if r[4] is None else r[4] for r in self.rows], dtype=np.float64)
        order = bagging.canonical_permutation(known, full_codes, values)
        out, refs = [], []
        for j in order:
            source, _, _, code, value, unit, ref = self.rows[j]
            event: dict[str, Any] = {"time": iso_utc(int(known[j])), "source": source, "code": code}
            if value is not None:
                event["value"] = value
            if unit:
                event["unit"] = unit
            out.append(event)
            refs.append(ref)
        return out, refs


def map_bundle(bundle: Any, model: ModelCodes, encounter_id: str | None = None) -> MappedAdmission:
    """A validated Bundle (read_bundle) -> MappedAdmission for the encounter `encounter_id` (default: the latest)."""
    return _Mapper(bundle, model, encounter_id).run()
