"""The service's answers in FHIR R4 and CDS Hooks 2.0 form: RiskAssessment, OperationOutcome, cards.

Pure functions of a ``PatientPrediction`` (the same object /v1/predict answers with) and of
what the FHIR mapping reported, so the numbers in every form are the same numbers. The
uncertainty travels in documented extensions (docs/fhir.md).

A RiskAssessment is marked as HL7's AI Transparency on FHIR guide asks: ``meta.security`` AIAST,
a Provenance naming the model (a contained Device with its version and export checksum), the
posterior interval as the guide's AIconfidence Range, and ``qualitativeRisk`` from the interval
and the decision threshold. Our own extensions carry canonical URLs under ``CANONICAL_BASE``,
each defined by a StructureDefinition in ``serving/fhir_definitions/`` that /fhir/r4 serves;
the older ``urn:`` copies stay beside them for the deprecation period docs/fhir.md states.
"""
from __future__ import annotations

import copy
import datetime as dt
import functools
import json
import pathlib
import re
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from ehr_pipeline.fhir import codes
from ehr_pipeline.fhir.mapping import MappedAdmission
from serving.schemas import Calibration, ModelIdentity, PatientPrediction

FHIR_JSON = "application/fhir+json"
EXTENSION = "urn:ehr-uncertainty:fhir:extension:"  # + name; each is described in docs/fhir.md
MODEL_SYSTEM = "urn:ehr-uncertainty:model"
# Our extensions' canonical URLs (+ name): identifiers, as FHIR canonicals are; each names a
# StructureDefinition of DEFINITIONS that the service serves at /fhir/r4/StructureDefinition/{name}.
CANONICAL_BASE = "http://ehr-uncertainty.org/fhir/StructureDefinition/"
DEFINITIONS = pathlib.Path(__file__).resolve().parents[1] / "fhir_definitions"
# HL7 AI Transparency on FHIR (STU1 ballot): the security label of AI-asserted data and the confidence extension.
V3_OBSERVATION_VALUE = "http://terminology.hl7.org/CodeSystem/v3-ObservationValue"
AI_ASSERTED = {"system": V3_OBSERVATION_VALUE, "code": "AIAST", "display": "Artificial Intelligence asserted"}
AI_CONFIDENCE = "http://hl7.org/fhir/uv/aitransparency/StructureDefinition/AIconfidence"
RISK_PROBABILITY = "http://terminology.hl7.org/CodeSystem/risk-probability"
PROVENANCE_PARTICIPANT = "http://terminology.hl7.org/CodeSystem/provenance-participant-type"
UCUM = "http://unitsofmeasure.org"
MODEL_DEVICE_ID = "model"
MAX_LISTED = 50  # unmapped / unknown codes listed in an answer (the counts are exact)
SUMMARY_LIMIT = 140  # CDS Hooks: a card's summary must be shorter than this


def fhir_id(text: str) -> str:
    """A FHIR id ([A-Za-z0-9.-], 1-64 characters) from a request id (which may also hold '_' and ':')."""
    return re.sub(r"[^A-Za-z0-9.-]", "-", text)[:64] or "-"


def clean(text: str) -> str:
    """Text from a request made safe to echo: unpaired surrogates (valid JSON, invalid UTF-8) replaced."""
    return text.encode("utf-8", "replace").decode("utf-8")


def operation_outcome(issues: Iterable[tuple[str, str, str]]) -> dict[str, Any]:
    """An OperationOutcome with one error issue per (FHIRPath expression, message, issue code)."""
    return {"resourceType": "OperationOutcome", "issue": [
        {"severity": "error", "code": code, "diagnostics": clean(message)[:500], "expression": [clean(where)[:200]]}
        for where, message, code in issues]}


def _decimal(url: str, value: float) -> dict[str, Any]:
    return {"url": url, "valueDecimal": float(value)}


def _uncertainty(p: PatientPrediction, num_samples: int, ensemble_size: int) -> dict[str, Any]:
    parts = [
        _decimal("std", p.std),
        _decimal("interval-level", p.interval.level),
        _decimal("interval-lower", p.interval.lower),
        _decimal("interval-upper", p.interval.upper),
        _decimal("predictive-entropy", p.predictive_entropy),
        _decimal("aleatoric", p.aleatoric),
        _decimal("epistemic", p.epistemic),
        *[_decimal("member-probability", m) for m in p.member_probabilities],
        _decimal("decision-threshold", p.decision_threshold),
        _decimal("samples-across-threshold", p.samples_across_threshold),
        {"url": "num-samples", "valueInteger": num_samples},
        {"url": "ensemble-size", "valueInteger": ensemble_size},
    ]
    return {"url": EXTENSION + "prediction-uncertainty", "extension": parts}


def _referral(p: PatientPrediction) -> dict[str, Any]:
    r = p.referral
    parts = [{"url": "refer", "valueBoolean": r.refer}, {"url": "measure", "valueCode": r.measure},
             _decimal("value", r.value), _decimal("rate", r.rate)]
    if r.threshold is not None:
        parts.append(_decimal("threshold", r.threshold))
    return {"url": EXTENSION + "referral", "extension": parts}


def _counts(name: str, counts: dict[str, int]) -> list[dict[str, Any]]:
    return [{"url": EXTENSION + name, "extension": [{"url": "reason", "valueCode": reason},
                                                      {"url": "count", "valueInteger": int(n)}]}
            for reason, n in sorted(counts.items()) if n]


def risk_assessment(mapped: MappedAdmission, p: PatientPrediction, *, model: ModelIdentity,
                    calibration: Calibration, num_samples: int, ensemble_size: int,
                    request_id: str) -> dict[str, Any]:
    """The prediction as a FHIR R4 RiskAssessment: outcome in-hospital death, probability and uncertainty."""
    extensions: list[dict[str, Any]] = [
        {"url": EXTENSION + "events", "extension": [{"url": "received", "valueInteger": p.events.received},
                                                     {"url": "used", "valueInteger": p.events.used}]},
        *_counts("events-ignored", p.events.ignored),
        *_counts("resources-skipped", mapped.skipped),
        *[{"url": EXTENSION + "unmapped-code",
           "valueCoding": {**({"system": clean(u["system"])} if u["system"] else {}),
                           **({"code": clean(u["code"])} if u["code"] else {})}}
          for u in mapped.unmapped[:MAX_LISTED] if u["system"] or u["code"]],
        *[{"url": EXTENSION + "out-of-vocabulary-code", "valueString": clean(c)} for c in p.out_of_vocabulary.codes],
        {"url": EXTENSION + "calibration", "extension": [
            {"url": "split", "valueString": calibration.split},
            {"url": "held-out", "valueBoolean": calibration.held_out},
            *([{"url": "admissions", "valueInteger": calibration.admissions}]
              if calibration.admissions is not None else []),
            {"url": "source", "valueString": calibration.source},
            *([_decimal("ece", calibration.ece)] if calibration.ece is not None else []),
            *([_decimal("nll", calibration.nll)] if calibration.nll is not None else [])]},
    ]
    outcome = {"coding": [dict(codes.DEATH_OUTCOME)], "text": codes.DEATH_OUTCOME_TEXT}
    notes = [*p.warnings, *mapped.warnings[:MAX_LISTED]]
    answer: dict[str, Any] = {
        "resourceType": "RiskAssessment",
        "id": fhir_id(request_id),
        "extension": extensions,
        "status": "final",
        "subject": {"reference": clean(mapped.patient_reference)},
        "encounter": {"reference": clean(mapped.encounter_reference)},
        "occurrenceDateTime": p.prediction_time.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "method": {"coding": [{"system": MODEL_SYSTEM, "version": model.version, "code": model.name,
                               "display": f"{model.name} {model.version}"}],
                   "text": f"{model.name} {model.version} (export sha256 {model.checksum}, {model.precision})"},
        "prediction": [{
            "extension": [_uncertainty(p, num_samples, ensemble_size), _referral(p)],
            "outcome": outcome,
            "probabilityDecimal": p.probability,
            "rationale": f"mean of {num_samples} x {ensemble_size} sampled probabilities of a rank-1 Bayesian "
                         "model; the spread is the model's uncertainty",
        }],
    }
    if p.prediction_id is not None:  # the key of POST /v1/outcomes (an outcome store is configured)
        answer["identifier"] = [{"system": EXTENSION + "prediction-id", "value": p.prediction_id}]
    if mapped.basis:
        answer["basis"] = [{"reference": clean(ref)} for ref in mapped.basis]
    if notes:
        answer["note"] = [{"text": clean(n)} for n in notes]
    return with_ai_transparency(answer, p, model)


# ----------------------------------------------------------------------------- AI transparency


@functools.cache
def structure_definitions() -> dict[str, dict[str, Any]]:
    """Our extensions' StructureDefinitions by id, as shipped in DEFINITIONS (read once)."""
    return {d["id"]: d for d in (json.loads(f.read_text(encoding="utf-8"))
                                 for f in sorted(DEFINITIONS.glob("StructureDefinition-*.json")))}


def qualitative_risk(p: PatientPrediction) -> dict[str, Any]:
    """risk-probability 'high' when the whole interval lies above the decision threshold, 'low' when it lies at or
    below it, else 'moderate' (the samples disagree about the side): the rule docs/fhir.md states."""
    threshold = p.decision_threshold
    code = "high" if p.interval.lower > threshold else "low" if p.interval.upper <= threshold else "moderate"
    return {"coding": [{"system": RISK_PROBABILITY, "code": code, "display": code.capitalize() + " likelihood"}]}


def _percent_quantity(x: float) -> dict[str, Any]:
    return {"value": round(100.0 * float(x), 6), "unit": "%", "system": UCUM, "code": "%"}


def _canonical_copies(extensions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each urn: extension again under its canonical URL (sub-extension urls are relative names, kept)."""
    return [{**copy.deepcopy(e), "url": CANONICAL_BASE + e["url"][len(EXTENSION):]}
            for e in extensions if e["url"].startswith(EXTENSION)]


def with_ai_transparency(answer: dict[str, Any], p: PatientPrediction, model: ModelIdentity) -> dict[str, Any]:
    """The RiskAssessment marked as the AI Transparency guide asks, and its extensions under canonical URLs too."""
    device = {"resourceType": "Device", "id": MODEL_DEVICE_ID,
              "deviceName": [{"name": model.name, "type": "model-name"}],
              "version": [{"type": {"text": "model version"}, "value": model.version},
                          {"type": {"text": "export manifest sha256"}, "value": model.checksum},
                          {"type": {"text": "served precision"}, "value": model.precision}],
              "note": [{"text": "Research model, not a medical device."}]}
    provenance = {"resourceType": "Provenance", "id": "provenance", "target": [{"reference": "#"}],
                  "recorded": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
                  "agent": [{"type": {"coding": [{"system": PROVENANCE_PARTICIPANT, "code": "author",
                                                  "display": "Author"}]},
                             "who": {"reference": f"#{MODEL_DEVICE_ID}", "display": f"{model.name} {model.version}"}}]}
    prediction = answer["prediction"][0]
    prediction["qualitativeRisk"] = qualitative_risk(p)
    prediction["extension"] = [
        *prediction["extension"], *_canonical_copies(prediction["extension"]),
        {"url": AI_CONFIDENCE, "valueRange": {"low": _percent_quantity(p.interval.lower),
                                              "high": _percent_quantity(p.interval.upper)}}]
    marked = {"resourceType": answer["resourceType"], "id": answer["id"],
              "meta": {"security": [dict(AI_ASSERTED)]}, "contained": [device, provenance]}
    rest = {k: v for k, v in answer.items() if k not in marked}
    rest["extension"] = [*answer["extension"], *_canonical_copies(answer["extension"])]
    return {**marked, **rest, "performer": {"reference": f"#{MODEL_DEVICE_ID}"}}


# ----------------------------------------------------------------------------- CDS Hooks


def _percent(x: float) -> str:
    return f"{round(100 * x)}"


def card_summary(p: PatientPrediction) -> str:
    """'In-hospital mortality risk 23% (95%: 15-31%)': always under 140 characters."""
    return (f"In-hospital mortality risk {_percent(p.probability)}% "
            f"({round(100 * p.interval.level)}%: {_percent(p.interval.lower)}-{_percent(p.interval.upper)}%)")


def card_indicator(p: PatientPrediction) -> str:
    """'critical' above the decision threshold, else 'warning' when the model is unsure enough to refer, else 'info'."""
    if p.predicted_positive:
        return "critical"
    return "warning" if p.refer else "info"


def card_detail(p: PatientPrediction, mapped: MappedAdmission, calibration: Calibration, num_samples: int,
                ensemble_size: int) -> str:
    """Markdown: the probability, the uncertainty decomposition, the referral, the calibration and its source, input."""
    r = p.referral
    threshold = "every case is referred" if r.threshold is None else f"threshold {r.threshold:.4g}"
    lines = [
        f"**Probability of in-hospital death:** {100 * p.probability:.1f}% (95% interval "
        f"{100 * p.interval.lower:.1f}-{100 * p.interval.upper:.1f}%, std {100 * p.std:.1f}%), the mean of "
        f"{num_samples} x {ensemble_size} model samples. Decision threshold {100 * p.decision_threshold:.0f}%.",
        "",
        "| uncertainty | nats |",
        "| --- | --- |",
        f"| total (predictive entropy) | {p.predictive_entropy:.4f} |",
        f"| aleatoric (expected entropy: noise in the data) | {p.aleatoric:.4f} |",
        f"| epistemic (mutual information: the model's own doubt) | {p.epistemic:.4f} |",
        "",
        f"**Referral:** {'refer to a clinician' if r.refer else 'not flagged'} ({r.measure} {r.value:.4g}; "
        f"{threshold}, chosen to refer {100 * r.rate:.0f}% of validation cases).",
        "",
        f"**Calibration on {calibration.source}:** ECE "
        f"{'n/a' if calibration.ece is None else f'{calibration.ece:.3f}'}, NLL "
        f"{'n/a' if calibration.nll is None else f'{calibration.nll:.3f}'}.",
        "",
        f"**Input:** {p.events.used} of {p.events.received} events used; {len(mapped.unmapped)} codings could "
        f"not be mapped; {p.out_of_vocabulary.count} codes unknown to the model.",
    ]
    for warning in [*p.warnings, *mapped.warnings][:5]:
        lines.append(f"- {clean(warning)}")
    lines += ["", "Research model, not a medical device."]
    return "\n".join(lines)


def card(p: PatientPrediction, mapped: MappedAdmission, *, model: ModelIdentity, calibration: Calibration,
         num_samples: int, ensemble_size: int, model_url: str | None) -> dict[str, Any]:
    """One CDS Hooks 2.0 card for a prediction."""
    source: dict[str, Any] = {"label": f"{model.name} {model.version}"}
    if model_url:
        source["url"] = model_url
    return {"uuid": str(uuid.uuid4()), "summary": card_summary(p), "indicator": card_indicator(p),
            "detail": card_detail(p, mapped, calibration, num_samples, ensemble_size), "source": source}


def prefetch_templates() -> dict[str, str]:
    """Prefetch templates: the patient, the encounter, and the patient's records (history counts, as in training)."""
    patient = "{{context.patientId}}"
    return {
        "patient": f"Patient/{patient}",
        "encounter": "Encounter/{{context.encounterId}}",
        "encounters": f"Encounter?patient={patient}",
        "observations": f"Observation?patient={patient}",
        "medicationRequests": f"MedicationRequest?patient={patient}",
        "medicationAdministrations": f"MedicationAdministration?patient={patient}",
        "conditions": f"Condition?patient={patient}",
        "procedures": f"Procedure?patient={patient}",
    }


REQUIRED_PREFETCH = ("patient",)


def prefetch_bundle(prefetch: dict[str, Any], keys: Sequence[str],
                    fhir_server: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A collection Bundle of every resource in the prefetch (single resources and searchset Bundles alike),
    and where each entry came from ('prefetch.observations.entry[3].resource'), for error messages.

    Each entry keeps the fullUrl its searchset gave it, else gets fhir_server/Type/id: references
    to the client's server (relative or absolute) then resolve to these very resources.
    """
    entries: list[dict[str, Any]] = []
    origins: list[str] = []
    seen: set[str] = set()
    base = fhir_server.rstrip("/") if fhir_server and fhir_server.startswith(("http://", "https://")) else None
    for key in keys:
        item = prefetch.get(key)
        if not isinstance(item, dict):
            continue
        if item.get("resourceType") == "Bundle":
            found = [(f"prefetch.{key}.entry[{j}].resource", e.get("resource"), e.get("fullUrl"))
                     for j, e in enumerate(item.get("entry") or []) if isinstance(e, dict)]
        else:
            found = [(f"prefetch.{key}", item, None)]
        for origin, resource, full_url in found:
            if not isinstance(resource, dict):
                continue
            ident = f"{resource.get('resourceType')}/{resource.get('id')}"
            if resource.get("id") is not None and ident in seen:
                continue  # the encounter comes both alone and in the encounter search
            seen.add(ident)
            entry: dict[str, Any] = {"resource": resource}
            if isinstance(full_url, str) and full_url:
                entry["fullUrl"] = full_url
            elif base and isinstance(resource.get("id"), str) and isinstance(resource.get("resourceType"), str):
                entry["fullUrl"] = f"{base}/{ident}"
            entries.append(entry)
            origins.append(origin)
    return {"resourceType": "Bundle", "type": "collection", "entry": entries}, origins


def capability_statement(software_version: str) -> dict[str, Any]:
    """The service's CapabilityStatement (R4): the $predict-mortality operation and the definitions it serves."""
    return {
        "resourceType": "CapabilityStatement", "status": "active", "date": dt.date.today().isoformat(),
        "kind": "instance",
        "publisher": "ehr-uncertainty", "fhirVersion": "4.0.1", "format": ["json"],
        "software": {"name": "ehr-uncertainty prediction service", "version": software_version},
        "implementation": {"description": "In-hospital mortality risk with its uncertainty from a rank-1 Bayesian "
                                          "model; research model, not a medical device."},
        "rest": [{
            "mode": "server",
            "security": {"description": "The operation takes an API key (X-API-Key header or 'Authorization: Bearer "
                                        "<key>'); this statement and the StructureDefinitions are open."},
            "resource": [{"type": "StructureDefinition", "interaction": [{"code": "read"}],
                          "supportedProfile": sorted(d["url"] for d in structure_definitions().values())}],
            "operation": [{"name": "predict-mortality", "definition": CANONICAL_BASE.replace(
                "StructureDefinition", "OperationDefinition") + "predict-mortality",
                "documentation": "POST a Bundle of one patient's records; the answer is a RiskAssessment "
                                 "(docs/fhir.md)."}],
        }],
    }
