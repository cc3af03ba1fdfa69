"""The app factory: create_app(settings) -> FastAPI, with everything it needs on app.state.

No module-level state besides the logger: the settings, the model, the micro-batcher and the
metrics registry all belong to one app, handed to routes by dependency injection.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import hashlib
import time
import traceback
import uuid

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving import __version__
from serving.auth import API_KEY_HEADER, check_key
from serving.batching import BatcherStoppedError, MicroBatcher, QueueFullError
from serving.encoding import InputError, encode
from serving.metrics import ServiceMetrics
from serving import precision as precision_choice
from serving.monitor import Monitor
from serving.predictor import ServedModel
from serving.fhir_answers import FHIR_JSON, operation_outcome
from serving.fhir_routes import cds_router, fhir_router
from serving.routes import health_router, metrics_router, v1_router
from serving.schemas import Admission, Patient, PredictRequest
from serving.settings import Settings

logger = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Request-ID"
CLIENT_GONE = "client_gone"  # scope state flag: the client left before its body was read
CLIENT_CLOSED_REQUEST = 499  # nginx's status for it; logged and counted, never sent


def error_kind(route: str, status: int) -> str:
    """The ehr_http_errors_total kind of a failed request: what it is, not only its status class."""
    if status == CLIENT_CLOSED_REQUEST:
        return "client_disconnect"
    if route == "/readyz" and status == 503:
        return "not_ready"  # warm-up or shutdown: the probe is doing its job
    return "server" if status >= 500 else "client"

DESCRIPTION = """\
In-hospital mortality predictions from a rank-1 Bayesian LSTM, with their uncertainty:
predictive mean and spread over S samples of each of K ensemble members, total / aleatoric /
epistemic uncertainty, and a referral flag calibrated on held-out data.

Events are bagged by the same code that built the training data. Authenticate with an
`X-API-Key` header (or `Authorization: Bearer <key>`). Not a medical device.
"""


class RequestContextMiddleware:
    """Pure ASGI middleware: request id, one access-log line, and the HTTP metrics.

    It logs the route template (never the raw path or query), status and latency: request
    bodies hold patient data and must not reach the logs.
    """

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope.get("headers", []) if k == REQUEST_ID_HEADER.lower().encode()), None)
        # Always our own id: a client's id may carry a record number, so the log keeps only a
        # hash of it (enough to match the client's records, not to read them).
        request_id = uuid.uuid4().hex
        client_ref = f" client_request_id_sha256={hashlib.sha256(given).hexdigest()[:16]}" if given else ""
        scope.setdefault("state", {})["request_id"] = request_id
        status = 500  # if the app dies before answering, that is what the client gets
        status_sent: int | None = None
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status, status_sent
            if message["type"] == "http.response.start":
                status = status_sent = message["status"]
                message.setdefault("headers", [])
                message["headers"] = list(message["headers"]) + [
                    (REQUEST_ID_HEADER.lower().encode(), request_id.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            # Handled here, not by Starlette's ServerErrorMiddleware: that one re-raises, and the
            # server would then log the traceback WITH the exception's message, which may quote
            # request data. We log the type and the line that raised, and answer 500 ourselves.
            where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
            logger.error("request_id=%s unhandled %s at %s:%s", request_id, type(exc).__name__,
                         where.filename if where else "?", where.lineno if where else "?")
            if status_sent is None:
                response = JSONResponse(status_code=500, content={
                    "detail": "internal error; quote the request_id when reporting it", "request_id": request_id})
                await response(scope, receive, send_with_id)
            # else: the answer had started; the client sees it cut off, and the log says why.
        finally:
            elapsed = time.perf_counter() - started
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            method = scope.get("method", "")
            if status_sent is None and scope.get("state", {}).get(CLIENT_GONE):
                status = CLIENT_CLOSED_REQUEST  # nobody was answered: not a server error
            self.metrics.requests.labels(route=template, method=method, status=str(status)).inc()
            self.metrics.latency.labels(route=template).observe(elapsed)
            if status >= 400:
                self.metrics.errors.labels(route=template, kind=error_kind(template, status)).inc()
            logger.info("request_id=%s%s %s %s status=%d latency_ms=%.1f", request_id, client_ref, method, template,
                        status, elapsed * 1000.0)


class BodyLimitMiddleware:
    """Pure ASGI middleware: the request body, read before any route sees it, within limits.

    Unauthenticated requests with a body are refused (401) before a byte of it is read, a declared
    Content-Length over max_bytes without reading it (413), and a body whose next piece takes
    longer than timeout_s is cut off (408): a slow or anonymous client cannot hold a
    connection for long. The body is then replayed to the app, which would buffer it whole
    anyway to parse the JSON.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float, settings: Settings, routes: list):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.settings = settings
        self.routes = routes  # the app's routes: a refusal is counted under its route template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        # Every route that takes a body needs a key (/v1, FHIR, CDS Hooks): check it before
        # reading a byte, so an anonymous client cannot hold a connection with a slow body.
        if scope.get("method") in ("POST", "PUT", "PATCH") and not self.settings.no_auth:
            try:
                check_key(self.settings, _key_from_headers(headers))
            except StarletteHTTPException as exc:
                await self._refuse(scope, send, exc.status_code, str(exc.detail), exc.headers)
                return
        declared = headers.get(b"content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await self._refuse(scope, send, 400, "invalid Content-Length header")
                return
            if int(declared) > self.max_bytes:
                await self._refuse(scope, send, 413, f"request body larger than {self.max_bytes} bytes")
                return
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), self.timeout_s)
            except asyncio.TimeoutError:
                await self._refuse(scope, send, 408, f"request body not received within {self.timeout_s:g} s")
                return
            if message["type"] != "http.request":  # client went away: nothing to answer
                scope.setdefault("state", {})[CLIENT_GONE] = True
                self._name_route(scope)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(scope, send, 413, f"request body larger than {self.max_bytes} bytes")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body, only http.disconnect is left

        await self.app(scope, replay, send)

    def _name_route(self, scope: Scope) -> None:
        """Sets scope["route"] as routing would have, for the access log and the metrics."""
        for route in _leaf_routes(self.routes):
            if route.matches(scope)[0] == Match.FULL:
                scope["route"] = route
                return

    async def _refuse(self, scope: Scope, send: Send, status: int, message: str, headers=None) -> None:
        self._name_route(scope)
        request_id = scope.get("state", {}).get("request_id")
        response = JSONResponse(status_code=status, content={"detail": message, "request_id": request_id},
                                headers={**(headers or {}), "Connection": "close"})  # the body stays unread
        await response(scope, None, send)  # type: ignore[arg-type]  # a JSONResponse never receives


def _leaf_routes(routes) -> list:
    """The endpoint routes under routes, through included routers and mounts."""
    out = []
    for route in routes:
        inner = getattr(route, "routes", None) or getattr(getattr(route, "original_router", None), "routes", None)
        if inner is not None:
            out += _leaf_routes(inner)
        elif getattr(route, "path", None) is not None:
            out.append(route)
    return out


def _key_from_headers(headers: dict[bytes, bytes]) -> str | None:
    """The API key of a request, as the auth dependency reads it (X-API-Key, else a bearer token)."""
    key = headers.get(API_KEY_HEADER.lower().encode())
    if key is not None:
        return key.decode("latin-1")
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def _error_items(errors) -> list[dict]:
    """FastAPI/pydantic errors without 'input' and 'ctx': they would echo patient data back and may not be JSON."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", "value_error"))}
            for e in errors]


def _install_error_handlers(app: FastAPI) -> None:
    """Every failure becomes a JSON ErrorResponse; client mistakes are 4xx with the field named."""

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        if request.url.path.startswith(fhir_router.prefix + "/"):  # FHIR clients read OperationOutcomes
            items = _error_items(exc.errors())
            return JSONResponse(status_code=422, media_type=FHIR_JSON, content=operation_outcome(
                [(".".join(str(p) for p in e["loc"]), e["msg"], "value") for e in items]))
        return JSONResponse(status_code=422, content={"detail": _error_items(exc.errors()),
                                                      "request_id": _request_id(request)})

    @app.exception_handler(InputError)
    async def input_error(request: Request, exc: InputError) -> JSONResponse:
        return JSONResponse(status_code=422, content={
            "detail": [{"loc": list(exc.loc), "msg": exc.msg, "type": exc.kind}], "request_id": _request_id(request)})

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(status_code=exc.status_code, content=jsonable_encoder(
            {"detail": exc.detail, "request_id": _request_id(request)}), headers=getattr(exc, "headers", None))

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                            content={"detail": str(exc), "request_id": _request_id(request)})

    @app.exception_handler(BatcherStoppedError)
    async def stopped(request: Request, exc: BatcherStoppedError) -> JSONResponse:
        return JSONResponse(status_code=503, headers={"Retry-After": "1"},
                            content={"detail": str(exc), "request_id": _request_id(request)})


def _warmup_request(events: bool = True, meds_codes=None) -> PredictRequest:
    """A minimal admission (one event, or none) for the warm-up passes; its prediction is thrown away.

    A model trained on MEDS data reads MEDS codes: its event is a code its map reads as an event.
    """
    admit = dt.datetime(2150, 1, 1, 8, 0)
    event = {"source": "lab", "code": "warmup"}
    if meds_codes is not None:
        rule = next((r for r in meds_codes.events if r.item_range is None), meds_codes.events[0])
        event = {"code": f"{rule.prefix}//{rule.item_range[0] if rule.item_range else 'warmup'}"}
    return PredictRequest(
        patient=Patient(gender="U", age_years=60.0),
        admission=Admission(admit_time=admit.isoformat(), admission_type="EMERGENCY"),
        events=[{"time": (admit + dt.timedelta(hours=1)).isoformat(), **event}] if events else [],
    )


async def _warm_up(app: FastAPI, predictor: ServedModel, batcher: MicroBatcher, settings: Settings) -> None:
    """Forward passes on the model thread, then /readyz turns 'ok'; a failure of the first keeps it 503.

    bfloat16 compiles its fused LSTM step (XLA) once per batch shape (0.1-0.2 s each at Table-7
    size) and per loop (all sequences full, or some padded), so every batch the micro-batcher
    can form at the default num_samples, 1 .. max_batch admissions of equal and of unequal bag
    counts, runs once here instead of making the first patient in a batch of that shape wait.
    Before /readyz turns ok: compiling alongside the first requests slowed them instead. The
    warm-up admissions have at most one bag, so each pass costs little beyond its compilation.
    """
    try:
        # The unit registry too: the first request with a value to convert must not wait for it.
        await run_in_threadpool(predictor.export.harmoniser.converter.load)
        one, empty = [(await run_in_threadpool(encode, _warmup_request(events, predictor.export.meds_codes),
                                               predictor.export)).example
                      for events in (True, False)]
        await batcher.run_in_model_thread(predictor.forward, [one], settings.default_num_samples, 0)
    except asyncio.CancelledError:
        raise
    except Exception as err:
        logger.error("warm-up forward pass failed (%s: %s); /readyz stays 503", type(err).__name__, err)
        return
    if predictor.choice.requested == precision_choice.AUTO:
        try:
            timing = [(await run_in_threadpool(encode, r, predictor.export)).example
                      for r in precision_choice.timing_requests(predictor.export)]
            await batcher.run_in_model_thread(predictor.choose_precision, timing, settings.default_num_samples)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the float32 pass above worked: serve it
            logger.warning("precision auto: timing failed (%s: %s); serving float32", type(err).__name__, err)
    choice = predictor.choice
    logger.info("precision: serving %s (--precision %s): %s", choice.served, choice.requested, choice.reason)
    if predictor.precision == "bfloat16":  # float32 compiles nothing per shape
        try:
            for n in range(1, settings.max_batch + 1):
                for batch in ([one] * n, [one] * (n - 1) + [empty]):  # no bag padded, some padded
                    await batcher.run_in_model_thread(predictor.forward, batch, settings.default_num_samples, 0)
            logger.info("bfloat16 step compiled for batches of 1-%d admissions at num_samples=%d",
                        settings.max_batch, settings.default_num_samples)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the model did answer one pass: serve, and compile the rest on demand
            logger.warning("bfloat16 warm-up stopped (%s); other batch shapes compile on first use",
                           type(err).__name__)
    app.state.ready = True
    app.state.metrics.ready.set(1)
    logger.info("model warmed up; ready")


def create_app(settings: Settings, predictor: ServedModel | None = None) -> FastAPI:
    """The service app; loads settings.model_dir at start-up unless a loaded `predictor` is given."""
    metrics = ServiceMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        model = (predictor if predictor is not None
                 else await run_in_threadpool(ServedModel.load, settings.model_dir, settings.precision))
        export = model.export
        card = export.card
        metrics.model_info.labels(name=card.name, version=card.version, checksum=export.checksum).set(1)
        batcher = MicroBatcher(model.forward, max_batch=settings.max_batch, max_wait_s=settings.max_wait_ms / 1000.0,
                               max_queue=settings.max_queue, metrics=metrics)
        await batcher.start()
        app.state.predictor = model
        app.state.batcher = batcher
        app.state.monitor = Monitor(export, settings.monitor_window, metrics)
        if export.reference is None:
            logger.info("the export carries no reference population: /v1/monitor answers 'unavailable'")
        if settings.warmup:
            warm = asyncio.create_task(_warm_up(app, model, batcher, settings))
        else:
            warm = None
            app.state.ready = True
            metrics.ready.set(1)
        try:
            yield
        finally:
            app.state.ready = False  # tell load balancers first, then drain
            metrics.ready.set(0)
            if warm is not None:
                warm.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await warm
            await batcher.stop()

    app = FastAPI(
        title="ehr-uncertainty prediction service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.predictor = None
    app.state.monitor = None
    app.state.ready = False
    # Last added runs first: the request id, log line and metrics cover 413s too.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                       settings=settings, routes=app.router.routes)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    _install_error_handlers(app)
    app.include_router(health_router)
    app.include_router(metrics_router)
    app.include_router(v1_router)
    app.include_router(fhir_router)
    app.include_router(cds_router)
    return app
