"""Request and response bodies of the service (pydantic), with descriptions and examples for /docs, and
``InputError``: a request that fits them but makes no sense, which ``serving.api.errors`` answers 422.

Requests reject unknown fields (a typo such as ``"admit_tim"`` must not silently fall back to
a default) and text that cannot be encoded as UTF-8. Times are ISO 8601 strings: a bare
number is refused because "seconds or milliseconds since 1970?" has no safe answer. A time
without a UTC offset is read as UTC, which is how MIMIC-style (date-shifted) times are
stored by the pipeline.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import bagging, units

MAX_TEXT = 128  # longest code / admission type / unit / id accepted, characters


class InputError(ValueError):
    """A request that fits the schemas below but makes no sense (answered 422); loc names the field."""

    def __init__(self, loc: tuple[str | int, ...], msg: str, kind: str = "value_error"):
        super().__init__(msg)
        self.loc = loc
        self.msg = msg
        self.kind = kind


def _require_iso_text(value: Any) -> Any:
    """Only strings may become times: a bare number has no unit anyone could agree on."""
    if not isinstance(value, str):
        raise ValueError("must be an ISO 8601 string, e.g. '2150-03-01T08:30:00'")
    return value


def _utf8_text(value: str) -> str:
    """Text must survive UTF-8 encoding: JSON allows lone surrogates ('\\ud800'), protobuf does not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode text (no unpaired surrogates)") from None
    return value


def _no_control_characters(value: str) -> str:
    """The job drops codes with control characters (events.BAD_CODE); the service refuses them."""
    if re.search(spec.CODE_CONTROL_CHARACTERS, value):
        raise ValueError("must not hold control characters (U+0000-U+001F, U+007F)")
    return value


def _no_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


IsoDateTime = Annotated[dt.datetime, BeforeValidator(_require_iso_text)]
IsoDate = Annotated[dt.date, BeforeValidator(_require_iso_text)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_utf8_text), AfterValidator(_no_blank),
                AfterValidator(_no_control_characters)]
# An event code: trimmed of surrounding whitespace and checked by the spec's own function, the
# one the job's codes went through, so " 50912" is the model's "lab:50912".
Code = Annotated[str, Field(min_length=1, max_length=MAX_TEXT), AfterValidator(_utf8_text),
                 AfterValidator(spec.code_text)]
Source = Literal[spec.SOURCES]  # type: ignore[valid-type]  # the spec's sources, one list for all
Gender = Literal[spec.GENDERS]  # type: ignore[valid-type]

_STRICT_FLOAT = dict(strict=True, allow_inf_nan=False)  # no "1.5" strings, no NaN / Infinity


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Patient(_Request):
    """Who the patient is; give exactly one of date_of_birth and age_years."""

    # The schema states the rule the validator below enforces, so clients (and schema-driven
    # fuzzers) see it: one of the two keys, never both, never neither.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"required": ["date_of_birth"], "not": {"required": ["age_years"]}},
        {"required": ["age_years"], "not": {"required": ["date_of_birth"]}},
    ]})

    gender: Gender = Field(description="'M', 'F' or 'U' (unknown), as in the training data.", examples=["F"])
    date_of_birth: IsoDate | None = Field(
        None, description="Date of birth (YYYY-MM-DD); the age at admission is computed on the calendar "
                          "exactly as in training, then capped at 90.", examples=["2080-05-17"])
    age_years: float | None = Field(
        None, ge=0.0, le=150.0, description="Age at admission in years, if the date of birth is not "
                                            "given; capped at 90 like the training data.",
        examples=[67.5], **_STRICT_FLOAT)

    @model_validator(mode="after")
    def _one_age(self) -> Patient:
        if (self.date_of_birth is None) == (self.age_years is None):
            raise ValueError("give exactly one of date_of_birth and age_years")
        return self


class AdmissionRequest(_Request):
    """The hospital admission the prediction is about, as a request states it."""

    admit_time: IsoDateTime = Field(description="Admission time, ISO 8601; no offset means UTC.",
                                    examples=["2150-03-01T08:30:00"])
    admission_type: Text | None = Field(
        None, description="MIMIC-III ADMISSION_TYPE as in the training data, e.g. EMERGENCY, ELECTIVE, URGENT. "
                          "null or left out when unknown: the risk is then averaged over the training admission "
                          "types by their training frequency, with a warning. A type the training data never "
                          "held is refused.", examples=["EMERGENCY"])
    previous_discharge_time: IsoDateTime | None = Field(
        None, description="Discharge time of the patient's previous hospital admission, ISO 8601; no offset means "
                          "UTC. It must not be after admit_time (the latest discharge at or before it, as the "
                          "training data took it). null or left out: no previous admission, as the training data "
                          "records an admission without one.", examples=["2150-01-12T14:00:00"])


class Event(_Request):
    """One timestamped observation: a lab result, chart entry, drug, diagnosis, ..."""

    time: IsoDateTime = Field(description=(
        "When the event became known, ISO 8601; no offset means UTC. As in training: lab, chart, output "
        "at the time charted or resulted; input at the end of what was given (MetaVision ENDTIME); "
        "prescription at its start date (the service moves it to 23:59:59 of that day); diagnosis and "
        "procedure at the discharge of the admission they were coded for. Events at or after the "
        "prediction time are ignored and counted."), examples=["2150-03-01T10:00:00"])
    source: Source | None = Field(
        None, description=f"Event table, one of {', '.join(spec.SOURCES)}; required by a model trained on MIMIC-III "
                          "tables, left out for a model trained on MEDS data (its codes name their source).",
        examples=["lab"])
    code: Code = Field(description="The code within its source (MIMIC ITEMID, ICD-9 code, drug name, ...); "
                                   "surrounding whitespace is trimmed and the model sees 'source:code'. For a "
                                   "model trained on MEDS data (model card: meds_codes), the MEDS code, e.g. "
                                   "'LAB//50912//mg/dL', read with the model's code map (docs/meds.md).",
                       examples=["50912"])
    value: float | None = Field(None, description="Numeric value, if any (text results: leave it out).",
                                examples=[1.4], **_STRICT_FLOAT)
    unit: Text | None = Field(None, description=(
        "Unit of the value as recorded: UCUM ('umol/L', 'meq/L', '10*3/uL') or a common spelling ('mEq/L', 'K/uL', "
        "'mmHg'). The value is converted to the unit the model was trained on (mass <-> substance "
        "concentrations by the analyte's molar mass); a value whose unit cannot be converted is not used "
        "and the answer warns. Without a unit the value is taken to be in the model's unit."),
        examples=["mg/dL"])


class PredictRequest(_Request):
    """One admission to score."""

    id: Text | None = Field(None, description="Your reference for this admission, echoed back; never logged.",
                            examples=["bed-12"])
    patient: Patient
    admission: AdmissionRequest
    prediction_time: IsoDateTime | None = Field(
        None, description="Predict as of this time; default: admit_time + the model's trigger offset "
                          "(the time point it was trained for). Must not precede admit_time.")
    events: list[Event] = Field(default_factory=list, description="The admission's events, in any order: "
                                                                   "the answer does not depend on it.")

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [{
        "id": "bed-12",
        "patient": {"gender": "F", "date_of_birth": "2080-05-17"},
        "admission": {"admit_time": "2150-03-01T08:30:00", "admission_type": "EMERGENCY"},
        "events": [
            {"time": "2150-03-01T09:10:00", "source": "lab", "code": "50912", "value": 1.4, "unit": "mg/dL"},
            {"time": "2150-03-01T09:15:00", "source": "chart", "code": "220045", "value": 112},
            {"time": "2150-03-01T11:00:00", "source": "prescription", "code": "Vancomycin"},
        ],
    }]})


class BatchRequest(_Request):
    """Several admissions scored in one call (one vectorised forward pass)."""

    patients: list[PredictRequest] = Field(min_length=1, description="The admissions to score, in order.")


# ----------------------------------------------------------------------------- responses


class ModelIdentity(BaseModel):
    """Which exported model answered."""

    name: str = Field(description="The model's name: its folder in the server's model repository, else "
                                  "model_card.json's name.", examples=["rank1-lstm-mimic"])
    version: str = Field(description="The version that answered: its folder in the model repository (a positive "
                                     "integer), else model_card.json's version.", examples=["1.0.0"])
    checksum: str = Field(description="SHA-256 of the export's manifest.json, which pins every file's hash.")
    precision: Literal["float32", "bfloat16"] = Field(
        "float32", description="Operand precision of the LSTM's matmuls in the signature that answered "
                               "(ehr-serve --precision).")
    selected_by: Literal["default", "split", "request"] = Field(
        "default", description="How this version was chosen: the server's default version, the traffic split "
                               "(by a hash of the admission: the same admission always gets the same version), or "
                               "the request (OIP's /v2/models/NAME/versions/V).")


class Calibration(BaseModel):
    """How well calibrated the model was, and on which admissions (from metrics.json, not this request).

    A trained or ensemble export's numbers come from the held-out test split of its data; an export
    updated at a new site (ehr-adapt) scored the local admissions the update was fitted on, so its
    numbers are in-sample (``held_out`` false) and flatter the model.
    """

    split: str = Field(description="The data split the numbers were computed on: 'test' of the training data, or "
                                   "the split of the site's data an update was fitted on.", examples=["test"])
    held_out: bool = Field(description="True when the model was not fitted on these admissions; false: in-sample "
                                       "(an updated export's local admissions), optimistic.")
    admissions: int | None = Field(description="Admissions the numbers are over (null where metrics.json does "
                                               "not say).", examples=[48])
    source: str = Field(description="Where the numbers come from, in words (the CDS card and FHIR answer say the "
                                    "same).", examples=["the held-out test split (48 admissions)"])
    ece: float | None = Field(description="Expected calibration error (15 bins), lower is better.")
    nll: float | None = Field(description="Negative log-likelihood per admission, nats.")


class Interval(BaseModel):
    """Central interval of the sampled probabilities."""

    level: float = Field(0.95, description="Coverage of the interval.")
    lower: float = Field(description="2.5th percentile of the S*K sampled probabilities.")
    upper: float = Field(description="97.5th percentile of the S*K sampled probabilities.")


class Referral(BaseModel):
    """Whether to refer this case to a clinician because the model is unsure."""

    refer: bool = Field(description="True when this case's uncertainty exceeds the threshold.")
    measure: str = Field(description="Uncertainty measure the threshold applies to.",
                         examples=["predictive_entropy"])
    value: float = Field(description="This case's value of that measure.")
    threshold: float | None = Field(description="Refer when value > threshold (chosen on validation data); "
                                                 "null means every case is referred.")
    rate: float = Field(description="Share of validation cases the threshold refers.")


class EventCounts(BaseModel):
    """What happened to the request's events."""

    received: int = Field(description="Events in the request.")
    used: int = Field(description="Events that went into the model's time bags.")
    ignored: dict[str, int] = Field(
        description=f"Events not used, by reason: '{bagging.DROP_AT_OR_AFTER_TRIGGER}' (at or after the "
                    f"prediction time) and '{bagging.DROP_OLDER_THAN_MAX_BAGS}' (beyond the model's history).")
    values: dict[str, int] = Field(default_factory=dict, description=(
        f"Numeric values by what their unit needed: '{units.SAME}' (the model's unit), '{units.CONVERTED}', "
        f"'{units.NO_UNIT}' (taken to be in the model's unit), '{units.UNCHECKED}' (the model saw this code "
        f"without a unit), and not used (see warnings): '{units.NOT_CONVERTIBLE}', '{units.AMBIGUOUS}' (a unit "
        f"whose letter case decides its meaning, written in one case), '{units.PLACEHOLDER}' ('N/A', 'NULL', ...) "
        f"and '{units.IMPLAUSIBLE}' (converted, the values would lie over 1000 times from the training median)."))


class OutOfVocabulary(BaseModel):
    """Codes the model never learned (they share one 'unknown' embedding)."""

    count: int = Field(description="Distinct unknown codes.")
    codes: list[str] = Field(description="The first of them ('source:code'), sorted.")


class PatientPrediction(BaseModel):
    """The prediction for one admission, with its uncertainty."""

    id: str | None = Field(None, description="The request's id, if it gave one.")
    probability: float = Field(description="Predictive mean probability of in-hospital death "
                                           "(mean over all S*K samples).", examples=[0.12])
    std: float = Field(description="Standard deviation of the S*K sampled probabilities.")
    interval: Interval
    predictive_entropy: float = Field(description="Total uncertainty H[E p], nats.")
    aleatoric: float = Field(description="Expected entropy E H[p] (noise in the data), nats.")
    epistemic: float = Field(description="Mutual information H[E p] - E H[p] (model uncertainty), nats.")
    member_probabilities: list[float] = Field(description="Each ensemble member's mean over its S samples.")
    decision_threshold: float = Field(description="Positive when probability > this (from metrics.json).")
    predicted_positive: bool = Field(description="probability > decision_threshold.")
    samples_across_threshold: float = Field(
        description="Share of the S*K samples on the other side of the decision threshold from the mean.")
    refer: bool = Field(description="Shortcut for referral.refer.")
    referral: Referral
    events: EventCounts
    out_of_vocabulary: OutOfVocabulary
    prediction_time: dt.datetime = Field(description="The prediction time used (UTC).")
    age_years: float = Field(description="Age at admission fed to the model, years (capped at 90).")
    warnings: list[str] = Field(default_factory=list,
                                description="Ways this input differs from what the model was trained on.")
    samples: list[float] | None = Field(
        None, description="All S*K sampled probabilities, sample-major (column s*K + k), with include_samples=true.")
    prediction_id: str | None = Field(
        None, description="Key of this prediction in the server's outcome store: POST its outcome to /v1/outcomes "
                          "when known. Null when the server keeps no outcomes (no --outcome-dir).")


class _Answer(BaseModel):
    num_samples: int = Field(description="Samples S per ensemble member.", examples=[25])
    ensemble_size: int = Field(description="Ensemble members K.", examples=[4])
    model: ModelIdentity
    calibration: Calibration
    request_id: str = Field(description="Also in the X-Request-ID header; quote it when reporting a problem.")


class PredictResponse(_Answer, PatientPrediction):
    """POST /v1/predict answer."""


class BatchResponse(_Answer):
    """POST /v1/predict/batch answer: predictions in request order."""

    predictions: list[PatientPrediction]


class PrecisionInfo(BaseModel):
    """Which signature answers and why (ehr-serve --precision; auto measures at warm-up)."""

    requested: Literal["auto", "float32", "bfloat16"] = Field(description="ehr-serve --precision.")
    served: Literal["float32", "bfloat16"] = Field(description="The signature answering now.")
    reason: str = Field(description="Why: the flag, or what auto measured on this machine.")
    float32_ms: float | None = Field(None, description="auto: median float32 pass for one full-history "
                                                       "admission at the default num_samples, ms.")
    bfloat16_ms: float | None = Field(None, description="auto: the same for bfloat16, ms.")
    max_mean_diff: float | None = Field(None, description="auto: largest |bfloat16 - float32| predictive mean "
                                                          "over the warm-up admissions, same seed.")
    max_sample_diff: float | None = Field(None, description="auto: largest |bfloat16 - float32| single sampled "
                                                            "probability, same admissions and seed.")


class VersionState(BaseModel):
    """One version of the served model, as this server holds it."""

    version: str = Field(description="The version's folder in the model repository (or model_card.json's version).")
    state: Literal["ready", "warming_up", "failed"] = Field(description="failed: it did not load (reason says why); "
                                                                        "the other versions serve.")
    default: bool = Field(description="Answers admissions the traffic split does not send elsewhere.")
    share_percent: int = Field(description="Percent of admissions the traffic split sends to it (100 for the "
                                           "default without a split).")
    reason: str | None = Field(None, description="Why it did not load, in one line.")


class ModelInfo(BaseModel):
    """GET /v1/model answer."""

    model: ModelIdentity
    precision: PrecisionInfo
    model_card: dict[str, Any] = Field(description="model_card.json as exported.")
    metrics: dict[str, Any] = Field(description="metrics.json as exported (held-out test metrics, referral).")
    pipeline_config: dict[str, Any] = Field(description="pipeline_config.json: how training data was bagged.")
    vocabulary_size: int = Field(description="Codes the model knows, all sources.")
    limits: dict[str, int] = Field(description="This server's request limits.")
    versions: list[VersionState] = Field(
        default_factory=list, description="Every version of the model this server holds; `model` and the rest "
                                          "describe the default.")


class ShiftFinding(BaseModel):
    """One way the recent admissions differ from the training population (docs/shift.md)."""

    kind: str = Field(description="unit_mismatch, value_shift, not_convertible, units_converted, oov_share, "
                                   "code_presence, events_per_admission, case_mix or uncertainty.")
    severity: Literal["none", "moderate", "severe"]
    subject: str = Field(description="The code ('lab:50912'), source ('chart'), case-mix field or 'model'.")
    message: str = Field(description="What differs, in words.",
                         examples=["lab:50912 values are ~88x the training median (1 mg/dL -> 88 mg/dL; PSI 7.5): "
                                   "likely umol/L labelled as mg/dL"])
    numbers: dict[str, Any] = Field(description="The numbers behind the message (PSI, medians, shares, ...).")


class MonitorResponse(BaseModel):
    """GET /v1/monitor answer: the shift report of the service's recent admissions."""

    level: Literal["none", "moderate", "severe", "unavailable", "error"] = Field(
        description="The worst finding's severity; 'unavailable' when the export carries no reference population "
                    "or the monitor is off; 'error' when the report of the window could not be made (see 'error').")
    admissions: int = Field(description="Admissions in the window now.")
    window: int = Field(description="Most recent admissions the monitor keeps (the server's --monitor-window).")
    findings: list[ShiftFinding] = Field(description="Findings above the thresholds, worst first.")
    summary: dict[str, Any] = Field(description="What was compared: sizes, tests, worst PSI, out-of-vocabulary "
                                                "shares, converted values, mutual information, thresholds.")
    error: str | None = Field(None, description="Why there is no report when level is 'error' (one line; the "
                                                "server logs the traceback and counts it in "
                                                "ehr_monitor_errors_total).")
    age_s: float | None = Field(None, description="Seconds since this report was made (at most about "
                                                  "--monitor-refresh-s when admissions keep coming); null when none "
                                                  "was made.")
    model: ModelIdentity
    performance_estimate: dict[str, Any] | None = Field(
        None, description="The performance the model expects over the window's admissions before their outcomes "
                          "arrive: per metric (auc_roc, auc_pr, brier, observed_expected) the estimate and its 90% "
                          "interval, and net benefit at the decision thresholds, from outcomes drawn from each "
                          "admission's sampled probabilities (docs/shift.md 'Expected performance before outcomes'); it holds "
                          "only if the model is calibrated for this population. Null before any admission.")
    outcomes: dict[str, Any] | None = Field(
        None, description="With an outcome store: the outcomes received, realized performance beside the "
                          "performance expected on the same predictions, and the O/E alarm (docs/serving.md "
                          "'Outcomes'); outcomes are matched to their prediction, not to the window.")


class OutcomeRequest(BaseModel):
    """POST /v1/outcomes body: the outcome of one answered admission."""

    model_config = ConfigDict(extra="forbid")

    prediction_id: str = Field(min_length=1, max_length=64, description="The prediction_id of the answer.")
    outcome: Literal[0, 1] = Field(description="1: died in hospital, 0: discharged alive.")


class OutcomeResponse(BaseModel):
    """POST /v1/outcomes answer."""

    prediction_id: str
    stored: bool = Field(description="True when this call stored the outcome; false when the same outcome was "
                                     "stored before (sending it again changes nothing).")


class Health(BaseModel):
    """GET /healthz and /readyz answer."""

    status: Literal["ok", "starting"] = Field(description="'ok', or 'starting' while the model warms up.")


class ErrorItem(BaseModel):
    """One problem with a request."""

    loc: list[str | int] = Field(description="Where: e.g. ['body', 'events', 3, 'time'] or ['query', 'num_samples'].")
    msg: str = Field(description="What is wrong.")
    type: str = Field(description="Machine-readable kind of problem.")


class ErrorResponse(BaseModel):
    """Every 4xx/5xx answer."""

    detail: list[ErrorItem] | str
    request_id: str | None = None
