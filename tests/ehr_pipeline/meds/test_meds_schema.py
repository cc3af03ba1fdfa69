"""The job's pyarrow statement of the MEDS schemas (ehr_pipeline/meds/standard.py) against the `meds` package's own.

The job cannot import `meds` (its dependency group has no such package), so the schemas are written twice;
these tests keep them one: the same columns, types, required and nullable flags, and, over a table of Arrow
types, a verdict that never accepts what `meds`' `align` refuses, never refuses what `meds`' `validate`
accepts, and is stricter than `align` exactly where meds_schema's docstring says.
"""
from __future__ import annotations

import datetime
import decimal

import meds
import pyarrow as pa
import pytest
from flexible_schema.columns import Nullability

from ehr_pipeline.meds import standard

PAIRS = [(meds.DataSchema, standard.DATA), (meds.LabelSchema, standard.LABELS),
         (meds.CodeMetadataSchema, standard.CODES), (meds.SubjectSplitSchema, standard.SPLITS)]
# Where the job's schema departs from MEDS' on purpose: its tasks are binary, so labels need boolean_value.
REQUIRED_HERE = {("label", "boolean_value")}

# Two values of each Arrow type, chosen so that a cast `align` makes is exact where one exists.
CANDIDATES = {
    "int8": pa.array([1, 2], pa.int8()), "int32": pa.array([1, 2], pa.int32()), "int64": pa.array([1, 2]),
    "uint32": pa.array([1, 2], pa.uint32()), "uint64": pa.array([1, 2], pa.uint64()),
    "float16": pa.array([1.0, 2.5], pa.float32()).cast(pa.float16()), "float32": pa.array([1.0, 2.5], pa.float32()),
    "float64": pa.array([1.0, 2.5]), "decimal": pa.array([decimal.Decimal("1"), decimal.Decimal("2")],
                                                        pa.decimal128(10, 2)),
    "bool": pa.array([True, False]), "text_of_numbers": pa.array(["1", "2"]), "text": pa.array(["a", "b"]),
    "text_of_bools": pa.array(["true", "false"]), "large_string": pa.array(["a", "b"], pa.large_string()),
    "string_view": pa.array(["a", "b"], pa.string_view()), "dictionary": pa.array(["a", "b"]).dictionary_encode(),
    "timestamp_s": pa.array([1, 2], pa.timestamp("s")), "timestamp_ms": pa.array([1, 2], pa.timestamp("ms")),
    "timestamp_us": pa.array([1, 2], pa.timestamp("us")), "timestamp_ns": pa.array([1000, 2000], pa.timestamp("ns")),
    "timestamp_us_utc": pa.array([1, 2], pa.timestamp("us", "UTC")),
    "date32": pa.array([datetime.date(2020, 1, 1)] * 2), "null": pa.nulls(2),
    "list": pa.array([["a"], ["b"]]), "large_list": pa.array([["a"], ["b"]], pa.large_list(pa.string())),
    "list_of_large": pa.array([["a"], ["b"]], pa.list_(pa.large_string())),
    "binary": pa.array([b"a", b"b"]),
}


def _kind(t: pa.DataType) -> str:
    """A type's family, as meds_schema's docstring names them."""
    for name, test in (("integer", pa.types.is_integer), ("float", pa.types.is_floating),
                       ("decimal", pa.types.is_decimal), ("bool", pa.types.is_boolean),
                       ("timestamp", pa.types.is_timestamp), ("date", pa.types.is_date), ("null", pa.types.is_null),
                       ("list", lambda x: pa.types.is_list(x) or pa.types.is_large_list(x)),
                       ("text", standard.is_text), ("binary", pa.types.is_binary)):
        if test(t):
            return name
    return "other"


# (the MEDS type's family, the family of the type `align` would take and the job refuses): the docstring's list.
STRICTER = {
    ("text", "integer"), ("text", "float"), ("text", "decimal"), ("text", "bool"), ("text", "timestamp"),
    ("text", "date"), ("text", "binary"), ("integer", "text"), ("integer", "bool"), ("integer", "timestamp"), ("integer", "decimal"),
    ("timestamp", "integer"), ("timestamp", "date"), ("bool", "integer"), ("bool", "float"), ("bool", "text"),
    ("float", "text"), ("float", "bool"),
}


def _base(meds_class) -> dict[str, pa.Array]:
    """A valid two-row table of the schema's required columns."""
    values = {"subject_id": pa.array([1, 2]), "time": pa.array([1, 2], pa.timestamp("us")),
              "prediction_time": pa.array([1, 2], pa.timestamp("us")), "code": pa.array(["a", "b"]),
              "boolean_value": pa.array([True, False]), "split": pa.array(["train", "held_out"])}
    return {name: values[name] for name in meds_class.required_columns()}


def _verdicts(meds_class, column: str, array: pa.Array) -> tuple[bool, bool]:
    """(meds validates the table as it is, meds aligns it)."""
    table = pa.table({**_base(meds_class), column: array})
    try:
        meds_class.validate(table)
        return True, True
    except Exception:  # flexible_schema raises its own errors and pyarrow's
        pass
    try:
        meds_class.align(table)
        return False, True
    except Exception:
        return False, False


@pytest.mark.parametrize("meds_class, ours", PAIRS, ids=lambda x: getattr(x, "kind", None))
def test_same_columns_types_and_flags_as_meds(meds_class, ours):
    assert [c.name for c in ours.columns] == meds_class.columns()
    for c in ours.columns:
        assert c.meds_type == meds_class.column_type(c.name), c.name
        nullable = meds_class._columns_map()[c.name].nullable != Nullability.NONE
        assert c.nullable == nullable, c.name
        required = c.name in meds_class.required_columns() or (ours.kind, c.name) in REQUIRED_HERE
        assert c.required == required, c.name


def test_accepted_types_lie_between_meds_validate_and_align():
    stricter_seen = set()
    for meds_class, ours in PAIRS:
        for column in ours.columns:
            for name, array in CANDIDATES.items():
                exact, aligned = _verdicts(meds_class, column.name, array)
                mine = column.takes(array.type)
                where = f"{ours.kind}.{column.name} as {name}"
                assert mine or not exact, f"{where}: meds validates it, the job refuses it"
                assert aligned or not mine, f"{where}: the job accepts what meds cannot align"
                if aligned and not mine:
                    pair = (_kind(column.meds_type), _kind(array.type))
                    if pair[1] == "null":  # a column MEDS never lets be null, all null
                        assert not column.nullable, where
                        continue
                    assert pair in STRICTER, f"{where}: stricter than meds' align, and not said why"
                    stricter_seen.add(pair)
    assert stricter_seen == STRICTER  # no entry in the list that nothing needs


def test_check_names_the_file_and_the_column_in_one_line():
    schema = pa.schema([("subject_id", pa.string()), ("time", pa.timestamp("us")), ("code", pa.string())])
    with pytest.raises(standard.MedsError) as err:
        standard.check("d/0.parquet", schema, standard.DATA)
    assert str(err.value) == "d/0.parquet: column 'subject_id' is string, MEDS data files want int64"
    with pytest.raises(standard.MedsError) as err:
        standard.check("l.parquet", pa.schema([("subject_id", pa.int64())]), standard.LABELS)
    assert str(err.value) == "l.parquet: not a MEDS label file: no columns 'prediction_time', 'boolean_value'"
    standard.check("d/0.parquet", meds.DataSchema.schema(), standard.DATA)  # MEDS' own schema passes
