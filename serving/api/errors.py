"""Exception handlers: every failure becomes a JSON answer naming the request, never echoing its data.

Client mistakes are 4xx with the field named (an OperationOutcome for FHIR clients): 400 for a body
that is not JSON, 422 for JSON that does not fit the schema, on every route that takes a body; a full
queue or a stopped batcher is 503 with Retry-After. Under /v2 (the Open Inference Protocol) every
answer is the protocol's ``{"error": "..."}`` instead, which its clients read. Unhandled exceptions are answered by
``serving.api.middleware.RequestContextMiddleware``, which logs them without their message.
"""
from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving.api.fhir_answers import FHIR_JSON, operation_outcome
from serving.inference.batching import BatcherStoppedError, QueueFullError
from serving.oip import protocol_error
from serving.oip.routes import PREFIX as OIP_PREFIX
from serving.schemas import InputError


def _request_id(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def _is_oip(request: Request) -> bool:
    """Open Inference Protocol clients (tritonclient, the kserve SDK) read {"error": "..."} and nothing else."""
    return request.url.path == OIP_PREFIX or request.url.path.startswith(OIP_PREFIX + "/")


def _answer(request: Request, status: int, detail, headers=None) -> JSONResponse:
    """{"detail", "request_id"}, or the protocol's {"error"} under /v2."""
    if _is_oip(request):
        return protocol_error(status, detail if isinstance(detail, str) else str(jsonable_encoder(detail)), headers)
    return JSONResponse(status_code=status, content=jsonable_encoder({"detail": detail,
                                                                      "request_id": _request_id(request)}),
                        headers=headers)


def _error_items(errors) -> list[dict]:
    """FastAPI/pydantic errors without 'input' and 'ctx': they would echo patient data back and may not be JSON."""
    return [{"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", "value_error"))}
            for e in errors]


def _not_json(errors) -> str | None:
    """Why a body is not JSON (FastAPI's parse errors: malformed or empty), or None when these are schema errors.

    A body that cannot be parsed is a malformed request (400, RFC 9110 15.5.1), as FHIR and CDS Hooks
    answer too; 422 is for JSON that parsed but does not fit the schema.
    """
    for e in errors:
        if e.get("type") == "json_invalid":
            loc = tuple(e.get("loc", ()))
            where = f" at character {loc[1]}" if len(loc) > 1 else ""
            return f"request body is not valid JSON: {(e.get('ctx') or {}).get('error', 'decode error')}{where}"
        if e.get("type") == "missing" and tuple(e.get("loc", ())) == ("body",):
            return "request body is empty: send a JSON object"
    return None


def install_error_handlers(app: FastAPI, fhir_prefix: str) -> None:
    """Every failure becomes a JSON ErrorResponse; client mistakes are 4xx with the field named.

    Validation errors under `fhir_prefix` are answered as OperationOutcomes instead.
    """

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        reason = _not_json(exc.errors())
        if reason is not None:
            return _answer(request, 400, reason)
        if _is_oip(request):
            first = _error_items(exc.errors())[0]
            return _answer(request, 400, f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}")
        if request.url.path.startswith(fhir_prefix + "/"):  # FHIR clients read OperationOutcomes
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
        return _answer(request, exc.status_code, exc.detail, getattr(exc, "headers", None))

    @app.exception_handler(QueueFullError)
    async def queue_full(request: Request, exc: QueueFullError) -> JSONResponse:
        return _answer(request, 503, str(exc), {"Retry-After": "1"})

    @app.exception_handler(BatcherStoppedError)
    async def stopped(request: Request, exc: BatcherStoppedError) -> JSONResponse:
        return _answer(request, 503, str(exc), {"Retry-After": "1"})
