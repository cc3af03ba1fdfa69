"""Open Inference Protocol v2 tensors: a request body -> named inputs, named outputs -> a response body.

The protocol (KServe v2, spoken by Triton, MLServer, Seldon Core 2 and their clients) sends a JSON
object whose ``inputs`` are typed tensors: ``{"name", "shape", "datatype", "data"}``, ``data`` the
row-major values. The binary-data extension (Triton's ``binary_tensor_data``) may instead append a
tensor's raw bytes after the JSON: the header ``Inference-Header-Content-Length`` says where the JSON
ends, and the tensor's ``parameters.binary_data_size`` how many bytes are its own. A BYTES element
in binary is a 4-byte little-endian length and the bytes; in JSON it is a string. Outputs travel the
same two ways, as the request asks (``binary_data_output`` for all, ``binary_data`` per output).

Pure functions, no HTTP and no model: ``serving.oip.routes`` reads the body and calls them.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

HEADER_LENGTH = "inference-header-content-length"
BINARY_EXTENSION = "binary_tensor_data"
# The protocol's datatypes of the tensors this service reads and writes, with their little-endian layout.
_NUMPY = {"BOOL": np.dtype("?"), "INT64": np.dtype("<i8"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8")}


class ProtocolError(ValueError):
    """A request the protocol or this model refuses; answered {"error": message} with `status`."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class InputTensor:
    """One named input of a request: a BYTES tensor's elements, flattened in row-major order."""

    name: str
    shape: tuple[int, ...]
    elements: list[bytes]
    from_binary: bool  # the raw bytes came after the JSON (binary extension), not as JSON strings


@dataclasses.dataclass(frozen=True)
class InferRequest:
    """A parsed infer request: its id, parameters, inputs by name, and the outputs asked for."""

    id: str | None
    parameters: Mapping[str, Any]
    inputs: Mapping[str, InputTensor]
    outputs: Mapping[str, bool] | None  # output name -> binary; None: all outputs
    binary_default: bool  # binary_data_output: outputs the request does not name travel as binary


@dataclasses.dataclass(frozen=True)
class OutputTensor:
    """One named output: its datatype and values (numpy, any shape)."""

    name: str
    datatype: str
    values: np.ndarray


def parse_request(body: bytes, header_length: str | None) -> InferRequest:
    """An infer request from its body (JSON, or JSON + binary tensors); ProtocolError naming the field."""
    json_size = len(body)
    if header_length is not None:
        if not header_length.strip().isdigit() or int(header_length) > len(body):
            raise ProtocolError(f"Inference-Header-Content-Length {header_length!r} is not a length within the body")
        json_size = int(header_length)
    try:
        doc = json.loads(body[:json_size])
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ProtocolError(f"request body is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise ProtocolError("request body must be a JSON object with 'inputs'")
    parameters = _object(doc.get("parameters"), "parameters")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError("'inputs' must be a non-empty list of tensors")
    binary, offset, inputs = memoryview(body), json_size, {}
    for i, tensor in enumerate(raw_inputs):
        parsed, offset = _input(tensor, f"inputs[{i}]", binary, offset)
        if parsed.name in inputs:
            raise ProtocolError(f"inputs[{i}]: input {parsed.name!r} given twice")
        inputs[parsed.name] = parsed
    if offset != len(body):
        raise ProtocolError(f"{len(body) - offset} bytes after the tensors that no input's binary_data_size claims")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError("'id' must be a string")
    binary_default = parameters.get("binary_data_output") is True
    return InferRequest(request_id, parameters, inputs, _requested_outputs(doc, binary_default), binary_default)


def _object(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ProtocolError(f"'{where}' must be a JSON object")
    return value


def _input(tensor: Any, where: str, body: memoryview, offset: int) -> tuple[InputTensor, int]:
    """One input tensor of the JSON (its bytes from `offset` of the body when binary); and the next offset."""
    if not isinstance(tensor, dict):
        raise ProtocolError(f"{where} must be a JSON object")
    name, shape, datatype = tensor.get("name"), tensor.get("shape"), tensor.get("datatype")
    if not isinstance(name, str) or not name:
        raise ProtocolError(f"{where}.name must be a non-empty string")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                              for d in shape):
        raise ProtocolError(f"{where} ({name}): shape must be a list of non-negative integers")
    if datatype != "BYTES":
        raise ProtocolError(f"{where} ({name}): datatype must be BYTES, got {datatype!r}")
    count = math.prod(shape)
    size = _object(tensor.get("parameters"), f"{where}.parameters").get("binary_data_size")
    if size is not None:
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or offset + size > len(body):
            raise ProtocolError(f"{where} ({name}): binary_data_size {size!r} runs past the body")
        elements = _bytes_elements(body[offset:offset + size], f"{where} ({name})")
        offset += size
        from_binary = True
    else:
        elements = [_text_element(v, f"{where} ({name})") for v in _flatten(tensor.get("data"), f"{where} ({name})")]
        from_binary = False
    if len(elements) != count:
        raise ProtocolError(f"{where} ({name}): shape {shape} holds {count} elements, data holds {len(elements)}")
    return InputTensor(name, tuple(shape), elements, from_binary), offset


def _flatten(data: Any, where: str) -> list:
    """Row-major elements of a JSON tensor's data (flat, or nested as the protocol allows)."""
    if not isinstance(data, list):
        raise ProtocolError(f"{where}: data must be a JSON list")
    out: list = []
    stack = [iter(data)]
    while stack:  # iterative: a deeply nested list must not exhaust the recursion limit
        item = next(stack[-1], _END)
        if item is _END:
            stack.pop()
        elif isinstance(item, list):
            stack.append(iter(item))
        else:
            out.append(item)
    return out


_END = object()


def _text_element(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise ProtocolError(f"{where}: a BYTES element in JSON must be a string, got {type(value).__name__}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise ProtocolError(f"{where}: a BYTES element is not valid Unicode text") from None


def _bytes_elements(raw: memoryview, where: str) -> list[bytes]:
    """The elements of a binary BYTES tensor: each a 4-byte little-endian length, then that many bytes."""
    out, i = [], 0
    while i < len(raw):
        if i + 4 > len(raw):
            raise ProtocolError(f"{where}: binary BYTES element {len(out)} has a cut-off length prefix")
        (n,) = struct.unpack_from("<I", raw, i)
        if i + 4 + n > len(raw):
            raise ProtocolError(f"{where}: binary BYTES element {len(out)} claims {n} bytes past the tensor's end")
        out.append(bytes(raw[i + 4:i + 4 + n]))
        i += 4 + n
    return out


def base64_element(element: bytes, where: str) -> bytes:
    """A binary element sent in JSON as base64 text (JSON strings cannot carry raw protobuf bytes)."""
    try:
        return base64.b64decode(element, validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError(f"{where}: not base64 text (a serialized record in JSON is sent base64-encoded; "
                            "or send it as binary data)") from None


def _requested_outputs(doc: dict, default_binary: bool) -> dict[str, bool] | None:
    """Output name -> binary, for the outputs the request names; None when it names none (then all)."""
    outputs = doc.get("outputs")
    if outputs is None:
        return None
    if not isinstance(outputs, list):
        raise ProtocolError("'outputs' must be a list of {'name': ...}")
    out: dict[str, bool] = {}
    for i, o in enumerate(outputs):
        if not isinstance(o, dict) or not isinstance(o.get("name"), str):
            raise ProtocolError(f"outputs[{i}] must be an object with a 'name'")
        binary = _object(o.get("parameters"), f"outputs[{i}].parameters").get("binary_data", default_binary)
        out[o["name"]] = binary is True
    return out


def int_parameter(parameters: Mapping[str, Any], name: str, low: int, high: int) -> int | None:
    """An integer request parameter within [low, high], or None when absent; ProtocolError otherwise."""
    value = parameters.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ProtocolError(f"parameters.{name} must be an integer in [{low}, {high}], got {value!r}")
    return value


def encode_response(head: dict, outputs: Sequence[OutputTensor],
                    binary: Mapping[str, bool]) -> tuple[bytes, int | None]:
    """The response body for `outputs` after the `head` fields, and the JSON's length when binary tensors follow."""
    tensors, raw = [], []
    for out in outputs:
        as_binary = binary.get(out.name, False)
        if out.datatype == "BYTES":
            # Text elements (the service's BYTES outputs are ASCII identifiers): strings in JSON; in binary
            # each a 4-byte little-endian length and its bytes, as BYTES inputs travel.
            texts = [str(v) for v in np.asarray(out.values, dtype=object).reshape(-1)]
            shape = list(np.shape(out.values))
            data = b"".join(struct.pack("<I", len(e)) + e for e in (t.encode("utf-8") for t in texts)) \
                if as_binary else b""
            values_json: list = texts
        else:
            values = np.ascontiguousarray(out.values, dtype=_NUMPY[out.datatype])
            shape = list(values.shape)
            data, values_json = (values.tobytes(), []) if as_binary else (b"", values.reshape(-1).tolist())
        tensor: dict[str, Any] = {"name": out.name, "datatype": out.datatype, "shape": shape}
        if as_binary:
            tensor["parameters"] = {"binary_data_size": len(data)}
            raw.append(data)
        else:
            tensor["data"] = values_json
        tensors.append(tensor)
    header = json.dumps({**head, "outputs": tensors}, allow_nan=False).encode("utf-8")
    if not raw:
        return header, None
    return header + b"".join(raw), len(header)
