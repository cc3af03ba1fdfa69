"""Reading a config file into a pydantic model, and the one way a config error reads.

Every YAML config of the project (the pipeline's, the EHR and image experiments') is read by
``load`` and every rejected config, the service's settings included, is described by
``describe_errors``: one line that names the file and each bad field by its dotted path,
e.g. ``runs.yaml: invalid experiment config: train.batch_sise: Extra inputs are not permitted``.
Their sections share one base, ``ConfigModel`` (unknown fields rejected, frozen), or
``StrictConfigModel`` (no conversion either) where the data layer asks for it.

It lives at the bottom of the layering (no TensorFlow, no Beam) so the pipeline, the model
and the service all import it.
"""
from __future__ import annotations

import os
from typing import Any, TypeVar

import pydantic
import yaml

M = TypeVar("M", bound=pydantic.BaseModel)


class ConfigError(ValueError):
    """A configuration file that cannot be read or does not validate."""


class ConfigModel(pydantic.BaseModel):
    """Base of every config section: an unknown field is an error (a misspelt key never passes as the
    default), and a loaded config is immutable (hashable, shared without copies)."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)


class StrictConfigModel(ConfigModel):
    """A ``ConfigModel`` that converts nothing (YAML's ``1.5`` or ``"3"`` is no int, ``1`` no bool): the data
    layer's configs, where a quietly converted value would change what a job writes."""

    model_config = pydantic.ConfigDict(strict=True)


def describe_errors(err: pydantic.ValidationError) -> str:
    """Every problem of `err` on one line: 'dotted.field: why; other.field: why'."""
    parts = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"])
        # pydantic prefixes the messages of our own validators; the field path already says where.
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{where}: {msg}" if where else msg)
    return "; ".join(parts)


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """Parsed YAML of a config file; ConfigError naming the file when it is unreadable or malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None
    except yaml.YAMLError as err:
        # PyYAML's message spans lines (the mark and a caret); one line keeps errors alike.
        raise ConfigError(f"{path}: not valid YAML: {' '.join(str(err).split())}") from None


def validate(model: type[M], data: Any, source: str, what: str) -> M:
    """Parsed YAML/JSON `data` (None, an empty file, means all defaults) as `model`.

    Raises ConfigError "<source>: invalid <what>: <field>: <why>; ..." naming every bad field.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a {what} must be a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as err:
        raise ConfigError(f"{source}: invalid {what}: {describe_errors(err)}") from None


def load(model: type[M], path: str | os.PathLike[str], what: str) -> M:
    """Reads and validates the YAML file at `path` as `model` (see ``validate``)."""
    return validate(model, read_yaml(path), os.fspath(path), what)
