"""HTTP routes: health and readiness, Prometheus metrics, and the authenticated /v1 API."""
from __future__ import annotations

import logging

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from starlette.concurrency import run_in_threadpool

from serving.api.auth import require_api_key, require_metrics_key
from serving.api.dependencies import (
    IncludeSamplesQuery,
    MetricsDep,
    MonitorDep,
    NumSamplesQuery,
    OutcomeMonitorDep,
    OutcomesDep,
    SeedQuery,
    ServedModelDep,
    ServingDep,
    SettingsDep,
    VersionsDep,
)
from serving.inference.model_versions import admission_key
from serving.monitoring.monitor import MonitorReading
from serving.monitoring.outcome_store import OutcomeError
from serving.inference.prediction import (
    check_event_limit,
    calibration,
    model_identity,
    predict_admissions,
    resolve_num_samples,
)
from serving.schemas import (
    BatchRequest,
    BatchResponse,
    ErrorResponse,
    Health,
    InputError,
    ModelInfo,
    MonitorResponse,
    OutcomeRequest,
    OutcomeResponse,
    PatientPrediction,
    PredictRequest,
    PrecisionInfo,
    PredictResponse,
    ShiftFinding,
    VersionState,
)

logger = logging.getLogger(__name__)

_ERRORS = {
    400: {"model": ErrorResponse, "description": "Body is not JSON: invalid UTF-8, malformed or nested too deep."},
    401: {"model": ErrorResponse, "description": "Missing or invalid API key."},
    408: {"model": ErrorResponse, "description": "The request body did not arrive in time."},
    413: {"model": ErrorResponse, "description": "Request body larger than the server's limit."},
    422: {"model": ErrorResponse, "description": "Invalid request; `loc` names the field."},
    429: {"model": ErrorResponse, "description": "Too many failed authentications from this client address: "
                                                 "retry after Retry-After seconds."},
    503: {"model": ErrorResponse, "description": "Model not loaded yet, or too many requests waiting."},
}

health_router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["metrics"], dependencies=[Depends(require_metrics_key)],
                           responses={401: _ERRORS[401], 429: _ERRORS[429]})
v1_router = APIRouter(prefix="/v1", tags=["prediction"], dependencies=[Depends(require_api_key)],
                      responses=_ERRORS)


# ------------------------------------------------------------------------------- health


@health_router.get("/healthz", response_model=Health, summary="Liveness: the process answers")
async def healthz() -> Health:
    """Always 'ok' while the event loop runs; says nothing about the model."""
    return Health(status="ok")


@health_router.get("/readyz", response_model=Health, summary="Readiness: model loaded and warmed up",
                   responses={503: {"model": Health, "description": "Still loading or warming up."}})
async def readyz(request: Request, response: Response) -> Health:
    """'ok' once the model is loaded and has run one forward pass; 503 'starting' before that."""
    if getattr(request.app.state, "ready", False):
        return Health(status="ok")
    response.status_code = 503
    return Health(status="starting")


@metrics_router.get("/metrics", summary="Prometheus metrics", response_class=Response,
                    responses={200: {"content": {"text/plain": {}, "application/openmetrics-text": {}},
                                     "description": "Prometheus text format; OpenMetrics when the Accept header "
                                                    "asks for it."}})
async def prometheus(request: Request, metrics: MetricsDep, monitor: MonitorDep,
                     outcome_monitor: OutcomeMonitorDep) -> Response:
    """Request counts by route and status, latencies, errors, batch sizes, population shift (no patient data)."""
    # Off the event loop: a scrape takes milliseconds to render (the shift gauges are refreshed
    # first when the monitor's report is due; only the first report is made while it waits).
    def render() -> tuple[bytes, str]:
        if monitor is not None:
            monitor.report()
        if outcome_monitor is not None:
            outcome_monitor.reading()
        return metrics.render(request.headers.get("accept"))

    body, content_type = await run_in_threadpool(render)
    return Response(body, media_type=content_type)


# ------------------------------------------------------------------------------- helpers


def _log(request: Request, route: str, predictions: list[PatientPrediction], num_samples: int) -> None:
    """Counts only: no codes, values, times or ids of patients ever reach the log."""
    logger.info("%s request_id=%s patients=%d events=%d used=%d ignored=%d oov=%d num_samples=%d referred=%d",
                route, getattr(request.state, "request_id", "-"), len(predictions),
                sum(p.events.received for p in predictions), sum(p.events.used for p in predictions),
                sum(sum(p.events.ignored.values()) for p in predictions),
                sum(p.out_of_vocabulary.count for p in predictions), num_samples,
                sum(p.refer for p in predictions))


# ------------------------------------------------------------------------------- /v1


@v1_router.post("/predict", response_model=PredictResponse, summary="Predict one admission with uncertainty")
async def predict(
    body: PredictRequest,
    request: Request,
    serving: ServingDep,
    num_samples: NumSamplesQuery = None,
    seed: SeedQuery = None,
    include_samples: IncludeSamplesQuery = False,
) -> PredictResponse:
    """In-hospital mortality probability for one admission, with its predictive uncertainty.

    Concurrent calls are micro-batched into shared forward passes (unless they pass a seed). With several
    versions served, the admission's version is the traffic split's (sticky per admission) or the default;
    `model` names it.
    """
    serving = serving.routed(admission_key(body))
    settings, predictor = serving.settings, serving.predictor
    samples = resolve_num_samples(num_samples, settings)
    check_event_limit(body, settings, ("body",))
    [prediction] = await predict_admissions(
        [body], [("body",)], num_samples=samples, seed=seed, include_samples=include_samples,
        predictor=predictor, batcher=serving.batcher, arrival=serving.arrival, metrics=serving.metrics,
        monitor=serving.monitor, outcomes=serving.outcomes)
    _log(request, "predict", [prediction], samples)
    export = predictor.export
    return PredictResponse(**prediction.model_dump(), num_samples=samples, ensemble_size=export.ensemble_size,
                           model=model_identity(predictor, serving.selected_by), calibration=calibration(export),
                           request_id=request.state.request_id)


# The same parameters as /predict on purpose: each endpoint declares its own query and body for
# the OpenAPI schema; the work they share is predict_admissions.
@v1_router.post("/predict/batch", response_model=BatchResponse, summary="Predict several admissions")
async def predict_batch(
    body: BatchRequest,
    request: Request,
    serving: ServingDep,
    num_samples: NumSamplesQuery = None,
    seed: SeedQuery = None,
    include_samples: IncludeSamplesQuery = False,
) -> BatchResponse:
    """Predictions for up to the server's max patients, in request order, from one forward pass.

    One version answers the whole batch (`model` names it): the one its first admission is routed to.
    """
    serving = serving.routed(admission_key(body.patients[0]))
    settings, predictor = serving.settings, serving.predictor
    samples = resolve_num_samples(num_samples, settings)
    if len(body.patients) > settings.max_patients:
        raise InputError(("body", "patients"), f"at most {settings.max_patients} patients per batch, got "
                                               f"{len(body.patients)}", "too_long")
    locs: list[tuple[str | int, ...]] = [("body", "patients", i) for i in range(len(body.patients))]
    for req, loc in zip(body.patients, locs):
        check_event_limit(req, settings, loc)
    predictions = await predict_admissions(
        body.patients, locs, num_samples=samples, seed=seed, include_samples=include_samples,
        predictor=predictor, batcher=serving.batcher, arrival=serving.arrival, metrics=serving.metrics,
        monitor=serving.monitor, outcomes=serving.outcomes)
    _log(request, "predict_batch", predictions, samples)
    export = predictor.export
    return BatchResponse(predictions=predictions, num_samples=samples, ensemble_size=export.ensemble_size,
                         model=model_identity(predictor, serving.selected_by), calibration=calibration(export),
                         request_id=request.state.request_id)


@v1_router.get("/model", response_model=ModelInfo, summary="The served model: card, metrics, config")
async def model_info(settings: SettingsDep, predictor: ServedModelDep, versions: VersionsDep) -> ModelInfo:
    """The model card, held-out metrics and bagging config of the default version, this server's limits, and the
    state of every version."""
    export = predictor.export
    shares = versions.shares()
    states = [VersionState(version=v, state="ready" if served.ready else "warming_up", default=v == versions.default,
                           share_percent=shares[v]) for v, served in versions.loaded.items()]
    states += [VersionState(version=v, state="failed", default=False, share_percent=0, reason=why)
               for v, why in versions.failed.items()]
    return ModelInfo(
        model=model_identity(predictor),
        precision=PrecisionInfo(**predictor.choice.as_dict()),
        model_card=dict(export.card_raw),
        metrics=dict(export.metrics_raw),
        pipeline_config=dict(export.pipeline_raw),
        vocabulary_size=len(export.vocabulary),
        limits={
            "max_events": settings.max_events,
            "max_patients": settings.max_patients,
            "max_body_bytes": settings.max_body_bytes,
            "default_num_samples": settings.default_num_samples,
            "max_num_samples": settings.max_num_samples,
            "max_batch": settings.max_batch,
        },
        versions=sorted(states, key=lambda state: int(state.version) if state.version.isdigit() else 0),
    )


@v1_router.get("/monitor", response_model=MonitorResponse, summary="Population shift of the recent admissions")
async def monitor_report(settings: SettingsDep, predictor: ServedModelDep, monitor: MonitorDep,
                         outcome_monitor: OutcomeMonitorDep) -> MonitorResponse:
    """The shift report of the last --monitor-window admissions against the model's training population.

    Per-code value distributions in the model's units, values that arrived in other units, codes
    out of the model's vocabulary, charting frequency, case mix and the model's mutual
    information (docs/shift.md); 'unavailable' when the export carries no reference; 'error' (with the
    reason in one line, logged and counted in ehr_monitor_errors_total) when the report could not be made.
    Beside it, the performance the model expects over the window before outcomes arrive.
    """
    reading = (await run_in_threadpool(monitor.report)) if monitor is not None else MonitorReading(None, 0)
    outcomes = (await run_in_threadpool(outcome_monitor.reading)) if outcome_monitor is not None else None
    if reading.report is None:
        return MonitorResponse(level="error" if reading.error else "unavailable", admissions=reading.admissions,
                               window=settings.monitor_window, findings=[], summary={}, error=reading.error,
                               age_s=reading.age_s(), model=model_identity(predictor),
                               performance_estimate=reading.performance, outcomes=outcomes)
    doc = reading.report.to_json()
    return MonitorResponse(level=reading.report.level, admissions=reading.admissions, window=settings.monitor_window,
                           findings=[ShiftFinding(**f) for f in doc["findings"]], summary=doc["summary"],
                           age_s=reading.age_s(), model=model_identity(predictor),
                           performance_estimate=reading.performance, outcomes=outcomes)


@v1_router.post("/outcomes", response_model=OutcomeResponse, summary="The outcome of an answered admission",
                responses={404: {"model": ErrorResponse, "description": "No such prediction, or no outcome store."},
                           409: {"model": ErrorResponse, "description": "A different outcome was stored for it."},
                           410: {"model": ErrorResponse, "description": "The prediction is past the retention "
                                                                        "period: its row was deleted."}})
async def post_outcome(body: OutcomeRequest, outcomes: OutcomesDep) -> OutcomeResponse:
    """Stores the outcome (1 died, 0 survived) of the prediction a /v1/predict or FHIR answer named.

    Idempotent: the same outcome sent again answers stored=false and changes nothing; a different
    one is a 409. Off (404) unless the server keeps outcomes (--outcome-dir).
    """
    if outcomes is None:
        raise HTTPException(404, "this server keeps no outcomes (start it with --outcome-dir)")
    try:
        stored = await run_in_threadpool(outcomes.record_outcome, body.prediction_id, body.outcome)
    except OutcomeError as err:
        raise HTTPException(err.status, str(err)) from None
    return OutcomeResponse(prediction_id=body.prediction_id, stored=stored)
