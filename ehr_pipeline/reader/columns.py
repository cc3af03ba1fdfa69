"""The schema's columns as Arrow sees them: which are requested, how each is cast from text,
and which rows of a block fail a cast or a check.

Every column is read as a string and cast per block with vectorised kernels; the rare block
with a failure is bisected to find the rows (see ``failures``).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline.reader import table_schemas
from ehr_pipeline.reader.dead_letters import BAD_ENCODING, BAD_NUMBER, BAD_TIMESTAMP, MISSING_REQUIRED, NUL_CHARACTER
from ehr_pipeline.reader.window import NEWLINE

ARROW_TYPES: dict[table_schemas.ColType, pa.DataType] = {
    table_schemas.ColType.INT: pa.int64(),
    table_schemas.ColType.FLOAT: pa.float64(),
    # Seconds, never nanoseconds: DOBs of patients over 89 sit ~300 years before the other
    # shifted dates and would overflow int64 nanoseconds in age arithmetic.
    table_schemas.ColType.TIMESTAMP: pa.int64(),
    table_schemas.ColType.STR: pa.string(),
}


def arrow_schema(table: str | table_schemas.TableSchema, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema TableReader yields for ``table`` restricted to ``columns``."""
    schema = as_schema(table)
    return pa.schema([pa.field(c.name, ARROW_TYPES[c.type]) for c in requested(schema, columns)])


def as_schema(table: str | table_schemas.TableSchema) -> table_schemas.TableSchema:
    """The schema of ``table``, given by name or as a schema."""
    return table if isinstance(table, table_schemas.TableSchema) else table_schemas.get(table)


def requested(schema: table_schemas.TableSchema, columns: Sequence[str] | None) -> tuple[table_schemas.Column, ...]:
    """Requested columns in the caller's order; names match the schema case-insensitively."""
    if columns is None:
        return schema.columns
    if isinstance(columns, str):
        raise TypeError("columns must be a sequence of column names, not one string")
    by_upper = {c.name: c for c in schema.columns}
    out: list[table_schemas.Column] = []
    for name in columns:
        col = by_upper.get(str(name).upper())
        if col is None:
            raise KeyError(f"{schema.name} has no column {name!r}; columns: {', '.join(schema.column_names)}")
        if col in out:
            raise ValueError(f"column {col.name} requested twice")
        out.append(col)
    if not out:
        raise ValueError("columns must name at least one column (or be None for all)")
    return tuple(out)


def string_newlines(arr: pa.Array) -> int:
    """Number of '\\n' bytes in the values of a string array (nulls count none)."""
    bufs = arr.buffers()
    if arr.null_count == len(arr) or bufs[2] is None:
        return 0
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(arr) + 1, offset=4 * arr.offset)
    start, end = int(offsets[0]), int(offsets[-1])
    if end == start:
        return 0
    data = np.frombuffer(bufs[2], dtype=np.uint8, count=end - start, offset=start)
    return int(np.count_nonzero(data == NEWLINE))


def per_row_newlines(arr: pa.Array) -> np.ndarray:
    """Number of '\\n' characters in each value of a string array (0 for nulls), as int64."""
    return pc.count_substring(arr, "\n").fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)


def failures(raw: pa.Array, convert: Callable[[pa.Array], pa.Array]) -> np.ndarray:
    """Boolean mask of the values ``convert`` rejects, found by bisection (rare path)."""
    bad = np.zeros(len(raw), dtype=bool)

    def visit(lo: int, hi: int) -> None:
        try:
            convert(raw.slice(lo, hi - lo))
            return
        except pa.ArrowInvalid:
            pass
        if hi - lo <= 16:
            for i in range(lo, hi):
                try:
                    convert(raw.slice(i, 1))
                except pa.ArrowInvalid:
                    bad[i] = True
            return
        mid = (lo + hi) // 2
        visit(lo, mid)
        visit(mid, hi)

    visit(0, len(raw))
    return bad


def _to_int(raw: pa.Array) -> pa.Array:
    return pc.cast(raw, pa.int64())


# The largest finite float32. MEDS stores numeric_value as float32, so a value beyond it would be
# written as infinity by to-meds, refused by the MEDS source, yet kept by the CSV road: one rule for
# both roads, applied where each reads a number (here and meds.source), refuses it as a bad number.
FLOAT32_MAX = float(np.finfo(np.float32).max)


def is_measurement(value: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Where a float64 column holds a number both roads keep: finite and |value| <= FLOAT32_MAX (null stays null)."""
    return pc.and_(pc.is_finite(value), pc.less_equal(pc.abs(value), FLOAT32_MAX))


def _to_float(raw: pa.Array) -> pa.Array:
    value = pc.cast(raw, pa.float64())
    # "inf", "nan" and "1e400" cast fine but are no measurement: they would poison every
    # mean and z-score built from the column; nor is "1e39", which no float32 holds.
    if value.null_count < len(value) and not pc.all(is_measurement(value)).as_py():
        raise pa.ArrowInvalid("non-finite number")
    return value


def _to_seconds(raw: pa.Array) -> pa.Array:
    # Arrow's ISO-8601 parser checks calendar ranges (no 2164-02-30) and rejects trailing text.
    return pc.cast(pc.cast(raw, pa.timestamp("s")), pa.int64())


def _checked_utf8(raw: pa.Array) -> pa.Array:
    raw.validate(full=True)
    return raw


_CONVERTERS = {
    table_schemas.ColType.INT: (_to_int, BAD_NUMBER, "is not an integer"),
    table_schemas.ColType.FLOAT: (_to_float, BAD_NUMBER, "is not a finite number a float32 holds"),
    table_schemas.ColType.TIMESTAMP: (_to_seconds, BAD_TIMESTAMP, "is not a YYYY-MM-DD[ HH:MM:SS] timestamp"),
    table_schemas.ColType.STR: (_checked_utf8, BAD_ENCODING, "is not valid UTF-8"),
}


@dataclasses.dataclass
class Problem:
    """A check that failed in some rows of one column of a block."""

    column: str
    reason: str
    mask: np.ndarray
    message: str
    raw: pa.Array | None  # to quote the offending value in the detail


def type_block(
    batch: pa.RecordBatch, wanted: Sequence[tuple[table_schemas.Column, int]], untyped: Sequence[int],
) -> tuple[list[pa.Array], list[Problem], list[pa.Array]]:
    """Typed ``wanted`` (column, position) pairs, their problems, and the string columns that may hold newlines."""
    n = batch.num_rows
    typed: list[pa.Array] = []
    problems: list[Problem] = []
    nl_columns: list[pa.Array] = []
    for col, pos in wanted:
        raw = batch.column(pos)
        convert, reason, message = _CONVERTERS[col.type]
        try:
            value = convert(raw)
        except pa.ArrowInvalid:
            bad = failures(raw, convert)
            # Invalid UTF-8 cannot be quoted back as text; the raw line still carries it.
            quote = raw if col.type is not table_schemas.ColType.STR else None
            problems.append(Problem(col.name, reason, bad, message, quote))
            value = convert(pc.if_else(pa.array(bad), pa.nulls(n, raw.type), raw))
            # Unparseable values may hide quoted newlines; parsed numbers never do.
            nl_columns.append(raw)
        else:
            if col.type is table_schemas.ColType.STR:
                nl_columns.append(raw)
                if value.null_count < n and pc.any(pc.match_substring(value, "\0")).as_py():
                    # NUL ends C strings: a code "50912\0x" would become "50912" downstream.
                    mask = pc.fill_null(pc.match_substring(value, "\0"), False).to_numpy(zero_copy_only=False)
                    problems.append(Problem(col.name, NUL_CHARACTER, mask, "holds a NUL character", None))
                    value = pc.if_else(pa.array(mask), pa.nulls(n, value.type), value)
        if not col.nullable and raw.null_count:
            problems.append(Problem(col.name, MISSING_REQUIRED, raw.is_null().to_numpy(zero_copy_only=False),
                                    "is empty but NOT NULL", None))
        typed.append(value)
    nl_columns.extend(batch.column(i) for i in untyped)
    return typed, problems, nl_columns

