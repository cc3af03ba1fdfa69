"""HTTP routes: health and readiness, Prometheus metrics, and the authenticated /v1 API."""
from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import numpy as np

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from serving import admission_type
from serving.auth import require_api_key, require_metrics_key
from serving.batching import Arrival, MicroBatcher
from serving.dependencies import get_arrival, get_batcher, get_metrics, get_monitor, get_predictor, get_settings
from serving.encoding import Encoded, InputError, encode
from serving.metrics import ServiceMetrics
from serving.monitor import Monitor
from model.export.load import Export
from serving.predictor import ServedModel, summarise
from serving.schemas import (
    BatchRequest,
    BatchResponse,
    Calibration,
    ErrorResponse,
    EventCounts,
    Health,
    Interval,
    ModelIdentity,
    ModelInfo,
    MonitorResponse,
    OutOfVocabulary,
    PatientPrediction,
    PredictRequest,
    PrecisionInfo,
    PredictResponse,
    Referral,
    ShiftFinding,
)
from serving.settings import Settings

logger = logging.getLogger(__name__)

# Up to this many events per request are bagged on the event loop (~1 ms per 100 events).
INLINE_ENCODE_EVENTS = 2000

_ERRORS = {
    400: {"model": ErrorResponse, "description": "Body is not JSON: invalid UTF-8, malformed or nested too deep."},
    401: {"model": ErrorResponse, "description": "Missing or invalid API key."},
    408: {"model": ErrorResponse, "description": "The request body did not arrive in time."},
    413: {"model": ErrorResponse, "description": "Request body larger than the server's limit."},
    422: {"model": ErrorResponse, "description": "Invalid request; `loc` names the field."},
    503: {"model": ErrorResponse, "description": "Model not loaded yet, or too many requests waiting."},
}

health_router = APIRouter(tags=["health"])
metrics_router = APIRouter(tags=["metrics"], dependencies=[Depends(require_metrics_key)],
                           responses={401: _ERRORS[401]})
v1_router = APIRouter(prefix="/v1", tags=["prediction"], dependencies=[Depends(require_api_key)],
                      responses=_ERRORS)

SettingsDep = Annotated[Settings, Depends(get_settings)]
ServedModelDep = Annotated[ServedModel, Depends(get_predictor)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
ArrivalDep = Annotated[Arrival, Depends(get_arrival)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
MonitorDep = Annotated[Monitor | None, Depends(get_monitor)]
NumSamplesQuery = Annotated[int | None, Query(
    ge=1, description="Monte-Carlo samples S per ensemble member; default and upper limit are server "
                      "settings (25 and 100 unless changed). The response holds S*K samples.")]
SeedQuery = Annotated[int | None, Query(
    ge=0, le=2**63 - 1, description="Seed for reproducible samples: the same request with the same seed "
                                    "gives the same answer. Without it every call draws fresh samples.")]
IncludeSamplesQuery = Annotated[bool, Query(description="Return all S*K sampled probabilities.")]


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
async def prometheus(request: Request, metrics: MetricsDep, monitor: MonitorDep) -> Response:
    """Request counts by route and status, latencies, errors, batch sizes, population shift (no patient data)."""
    # Off the event loop: a scrape takes milliseconds to render (the shift gauges are refreshed
    # first when the monitor's window changed), and requests on the loop would wait.
    def render() -> tuple[bytes, str]:
        if monitor is not None:
            monitor.report()
        return metrics.render(request.headers.get("accept"))

    body, content_type = await run_in_threadpool(render)
    return Response(body, media_type=content_type)


# ------------------------------------------------------------------------------- helpers


def model_identity(predictor: ServedModel) -> ModelIdentity:
    export = predictor.export
    return ModelIdentity(name=export.card.name, version=export.card.version, checksum=export.checksum,
                         precision=predictor.precision)


def held_out_calibration(export: Export) -> Calibration:
    return Calibration(split="test", ece=export.metrics.test.ece, nll=export.metrics.test.nll)


def resolve_num_samples(requested: int | None, settings: Settings) -> int:
    if requested is None:
        return settings.default_num_samples
    if requested > settings.max_num_samples:
        raise InputError(("query", "num_samples"), f"num_samples must be at most {settings.max_num_samples}, "
                                                   f"got {requested}", "less_than_equal")
    return requested


def check_event_limit(request: PredictRequest, settings: Settings, loc: tuple[str | int, ...]) -> None:
    if len(request.events) > settings.max_events:
        raise InputError(loc + ("events",), f"at most {settings.max_events} events per patient, got "
                                            f"{len(request.events)}", "too_long")


async def predict_admissions(
    requests: list[PredictRequest],
    locs: list[tuple[str | int, ...]],
    *,
    num_samples: int,
    seed: int | None,
    include_samples: bool,
    predictor: ServedModel,
    batcher: MicroBatcher,
    arrival: Arrival,
    metrics: ServiceMetrics,
    monitor: Monitor | None = None,
) -> list[PatientPrediction]:
    """Encodes, runs (micro-batched) and summarises requests; predictions in request order (each joins the monitor).

    A request without an admission type is encoded once per training type and its samples are
    drawn from each in proportion to the type's training frequency (serving.admission_type).
    """
    export = predictor.export
    for r, loc in zip(requests, locs):
        admission_type.check(r, export, loc)
    unknown = {i for i, r in enumerate(requests) if r.admission.admission_type is None}
    allocation = admission_type.allocate(export.admission_types, num_samples) if unknown else []
    # (request index, type to encode it with or None for its own, samples per member)
    jobs = [(i, None, num_samples) for i, r in enumerate(requests) if r.admission.admission_type is not None]
    jobs += [(i, t, n) for t, n in allocation for i in sorted(unknown)]

    def encode_all() -> list[Encoded]:
        return [encode(_with_type(requests[i], t), export, locs[i]) for i, t, _ in jobs]

    if sum(len(requests[i].events) for i, _, _ in jobs) <= INLINE_ENCODE_EVENTS:
        # Small inputs are bagged right here: pure-Python work gains nothing from a thread
        # (the GIL), and many threads would starve the event loop of it under load.
        variants = encode_all()
    else:  # a big input would stall every other request for its whole encoding time
        variants = await run_in_threadpool(encode_all)
    groups: dict[int, list[int]] = {}  # samples per member -> positions in jobs (one forward pass each)
    for j, (_, _, n) in enumerate(jobs):
        groups.setdefault(n, []).append(j)
    results = await asyncio.gather(*(batcher.submit([variants[j].example for j in js], n, seed, arrival=arrival)
                                     for n, js in groups.items()))
    rows: dict[tuple[int, str | None], np.ndarray] = {}  # (request, type encoded) -> its samples
    for js, probs_n in zip(groups.values(), results):
        for j, row in zip(js, probs_n):
            rows[jobs[j][:2]] = row
    probs = np.stack([admission_type.mixed([rows[i, t] for t, _ in allocation]) if i in unknown else rows[i, None]
                      for i in range(len(requests))])
    first = {}
    for j, (i, _, _) in enumerate(jobs):
        first.setdefault(i, variants[j])
    encoded = [first[i] for i in range(len(requests))]
    s = summarise(probs, export, num_samples)
    policy = export.metrics.referral
    mixed_warning = [admission_type.warning(export.admission_types, allocation, num_samples)] if unknown else []
    out = []
    for i, (req, enc) in enumerate(zip(requests, encoded)):
        out.append(PatientPrediction(
            id=req.id,
            probability=float(s.probability[i]),
            std=float(s.std[i]),
            interval=Interval(lower=float(s.lower[i]), upper=float(s.upper[i])),
            predictive_entropy=float(s.predictive_entropy[i]),
            aleatoric=float(s.aleatoric[i]),
            epistemic=float(s.epistemic[i]),
            member_probabilities=[float(v) for v in s.members[i]],
            decision_threshold=export.metrics.decision_threshold,
            predicted_positive=bool(s.predicted_positive[i]),
            samples_across_threshold=float(s.across_threshold[i]),
            refer=bool(s.refer[i]),
            referral=Referral(refer=bool(s.refer[i]), measure=policy.measure, value=float(s.referral_value[i]),
                              threshold=policy.threshold, rate=policy.rate),
            events=EventCounts(received=enc.events_received, used=enc.events_used, ignored=enc.ignored,
                               values=enc.unit_outcomes),
            out_of_vocabulary=OutOfVocabulary(count=enc.oov_count, codes=enc.oov_codes),
            prediction_time=enc.prediction_time,
            age_years=enc.age_years,
            warnings=[*enc.warnings, *mixed_warning] if i in unknown else enc.warnings,
            samples=[float(v) for v in probs[i]] if include_samples else None,
        ))
        for reason, n in enc.ignored.items():
            if n:
                metrics.events_ignored.labels(reason=reason).inc(n)
        metrics.oov_codes.inc(enc.oov_count)
        for kind in [*enc.warning_kinds, *([admission_type.KIND] if i in unknown else [])]:
            metrics.input_warnings.labels(kind=kind).inc()
        if monitor is not None:
            monitor.record(enc.admission, enc.unit_rows, float(s.epistemic[i]))
    metrics.predictions.inc(len(out))
    metrics.referrals.inc(sum(p.refer for p in out))
    return out


def _with_type(request: PredictRequest, admission_type_: str | None) -> PredictRequest:
    """The request as sent (None), or with the admission type it did not know."""
    if admission_type_ is None:
        return request
    return request.model_copy(update={"admission": request.admission.model_copy(
        update={"admission_type": admission_type_})})


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
    settings: SettingsDep,
    predictor: ServedModelDep,
    batcher: BatcherDep,
    arrival: ArrivalDep,
    metrics: MetricsDep,
    monitor: MonitorDep,
    num_samples: NumSamplesQuery = None,
    seed: SeedQuery = None,
    include_samples: IncludeSamplesQuery = False,
) -> PredictResponse:
    """In-hospital mortality probability for one admission, with its predictive uncertainty.

    Concurrent calls are micro-batched into shared forward passes (unless they pass a seed).
    """
    samples = resolve_num_samples(num_samples, settings)
    check_event_limit(body, settings, ("body",))
    [prediction] = await predict_admissions([body], [("body",)], num_samples=samples, seed=seed,
                                  include_samples=include_samples, predictor=predictor, batcher=batcher,
                                  arrival=arrival, metrics=metrics, monitor=monitor)
    _log(request, "predict", [prediction], samples)
    export = predictor.export
    return PredictResponse(**prediction.model_dump(), num_samples=samples, ensemble_size=export.ensemble_size,
                           model=model_identity(predictor), calibration=held_out_calibration(export),
                           request_id=request.state.request_id)


@v1_router.post("/predict/batch", response_model=BatchResponse, summary="Predict several admissions")
async def predict_batch(
    body: BatchRequest,
    request: Request,
    settings: SettingsDep,
    predictor: ServedModelDep,
    batcher: BatcherDep,
    arrival: ArrivalDep,
    metrics: MetricsDep,
    monitor: MonitorDep,
    num_samples: NumSamplesQuery = None,
    seed: SeedQuery = None,
    include_samples: IncludeSamplesQuery = False,
) -> BatchResponse:
    """Predictions for up to the server's max patients, in request order, from one forward pass."""
    samples = resolve_num_samples(num_samples, settings)
    if len(body.patients) > settings.max_patients:
        raise InputError(("body", "patients"), f"at most {settings.max_patients} patients per batch, got "
                                               f"{len(body.patients)}", "too_long")
    locs: list[tuple[str | int, ...]] = [("body", "patients", i) for i in range(len(body.patients))]
    for req, loc in zip(body.patients, locs):
        check_event_limit(req, settings, loc)
    predictions = await predict_admissions(body.patients, locs, num_samples=samples, seed=seed,
                                 include_samples=include_samples, predictor=predictor, batcher=batcher,
                                 arrival=arrival, metrics=metrics, monitor=monitor)
    _log(request, "predict_batch", predictions, samples)
    export = predictor.export
    return BatchResponse(predictions=predictions, num_samples=samples, ensemble_size=export.ensemble_size,
                         model=model_identity(predictor), calibration=held_out_calibration(export),
                         request_id=request.state.request_id)


@v1_router.get("/model", response_model=ModelInfo, summary="The served model: card, metrics, config")
async def model_info(settings: SettingsDep, predictor: ServedModelDep) -> ModelInfo:
    """The model card, held-out metrics and bagging config of the loaded export, and this server's limits."""
    export = predictor.export
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
    )


@v1_router.get("/monitor", response_model=MonitorResponse, summary="Population shift of the recent admissions")
async def monitor_report(settings: SettingsDep, predictor: ServedModelDep, monitor: MonitorDep) -> MonitorResponse:
    """The shift report of the last --monitor-window admissions against the model's training population.

    Per-code value distributions in the model's units, values that arrived in other units, codes
    out of the model's vocabulary, charting frequency, case mix and the model's mutual
    information (docs/shift.md); 'unavailable' when the export carries no reference.
    """
    report, admissions = (await run_in_threadpool(monitor.report)) if monitor is not None else (None, 0)
    if report is None:
        return MonitorResponse(level="unavailable", admissions=admissions, window=settings.monitor_window,
                               findings=[], summary={}, model=model_identity(predictor))
    doc = report.to_json()
    return MonitorResponse(level=report.level, admissions=admissions, window=settings.monitor_window,
                           findings=[ShiftFinding(**f) for f in doc["findings"]], summary=doc["summary"],
                           model=model_identity(predictor))
