"""MEDS codes <-> this project's events: one code map for the MEDS reader, the converter and the service.

A MEDS code is a string of parts joined by ``//``: ``LAB//50912//mg/dL``,
``HOSPITAL_ADMISSION//EMERGENCY//EMERGENCY ROOM ADMIT``, ``DIAGNOSIS//ICD//9//4019``, ``MEDS_DEATH``.
The model speaks ``source:code`` (``lab:50912``) with the value's unit beside it, so every MEDS
code is read by the first rule of ``MedsCodes.events`` whose ``prefix`` it starts with:

* the parts after the prefix are the code's text (``50912``), or the whole code when it is the prefix alone
  (``HR``); with ``unit: last_part`` the last of
  them is the value's unit (``mg/dL``), as the MIMIC-IV MEDS ETL writes labs, chart items and
  outputs; with ``unit: column`` the unit is the data's ``unit`` column (its inputs);
* ``item_range: [lo, hi]`` makes a rule apply only when the first text part is an integer with
  lo <= item < hi: the MIMIC-IV ETL writes hospital labs AND ICU chart items as ``LAB//<itemid>//<unit>``,
  and only the item id tells them apart (labs 50000-59999 in MIMIC-III and -IV, chart items below or
  from 220000);
* ``known_at: next_discharge`` moves an event to the subject's next hospital discharge at or after it
  (billing codes are assigned after the stay: docs/task.md); ``bagging.known_time`` then applies the
  source's own rule (a prescription at the end of its day) as for every other source.

Codes matching no rule, and the reserved codes below, are not events. Admissions, discharges,
deaths, births and gender are read by their own prefixes to build the built-in task (docs/meds.md).
A part ``UNK`` is what MEDS-Transforms writes for a null column: as a unit or admission type it means
"none". The defaults read the MIMIC-IV MEDS ETL's output and what ``ehr-pipeline to-meds`` writes
(``MIMIC_III_TEMPLATES``, the inverse direction); ``configs/meds_codes.yaml`` lists them.

Cheap to import: pydantic and the standard library only.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from ehr_base import yaml_config
from ehr_base.yaml_config import StrictConfigModel
from ehr_pipeline.contract import spec

SEPARATOR = "//"  # MEDS joins code parts with it
UNKNOWN_PART = "UNK"  # MEDS-Transforms' text for a null code part
MEDS_BIRTH = "MEDS_BIRTH"
MEDS_DEATH = "MEDS_DEATH"

# What a code is, for the MEDS reader (MappedCode.kind).
EVENT = "event"
ADMISSION = "admission"
DISCHARGE = "discharge"
DEATH = "death"
BIRTH = "birth"
GENDER = "gender"
UNMAPPED = "unmapped"

_Source = Literal[spec.SOURCES]  # type: ignore[valid-type]
_StrictInt = Annotated[int, Field(strict=True)]
# YAML gives lists; strict models take tuples only from Python, so these fields accept lists too.
_Strs = Annotated[tuple[str, ...], Field(strict=False)]


class EventRule(StrictConfigModel):
    """MEDS codes starting with ``prefix`` are events of ``source``; see the module docstring."""

    prefix: str = Field(min_length=1, description="Leading parts of the code, '//'-joined, e.g. 'LAB'.")
    source: _Source = Field(description="The project's event source the codes become.")
    unit: Literal["last_part", "column", "none"] = Field(
        "none", description="Where the value's unit is: the code's last part, the data's unit column, or nowhere.")
    item_range: Annotated[tuple[int, int], Field(strict=False)] | None = Field(
        None, description="[lo, hi): only codes whose first text part is an integer in it.")
    known_at: Literal["as_recorded", "next_discharge"] = Field(
        "as_recorded", description="next_discharge: the event is known at the subject's next hospital discharge.")


def _rules(*rows: tuple) -> tuple[EventRule, ...]:
    keys = ("prefix", "source", "unit", "item_range", "known_at")
    return tuple(EventRule(**{k: v for k, v in zip(keys, row) if v is not None}) for row in rows)


DEFAULT_EVENTS = _rules(
    ("LAB", "lab", "last_part", (50000, 60000)),
    ("LAB", "chart", "last_part"),
    ("SUBJECT_FLUID_OUTPUT", "output", "last_part"),
    ("INFUSION_END", "input", "column"),
    ("MEDICATION//START", "prescription"),
    ("DIAGNOSIS//ICD//9", "diagnosis"),
    ("DIAGNOSIS//ICD", "diagnosis"),
    ("PROCEDURE//ICD//9", "procedure", None, None, "next_discharge"),
    ("PROCEDURE//ICD", "procedure", None, None, "next_discharge"),
)


class MedsCodes(StrictConfigModel):
    """How MEDS codes become the project's events and the built-in task's admissions (docs/meds.md)."""

    events: Annotated[tuple[EventRule, ...], Field(strict=False)] = Field(DEFAULT_EVENTS, description="Event rules, first match wins.")
    admission: _Strs = Field(("HOSPITAL_ADMISSION",), description="Prefixes of admission codes.")
    admission_type_part: _StrictInt = Field(
        1, ge=1, description="Which part of an admission code names its type (0 is the prefix).")
    discharge: _Strs = Field(("HOSPITAL_DISCHARGE",), description="Prefixes of discharge codes.")
    died_discharge: _Strs = Field(
        ("HOSPITAL_DISCHARGE//DIED",), description="Discharge codes that say the patient died in hospital.")
    death: _Strs = Field((MEDS_DEATH,), description="Death codes.")
    birth: _Strs = Field((MEDS_BIRTH,), description="Birth codes (the age is computed from them).")
    gender: str = Field("GENDER", description="Prefix of gender codes: GENDER//M, GENDER//F.")
    gender_values: dict[str, Literal["M", "F"]] = Field(
        {"M": "M", "F": "F", "MALE": "M", "FEMALE": "F"},
        description="Gender code part (upper-cased) -> the spec's M / F; anything else is U.")
    unknown_parts: _Strs = Field((UNKNOWN_PART,), description="Parts that mean 'none' (a null column).")
    unit_column: str = Field("unit", description="The data column read by rules with unit: column.")
    admission_attributes: dict[Literal["ethnicity", "insurance"], _Strs] = Field(
        {"ethnicity": ("ethnicity", "race"), "insurance": ("insurance",)},
        description="Columns of the admission code's row that carry the admission's ethnicity and insurance, for "
                    "subgroup reports (the MIMIC-IV ETL writes race and insurance there); the first column present "
                    "is read, none present means not recorded.")

    @pydantic.field_validator("events")
    @classmethod
    def _some_events(cls, value: tuple[EventRule, ...]) -> tuple[EventRule, ...]:
        if not value:
            raise ValueError("at least one event rule is needed")
        return value

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (the job writes it to meds_codes.json; the service reads it back)."""
        return self.model_dump(mode="json")


@dataclasses.dataclass(frozen=True)
class MappedCode:
    """What one MEDS code says: an event ('lab:50912' with its unit), an admission (its type), or another kind."""

    kind: str  # EVENT, ADMISSION, DISCHARGE, DEATH, BIRTH, GENDER or UNMAPPED
    code: str | None = None  # EVENT: 'source:code'
    unit: str | None = None  # EVENT: the unit the code names (unit: last_part), None otherwise
    unit_from_column: bool = False  # EVENT: read the unit from the data's unit column
    next_discharge: bool = False  # EVENT: known at the next discharge
    detail: str | None = None  # ADMISSION: the admission type; DISCHARGE: 'died' or None; GENDER: M / F / U


def _starts(code: str, prefix: str) -> bool:
    return code == prefix or code.startswith(prefix + SEPARATOR)


def _rest(code: str, prefix: str) -> list[str]:
    return code[len(prefix) + len(SEPARATOR):].split(SEPARATOR) if len(code) > len(prefix) else []


class CodeMapper:
    """Maps MEDS codes with a MedsCodes config, one answer cached per distinct code (codes repeat a lot)."""

    def __init__(self, config: MedsCodes) -> None:
        self.config = config
        self._cache: dict[str, MappedCode] = {}

    def __call__(self, code: str) -> MappedCode:
        """The MappedCode of one MEDS code."""
        hit = self._cache.get(code)
        if hit is None:
            hit = self._cache[code] = self._map(code)
        return hit

    def _none(self, part: str | None) -> str | None:
        return None if part is None or part.strip() == "" or part in self.config.unknown_parts else part

    def _map(self, code: str) -> MappedCode:
        cfg = self.config
        if code in cfg.death:
            return MappedCode(DEATH)
        if code in cfg.birth:
            return MappedCode(BIRTH)
        if any(_starts(code, p) for p in cfg.died_discharge):
            return MappedCode(DISCHARGE, detail="died")
        if any(_starts(code, p) for p in cfg.discharge):
            return MappedCode(DISCHARGE)
        for prefix in cfg.admission:
            if _starts(code, prefix):
                parts = code.split(SEPARATOR)
                kind = parts[cfg.admission_type_part] if len(parts) > cfg.admission_type_part else None
                return MappedCode(ADMISSION, detail=self._none(kind) or "UNKNOWN")
        if _starts(code, cfg.gender):
            rest = _rest(code, cfg.gender)
            return MappedCode(GENDER, detail=cfg.gender_values.get(rest[0].strip().upper(), "U") if rest else "U")
        for rule in cfg.events:
            mapped = self._event(code, rule)
            if mapped is not None:
                return mapped
        return MappedCode(UNMAPPED)

    def _event(self, code: str, rule: EventRule) -> MappedCode | None:
        if not _starts(code, rule.prefix):
            return None
        rest = _rest(code, rule.prefix)
        unit = None
        if rule.unit == "last_part" and len(rest) >= 2:
            unit = self._none(rest.pop())
        if rule.item_range is not None:
            try:
                item = int(rest[0]) if rest else None
            except ValueError:
                item = None
            if item is None or not rule.item_range[0] <= item < rule.item_range[1]:
                return None
        try:
            # A code that is the prefix alone ('HR') is its own text: 'chart:HR'.
            text = spec.format_code(rule.source, SEPARATOR.join(rest) if rest else code)
        except ValueError:  # blank or control characters: not an event the model could read
            return MappedCode(UNMAPPED)
        return MappedCode(EVENT, code=text, unit=unit, unit_from_column=rule.unit == "column",
                          next_discharge=rule.known_at == "next_discharge")


# ----------------------------------------------------------------------------- the other direction
# How `ehr-pipeline to-meds` writes each source of MIMIC-III as a MEDS code, after the MIMIC-IV MEDS
# ETL's counterpart: hospital labs and ICU chart items as LAB//<itemid>//<unit> (hosp/labevents,
# icu/chartevents), outputs as SUBJECT_FLUID_OUTPUT//<itemid>//<unit>, what an infusion gave at its end
# as INFUSION_END//<itemid> with the unit in the unit column (icu/inputevents), orders as
# MEDICATION//START//<drug> (hosp/pharmacy), and ICD-9 codes as DIAGNOSIS//ICD//9//<code> and
# PROCEDURE//ICD//9//<code>. {code} is the code's text, {unit} its unit (UNK when there is none).
MIMIC_III_TEMPLATES: dict[str, str] = {
    "lab": "LAB//{code}//{unit}",
    "chart": "LAB//{code}//{unit}",
    "output": "SUBJECT_FLUID_OUTPUT//{code}//{unit}",
    "input": "INFUSION_END//{code}",
    "prescription": "MEDICATION//START//{code}",
    "diagnosis": "DIAGNOSIS//ICD//9//{code}",
    "procedure": "PROCEDURE//ICD//9//{code}",
}
# Sources whose unit goes to the data's unit column rather than into the code (icu/inputevents does so).
UNIT_IN_COLUMN = frozenset({"input"})


def parse_meds_codes(data: Any, source: str = "<dict>") -> MedsCodes:
    """Validates already-parsed YAML/JSON data; raises ConfigError naming each bad field."""
    return yaml_config.validate(MedsCodes, data, source, "MEDS code map")


def load_meds_codes(path: str | os.PathLike[str] | None = None) -> MedsCodes:
    """Reads a MEDS code map (YAML); None gives the defaults (the MIMIC-IV ETL and to-meds)."""
    if path is None:
        return MedsCodes()
    return yaml_config.load(MedsCodes, path, "MEDS code map")
