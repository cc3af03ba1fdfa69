"""FHIR R4 and CDS Hooks 2.0 routes, with the auth, limits, metrics and encoding path of /v1/predict.

* ``POST /fhir/r4/$predict-mortality``: a Bundle for one patient and encounter -> RiskAssessment;
  a body that is not JSON -> 400, invalid FHIR or a Bundle the model cannot use -> 422, each an
  OperationOutcome naming the element.
* ``GET /cds-services``: CDS Hooks discovery (patient-view and encounter-start services).
* ``POST /cds-services/{id}``: a hook call -> cards. A prefetch without the Patient is answered
  412 as the spec says; this service never queries the client's FHIR server. A context whose
  patientId (or encounterId) is not the prefetched one is refused (422), never answered.

A Bundle is one patient's records: any resource whose subject or patient is someone else
refuses it (422 naming the element and both references), and an Encounter that does not
state its admission type is answered with the risk averaged over the training types and a
warning (``serving.inference.admission_type``).

A Bundle is validated by ``fhir.resources`` and mapped by ``ehr_pipeline.fhir.mapping``; the
result becomes a ``PredictRequest`` and goes through ``prediction.predict_admissions``, the very
function behind /v1/predict (bagging, encoding, micro-batching, uncertainty, metrics).
"""
from __future__ import annotations

import json
import logging
import re
from typing import Annotated, Any

import pydantic
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from ehr_pipeline.fhir.mapping import FhirInputError, MappedAdmission, ModelCodes, map_bundle, read_bundle
from serving import __version__
from serving.api import fhir_answers
from serving.api.auth import require_api_key
from serving.api.dependencies import NumSamplesQuery, SeedQuery, Serving, ServingDep
from serving.inference.model_versions import key_of
from serving.inference.prediction import (
    check_event_limit,
    calibration,
    model_identity,
    predict_admissions,
    resolve_num_samples,
)
from serving.schemas import InputError, PatientPrediction, PredictRequest

logger = logging.getLogger(__name__)

PREDICT_OPERATION = "/$predict-mortality"
_BUNDLE_SCHEMA = {"type": "object", "required": ["resourceType", "type"], "properties": {
    "resourceType": {"type": "string", "enum": ["Bundle"]}, "type": {"type": "string"},
    "entry": {"type": "array", "items": {"type": "object", "properties": {
        "fullUrl": {"type": "string"}, "resource": {"type": "object"}}}}}}
_FHIR_BODY = {"requestBody": {"required": True, "content": {
    fhir_answers.FHIR_JSON: {"schema": _BUNDLE_SCHEMA}, "application/json": {"schema": _BUNDLE_SCHEMA}}}}
_FHIR_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "A FHIR R4 RiskAssessment.", "content": {fhir_answers.FHIR_JSON: {}}},
    400: {"description": "The body is not JSON (an OperationOutcome).", "content": {fhir_answers.FHIR_JSON: {}}},
    401: {"description": "Missing or invalid API key."},
    413: {"description": "Request body larger than the server's limit."},
    422: {"description": "A FHIR OperationOutcome naming each invalid element.",
          "content": {fhir_answers.FHIR_JSON: {}}},
    429: {"description": "Too many failed authentications from this client address (Retry-After)."},
    503: {"description": "Model not loaded yet, or too many requests waiting."},
}

fhir_router = APIRouter(prefix="/fhir/r4", tags=["fhir"], dependencies=[Depends(require_api_key)])
# What a FHIR client reads before it calls: the CapabilityStatement and our extensions' definitions (no patient data).
fhir_open_router = APIRouter(prefix="/fhir/r4", tags=["fhir"])
cds_router = APIRouter(tags=["cds-hooks"], dependencies=[Depends(require_api_key)])

EncounterQuery = Annotated[str | None, Query(
    max_length=64, description="id of the Encounter to predict for; default: the latest-starting one.")]


class FhirError(Exception):
    """Answered 422 (or `status`) with an OperationOutcome."""

    def __init__(self, issues: list[tuple[str, str, str]], status: int = 422):
        super().__init__(issues)
        self.issues = issues
        self.status = status


def outcome_response(issues: list[tuple[str, str, str]], status: int, request: Request) -> JSONResponse:
    """An OperationOutcome JSON response (application/fhir+json)."""
    return JSONResponse(status_code=status, content=fhir_answers.operation_outcome(issues),
                        media_type=fhir_answers.FHIR_JSON,
                        headers={"X-Request-ID": getattr(request.state, "request_id", "")})


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(raw: bytes) -> Any:
    """A request body as JSON; ValueError for anything that is not strict JSON (NaN, bad UTF-8, deep nesting)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"not valid JSON: {type(err).__name__}") from None


def model_codes(predictor: Any) -> ModelCodes:
    """What the loaded export knows: vocabulary ranks and the LOINC bridge."""
    export = predictor.export
    return ModelCodes(vocabulary=export.vocabulary_rank, lab_loinc=export.lab_loinc)


def _expression(loc: tuple[str | int, ...], mapped: MappedAdmission) -> str:
    """A PredictRequest error location -> the FHIR element it came from."""
    parts = [p for p in loc if p != "body"]
    if parts[:1] == ["events"] and len(parts) > 1 and isinstance(parts[1], int) \
            and parts[1] < len(mapped.event_references):
        return mapped.event_references[parts[1]]
    if parts[:1] == ["events"]:
        return "Bundle.entry"
    if parts[:1] == ["patient"]:
        return f"{mapped.patient_reference}.birthDate" if "date_of_birth" in parts else mapped.patient_reference
    if parts[:1] == ["admission"]:
        return f"{mapped.encounter_reference}.period.start" if "admit_time" in parts \
            else f"{mapped.encounter_reference}.type"
    return "Bundle"


def to_request(mapped: MappedAdmission) -> PredictRequest:
    """The mapped Bundle as the /v1/predict request body; FhirError naming the resource when it does not fit."""
    body = {
        "patient": {"gender": mapped.gender, "date_of_birth": mapped.birth_date.isoformat()},
        "admission": {"admit_time": mapped.admit_time.isoformat(), "admission_type": mapped.admission_type,
                      "previous_discharge_time": None if mapped.previous_discharge_time is None
                      else mapped.previous_discharge_time.isoformat()},
        "events": mapped.events,
    }
    try:
        return PredictRequest.model_validate(body)
    except pydantic.ValidationError as err:
        raise FhirError([(_expression(tuple(e.get("loc", ())), mapped), str(e.get("msg", "invalid")), "value")
                         for e in err.errors()[:20]]) from None


async def _predict_mapped(mapped: MappedAdmission, serving: Serving, num_samples: int,
                          seed: int | None) -> PatientPrediction:
    request = to_request(mapped)
    try:
        check_event_limit(request, serving.settings, ("body",))
        [prediction] = await predict_admissions(
            [request], [("body",)], num_samples=num_samples, seed=seed, include_samples=False,
            predictor=serving.predictor, batcher=serving.batcher, arrival=serving.arrival, metrics=serving.metrics,
            monitor=serving.monitor, outcomes=serving.outcomes)
    except InputError as err:
        code = "too-costly" if err.kind == "too_long" else "value"
        raise FhirError([(_expression(err.loc, mapped), err.msg, code)]) from None
    return prediction


def _read_and_map(document: Any, predictor: Any, encounter: str | None) -> MappedAdmission:
    try:
        return map_bundle(read_bundle(document), model_codes(predictor), encounter)
    except FhirInputError as err:
        raise FhirError(err.issues) from None


async def _route_and_map(document: Any, serving: Serving, encounter: str | None) -> tuple[Serving, MappedAdmission]:
    """The Bundle mapped, and the version its admission is routed to (serving.routed); FhirError if it does not map.

    The Bundle is mapped with the default version's codes to find the admission; when the split sends it to a
    version that knows other codes, it is mapped again with that version's.
    """
    # fhir.resources validates ~1 ms per resource: off the event loop, like a big /v1 encoding.
    mapped = await run_in_threadpool(_read_and_map, document, serving.predictor, encounter)
    routed = serving.routed(key_of(mapped.gender, mapped.birth_date, None, mapped.admit_time))
    if routed.predictor is not serving.predictor and model_codes(routed.predictor) != model_codes(serving.predictor):
        mapped = await run_in_threadpool(_read_and_map, document, routed.predictor, encounter)
    return routed, mapped


def _log(route: str, request: Request, mapped: MappedAdmission, p: PatientPrediction) -> None:
    """Counts only, as /v1 logs: no codes, values, times or ids."""
    logger.info("%s request_id=%s resources=%d events=%d used=%d unmapped=%d oov=%d referred=%d", route,
                getattr(request.state, "request_id", "-"), len(mapped.basis), p.events.received, p.events.used,
                len(mapped.unmapped), p.out_of_vocabulary.count, int(p.refer))


# ------------------------------------------------------------------------------- FHIR operation


@fhir_router.post(PREDICT_OPERATION, summary="FHIR operation: Bundle in, RiskAssessment out",
                  openapi_extra=_FHIR_BODY, responses=_FHIR_RESPONSES, response_class=JSONResponse)
async def predict_mortality(
    request: Request,
    serving: ServingDep,
    num_samples: NumSamplesQuery = None,
    seed: SeedQuery = None,
    encounter: EncounterQuery = None,
) -> JSONResponse:
    """In-hospital mortality risk for one patient's encounter as a FHIR R4 RiskAssessment with its uncertainty.

    The body is a Bundle (application/fhir+json) holding one Patient, the Encounter and the
    patient's Observations, MedicationRequests, MedicationAdministrations, Conditions and
    Procedures. Invalid FHIR gets 422 with an OperationOutcome naming the element.
    """
    try:
        samples = resolve_num_samples(num_samples, serving.settings)
        try:
            document = parse_json(await request.body())
        except ValueError as err:
            raise FhirError([("Bundle", str(err), "structure")], status=400) from None
        serving, mapped = await _route_and_map(document, serving, encounter)
        prediction = await _predict_mapped(mapped, serving, samples, seed)
    except FhirError as err:
        return outcome_response(err.issues, err.status, request)
    except InputError as err:  # the query's num_samples
        return outcome_response([(".".join(str(p) for p in err.loc), err.msg, "value")], 422, request)
    _log("fhir_predict", request, mapped, prediction)
    predictor = serving.predictor
    export = predictor.export
    answer = fhir_answers.risk_assessment(
        mapped, prediction, model=model_identity(predictor, serving.selected_by), calibration=calibration(export),
        num_samples=samples, ensemble_size=export.ensemble_size, request_id=request.state.request_id)
    return JSONResponse(answer, media_type=fhir_answers.FHIR_JSON)


@fhir_open_router.get("/metadata", summary="FHIR CapabilityStatement", response_class=JSONResponse,
                      responses={200: {"description": "A FHIR R4 CapabilityStatement.",
                                       "content": {fhir_answers.FHIR_JSON: {}}}})
async def capability_statement() -> JSONResponse:
    """What this FHIR endpoint does: the $predict-mortality operation and the StructureDefinitions it serves."""
    return JSONResponse(fhir_answers.capability_statement(__version__), media_type=fhir_answers.FHIR_JSON)


@fhir_open_router.get("/StructureDefinition/{definition_id}", summary="One of our extensions' StructureDefinitions",
                      response_class=JSONResponse,
                      responses={200: {"description": "A FHIR R4 StructureDefinition.",
                                       "content": {fhir_answers.FHIR_JSON: {}}},
                                 404: {"description": "No StructureDefinition of that id (an OperationOutcome naming "
                                                      "those served).", "content": {fhir_answers.FHIR_JSON: {}}}})
async def structure_definition(definition_id: str, request: Request) -> JSONResponse:
    """The StructureDefinition of one of the answer's extensions (their canonical URLs end in its id)."""
    found = fhir_answers.structure_definitions().get(definition_id)
    if found is None:
        return outcome_response([("StructureDefinition", f"no StructureDefinition {definition_id[:64]!r} here; "
                                  f"these are served: {', '.join(sorted(fhir_answers.structure_definitions()))}",
                                  "not-found")], 404, request)
    return JSONResponse(found, media_type=fhir_answers.FHIR_JSON)


# ------------------------------------------------------------------------------- CDS Hooks

SERVICES = {
    "mortality-risk": ("patient-view", "In-hospital mortality risk with uncertainty"),
    "mortality-risk-encounter-start": ("encounter-start", "In-hospital mortality risk at encounter start"),
}
_DESCRIPTION = ("In-hospital mortality risk of the patient's current encounter from a rank-1 Bayesian model, "
                "with its uncertainty (interval, aleatoric and epistemic parts) and a referral flag. "
                "Research model, not a medical device.")


class CdsContext(BaseModel):
    """The hook context fields this service reads (others are allowed and ignored)."""

    model_config = ConfigDict(extra="allow")

    userId: str | None = Field(None, max_length=256)  # noqa: N815  (the spec's names)
    patientId: str = Field(min_length=1, max_length=64)  # noqa: N815
    encounterId: str | None = Field(None, max_length=64)  # noqa: N815


class CdsRequest(BaseModel):
    """A CDS Hooks 2.0 service call."""

    model_config = ConfigDict(extra="allow")

    hook: str
    hookInstance: str = Field(min_length=1, max_length=256)  # noqa: N815
    context: CdsContext
    prefetch: dict[str, Any] | None = None
    fhirServer: str | None = None  # noqa: N815
    fhirAuthorization: dict[str, Any] | None = None  # noqa: N815


@cds_router.get("/cds-services", summary="CDS Hooks discovery",
                responses={401: {"description": "No valid key."}, 429: _FHIR_RESPONSES[429]})
async def cds_discovery() -> dict[str, Any]:
    """The CDS services this server offers, with their hooks and prefetch templates."""
    return {"services": [{"hook": hook, "id": sid, "title": title, "description": _DESCRIPTION,
                          "prefetch": fhir_answers.prefetch_templates()}
                         for sid, (hook, title) in SERVICES.items()]}


def _cds_error(status: int, message: str, request: Request) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": message,
                                                     "request_id": getattr(request.state, "request_id", None)})


def _context_mismatch(context: CdsContext, prefetch: dict[str, Any]) -> list[tuple[str, str, str]]:
    """Issues when the hook's context names another patient (or encounter) than the prefetch holds."""
    issues = []
    patient = prefetch["patient"]
    patient_id = patient.get("id") if patient.get("resourceType") == "Patient" else None
    if patient_id != context.patientId:
        shown = f"Patient/{patient_id}"[:80] if isinstance(patient_id, str) else \
            f"a {str(patient.get('resourceType'))[:40]} without a Patient id"
        issues.append(("context.patientId", f"context.patientId {context.patientId!r} is not the prefetched patient "
                       f"(prefetch.patient is {shown}): a card would be about another patient", "business-rule"))
    encounter = prefetch.get("encounter")
    if context.encounterId is not None and isinstance(encounter, dict) and encounter.get("resourceType") != "Bundle" \
            and encounter.get("id") != context.encounterId:
        shown = f"Encounter/{encounter.get('id')}"[:80] if isinstance(encounter.get("id"), str) else "no id"
        issues.append(("context.encounterId", f"context.encounterId {context.encounterId!r} is not the prefetched "
                       f"encounter (prefetch.encounter is {shown})", "business-rule"))
    return issues


def _in_prefetch(issues: list[tuple[str, str, str]], origins: list[str]) -> list[tuple[str, str, str]]:
    """Issues about the gathered Bundle's entries, named by where the hook call's prefetch held them."""
    def where(expression: str) -> str:
        m = re.match(r"^Bundle\.entry\[(\d+)\]\.resource", expression)
        return origins[int(m.group(1))] + expression[m.end():] if m and int(m.group(1)) < len(origins) \
            else expression
    return [(where(e), message, code) for e, message, code in issues]


@cds_router.post("/cds-services/{service_id}", summary="CDS Hooks service call: cards",
                 openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
                     "schema": CdsRequest.model_json_schema()}}}},
                 responses={400: {"description": "Malformed hook call."}, 401: {"description": "No valid key."},
                            404: {"description": "Unknown service id."},
                            412: {"description": "The prefetch lacks data the service needs."},
                            429: _FHIR_RESPONSES[429],
                            422: {"description": "The prefetched resources are not valid FHIR "
                                                 "(an OperationOutcome)."}})
async def cds_service(service_id: str, request: Request, serving: ServingDep) -> JSONResponse:
    """Cards for a patient-view or encounter-start hook call, computed from its prefetch."""
    settings = serving.settings
    if service_id not in SERVICES:
        return _cds_error(404, "unknown CDS service id", request)
    try:
        call = CdsRequest.model_validate(parse_json(await request.body()))
    except (ValueError, pydantic.ValidationError) as err:
        where = "; ".join(".".join(str(p) for p in e["loc"]) + ": " + e["msg"] for e in err.errors()[:5]) \
            if isinstance(err, pydantic.ValidationError) else str(err)
        return _cds_error(400, f"malformed hook call: {where}", request)
    hook, _ = SERVICES[service_id]
    if call.hook != hook:
        return _cds_error(400, f"service {service_id} answers the {hook} hook, not {call.hook[:40]!r}", request)
    prefetch = call.prefetch or {}
    missing = [k for k in fhir_answers.REQUIRED_PREFETCH if not isinstance(prefetch.get(k), dict)]
    if call.context.encounterId is not None and not isinstance(prefetch.get("encounter"), dict) \
            and not isinstance(prefetch.get("encounters"), dict):
        missing.append("encounter")
    if missing:
        # CDS Hooks 2.0: 412 when the service cannot get the data it needs; this service does
        # not query the client's FHIR server (fhirServer / fhirAuthorization are not used).
        return _cds_error(412, f"prefetch lacks {', '.join(missing)}: send the prefetch templates of "
                               f"GET /cds-services (this service does not query FHIR servers)", request)
    mismatch = _context_mismatch(call.context, prefetch)
    if mismatch:
        return outcome_response(mismatch, 422, request)
    document, origins = fhir_answers.prefetch_bundle(prefetch, list(fhir_answers.prefetch_templates()),
                                                     call.fhirServer)
    try:
        serving, mapped = await _route_and_map(document, serving, call.context.encounterId)
        prediction = await _predict_mapped(mapped, serving, settings.default_num_samples, None)
    except FhirError as err:
        return outcome_response(_in_prefetch(err.issues, origins), err.status, request)
    _log("cds_service", request, mapped, prediction)
    export = serving.predictor.export
    model_url = str(request.base_url).rstrip("/") + "/v1/model"
    answer = fhir_answers.card(prediction, mapped, model=model_identity(serving.predictor, serving.selected_by),
                               calibration=calibration(export), num_samples=settings.default_num_samples,
                               ensemble_size=export.ensemble_size, model_url=model_url)
    return JSONResponse({"cards": [answer]})
