"""The header line of a table file: read it, and match its names to the v1.4 schema.

Everything that makes a file unreadable as its table shows here, before any row is read.
"""
from __future__ import annotations

import csv
import io
import logging
import pathlib

from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.columns import as_schema
from ehr_pipeline.reader.errors import CorruptFileError, EmptyFileError, ReaderError, SchemaMismatchError
from ehr_pipeline.reader.stream import GZIP_MAGIC
from ehr_pipeline.reader.window import RawWindow

# The package's logger, not this module's: what the reader logs keeps one name for filters.
logger = logging.getLogger(__package__)

_HEADER_PROBE_BYTES = 1 << 16
_MAX_HEADER_BYTES = 1 << 20


def check_header(path: str | pathlib.Path, table: str | table_schemas.TableSchema) -> None:
    """Reads only the header of a table file; raises the ReaderError a full read would raise first."""
    path = pathlib.Path(path)
    with RawWindow.open(path, _HEADER_PROBE_BYTES) as window:  # no Arrow reader: any size will do
        match_header(read_header(window, path), as_schema(table), path)


def read_header(window: RawWindow, path: pathlib.Path) -> list[str]:
    """Parses the first physical line as CSV column names."""
    data = b""
    while b"\n" not in data:
        more = window.probe()
        if not more:
            break
        data += more
        if len(data) > _MAX_HEADER_BYTES and b"\n" not in data:
            raise ReaderError(f"{path}: no line break in the first {_MAX_HEADER_BYTES} bytes; not a CSV table")
    if window.error is not None and b"\n" not in data:
        raise CorruptFileError(f"{path}: compressed data is truncated or corrupt before the end of line 1 "
                               f"(the header): {window.error}")
    if data.startswith(GZIP_MAGIC):  # gzip inside gzip: no CSV header would ever come out
        raise ReaderError(f"{path}: the decompressed content is gzip data again (compressed twice); "
                          "decompress it once")
    line = data.split(b"\n", 1)[0].rstrip(b"\r")
    if not line.strip():
        if not data.strip():
            raise EmptyFileError(f"{path} is empty: expected a header line with the column names")
        raise EmptyFileError(f"{path}: line 1 is blank; expected the header line with the column names")
    try:
        text = line.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ReaderError(f"{path}: header line is not UTF-8 ({e})") from e
    if text.count('"') % 2:
        raise ReaderError(f"{path}: header line has an unterminated quote: {text[:200]!r}")
    return next(csv.reader(io.StringIO(text)))


def match_header(names: list[str], schema: table_schemas.TableSchema, path: pathlib.Path) -> dict[str, int]:
    """Maps each schema column to its position in the header (names match case-insensitively)."""
    positions: dict[str, int] = {}
    extras: list[str] = []
    for i, name in enumerate(names):
        key = name.strip().upper()
        if key in positions:
            raise SchemaMismatchError(
                f"{path}: header names column {key} twice (positions {positions[key] + 1}, {i + 1})")
        if key in schema.column_names:
            positions[key] = i
        else:
            extras.append(name)
            positions[key] = i  # also catches duplicated extras
    missing = [c for c in schema.column_names if c not in positions]
    if missing:
        # Even a nullable column is not filled with nulls: a missing DEATHTIME would quietly
        # read as "nobody died". A header without a v1.4 column means the wrong file.
        raise SchemaMismatchError(
            f"{path}: header lacks {schema.name} column(s) {', '.join(missing)}; "
            f"found {', '.join(names)}"
        )
    if extras:
        logger.warning("%s: ignoring column(s) not in the %s v1.4 schema: %s", path, schema.name, ", ".join(extras))
    return {c: positions[c] for c in schema.column_names}

