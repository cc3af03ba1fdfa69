"""The service's two pure ASGI middlewares: what every request goes through before and after a route.

``RequestContextMiddleware`` gives each request its id, writes the one access-log line and
counts it in the HTTP metrics; ``BodyLimitMiddleware`` reads the body within the size, time and
auth limits before any route sees it. Neither keeps state beyond the request it is handling.
"""
from __future__ import annotations

import asyncio
import hashlib
import logging
import time
import traceback
import uuid

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serving.api.auth import API_KEY_HEADER, AuthGuard
from serving.monitoring.telemetry import ServiceMetrics
from serving.oip.routes import PREFIX as OIP_PREFIX

logger = logging.getLogger("serving.app")  # log filters and alerts select the service by this name

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

    Unauthenticated requests with a body are refused (401, or 429 for an address out of its failure
    budget: serving.api.auth) before a byte of it is read, a declared
    Content-Length over max_bytes without reading it (413), and a body whose next piece takes
    longer than timeout_s is cut off (408): a slow or anonymous client cannot hold a
    connection for long. The body is then replayed to the app, which would buffer it whole
    anyway to parse the JSON.
    """

    def __init__(self, app: ASGIApp, max_bytes: int, timeout_s: float, auth: AuthGuard, routes: list):
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s
        self.auth = auth
        self.routes = routes  # the app's routes: a refusal is counted under its route template

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers", []))
        # Every route that takes a body needs a key (/v1, FHIR, CDS Hooks): check it before
        # reading a byte, so an anonymous client cannot hold a connection with a slow body.
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            try:
                self.auth.check(_key_from_headers(headers), scope)
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
        # Open Inference Protocol clients read {"error": ...} (serving.oip), every other client {"detail": ...}.
        oip = scope.get("path", "") == OIP_PREFIX or scope.get("path", "").startswith(OIP_PREFIX + "/")
        content = {"error": message} if oip else {"detail": message, "request_id": request_id}
        response = JSONResponse(status_code=status, content=content,
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
