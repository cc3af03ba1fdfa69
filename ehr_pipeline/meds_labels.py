"""MEDS label files: what the job reads of them, what became of every row, and each example's exact prediction time.

A label file (``meds.LabelSchema``: ``subject_id``, ``prediction_time``, one label value column per task
kind) gives one example per row. This job's tasks are binary, so it reads ``boolean_value``, which must be
of Arrow type bool: 'False' as text or 0.3 as a float is not a boolean, and reading one as ``bool(v)``
once made every such label positive. A file whose rows carry an ``integer_value``, ``float_value`` or
``categorical_value`` label (multi-class, ordinal, regression) is refused: it is a task this model
cannot learn, not a binary one to guess from. All-null columns of those names (ACES writes them) are fine.

Prediction times are kept to the microsecond, MEDS' unit: two rows are one example (the second counted
``duplicate``) only when subject and time agree to the microsecond. An example's trigger time is whole
seconds (``spec.TRIGGER_TIME``), the floor of its prediction time, and data times are read to the second
too, so an event in the same second as the prediction time counts as at it (not used: docs/meds.md).
The exact time of every example goes to ``PREDICTION_TIMES`` beside the examples, keyed by the example
key; ``ehr-eval`` writes it into ``predictions.meds.parquet``, so each prediction joins its label row.
"""
from __future__ import annotations

import dataclasses
import glob
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ehr_pipeline import meds_schema
from ehr_pipeline.meds_rows import micros
from ehr_pipeline.meds_schema import MedsError

# labels/<reason>: every label row, exactly once.
LABEL_EXAMPLE = "example"
LABEL_NO_DATA = "no_subject_rows"  # its subject has no rows in the data
LABEL_NO_BIRTH = "no_birth"  # no birth code: the age, which every example carries, is unknown
LABEL_BEFORE_BIRTH = "before_birth"  # prediction time before the birth
LABEL_DUPLICATE = "duplicate"  # (subject, prediction_time to the microsecond) seen before: one example each
LABEL_NULL = "null_value"  # boolean_value null
LABEL_NULL_TIME = "null_prediction_time"
LABEL_REASONS = (LABEL_EXAMPLE, LABEL_NO_DATA, LABEL_NO_BIRTH, LABEL_BEFORE_BIRTH, LABEL_DUPLICATE, LABEL_NULL,
                 LABEL_NULL_TIME)
# Beside the examples: example key -> subject and prediction time (microseconds), for labelled runs.
PREDICTION_TIMES = "prediction_times.parquet"
_COLUMNS = ("subject_id", "prediction_time", "boolean_value")


@dataclasses.dataclass(frozen=True)
class Labels:
    """Label rows by subject: (prediction_time in microseconds, label 0/1) in file order; driver-side drops."""

    by_subject: dict[int, list[tuple[int, int]]]
    rows: int
    dropped: dict[str, int]  # LABEL_NULL, LABEL_NULL_TIME (found before any worker sees a row)
    files: tuple[str, ...]


def label_files(path: str | os.PathLike[str]) -> list[str]:
    """A label file, or every *.parquet under a folder, sorted; MedsError when there is none."""
    path = os.fspath(path)
    files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "**", "*.parquet"),
                                                                 recursive=True))
    if not files:
        raise MedsError(f"{path}: no label files (*.parquet)")
    return files


def read_labels(path: str | os.PathLike[str]) -> Labels:
    """MEDS label files (a parquet file, or a folder of them): subject_id, prediction_time, boolean_value."""
    files = label_files(path)
    by_subject: dict[int, list[tuple[int, int]]] = {}
    dropped = {LABEL_NULL: 0, LABEL_NULL_TIME: 0}
    rows = 0
    for file in files:
        table = _read_label_file(file)
        rows += table.num_rows
        subjects = table.column("subject_id").to_pylist()
        times = micros(table.column("prediction_time"), f"{file}: column 'prediction_time'").to_pylist()
        values = table.column("boolean_value").to_pylist()
        for sid, t, v in zip(subjects, times, values):
            if t is None:
                dropped[LABEL_NULL_TIME] += 1
            elif v is None:
                dropped[LABEL_NULL] += 1
            else:
                by_subject.setdefault(sid, []).append((t, int(v)))
    if rows == 0:
        where = files[0] if len(files) == 1 else f"{os.fspath(path)} ({len(files)} files)"
        raise MedsError(f"{where}: no label rows: there is nothing to make examples from")
    return Labels(by_subject=by_subject, rows=rows, dropped=dropped, files=tuple(files))


def _read_label_file(file: str) -> pa.Table:
    """One label file's subject_id (int64), prediction_time and boolean_value, checked against the label schema."""
    schema = meds_schema.read_schema(file)
    if "boolean_value" not in schema.names and {"subject_id", "prediction_time"} <= set(schema.names):
        raise MedsError(f"{file}: no column 'boolean_value': this job's tasks are binary (MEDS boolean_value labels)")
    meds_schema.check(file, schema, meds_schema.LABELS)
    others = [c for c in meds_schema.LABEL_VALUES if c in schema.names]
    table = meds_schema.read_table(file, [*_COLUMNS, *others])
    for name in others:
        if table.column(name).null_count < table.num_rows:
            raise MedsError(f"{file}: column '{name}' holds labels: this job's tasks are binary, it reads "
                            "boolean_value only")
    subject = table.column("subject_id")
    if subject.null_count:
        row = int(np.flatnonzero(pc.is_null(subject).to_numpy(zero_copy_only=False))[0])
        raise MedsError(f"{file}: row {row + 1}: subject_id is null (MEDS: never null)")
    return table.set_column(0, "subject_id", meds_schema.as_int64(subject, f"{file}: column 'subject_id'"))


def label_accounting(labels: Labels, counts: Mapping[str, int]) -> dict[str, Any]:
    """The manifest's labels section: every label row as an example or a reason; balanced when they add up."""
    found = {r: int(counts.get(f"labels/{r}", 0)) for r in LABEL_REASONS}
    for reason, n in labels.dropped.items():
        found[reason] += n
    seen = int(counts.get("labels/seen", 0))
    queued = sum(len(v) for v in labels.by_subject.values())
    found[LABEL_NO_DATA] = queued - seen
    problems = []
    if sum(found.values()) != labels.rows:
        problems.append(f"label rows {labels.rows} != examples + reasons {sum(found.values())}")
    if seen > queued:
        problems.append(f"{seen} label rows matched but {queued} queued: a subject's rows are in more than one file")
    times = int(counts.get("labels/prediction_times_written", 0))
    if times != found[LABEL_EXAMPLE]:
        problems.append(f"{times} prediction times written for {found[LABEL_EXAMPLE]} examples")
    return {"files": list(labels.files), "rows": labels.rows, "outcome": found, "balanced": not problems,
            "problems": problems}


# ----------------------------------------------------------------------------- exact prediction times


def prediction_times_table(rows: Iterable[Sequence[int]]) -> bytes:
    """(example key, subject_id, prediction time in microseconds) rows -> PREDICTION_TIMES' parquet bytes, by key."""
    rows = sorted(tuple(int(x) for x in r) for r in rows)
    table = pa.table({
        "key": pa.array([r[0] for r in rows], pa.int64()),
        "subject_id": pa.array([r[1] for r in rows], pa.int64()),
        "prediction_time": pa.array([r[2] for r in rows], pa.timestamp("us")),
    })
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def exact_prediction_times(data_dir: str | os.PathLike[str], keys: Sequence[int],
                           trigger_times: Sequence[int]) -> np.ndarray:
    """Each example's prediction time in microseconds: PREDICTION_TIMES' where the data has it, else trigger s x 1e6.

    ValueError (one line, naming the file) when the file misses a key or gives a time outside its trigger second.
    """
    keys = np.asarray(keys, dtype=np.int64)
    trigger = np.asarray(trigger_times, dtype=np.int64)
    path = os.path.join(os.fspath(data_dir), PREDICTION_TIMES)
    if not os.path.isfile(path):
        return trigger * 1_000_000
    table = pq.read_table(path, columns=["key", "prediction_time"])
    known = dict(zip(table.column("key").to_pylist(),
                     table.column("prediction_time").cast(pa.int64()).to_pylist()))
    out = np.empty(keys.size, dtype=np.int64)
    for i, (key, t) in enumerate(zip(keys.tolist(), trigger.tolist())):
        exact = known.get(key)
        if exact is None:
            raise ValueError(f"{path}: no prediction time for example {key} (the file belongs to other data)")
        if exact // 1_000_000 != t:
            raise ValueError(f"{path}: example {key}: prediction time {exact} us lies outside its trigger second {t} "
                             "(the file belongs to other data)")
        out[i] = exact
    return out
