"""Code systems and the tables between FHIR codings and the MIMIC-III codes the model knows.

Everything here is data plus small pure functions; docs/fhir.md prints the tables.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

from ehr_pipeline.encode import units

LOINC = "http://loinc.org"
SNOMED = "http://snomed.info/sct"
UCUM = "http://unitsofmeasure.org"
ICD9CM = "http://hl7.org/fhir/sid/icd-9-cm"
ICD10CM = "http://hl7.org/fhir/sid/icd-10-cm"
OBSERVATION_CATEGORY = "http://terminology.hl7.org/CodeSystem/observation-category"
ACT_CODE = "http://terminology.hl7.org/CodeSystem/v3-ActCode"
ACT_PRIORITY = "http://terminology.hl7.org/CodeSystem/v3-ActPriority"

# The local code system: MIMIC-III codes pass through unchanged when coded with
# MIMIC_PREFIX + source (e.g. lab ITEMIDs under "...:lab", formulary codes under "...:prescription").
MIMIC_PREFIX = "urn:ehr-uncertainty:mimic-iii:"
MIMIC_ADMISSION_TYPE = MIMIC_PREFIX + "admission-type"
MIMIC_SUBJECT_ID = MIMIC_PREFIX + "subject-id"
MIMIC_HADM_ID = MIMIC_PREFIX + "hadm-id"
MIMIC_DRUG_NAME = MIMIC_PREFIX + "drug-name"  # PRESCRIPTIONS.DRUG, the free-text name


def mimic_system(source: str) -> str:
    """The local code system URI of one event source ('lab' -> 'urn:ehr-uncertainty:mimic-iii:lab')."""
    return MIMIC_PREFIX + source


# The outcome the model predicts, as RiskAssessment.prediction.outcome.
DEATH_OUTCOME = {"system": SNOMED, "code": "419620001", "display": "Death (event)"}
DEATH_OUTCOME_TEXT = "In-hospital death"

GENDER_FROM_FHIR = {"male": "M", "female": "F"}  # 'other', 'unknown' and none: 'U' as in training
GENDER_TO_FHIR = {"M": "male", "F": "female", "U": "unknown"}

# Encounter.priority (v3 ActPriority) <-> MIMIC ADMISSION_TYPE; Encounter.class EMER also means EMERGENCY.
ADMISSION_TYPE_FROM_PRIORITY = {"EM": "EMERGENCY", "EL": "ELECTIVE", "UR": "URGENT"}
PRIORITY_FROM_ADMISSION_TYPE = {v: k for k, v in ADMISSION_TYPE_FROM_PRIORITY.items()}


@dataclasses.dataclass(frozen=True)
class VitalSign:
    """One row of the vital-sign table: a LOINC code in one UCUM unit -> MIMIC chart ITEMIDs."""

    loinc: str
    display: str
    ucum: str
    itemids: tuple[str, ...]  # MetaVision first, then CareVue: the first the model knows is used


# Common vital-sign LOINC codes (the FHIR vital-signs profile) -> CHARTEVENTS ITEMIDs.
VITAL_SIGNS: tuple[VitalSign, ...] = (
    VitalSign("8867-4", "Heart rate", "/min", ("220045", "211")),
    VitalSign("9279-1", "Respiratory rate", "/min", ("220210", "618")),
    VitalSign("8310-5", "Body temperature", "Cel", ("223762", "676")),
    VitalSign("8310-5", "Body temperature", "[degF]", ("223761", "678")),
    VitalSign("8480-6", "Systolic blood pressure", "mm[Hg]", ("220179", "455")),
    VitalSign("8462-4", "Diastolic blood pressure", "mm[Hg]", ("220180", "8441")),
    VitalSign("8478-0", "Mean blood pressure", "mm[Hg]", ("220181", "456")),
    VitalSign("59408-5", "Oxygen saturation by pulse oximetry", "%", ("220277", "646")),
    VitalSign("2708-6", "Oxygen saturation in arterial blood", "%", ("220277", "646")),
    VitalSign("29463-7", "Body weight", "kg", ("224639", "763")),
    VitalSign("8302-2", "Body height", "cm", ("226730",)),
    VitalSign("9269-2", "Glasgow coma score total", "{score}", ("198",)),
)

def resolve(candidates: Iterable[str], source: str, vocabulary: Mapping[str, int] | frozenset[str]) -> str | None:
    """The candidate the model knows best: lowest rank in `vocabulary` ('source:code' -> rank, most frequent
    first in training; a set counts as all equal, then table order), else the first candidate; None when none.
    """
    candidates = list(candidates)
    known = [(vocabulary[f"{source}:{c}"] if isinstance(vocabulary, Mapping) else 0, i, c)
             for i, c in enumerate(candidates) if f"{source}:{c}" in vocabulary]
    if known:
        return min(known)[2]
    return candidates[0] if candidates else None


def vital_sign_items(loinc: str, ucum: str | None, vocabulary: Mapping[str, int] | frozenset[str]
                     ) -> tuple[str, ...]:
    """Chart ITEMIDs for a vital-sign LOINC code: the row of the value's unit first, then the others.

    Temperature has a Celsius and a Fahrenheit item: the one of the value's unit is taken when
    the model knows it, otherwise one it knows in the other unit (the service converts the value).
    """
    rows = sorted((v for v in VITAL_SIGNS if v.loinc == loinc), key=lambda v: v.ucum != ucum)
    for row in rows:
        if any(f"chart:{i}" in vocabulary for i in row.itemids):
            return row.itemids
    return rows[0].itemids if rows else ()


def lab_items(loinc: str, bridge: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Lab ITEMIDs for a LOINC code: the bridge's, else those of another LOINC code of the same analyte.

    A site reporting creatinine in umol/L codes it 14682-9 (substance concentration) where
    MIMIC's dictionary says 2160-0 (mass concentration): both name one analyte
    (units.ANALYTES), so the value reaches the model's creatinine and is converted there.
    """
    if loinc in bridge:
        return tuple(bridge[loinc])
    analyte = units.ANALYTE_BY_LOINC.get(loinc)
    if analyte is None:
        return ()
    return tuple(item for sibling in analyte.loinc for item in bridge.get(sibling, ()))


def lab_loinc_bridge(rows: Iterable[Mapping[str, object]]) -> dict[str, list[str]]:
    """LOINC code -> lab ITEMIDs (sorted) from D_LABITEMS rows (ITEMID, LOINC_CODE); blanks skipped."""
    bridge: dict[str, set[str]] = {}
    for row in rows:
        loinc = str(row.get("LOINC_CODE") or "").strip()
        item = row.get("ITEMID")
        if loinc and item is not None:
            bridge.setdefault(loinc, set()).add(str(int(item)))
    return {k: sorted(v, key=int) for k, v in sorted(bridge.items())}


def itemid_loinc(bridge: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """ITEMID -> its LOINC code, the inverse of lab_loinc_bridge (D_LABITEMS gives each item at most one)."""
    return {item: loinc for loinc, items in bridge.items() for item in items}


def icd9_dotted(code: str, procedure: bool) -> str:
    """MIMIC's undotted ICD-9-CM code in the dotted form FHIR uses ('4019' -> '401.9', proc '9604' -> '96.04')."""
    head = 2 if procedure else (4 if code.startswith("E") else 3)
    return code if len(code) <= head else f"{code[:head]}.{code[head:]}"


def icd9_undotted(code: str) -> str:
    """The MIMIC form of an ICD-9-CM code: without its dot ('401.9' -> '4019')."""
    return code.replace(".", "").strip()
