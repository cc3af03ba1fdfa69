"""HTTP routes: health and readiness, Prometheus metrics, and the authenticated /v1 API."""
from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response
from starlette.concurrency import run_in_threadpool

from serving.auth import require_api_key, require_metrics_key
from serving.batching import Arrival, MicroBatcher
from serving.dependencies import get_arrival, get_batcher, get_metrics, get_predictor, get_settings
from serving.encoding import Encoded, InputError, encode
from serving.metrics import ServiceMetrics
from model.export import Export
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
    OutOfVocabulary,
    PatientPrediction,
    PredictRequest,
    PrecisionInfo,
    PredictResponse,
    Referral,
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
async def prometheus(request: Request, metrics: MetricsDep) -> Response:
    """Request counts by route and status, latencies, errors, batch sizes (no patient data)."""
    # Off the event loop: a scrape takes milliseconds to render, and requests on the loop would wait.
    body, content_type = await run_in_threadpool(metrics.render, request.headers.get("accept"))
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
) -> list[PatientPrediction]:
    """Encodes, runs (micro-batched) and summarises requests; predictions in request order."""
    export = predictor.export
    if sum(len(r.events) for r in requests) <= INLINE_ENCODE_EVENTS:
        # Small inputs are bagged right here: pure-Python work gains nothing from a thread
        # (the GIL), and many threads would starve the event loop of it under load.
        encoded: list[Encoded] = [encode(r, export, loc) for r, loc in zip(requests, locs)]
    else:  # a big input would stall every other request for its whole encoding time
        encoded = await run_in_threadpool(lambda: [encode(r, export, loc) for r, loc in zip(requests, locs)])
    probs = await batcher.submit([e.example for e in encoded], num_samples, seed, arrival=arrival)
    s = summarise(probs, export, num_samples)
    policy = export.metrics.referral
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
            events=EventCounts(received=enc.events_received, used=enc.events_used, ignored=enc.ignored),
            out_of_vocabulary=OutOfVocabulary(count=enc.oov_count, codes=enc.oov_codes),
            prediction_time=enc.prediction_time,
            age_years=enc.age_years,
            warnings=enc.warnings,
            samples=[float(v) for v in probs[i]] if include_samples else None,
        ))
        for reason, n in enc.ignored.items():
            if n:
                metrics.events_ignored.labels(reason=reason).inc(n)
        metrics.oov_codes.inc(enc.oov_count)
        for kind in enc.warning_kinds:
            metrics.input_warnings.labels(kind=kind).inc()
    metrics.predictions.inc(len(out))
    metrics.referrals.inc(sum(p.refer for p in out))
    return out


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
                                  arrival=arrival, metrics=metrics)
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
                                 arrival=arrival, metrics=metrics)
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
