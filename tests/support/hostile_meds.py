"""Faulted MEDS datasets and label files, one fault each, written to a test's tmp_path (not a test module).

``write_base`` writes a small, valid MEDS 0.4 dataset (six subjects in two data files, codes.parquet with a
LOINC parent, subject_splits.parquet) and a label file of one row per admission. Each fault of ``FAULTS``
rewrites one file of a fresh copy and says what a correct job makes of it: the exact one-line error
(``{meds}``, ``{labels}`` stand for the dataset folder and the label file), or the manifest entries the
fault moves and whether the examples stay the unfaulted dataset's, record for record. ``TOGETHER`` groups
faults that a correct job reads alike into one dataset each (one job run for the group).
"""
from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

T0 = 4_000_000_000  # the first admission, s since 1970
HOUR, DAY, YEAR = 3600, 86400, 365 * 86400
DATA0 = "data/train/0.parquet"  # subjects 1-3
DATA1 = "data/held_out/0.parquet"  # subjects 4-6
CODES = "metadata/codes.parquet"
SPLITS = "metadata/subject_splits.parquet"
LABELS = "labels.parquet"  # beside data/ and metadata/, read only with --labels
RUN = "ehr-pipeline run: error: "  # a problem found before any work starts
JOB = "ehr-pipeline: error: "  # one found while reading
DATA0_SUBJECT_ROWS = 10  # rows per subject (the static gender row first)


def _subject(sid: int, admit: int, died: bool) -> list[tuple]:
    """(subject, time s or None, code, value, hadm_id, unit) rows of one subject, sorted by time."""
    hadm = 100 + sid
    end = admit + (2 + sid % 3) * DAY
    rows = [(sid, None, "GENDER//F" if sid % 2 else "GENDER//M", None, None, None),
            (sid, admit - (40 + 5 * sid) * YEAR, "MEDS_BIRTH", None, None, None),
            (sid, admit, "HOSPITAL_ADMISSION//EMERGENCY//EMERGENCY ROOM ADMIT", None, hadm, None),
            (sid, admit + HOUR, "LAB//220045//bpm", 70.0 + sid, hadm, None),
            (sid, admit + 2 * HOUR, "LAB//50912//mg/dL", 0.9 + sid / 10, hadm, None),
            (sid, admit + 2 * HOUR, "LAB//50813//mmol/L", 1.5 + sid / 10, hadm, None),
            (sid, admit + 5 * HOUR, "INFUSION_END//225158", 100.0 * sid, hadm, "mL"),
            (sid, admit + 30 * HOUR, "LAB//50912//mg/dL", 1.0 + sid / 10, hadm, None),
            (sid, end, "DIAGNOSIS//ICD//9//4019", None, hadm, None)]
    rows.append((sid, end, "HOSPITAL_DISCHARGE//DIED" if died else "HOSPITAL_DISCHARGE//HOME", None, hadm, None))
    return rows


def data_table(subjects: range) -> pa.Table:
    """The MEDS rows of some subjects (subject 2 and 5 die in hospital)."""
    rows = [r for sid in subjects for r in _subject(sid, T0 + sid * DAY, died=sid in (2, 5))]
    return pa.table({
        "subject_id": pa.array([r[0] for r in rows], pa.int64()),
        "time": pa.array([None if r[1] is None else r[1] * 1_000_000 for r in rows], pa.timestamp("us")),
        "code": pa.array([r[2] for r in rows], pa.string()),
        "numeric_value": pa.array([r[3] for r in rows], pa.float32()),
        "text_value": pa.array([None] * len(rows), pa.large_string()),
        "hadm_id": pa.array([r[4] for r in rows], pa.int64()),
        "unit": pa.array([r[5] for r in rows], pa.string()),
    })


def label_table() -> pa.Table:
    """One label row per admission, at admission + 24 h: died in hospital."""
    return pa.table({"subject_id": pa.array(list(range(1, 7)), pa.int64()),
                     "prediction_time": pa.array([(T0 + s * DAY + DAY) * 1_000_000 for s in range(1, 7)],
                                                 pa.timestamp("us")),
                     "boolean_value": pa.array([s in (2, 5) for s in range(1, 7)], pa.bool_())})


def write_base(dest: pathlib.Path) -> pathlib.Path:
    """The unfaulted dataset at dest (and dest/labels.parquet); returns dest."""
    for rel in (DATA0, DATA1, CODES):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(data_table(range(1, 4)), dest / DATA0)
    pq.write_table(data_table(range(4, 7)), dest / DATA1)
    codes = sorted(set(data_table(range(1, 7)).column("code").to_pylist()))
    pq.write_table(pa.table({"code": codes, "description": [c.split("//")[0] for c in codes],
                             "parent_codes": [["LOINC/2160-0"] if c.startswith("LAB//50912//") else None
                                              for c in codes]}), dest / CODES)
    pq.write_table(pa.table({"subject_id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
                             "split": ["train", "train", "train", "tuning", "held_out", "held_out"]}), dest / SPLITS)
    pq.write_table(label_table(), dest / LABELS)
    return dest


@dataclasses.dataclass(frozen=True)
class Expect:
    """What a correct job makes of a fault: one exact error line, or the manifest entries it moves."""

    error: str | None = None  # the whole stderr line; {meds} = the dataset folder
    counts: tuple[tuple[str, int], ...] = ()  # ('labels/outcome/duplicate', 1): manifest entries by path
    labels: bool = False  # the run reads labels.parquet
    same_examples: bool = False  # the examples are the unfaulted dataset's, byte for byte


# ----------------------------------------------------------------------------- edits


def _edit(dest: pathlib.Path, rel: str, change: Callable[[pa.Table], pa.Table]) -> None:
    path = dest / rel
    pq.write_table(change(pq.read_table(path)), path)


def _column(dest: pathlib.Path, rel: str, name: str, make: Callable[[pa.ChunkedArray], pa.Array]) -> None:
    """Replaces (or adds, from None) one column of a file by make(old column or None)."""
    def change(table: pa.Table) -> pa.Table:
        if name in table.column_names:
            return table.set_column(table.column_names.index(name), name, make(table.column(name)))
        return table.append_column(name, make(None))
    _edit(dest, rel, change)


def _drop(dest: pathlib.Path, rel: str, name: str) -> None:
    _edit(dest, rel, lambda t: t.drop_columns([name]))


def _as(t: pa.DataType) -> Callable[[pa.ChunkedArray], pa.Array]:
    return lambda c: pc.cast(c, t)


def _text_of(c: pa.ChunkedArray) -> pa.Array:
    return pc.cast(c, pa.string())


def _value_at(c: pa.ChunkedArray, row: int, value) -> pa.Array:
    values = c.to_pylist()
    values[row] = value
    return pa.array(values, c.type)


def _retyped(rel: str, name: str, make, error: str | None = None, **expect) -> Callable[[pathlib.Path], Expect]:
    """A fault that rewrites one column: refused with `error` ({file} = the file), or read as `expect` says."""
    def fault(dest: pathlib.Path) -> Expect:
        _column(dest, rel, name, make)
        return Expect(error=error.replace("{file}", str(dest / rel)) if error else None, **expect)
    return fault


def _data_type(name: str, got: str, want: str) -> str:
    return RUN + "--meds-dir: {file}: column '" + name + f"' is {got}, MEDS data files want {want}"


def _label_type(name: str, got: str, want: str) -> str:
    return JOB + "{file}: column '" + name + f"' is {got}, MEDS label files want {want}"


# ----------------------------------------------------------------------------- data files


def data_not_parquet(dest):
    (dest / DATA0).write_bytes(b"subject_id,time,code\n1,,GENDER//F\n")
    return Expect(error=f"{RUN}--meds-dir: {dest / DATA0}: cannot read as parquet (Parquet magic bytes not found in "
                        "footer. Either the file is corrupted or this is not a parquet file.)")


def data_empty_file(dest):
    (dest / DATA0).write_bytes(b"")
    return Expect(error=f"{RUN}--meds-dir: {dest / DATA0}: cannot read as parquet (Parquet file size is 0 bytes)")


def data_truncated(dest):
    raw = (dest / DATA0).read_bytes()
    (dest / DATA0).write_bytes(raw[: len(raw) // 2])
    return Expect(error=f"{RUN}--meds-dir: {dest / DATA0}: cannot read as parquet (Parquet magic bytes not found in "
                        "footer. Either the file is corrupted or this is not a parquet file.)")


def no_data_files(dest):
    for rel in (DATA0, DATA1):
        (dest / rel).unlink()
    return Expect(error=f"{RUN}--meds-dir: {dest / 'data'}: no MEDS data files (data/**/*.parquet)")


def data_without_code(dest):
    _drop(dest, DATA1, "code")
    return Expect(error=f"{RUN}--meds-dir: {dest / DATA1}: not a MEDS data file: no column 'code'")


def data_without_subject_and_time(dest):
    _edit(dest, DATA1, lambda t: t.drop_columns(["subject_id", "time"]))
    return Expect(error=f"{RUN}--meds-dir: {dest / DATA1}: not a MEDS data file: no columns 'subject_id', 'time'")


def data_subject_ids_out_of_int64(dest):
    _column(dest, DATA0, "subject_id", lambda c: pa.array([2**63 + 1] * len(c), pa.uint64()))
    return Expect(error=f"{JOB}{dest / DATA0}: column 'subject_id': Integer value 9223372036854775809 not in range: "
                        "0 to 9223372036854775807 (MEDS ids are int64)")


def data_not_together(dest):
    def change(table):
        # subject 2's last row moved behind subject 3's rows.
        last = 2 * DATA0_SUBJECT_ROWS - 1
        order = [i for i in range(table.num_rows) if i != last] + [last]
        return table.take(pa.array(order))
    _edit(dest, DATA0, change)
    return Expect(error=f"{JOB}{dest / DATA0}: the rows of subject 2 are not together (MEDS keeps a subject's rows "
                        "together, sorted by time)")


def subject_in_two_files(dest):
    # subject 4's discharge (its last row) written into the other file: two half subjects, neither whole.
    last = DATA0_SUBJECT_ROWS - 1
    moved = pq.read_table(dest / DATA1).slice(last, 1)
    _edit(dest, DATA1, lambda t: pa.concat_tables([t.slice(0, last), t.slice(last + 1)]))
    _edit(dest, DATA0, lambda t: pa.concat_tables([t, moved]))
    return Expect(error=f"{JOB}subject 4: rows in two MEDS data files, {dest / DATA1} and {dest / DATA0} (MEDS keeps "
                        "each subject's rows in one file)")


def file_written_twice(dest):
    (dest / "data" / "train" / "1.parquet").write_bytes((dest / DATA0).read_bytes())
    return Expect(error=f"{JOB}subject 1: rows in two MEDS data files, {dest / DATA0} and "
                        f"{dest / 'data' / 'train' / '1.parquet'} (MEDS keeps each subject's rows in one file); "
                        "2 more subject(s) likewise")


def null_subject_ids_amid_a_subject(dest):
    _column(dest, DATA0, "subject_id", lambda c: _value_at(_value_at(c, 4, None), 25, None))
    return Expect(counts=(("tables/MEDS/dead_lettered/missing_required", 2), ("tables/MEDS/rows_read", 60)))


def non_finite_values(dest):
    _column(dest, DATA0, "numeric_value",
            lambda c: _value_at(_value_at(_value_at(c, 4, float("inf")), 7, float("nan")), 14, float("-inf")))
    return Expect(counts=(("tables/MEDS/dead_lettered/bad_number", 3), ("tables/MEDS/rows_read", 60)))


def values_beyond_float32(dest):
    # A float64 column can hold what MEDS' float32 cannot; 1e300 would overflow the code's sum of squares.
    _column(dest, DATA1, "numeric_value", lambda c: _value_at(pc.cast(c, pa.float64()), 4, 1e300))
    return Expect(counts=(("tables/MEDS/dead_lettered/bad_number", 1), ("tables/MEDS/rows_read", 60)))


def null_codes_and_times(dest):
    _column(dest, DATA0, "code", lambda c: _value_at(c, 3, None))
    _column(dest, DATA0, "time", lambda c: _value_at(c, 4, None))
    return Expect(counts=(("tables/MEDS/extract/missing_code", 1), ("tables/MEDS/extract/missing_time", 1)))


def numbers_in_other_widths(dest):
    for rel in (DATA0, DATA1):
        _column(dest, rel, "subject_id", _as(pa.int32()))
        _column(dest, rel, "numeric_value", _as(pa.float64()))
        _column(dest, rel, "hadm_id", _as(pa.uint32()))
    return Expect(same_examples=True)


def text_in_other_encodings(dest):
    _column(dest, DATA0, "code", _as(pa.large_string()))
    _column(dest, DATA1, "code", lambda c: c.combine_chunks().dictionary_encode())
    _column(dest, DATA1, "unit", _as(pa.large_string()))
    return Expect(same_examples=True)


def times_in_other_units(dest):
    _column(dest, DATA0, "time", _as(pa.timestamp("ms")))
    _column(dest, DATA1, "time", _as(pa.timestamp("ns", "UTC")))
    return Expect(same_examples=True)


def times_with_nanoseconds(dest):
    # Data times are read to the second: a few nanoseconds more change nothing.
    _column(dest, DATA0, "time", lambda c: pc.add(pc.cast(c, pa.timestamp("ns")), pa.scalar(7, pa.duration("ns"))))
    return Expect(same_examples=True)


def without_numeric_value(dest):
    for rel in (DATA0, DATA1):
        _drop(dest, rel, "numeric_value")
    return Expect(counts=(("tables/MEDS/rows_read", 60),))


def all_null_optional_columns(dest):
    # pandas writes a column without a value as Arrow's null type.
    _column(dest, DATA0, "text_value", lambda c: pa.nulls(len(c)))
    _column(dest, DATA0, "unit", lambda c: pa.nulls(len(c)))
    return Expect(counts=(("tables/MEDS/rows_read", 60),))


FAULTS_DATA = {
    "subject_id_as_text": _retyped(DATA0, "subject_id", _text_of, _data_type("subject_id", "string", "int64")),
    "subject_id_as_float": _retyped(DATA1, "subject_id", _as(pa.float64()), _data_type("subject_id", "double", "int64")),
    "subject_id_all_null": _retyped(DATA0, "subject_id", lambda c: pa.nulls(len(c), pa.null()),
                                    _data_type("subject_id", "null", "int64")),
    "time_as_text": _retyped(DATA0, "time", _text_of, _data_type("time", "string", "timestamp[us]")),
    "time_as_epoch_integers": _retyped(DATA0, "time", _as(pa.int64()), _data_type("time", "int64", "timestamp[us]")),
    "time_as_dates": _retyped(DATA1, "time", _as(pa.date32()), _data_type("time", "date32[day]", "timestamp[us]")),
    "code_as_integers": _retyped(DATA0, "code", lambda c: pa.array(range(len(c)), pa.int64()),
                                 _data_type("code", "int64", "string")),
    "numeric_value_as_text": _retyped(DATA0, "numeric_value", _text_of, _data_type("numeric_value", "string", "float")),
    "numeric_value_as_bool": _retyped(DATA1, "numeric_value", lambda c: pc.is_valid(c),
                                      _data_type("numeric_value", "bool", "float")),
    "text_value_as_integers": _retyped(DATA0, "text_value", lambda c: pa.array(range(len(c)), pa.int64()),
                                       _data_type("text_value", "int64", "large_string")),
    "hadm_id_as_text": _retyped(DATA0, "hadm_id", _text_of, RUN + "--meds-dir: {file}: column 'hadm_id' is string, "
                                "the job reads it as an integer admission id"),
    "unit_as_numbers": _retyped(DATA1, "unit", lambda c: pa.array([1.0] * len(c)),
                                RUN + "--meds-dir: {file}: column 'unit' is double, the job reads it as text (a unit)"),
}


# ----------------------------------------------------------------------------- metadata


def codes_not_parquet(dest):
    (dest / CODES).write_text("code,description\n")
    return Expect(error=f"{JOB}{dest / CODES}: cannot read as parquet (Parquet magic bytes not found in footer. "
                        "Either the file is corrupted or this is not a parquet file.)")


def codes_without_code(dest):
    _drop(dest, CODES, "code")
    return Expect(error=f"{JOB}{dest / CODES}: not a MEDS code metadata file: no column 'code'")


def codes_with_a_null_code(dest):
    _column(dest, CODES, "code", lambda c: _value_at(c, 2, None))
    return Expect(error=f"{JOB}{dest / CODES}: row 3: code is null (MEDS: never null)")


def codes_without_parent_codes(dest):
    _drop(dest, CODES, "parent_codes")
    return Expect(same_examples=True)


def splits_not_parquet(dest):
    (dest / SPLITS).write_bytes(b"PAR1")
    return Expect(error=f"{JOB}{dest / SPLITS}: cannot read as parquet (Parquet file size is 4 bytes, smaller than "
                        "the minimum file footer (8 bytes))")


def splits_without_split(dest):
    _drop(dest, SPLITS, "split")
    return Expect(error=f"{JOB}{dest / SPLITS}: not a MEDS subject split file: no column 'split'")


def subject_in_two_splits(dest):
    _edit(dest, SPLITS, lambda t: pa.concat_tables([t, pa.table({"subject_id": pa.array([3], pa.int64()),
                                                                 "split": ["held_out"]})]))
    return Expect(error=f"{JOB}{dest / SPLITS}: subject 3 is in two splits, 'train' and 'held_out'")


def subject_twice_in_one_split(dest):
    _edit(dest, SPLITS, lambda t: pa.concat_tables([t, t.slice(0, 2)]))
    return Expect(same_examples=True)


def splits_with_a_null(dest):
    _column(dest, SPLITS, "split", lambda c: _value_at(c, 4, None))
    return Expect(error=f"{JOB}{dest / SPLITS}: row 5: split is null (MEDS: never null)")


FAULTS_METADATA = {
    "codes_parent_codes_as_text": _retyped(CODES, "parent_codes", lambda c: pa.array(["LOINC/2160-0"] * len(c)),
                                           JOB + "{file}: column 'parent_codes' is string, MEDS code metadata files "
                                           "want list<item: string>"),
    "codes_parent_codes_as_large_lists": _retyped(CODES, "parent_codes", _as(pa.large_list(pa.large_string())),
                                                  same_examples=True),
    "codes_code_as_integers": _retyped(CODES, "code", lambda c: pa.array(range(len(c))),
                                       JOB + "{file}: column 'code' is int64, MEDS code metadata files want string"),
    "splits_subject_id_as_text": _retyped(SPLITS, "subject_id", _text_of,
                                          JOB + "{file}: column 'subject_id' is string, MEDS subject split files "
                                          "want int64"),
    "splits_split_as_integers": _retyped(SPLITS, "split", lambda c: pa.array(range(len(c))),
                                         JOB + "{file}: column 'split' is int64, MEDS subject split files want string"),
}


# ----------------------------------------------------------------------------- label files


def _labels(table: pa.Table) -> Callable[[pathlib.Path], None]:
    return lambda dest: pq.write_table(table, dest / LABELS)


def labels_integer_values_only(dest):
    _edit(dest, LABELS, lambda t: t.drop_columns(["boolean_value"]).append_column(
        "integer_value", pa.array([0, 1, 0, 0, 1, 0], pa.int64())))
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: no column 'boolean_value': this job's tasks are binary "
                                     "(MEDS boolean_value labels)")


def labels_with_integer_values_too(dest):
    _column(dest, LABELS, "integer_value", lambda c: pa.array([0, 1, 0, 0, 1, 2], pa.int64()))
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: column 'integer_value' holds labels: this job's tasks "
                                     "are binary, it reads boolean_value only")


def labels_with_aces_null_columns(dest):
    # ACES writes all-null integer, float and categorical label columns beside boolean_value.
    for name, t in (("integer_value", pa.int64()), ("float_value", pa.float64()), ("categorical_value", pa.string())):
        _column(dest, LABELS, name, lambda c, t=t: pa.nulls(6, t))
    return Expect(labels=True, same_examples=True)


def labels_with_an_extra_column(dest):
    _column(dest, LABELS, "hadm_id", lambda c: pa.array(range(6)))
    return Expect(labels=True, same_examples=True)


def labels_empty(dest):
    _edit(dest, LABELS, lambda t: t.slice(0, 0))
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: no label rows: there is nothing to make examples from")


def labels_folder_without_files(dest):
    (dest / LABELS).unlink()
    (dest / LABELS).mkdir()
    (dest / LABELS / "README.txt").write_text("labels go here\n")
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: no label files (*.parquet)")


def labels_not_parquet(dest):
    (dest / LABELS).write_text("subject_id,prediction_time,boolean_value\n1,2096-01-01,True\n")
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: cannot read as parquet (Parquet magic bytes not found in "
                                     "footer. Either the file is corrupted or this is not a parquet file.)")


def labels_null_subject(dest):
    _column(dest, LABELS, "subject_id", lambda c: _value_at(c, 2, None))
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: row 3: subject_id is null (MEDS: never null)")


def labels_nanosecond_times(dest):
    _column(dest, LABELS, "prediction_time", lambda c: pc.add(pc.cast(c, pa.timestamp("ns")),
                                                              pa.scalar(1, pa.duration("ns"))))
    return Expect(labels=True, error=f"{JOB}{dest / LABELS}: column 'prediction_time': row 1 is finer than a "
                                     "microsecond (MEDS times are microseconds)")


def labels_null_values_and_times(dest):
    _column(dest, LABELS, "boolean_value", lambda c: _value_at(c, 0, None))
    _column(dest, LABELS, "prediction_time", lambda c: _value_at(c, 1, None))
    return Expect(labels=True, counts=(("labels/outcome/null_value", 1), ("labels/outcome/null_prediction_time", 1),
                                       ("labels/outcome/example", 4)))


def labels_half_a_second_apart(dest):
    # Two rows of subject 3 half a second apart are two examples (two keys), not a duplicate.
    _edit(dest, LABELS, lambda t: pa.concat_tables([t, pa.table({
        "subject_id": pa.array([3], pa.int64()),
        "prediction_time": pa.array([(T0 + 4 * DAY) * 1_000_000 + 500_000], pa.timestamp("us")),
        "boolean_value": [True]})]))
    return Expect(labels=True, counts=(("labels/outcome/example", 7), ("labels/outcome/duplicate", 0)))


def labels_exact_duplicate_and_unknown_subject(dest):
    _edit(dest, LABELS, lambda t: pa.concat_tables([t, t.slice(2, 1), pa.table({
        "subject_id": pa.array([99], pa.int64()), "prediction_time": t.column("prediction_time").slice(0, 1),
        "boolean_value": [False]})]))
    return Expect(labels=True, counts=(("labels/outcome/example", 6), ("labels/outcome/duplicate", 1),
                                       ("labels/outcome/no_subject_rows", 1)))


def labels_in_other_widths(dest):
    _column(dest, LABELS, "subject_id", _as(pa.int16()))
    _column(dest, LABELS, "prediction_time", _as(pa.timestamp("ms", "UTC")))
    return Expect(labels=True, same_examples=True)


FAULTS_LABELS = {
    # The case: every 'False' read as bool('False'), a positive label.
    "labels_bool_as_text": _retyped(LABELS, "boolean_value", lambda c: pa.array([str(v) for v in c.to_pylist()]),
                                    _label_type("boolean_value", "string", "bool"), labels=True),
    "labels_bool_as_float": _retyped(LABELS, "boolean_value", lambda c: pa.array([0.0, 0.3, 0.0, 0.0, 1.0, 0.0]),
                                     _label_type("boolean_value", "double", "bool"), labels=True),
    "labels_bool_as_integers": _retyped(LABELS, "boolean_value", _as(pa.int8()),
                                        _label_type("boolean_value", "int8", "bool"), labels=True),
    "labels_time_as_text": _retyped(LABELS, "prediction_time", _text_of,
                                    _label_type("prediction_time", "string", "timestamp[us]"), labels=True),
    "labels_subject_id_as_text": _retyped(LABELS, "subject_id", _text_of, _label_type("subject_id", "string", "int64"),
                                          labels=True),
}


FAULTS: dict[str, Callable[[pathlib.Path], Expect]] = {
    **{f.__name__: f for f in (
        data_not_parquet, data_empty_file, data_truncated, no_data_files, data_without_code,
        data_without_subject_and_time, data_subject_ids_out_of_int64, data_not_together, subject_in_two_files,
        file_written_twice, null_subject_ids_amid_a_subject, non_finite_values,
        values_beyond_float32, null_codes_and_times, numbers_in_other_widths,
        text_in_other_encodings, times_in_other_units, times_with_nanoseconds, without_numeric_value,
        all_null_optional_columns, codes_not_parquet, codes_without_code, codes_with_a_null_code,
        codes_without_parent_codes, splits_not_parquet, splits_without_split, subject_in_two_splits,
        subject_twice_in_one_split, splits_with_a_null, labels_integer_values_only,
        labels_with_integer_values_too, labels_with_aces_null_columns, labels_with_an_extra_column, labels_empty,
        labels_folder_without_files, labels_not_parquet, labels_null_subject, labels_nanosecond_times,
        labels_null_values_and_times, labels_half_a_second_apart, labels_exact_duplicate_and_unknown_subject,
        labels_in_other_widths)},
    **FAULTS_DATA, **FAULTS_METADATA, **FAULTS_LABELS,
}


# Faults a correct job reads without an error, each on files or columns no other of its group touches and each
# moving counts of its own (or none): one dataset holds the group, so one job run (~4 s) checks them all, each
# by its own expectation. Not grouped: every error (the first would hide the others), the faults whose dead
# letters' lines or label counts another test or fault reads, and faults on the same column.
TOGETHER: dict[str, tuple[str, ...]] = {
    "storage_in_other_types": ("numbers_in_other_widths", "text_in_other_encodings", "times_in_other_units",
                               "codes_without_parent_codes", "subject_twice_in_one_split"),
    "storage_finer_times_and_large_lists": ("times_with_nanoseconds", "codes_parent_codes_as_large_lists"),
    "labels_in_other_storage": ("labels_with_aces_null_columns", "labels_with_an_extra_column",
                                "labels_in_other_widths"),
    "null_codes_and_values_beyond_float32": ("null_codes_and_times", "values_beyond_float32"),
    "optional_columns_absent_or_null": ("without_numeric_value", "all_null_optional_columns"),
}


def _together(expects: list[Expect]) -> Expect:
    """What a group's faults expect of one run: each one's counts, the examples unchanged only if no fault moves them."""
    assert all(e.error is None for e in expects) and len({e.labels for e in expects}) == 1, expects
    counts: dict[str, int] = {}
    for path, value in (c for e in expects for c in e.counts):
        assert counts.setdefault(path, value) == value, path  # a group never moves one count twice
    return Expect(counts=tuple(counts.items()), labels=expects[0].labels,
                  same_examples=all(e.same_examples for e in expects))


def faulted_meds(dest: pathlib.Path, fault: str) -> Expect:
    """Writes the dataset with one fault (or a TOGETHER group's faults) to dest; returns what the job must give."""
    write_base(pathlib.Path(dest))
    return _together([FAULTS[f](pathlib.Path(dest)) for f in TOGETHER[fault]]) if fault in TOGETHER else \
        FAULTS[fault](pathlib.Path(dest))


def fault_cases() -> list[str]:
    """The faults one run each, then the TOGETHER groups: every fault of FAULTS once."""
    grouped = [f for faults in TOGETHER.values() for f in faults]
    assert len(grouped) == len(set(grouped)) and set(grouped) <= FAULTS.keys()
    return sorted(f for f in FAULTS if f not in grouped) + sorted(TOGETHER)
