"""The Open Inference Protocol v2 endpoints (KServe v2 REST), on the same app as /v1.

``oip_routers`` builds two routers around the dependencies the app hands it (the app assembles the
service and imports this room, so this room cannot import the app's dependencies back):

* open, like /healthz: ``GET /v2/health/live`` and ``GET /v2/health/ready``;
* with the API key, like /v1: ``GET /v2`` (server metadata), ``GET /v2/models/{name}[/versions/{v}]``
  (model metadata), ``.../ready`` and ``POST .../infer``.

An infer request holds one of two inputs, each a BYTES tensor of one element per admission:
``admission_json``, the very JSON body /v1/predict takes, which goes through ``predict_admissions``
like every other route; or ``sequence_example``, serialized ``tf.train.SequenceExample`` records
(base64 text in JSON, raw with the binary-data extension), checked by ``serving.oip.records`` against
the export's contract before the model sees them. Request parameters ``num_samples`` and ``seed`` are
/v1's query parameters. Errors are the protocol's ``{"error": "..."}`` with a 4xx or 503 status.

When the server keeps outcomes (--outcome-dir), every admission of either input is kept in the outcome
store as /v1's answers are, and the answer carries one more output, ``prediction_id`` (BYTES, one per
admission: the key to POST its outcome to /v1/outcomes); the model metadata then lists it. A
``sequence_example`` record is the encoded admission itself, so it is kept under the same rule as the
JSON road's (its bytes only with --outcome-keep-admissions).
"""
import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pydantic
from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from serving import __version__
from serving.inference.model_versions import ModelVersions, ServedVersion, admission_key
from serving.inference.prediction import check_event_limit, predict_admissions
from serving.inference.served_model import ServedModel
from serving.oip import records
from serving.oip.tensors import (
    BINARY_EXTENSION,
    HEADER_LENGTH,
    InferRequest,
    InputTensor,
    OutputTensor,
    ProtocolError,
    base64_element,
    encode_response,
    int_parameter,
    parse_request,
)
from serving.schemas import InputError, PredictRequest

PREFIX = "/v2"
SERVER_NAME = "ehr-uncertainty"
ADMISSION_JSON = "admission_json"
SEQUENCE_EXAMPLE = "sequence_example"
_MAX_SEED = 2**63 - 1
# (name, datatype, shape with -1 for the admissions and S, K for the sampled probabilities, what it is)
OUTPUTS = (
    ("probability", "FP64", ("N",), "predictive mean probability of in-hospital death"),
    ("sampled_probabilities", "FP64", ("N", "S", "K"), "the S samples of each of the K ensemble members"),
    ("predictive_entropy", "FP64", ("N",), "total uncertainty H[E p], nats"),
    ("mutual_information", "FP64", ("N",), "epistemic uncertainty H[E p] - E H[p], nats"),
    ("interval_lower", "FP64", ("N",), "2.5th percentile of the sampled probabilities"),
    ("interval_upper", "FP64", ("N",), "97.5th percentile of the sampled probabilities"),
    ("refer", "BOOL", ("N",), "refer to a clinician: the uncertainty exceeds the export's referral threshold"),
)
PREDICTION_ID = ("prediction_id", "BYTES", ("N",), "key of the admission's prediction in the outcome store: POST "
                 "its outcome to /v1/outcomes (only when the server keeps outcomes)")
_ERROR = {"content": {"application/json": {"schema": {"type": "object", "required": ["error"],
                                                      "properties": {"error": {"type": "string"}}}}}}
_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {**_ERROR, "description": "The protocol or the model refuses the request (the field named)."},
    401: {**_ERROR, "description": "Missing or invalid API key."},
    404: {**_ERROR, "description": "Another model, or a version not in the server's model repository."},
    503: {**_ERROR, "description": "Model not loaded yet, a version that did not load (the reason given), or too "
                                  "many requests waiting."},
}
_TENSOR = {"type": "object", "required": ["name", "shape", "datatype"], "properties": {
    "name": {"type": "string", "enum": ["admission_json", "sequence_example"]},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "datatype": {"type": "string", "enum": ["BYTES"]}, "data": {"type": "array"},
    "parameters": {"type": "object"}}}
_INFER_BODY = {"requestBody": {"required": True, "content": {"application/json": {"schema": {
    "type": "object", "required": ["inputs"], "properties": {
        "id": {"type": "string"}, "parameters": {"type": "object"},
        "inputs": {"type": "array", "items": _TENSOR, "minItems": 1},
        "outputs": {"type": "array", "items": {"type": "object", "required": ["name"]}}}}}}}}


def protocol_error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    """The protocol's error answer."""
    return JSONResponse(status_code=status, content={"error": message}, headers=headers)


def _check_model(versions: ModelVersions, name: str, version: str | None) -> ServedVersion | None:
    """The loaded `version` a route names (None when it names none); ProtocolError 404 for another model or an
    unknown version, 503 with the reason for a version that did not load."""
    if name != versions.name:
        raise ProtocolError(f"model {name[:80]!r} is not served here (this server serves {versions.name!r})", 404)
    if version is None:
        return None
    if version in versions.failed:
        raise ProtocolError(f"version {version!r} of {name!r} did not load: {versions.failed[version]}", 503)
    if version not in versions.loaded:
        raise ProtocolError(f"model {name!r} has no version {version[:40]!r} here (served: "
                            f"{', '.join(versions.loaded)})", 404)
    return versions.loaded[version]


def _outputs(keeps_outcomes: bool) -> tuple[tuple, ...]:
    """The output tensors of this server: prediction_id only when it keeps outcomes."""
    return (*OUTPUTS, PREDICTION_ID) if keeps_outcomes else OUTPUTS


def model_metadata(predictor: ServedModel, keeps_outcomes: bool = False, versions: list[str] | None = None) -> dict:
    """The protocol's model metadata: name, versions (those a request may name; default: predictor's), platform, and
    predictor's input and output tensors."""
    export = predictor.export
    sizes = {"N": -1, "S": -1, "K": export.ensemble_size}
    return {
        "name": predictor.name, "versions": versions or [predictor.version], "platform": "tensorflow_savedmodel",
        "inputs": [
            {"name": ADMISSION_JSON, "datatype": "BYTES", "shape": [-1],
             "parameters": {"description": "one /v1/predict request body (JSON text) per admission"}},
            {"name": SEQUENCE_EXAMPLE, "datatype": "BYTES", "shape": [-1],
             "parameters": {"description": "one serialized tf.train.SequenceExample per admission (base64 in JSON)",
                            "schema_version": export.schema_version}},
        ],
        "outputs": [{"name": n, "datatype": d, "shape": [sizes[s] for s in shape], "parameters": {"description": w}}
                    for n, d, shape, w in _outputs(keeps_outcomes)],
        "parameters": {"checksum": export.checksum, "precision": predictor.precision},
    }


def _output_tensors(probs: np.ndarray, probability, lower, upper, entropy, mi, refer, ensemble_size: int,
                    num_samples: int) -> list[OutputTensor]:
    """The outputs in OUTPUTS' order; probs [N, S*K] sample-major becomes [N, S, K]."""
    values = (probability, probs.reshape(len(probs), num_samples, ensemble_size), entropy, mi, lower, upper, refer)
    return [OutputTensor(name, datatype, np.asarray(v)) for (name, datatype, _, _), v in zip(OUTPUTS, values)]


def _admissions(tensor: InputTensor) -> list[PredictRequest]:
    """The /v1/predict bodies of an admission_json tensor; ProtocolError naming the element and field."""
    out = []
    for i, element in enumerate(tensor.elements):
        try:
            out.append(PredictRequest.model_validate_json(element))
        except pydantic.ValidationError as err:
            first = err.errors(include_input=False, include_context=False)[0]
            loc = ".".join(str(p) for p in first.get("loc", ())) or "body"
            raise ProtocolError(f"input {ADMISSION_JSON!r} element {i}: {loc}: {first.get('msg', 'invalid')}"
                                f"{f' (and {err.error_count() - 1} more)' if err.error_count() > 1 else ''}") from None
    return out


def _single_input(req: InferRequest) -> InputTensor:
    unknown = sorted(set(req.inputs) - {ADMISSION_JSON, SEQUENCE_EXAMPLE})
    if unknown or len(req.inputs) != 1:
        raise ProtocolError(f"send exactly one input, {ADMISSION_JSON!r} or {SEQUENCE_EXAMPLE!r}; got "
                            f"{sorted(req.inputs)}")
    [tensor] = req.inputs.values()
    return tensor


def _binary_map(req: InferRequest, keeps_outcomes: bool) -> dict[str, bool]:
    """Output name -> sent as binary, for the outputs to send (all when the request names none)."""
    names = [o[0] for o in _outputs(keeps_outcomes)]
    if req.outputs is None:
        return {name: req.binary_default for name in names}
    if PREDICTION_ID[0] in req.outputs and not keeps_outcomes:
        raise ProtocolError(f"output {PREDICTION_ID[0]!r}: this server keeps no outcomes (no --outcome-dir)")
    unknown = sorted(set(req.outputs) - set(names))
    if unknown:
        raise ProtocolError(f"unknown output(s) {unknown}; this model has {names}")
    return dict(req.outputs)


def _element(tensor: InputTensor, i: int) -> bytes:
    """Element i of a sequence_example tensor as raw bytes."""
    element = tensor.elements[i]
    return element if tensor.from_binary else base64_element(element, f"{SEQUENCE_EXAMPLE}[{i}]")


def _routed(serving: Any, versions: ModelVersions, name: str, version: str | None, tensor: InputTensor,
            admissions: list[PredictRequest] | None) -> Any:
    """The serving bundle of the version that answers: the one the route names, else the one the request's first
    admission is routed to (the traffic split's, or the default; the whole request goes to one version)."""
    if _check_model(versions, name, version) is not None:
        return serving.addressed(version)
    if admissions is not None:
        return serving.routed(admission_key(admissions[0]))
    if versions.split is None:  # the default: the record is read once, by its check
        return serving.routed("")
    key = records.admission_key(_element(tensor, 0))
    return serving.routed(key) if key is not None else serving  # not a record: the default refuses it, uncounted


async def _infer(request: Request, serving: Any, name: str, version: str | None) -> Response:
    """One infer call: parse, pick the version, score through the prediction road, answer the named tensors."""
    settings = serving.settings
    _check_model(serving.versions, name, version)
    req = parse_request(await request.body(), request.headers.get(HEADER_LENGTH))
    num_samples = int_parameter(req.parameters, "num_samples", 1, settings.max_num_samples)
    num_samples = settings.default_num_samples if num_samples is None else num_samples
    seed = int_parameter(req.parameters, "seed", 0, _MAX_SEED)
    tensor, binary = _single_input(req), _binary_map(req, serving.outcomes is not None)
    if not 1 <= len(tensor.elements) <= settings.max_patients:
        raise ProtocolError(f"input {tensor.name!r}: 1 to {settings.max_patients} admissions per request, got "
                            f"{len(tensor.elements)}")
    admissions = _admissions(tensor) if tensor.name == ADMISSION_JSON else None
    serving = _routed(serving, serving.versions, name, version, tensor, admissions)
    predictor = serving.predictor
    export = predictor.export
    common = dict(num_samples=num_samples, seed=seed, batcher=serving.batcher, arrival=serving.arrival,
                  metrics=serving.metrics, monitor=serving.monitor)
    if admissions is not None:
        locs = [(ADMISSION_JSON, i) for i in range(len(admissions))]
        try:
            for body, loc in zip(admissions, locs):
                check_event_limit(body, settings, loc)
            predictions = await predict_admissions(admissions, locs, include_samples=True, predictor=predictor,
                                                   outcomes=serving.outcomes, **common)
        except InputError as err:
            raise ProtocolError(f"input {err.loc[0]!r} element {err.loc[1]}: "
                                f"{'.'.join(str(p) for p in err.loc[2:]) or 'body'}: {err.msg}") from None
        probs = np.asarray([p.samples for p in predictions], np.float64)
        outputs = _output_tensors(probs, [p.probability for p in predictions],
                                  [p.interval.lower for p in predictions], [p.interval.upper for p in predictions],
                                  [p.predictive_entropy for p in predictions], [p.epistemic for p in predictions],
                                  [p.refer for p in predictions], export.ensemble_size, num_samples)
        ids = [p.prediction_id for p in predictions] if serving.outcomes is not None else None
    else:
        schema_version = int_parameter(req.parameters, "schema_version", 0, 2**31)
        checked = [records.check_record(_element(tensor, i), export, f"input {SEQUENCE_EXAMPLE!r} element {i}",
                                        schema_version) for i in range(len(tensor.elements))]
        probs, s, ids = await records.predict_records(checked, export=export, outcomes=serving.outcomes, **common)
        outputs = _output_tensors(probs, s.probability, s.lower, s.upper, s.predictive_entropy, s.epistemic, s.refer,
                                  export.ensemble_size, num_samples)
    if ids is not None:
        outputs.append(OutputTensor(PREDICTION_ID[0], PREDICTION_ID[1], np.asarray(ids, dtype=object)))
    head = {"model_name": predictor.name, "model_version": predictor.version,
            **({"id": req.id} if req.id is not None else {}),
            "parameters": {"num_samples": num_samples, "ensemble_size": export.ensemble_size,
                           "checksum": export.checksum, "precision": predictor.precision,
                           "selected_by": serving.selected_by}}
    content, json_size = encode_response(head, [o for o in outputs if o.name in binary], binary)
    if json_size is None:
        return Response(content, media_type="application/json")
    return Response(content, media_type="application/octet-stream",
                    headers={"Inference-Header-Content-Length": str(json_size)})


def _answer_errors(handler: Callable) -> Callable:
    """The route's ProtocolErrors as the protocol's error answers (FastAPI reads the signature through wraps)."""
    @functools.wraps(handler)
    async def wrapped(*args, **kwargs):
        try:
            return await handler(*args, **kwargs)
        except ProtocolError as err:
            return protocol_error(err.status, str(err))
    return wrapped


def oip_routers(serving_dep: Any, versions_dep: Any, outcomes_dep: Any) -> tuple[APIRouter, APIRouter]:
    """(open health router, keyed router) of the protocol; serving_dep, versions_dep (the model's versions,
    serving.inference.model_versions) and outcomes_dep (the outcome store or None) are the app's Annotated deps."""
    health = APIRouter(prefix=PREFIX, tags=["open inference protocol"])
    keyed = APIRouter(prefix=PREFIX, tags=["open inference protocol"])

    @health.get("/health/live", summary="OIP v2: the server is live")
    async def live() -> dict:
        return {"live": True}

    @health.get("/health/ready", summary="OIP v2: the server is ready (model loaded and warmed up)")
    async def ready(request: Request) -> Response:
        is_ready = bool(getattr(request.app.state, "ready", False))
        return JSONResponse({"ready": is_ready}, status_code=200 if is_ready else 503)

    @keyed.get("", summary="OIP v2: server metadata", responses={401: _ERRORS[401]})
    async def server_metadata() -> dict:
        return {"name": SERVER_NAME, "version": __version__, "extensions": [BINARY_EXTENSION]}

    async def metadata(versions: ModelVersions, outcomes: Any, name: str, version: str | None) -> Response:
        served = _check_model(versions, name, version) or versions.loaded[versions.default]
        return JSONResponse(model_metadata(served.predictor, keeps_outcomes=outcomes is not None,
                                           versions=list(versions.loaded)))

    async def model_ready(request: Request, versions: ModelVersions, name: str, version: str | None) -> Response:
        if version is not None and name == versions.name and version in versions.failed:
            # Not an error: the version is known and not ready, and the answer says why.
            return JSONResponse({"name": name, "version": version, "ready": False,
                                 "reason": f"did not load: {versions.failed[version]}"}, status_code=503)
        served = _check_model(versions, name, version)
        is_ready = served.ready if served is not None else bool(getattr(request.app.state, "ready", False))
        return JSONResponse({"name": name, **({"version": version} if version is not None else {}),
                             "ready": is_ready}, status_code=200 if is_ready else 503)

    @keyed.get("/models/{name}", summary="OIP v2: model metadata (the default version's)", responses=_ERRORS)
    @_answer_errors
    async def model_metadata_route(name: str, versions: versions_dep, outcomes: outcomes_dep) -> Response:
        return await metadata(versions, outcomes, name, None)

    @keyed.get("/models/{name}/versions/{version}", summary="OIP v2: model metadata of one version", responses=_ERRORS)
    @_answer_errors
    async def version_metadata_route(name: str, version: str, versions: versions_dep,
                                     outcomes: outcomes_dep) -> Response:
        return await metadata(versions, outcomes, name, version)

    @keyed.get("/models/{name}/ready", summary="OIP v2: the model is ready", responses=_ERRORS)
    @_answer_errors
    async def model_ready_route(request: Request, name: str, versions: versions_dep) -> Response:
        return await model_ready(request, versions, name, None)

    @keyed.get("/models/{name}/versions/{version}/ready", summary="OIP v2: this version of the model is ready",
               responses=_ERRORS)
    @_answer_errors
    async def version_ready_route(request: Request, name: str, version: str, versions: versions_dep) -> Response:
        return await model_ready(request, versions, name, version)

    @keyed.post("/models/{name}/infer", summary="OIP v2: infer (the admission's version: the traffic split's, or "
                                               "the default)", openapi_extra=_INFER_BODY, responses=_ERRORS)
    @_answer_errors
    async def infer_route(request: Request, name: str, serving: serving_dep) -> Response:
        return await _infer(request, serving, name, None)

    @keyed.post("/models/{name}/versions/{version}/infer", summary="OIP v2: infer with one version",
                openapi_extra=_INFER_BODY, responses=_ERRORS)
    @_answer_errors
    async def version_infer_route(request: Request, name: str, version: str, serving: serving_dep) -> Response:
        return await _infer(request, serving, name, version)

    return health, keyed
