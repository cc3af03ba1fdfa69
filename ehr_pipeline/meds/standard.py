"""The MEDS 0.4 schemas as this job checks them: pyarrow only, one-line errors naming the file and the column.

The ``meds`` package defines the schemas (``DataSchema``, ``LabelSchema``, ``CodeMetadataSchema``,
``SubjectSplitSchema``), but the job's dependency group has no ``meds`` (a Beam worker installs the job
group alone), so the same checks are written here against pyarrow types; ``tests/ehr_pipeline/meds/test_meds_schema.py``
checks them type by type against ``meds``' own ``validate`` and ``align``.

``meds``' ``validate`` wants the exact types (subject_id int64, time timestamp[us], code string, ...), which
real MEDS files often do not carry (polars writes large_string, pandas timestamp[ns]); its ``align`` then
casts whatever pyarrow can cast. A column passes here when its type is the MEDS type or one that ``align``
turns into it without changing what the job reads:

* int64: any integer width (a value out of range is refused when read);
* timestamp[us]: a timestamp of any unit or time zone (data times are read to the second; label
  prediction times must be whole microseconds, checked when read);
* string: string, large_string, string_view, dictionary-encoded strings;
* a number (numeric_value, float_value): integers, floats, decimals (the job reads float64);
* list<string> (parent_codes): a list or large_list of strings;
* a column MEDS lets be null may also be all-null (pyarrow's null type).

Stricter than ``align``, on purpose (``align`` would change a value or guess a meaning):
* numbers, booleans, timestamps, dates or bytes where MEDS wants text (a code 50912 read as '50912'),
  and text, booleans, timestamps or decimals where it wants an integer ('17' parsed as 17);
* text or booleans where it wants a number (numeric_value '1.2' is a text value, not a measurement);
* integers and dates where it wants a timestamp (an integer's unit is unknown; a date is no time of day,
  and reading it as midnight would place a day's events before they happened);
* anything but bool where a label is boolean: ``align`` reads 'False' as false but 0.3 as true, and the
  issue that made this module saw every string label turn positive.

Looser, on purpose: extra columns are ignored where MEDS forbids them (label and split files: the job
reads its columns by name), and nulls where MEDS forbids them are counted per row rather than refusing
the file (a null subject_id in data is a dead letter, a null code an ``events/MEDS/extract/missing_code``,
a null label value ``labels/null_value``), except in the split file and a label's subject_id, where the
job has no row to count them under.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


class MedsError(ValueError):
    """A MEDS dataset or label file this job cannot read; the message names the file and the problem."""


def is_text(t: pa.DataType) -> bool:
    """Whether Arrow type t is text: string, large_string, string_view, or dictionary-encoded text."""
    if pa.types.is_dictionary(t):
        return is_text(t.value_type)
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t)


def is_integer(t: pa.DataType) -> bool:
    """Whether Arrow type t is an integer of any width or sign."""
    return pa.types.is_integer(t)


def _timestamp(t: pa.DataType) -> bool:
    return pa.types.is_timestamp(t)


def _number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _boolean(t: pa.DataType) -> bool:
    return pa.types.is_boolean(t)


def _text_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t)) and is_text(t.value_type)


@dataclasses.dataclass(frozen=True)
class MedsColumn:
    """One column of a MEDS schema: its MEDS type, the Arrow types accepted for it, required, nulls allowed."""

    name: str
    meds_type: pa.DataType
    accepts: Callable[[pa.DataType], bool]
    required: bool
    nullable: bool

    def takes(self, t: pa.DataType) -> bool:
        """Whether a column of Arrow type t passes (the null type only where MEDS allows nulls)."""
        return self.accepts(t) or (self.nullable and pa.types.is_null(t))


@dataclasses.dataclass(frozen=True)
class Schema:
    """A MEDS file kind ('data', 'label', 'code metadata', 'subject split') and its columns."""

    kind: str
    columns: tuple[MedsColumn, ...]

    def column(self, name: str) -> MedsColumn:
        """The column named `name`."""
        return next(c for c in self.columns if c.name == name)


DATA = Schema("data", (
    MedsColumn("subject_id", pa.int64(), is_integer, required=True, nullable=False),
    MedsColumn("time", pa.timestamp("us"), _timestamp, required=True, nullable=True),
    MedsColumn("code", pa.string(), is_text, required=True, nullable=False),
    MedsColumn("numeric_value", pa.float32(), _number, required=False, nullable=True),
    MedsColumn("text_value", pa.large_string(), is_text, required=False, nullable=True),
))
# boolean_value is optional in MEDS; this job's tasks are binary, so it is required here (LABEL_VALUES says why).
LABELS = Schema("label", (
    MedsColumn("subject_id", pa.int64(), is_integer, required=True, nullable=False),
    MedsColumn("prediction_time", pa.timestamp("us"), _timestamp, required=True, nullable=False),
    MedsColumn("boolean_value", pa.bool_(), _boolean, required=True, nullable=False),
    MedsColumn("integer_value", pa.int64(), is_integer, required=False, nullable=False),
    MedsColumn("float_value", pa.float32(), _number, required=False, nullable=False),
    MedsColumn("categorical_value", pa.string(), is_text, required=False, nullable=False),
))
CODES = Schema("code metadata", (
    MedsColumn("code", pa.string(), is_text, required=True, nullable=False),
    MedsColumn("description", pa.string(), is_text, required=False, nullable=True),
    MedsColumn("parent_codes", pa.list_(pa.string()), _text_list, required=False, nullable=True),
))
SPLITS = Schema("subject split", (
    MedsColumn("subject_id", pa.int64(), is_integer, required=True, nullable=False),
    MedsColumn("split", pa.string(), is_text, required=True, nullable=False),
))
# MEDS' label value columns other than boolean_value: a file whose rows carry one is a task this job
# cannot learn (multi-class, ordinal, regression), refused rather than read as binary.
LABEL_VALUES = ("integer_value", "float_value", "categorical_value")


def check(path: str, arrow_schema: pa.Schema, schema: Schema) -> None:
    """MedsError naming `path` and the first column that is missing or of a type MEDS would not take.

    Every column of the schema present is checked, read by the job or not: a file is MEDS or it is not.
    """
    names = arrow_schema.names
    missing = [c.name for c in schema.columns if c.required and c.name not in names]
    if missing:
        quoted = ", ".join(f"'{m}'" for m in missing)
        raise MedsError(f"{path}: not a MEDS {schema.kind} file: no column{'s' if len(missing) > 1 else ''} {quoted}")
    for column in schema.columns:
        if column.name not in names:
            continue
        if names.count(column.name) > 1:
            raise MedsError(f"{path}: column '{column.name}' appears {names.count(column.name)} times")
        got = arrow_schema.field(column.name).type
        if not column.takes(got):
            raise MedsError(f"{path}: column '{column.name}' is {got}, MEDS {schema.kind} files want "
                            f"{column.meds_type}")


def read_schema(path: str) -> pa.Schema:
    """The Arrow schema of a parquet file; MedsError naming it when it is no parquet file."""
    try:
        return pq.read_schema(path)
    except (OSError, pa.ArrowInvalid) as err:
        raise MedsError(f"{path}: cannot read as parquet ({_one_line(err)})") from None


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())


def read_table(path: str, columns: list[str]) -> pa.Table:
    """The named columns of a parquet file; MedsError naming it when a page cannot be read."""
    try:
        return pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowInvalid) as err:
        raise MedsError(f"{path}: cannot read as parquet ({_one_line(err)})") from None


def as_int64(column: pa.ChunkedArray | pa.Array, where: str) -> pa.ChunkedArray | pa.Array:
    """An integer column as int64; MedsError starting with `where` (file and column) for a value out of range."""
    try:
        return pc.cast(column, pa.int64())
    except pa.ArrowInvalid as err:
        raise MedsError(f"{where}: {_one_line(err)} (MEDS ids are int64)") from None
