"""The MEDS source of the Beam job: a MEDS dataset's subjects -> examples with their events, as the CSV source's.

MEDS (the Medical Event Data Standard, 0.4) stores ``data/**/*.parquet`` with ``subject_id``,
``time`` (timestamp, null = static), ``code``, ``numeric_value`` (and optional columns, such as
the ``hadm_id`` and ``unit`` the MIMIC-IV ETL writes); each subject's rows lie together in one
file. This module reads it with pyarrow only (the ``meds`` package is not needed to read), one
file at a time and one block of whole subjects at a time, so a worker's memory is one block, not
the dataset:

1. Every code is read once with the code map (``meds_codes``): an event ('lab:50912' and its unit),
   an admission, a discharge, a death, a birth, a gender, or nothing the model reads.
2. Events are timed when they were known (``bagging.known_time``, and the next discharge for billing
   codes), as the CSV source's extractors time them.
3. The task: without labels, the built-in one (in-hospital death predicted at admission + 24 h),
   computed by the very function the CSV source uses (``cohort.build_cohort``) from ADMISSIONS and
   PATIENTS tables rebuilt from the admission, discharge, death and birth codes. With labels, one
   example per label row (subject, prediction_time, boolean_value), no filter on top.
4. Events are cut to the examples by ``events.filter_to_cohort`` (strictly before the prediction time)
   and split per example, exactly as the CSV source does.

Every row read is counted once, under ``rows/MEDS/*`` and ``events/MEDS/extract/<reason>``, and
every kept event under ``events/MEDS/cohort/<reason>``; every label row under ``labels/<reason>``.

The prediction-time boundary: MEDS says data up to AND including ``prediction_time`` may be used.
This job uses events strictly BEFORE it, as it does for MIMIC-III (docs/meds.md says why).

A block's rows, read through the code map, and the task rows rebuilt from them are
``ehr_pipeline.meds_rows``.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline import ages, bagging, cohort, events, meds_codes, spec
from ehr_pipeline.meds_rows import KIND, MedsError, Rows, TaskRows, seconds, synthetic_key, task_rows

logger = logging.getLogger(__name__)

TABLE = "MEDS"  # the manifest's table name of MEDS data rows
DATA_DIR = "data"
METADATA_DIR = "metadata"
CODES_FILE = "codes.parquet"
SPLITS_FILE = "subject_splits.parquet"
# MEDS split names -> the project's (config.SPLIT_NAMES).
SPLITS = {"train": "train", "tuning": "validation", "held_out": "test"}
REQUIRED_COLUMNS = ("subject_id", "time", "code", "numeric_value")
BLOCK_ROWS = 1 << 16  # rows per parquet batch: about 4 MB of MEDS rows

# events/MEDS/extract/<reason>: every row, exactly once.
KEPT = events.KEPT
TASK_CODE = "task_code"  # admission, discharge, death, birth, gender: read by the task, not an event
UNMAPPED = "unmapped_code"  # a code no rule of the code map reads
SOURCE_OFF = "source_not_enabled"  # an event of a source the pipeline config leaves out
MISSING_TIME = events.MISSING_TIME  # an event or task row without a time
MISSING_CODE = events.MISSING_CODE
NO_DISCHARGE_AFTER = "no_discharge_after"  # known at the next discharge, and there is none
# labels/<reason>: every label row, exactly once.
LABEL_EXAMPLE = "example"
LABEL_NO_DATA = "no_subject_rows"  # its subject has no rows in the data
LABEL_NO_BIRTH = "no_birth"  # no birth code: the age, which every example carries, is unknown
LABEL_BEFORE_BIRTH = "before_birth"  # prediction time before the birth
LABEL_DUPLICATE = "duplicate"  # (subject, prediction_time) seen before: one example each
LABEL_NULL = "null_value"  # boolean_value null
LABEL_NULL_TIME = "null_prediction_time"
LABEL_REASONS = (LABEL_EXAMPLE, LABEL_NO_DATA, LABEL_NO_BIRTH, LABEL_BEFORE_BIRTH, LABEL_DUPLICATE, LABEL_NULL,
                 LABEL_NULL_TIME)


# ----------------------------------------------------------------------------- driver side


def data_files(meds_dir: str | os.PathLike[str]) -> list[str]:
    """Every data/**/*.parquet file of a MEDS dataset, sorted; MedsError when there is none."""
    root = os.path.join(os.fspath(meds_dir), DATA_DIR)
    files = sorted(glob.glob(os.path.join(root, "**", "*.parquet"), recursive=True))
    if not files:
        raise MedsError(f"{root}: no MEDS data files (data/**/*.parquet)")
    for path in files:
        names = _schema_names(path)
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise MedsError(f"{path}: not a MEDS data file, missing columns {missing}")
    return files


def _schema_names(path: str) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return pq.read_schema(path).names
    except (OSError, pa.ArrowInvalid) as err:
        raise MedsError(f"{path}: cannot read as parquet ({err})") from None


def read_subject_splits(meds_dir: str | os.PathLike[str]) -> dict[int, str] | None:
    """subject_id -> the project's split name from metadata/subject_splits.parquet; None without the file.

    Subjects absent from it (or in a split MEDS does not name) get the hashed split (splits.assign_split).
    """
    import pyarrow.parquet as pq

    path = os.path.join(os.fspath(meds_dir), METADATA_DIR, SPLITS_FILE)
    if not os.path.isfile(path):
        logger.warning("%s not found: splits are assigned by a hash of subject_id", path)
        return None
    table = pq.read_table(path, columns=["subject_id", "split"])
    out = {}
    for sid, split in zip(table.column("subject_id").to_pylist(), table.column("split").to_pylist()):
        if sid is not None and split in SPLITS:
            out[int(sid)] = SPLITS[split]
    return out


def lab_loinc_bridge(meds_dir: str | os.PathLike[str], codes: meds_codes.MedsCodes) -> dict[str, list[str]]:
    """LOINC -> lab item codes from metadata/codes.parquet's parent_codes ('LOINC/2160-0'); {} without it."""
    import pyarrow.parquet as pq

    path = os.path.join(os.fspath(meds_dir), METADATA_DIR, CODES_FILE)
    if not os.path.isfile(path) or "parent_codes" not in pq.read_schema(path).names:
        return {}
    table = pq.read_table(path, columns=["code", "parent_codes"])
    mapper = meds_codes.CodeMapper(codes)
    bridge: dict[str, set[str]] = {}
    for code, parents in zip(table.column("code").to_pylist(), table.column("parent_codes").to_pylist()):
        mapped = mapper(code) if code else None
        if mapped is None or mapped.kind != meds_codes.EVENT or not mapped.code.startswith("lab:"):
            continue
        for parent in parents or []:
            if parent and parent.upper().startswith("LOINC/"):
                bridge.setdefault(parent.split("/", 1)[1].strip(), set()).add(mapped.code.split(":", 1)[1])
    return {loinc: sorted(items) for loinc, items in sorted(bridge.items())}


@dataclasses.dataclass(frozen=True)
class Labels:
    """Label rows by subject: (prediction_time s, label 0/1) in file order; driver-side drops by reason."""

    by_subject: dict[int, list[tuple[int, int]]]
    rows: int
    dropped: dict[str, int]  # LABEL_NULL, LABEL_NULL_TIME (found before any worker sees a row)
    files: tuple[str, ...]


def read_labels(path: str | os.PathLike[str]) -> Labels:
    """MEDS label files (a parquet file, or every *.parquet under a folder): subject_id, prediction_time, boolean_value."""
    import pyarrow.parquet as pq

    path = os.fspath(path)
    files = [path] if os.path.isfile(path) else sorted(glob.glob(os.path.join(path, "**", "*.parquet"),
                                                                 recursive=True))
    if not files:
        raise MedsError(f"{path}: no label files (*.parquet)")
    by_subject: dict[int, list[tuple[int, int]]] = {}
    dropped = {LABEL_NULL: 0, LABEL_NULL_TIME: 0}
    rows = 0
    for file in files:
        names = _schema_names(file)
        missing = [c for c in ("subject_id", "prediction_time", "boolean_value") if c not in names]
        if missing:
            raise MedsError(f"{file}: not a MEDS label file with boolean labels, missing columns {missing}")
        table = pq.read_table(file, columns=["subject_id", "prediction_time", "boolean_value"])
        if table.column("subject_id").null_count:
            raise MedsError(f"{file}: subject_id must not be null")
        rows += table.num_rows
        times = seconds(table.column("prediction_time"))
        values = table.column("boolean_value").to_pylist()
        for sid, t, v in zip(table.column("subject_id").to_pylist(), times.to_pylist(), values):
            if t is None:
                dropped[LABEL_NULL_TIME] += 1
            elif v is None:
                dropped[LABEL_NULL] += 1
            else:
                by_subject.setdefault(int(sid), []).append((int(t), int(bool(v))))
    return Labels(by_subject=by_subject, rows=rows, dropped=dropped, files=tuple(files))


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
    return {"files": list(labels.files), "rows": labels.rows, "outcome": found, "balanced": not problems,
            "problems": problems}


# ----------------------------------------------------------------------------- worker side


@dataclasses.dataclass
class SubjectsOut:
    """What one block of whole subjects gives: examples, unit census and counts."""

    examples: list  # (key, cohort row dict, times s, codes, values, units)
    units: dict[tuple[str, str], tuple[int, dict[int, int]]]  # events.unit_counts: (rows, magnitude sketch)
    counts: dict[str, int]


class MedsReader:
    """Reads MEDS data files into examples; pickled to every worker (a plain-dict round trip)."""

    def __init__(self, *, codes: meds_codes.MedsCodes, trigger_offset_seconds: int, min_age_years: float,
                 sources: tuple[str, ...] = spec.SOURCES, labels: dict[int, list[tuple[int, int]]] | None = None,
                 splits: dict[int, str] | None = None, block_rows: int = BLOCK_ROWS):
        self.codes = codes
        self.trigger_offset_seconds = int(trigger_offset_seconds)
        self.min_age_years = float(min_age_years)
        self.sources = tuple(sources)
        self.labels = labels
        self.splits = splits
        self.block_rows = int(block_rows)
        self._mapper = meds_codes.CodeMapper(codes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the DoFn (from_dict rebuilds the reader on the worker)."""
        return {"codes": self.codes.to_dict(), "trigger_offset_seconds": self.trigger_offset_seconds,
                "min_age_years": self.min_age_years, "sources": list(self.sources), "labels": self.labels,
                "splits": self.splits, "block_rows": self.block_rows}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MedsReader:
        """Inverse of to_dict."""
        return cls(codes=meds_codes.MedsCodes.model_validate(d["codes"]),
                   trigger_offset_seconds=d["trigger_offset_seconds"], min_age_years=d["min_age_years"],
                   sources=tuple(d["sources"]), labels=d["labels"], splits=d["splits"], block_rows=d["block_rows"])

    # --- streaming a file

    def read_file(self, path: str) -> Iterator[SubjectsOut]:
        """Every block of whole subjects of one data file, in file order; memory is one block."""
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowInvalid) as err:
            raise MedsError(f"{path}: cannot read as parquet ({err})") from None
        names = pf.schema_arrow.names
        missing = [c for c in REQUIRED_COLUMNS if c not in names]
        if missing:
            raise MedsError(f"{path}: not a MEDS data file, missing columns {missing}")
        wanted = ("hadm_id", self.codes.unit_column, *(c for cs in self.codes.admission_attributes.values() for c in cs))
        columns = list(REQUIRED_COLUMNS) + [c for c in dict.fromkeys(wanted) if c in names]
        pending: pa.Table | None = None
        done: set[int] = set()
        for batch in pf.iter_batches(batch_size=self.block_rows, columns=columns):
            table = pa.Table.from_batches([batch])
            if pending is not None and pending.num_rows:
                table = pa.concat_tables([pending, table])
            subject = np.asarray(pc.fill_null(table.column("subject_id"), -1).to_numpy(), dtype=np.int64)
            # The last subject may go on in the next batch: keep it back.
            cut = int(np.flatnonzero(subject != subject[-1])[-1]) + 1 if np.any(subject != subject[-1]) else 0
            complete, pending = table.slice(0, cut), table.slice(cut)
            if complete.num_rows:
                yield self._block(complete, subject[:cut], done, path)
        if pending is not None and pending.num_rows:
            yield self._block(pending, np.asarray(pc.fill_null(pending.column("subject_id"), -1).to_numpy(),
                                                  dtype=np.int64), done, path)

    def _block(self, table: pa.Table, subject: np.ndarray, done: set[int], path: str) -> SubjectsOut:
        starts = np.flatnonzero(np.r_[True, subject[1:] != subject[:-1]])
        runs = subject[starts]
        if len(set(runs.tolist())) != runs.size or done.intersection(runs.tolist()):
            again = next(int(s) for s in runs.tolist() if s in done or runs.tolist().count(s) > 1)
            raise MedsError(f"{path}: the rows of subject {again} are not together (MEDS keeps a subject's rows "
                            "together, sorted by time)")
        done.update(runs.tolist())
        return self.process(table)

    # --- one block of whole subjects

    def process(self, table: pa.Table) -> SubjectsOut:
        """Examples, unit census and counts of a table holding whole subjects (MEDS columns)."""
        counts: dict[str, int] = {}

        def add(name: str, n: int) -> None:
            counts[name] = counts.get(name, 0) + int(n)

        n = table.num_rows
        add(f"rows/{TABLE}/read", n)
        null_subject = table.column("subject_id").null_count
        if null_subject:  # NOT NULL in MEDS: set aside as a dead row, never guessed
            table = table.filter(pc.is_valid(table.column("subject_id")))
            add(f"rows/{TABLE}/dead_letter/null_subject_id", null_subject)
        add(f"rows/{TABLE}/parsed", table.num_rows)
        rows = Rows.of(table, self._mapper, self.codes.unit_column)
        task = task_rows(rows)
        ev_table, extract_counts = self._events(rows, task)
        for reason, k in extract_counts.items():
            add(f"events/{TABLE}/extract/{reason}", k)
        if self.labels is None:
            cohort_index, metas = self._built_in(task, add)
        else:
            cohort_index, metas = self._labelled(task, rows, add)
        kept, cohort_counts = events.filter_to_cohort(ev_table, cohort_index)
        for reason, k in cohort_counts.items():
            add(f"events/{TABLE}/cohort/{reason}", k)
        chunks = {key: rest for key, *rest in events.split_by_admission(kept)}
        empty = (np.zeros(0, np.int64), np.zeros(0, np.str_), np.zeros(0), np.zeros(0, object))
        examples = [(key, meta, *chunks.get(key, empty)) for key, meta in metas]
        return SubjectsOut(examples=examples, units=events.unit_counts(ev_table), counts=counts)

    def _events(self, rows: Rows, task: TaskRows) -> tuple[pa.Table, dict[str, int]]:
        """The rows that are events (EVENT_SCHEMA, timed when known) and every row's reason."""
        kind = rows.kind
        is_event = kind == KIND[meds_codes.EVENT]
        enabled = np.isin(rows.source, [spec.SOURCES.index(s) for s in self.sources])
        time = rows.time.copy()
        # Billing codes: known at the subject's next discharge (at or after the recorded time).
        wants = is_event & rows.next_discharge & rows.time_ok
        found = np.zeros(kind.size, dtype=bool)
        if np.any(wants):
            found[wants], time[wants] = _next_at_or_after(rows.subject[wants], rows.time[wants],
                                                          task.disch_subject, task.disch_time)
        reasons = {
            MISSING_CODE: rows.code_null,
            UNMAPPED: ~rows.code_null & (kind == KIND[meds_codes.UNMAPPED]),
            TASK_CODE: ~rows.code_null & ~is_event & (kind != KIND[meds_codes.UNMAPPED]) & (
                rows.time_ok | (kind == KIND[meds_codes.GENDER])),
            SOURCE_OFF: is_event & ~enabled,
            MISSING_TIME: ~rows.time_ok,
            NO_DISCHARGE_AFTER: wants & ~found,
        }
        dropped = np.zeros(kind.size, dtype=bool)
        counts = {}
        for name, mask in reasons.items():
            first = mask & ~dropped
            counts[name] = int(np.count_nonzero(first))
            dropped |= first
        keep = ~dropped
        counts = {KEPT: int(np.count_nonzero(keep)), **counts}
        known = np.zeros(int(np.count_nonzero(keep)), dtype=np.int64)
        src, t = rows.source[keep], time[keep]
        for source in np.unique(src).tolist():  # a handful of small ints: one call per source
            at = src == source
            known[at] = bagging.known_time(spec.SOURCES[source], t[at])
        take = pa.array(np.flatnonzero(keep), pa.int64())
        table = pa.table([
            pa.array(rows.subject[keep], pa.int64()), pa.array(rows.hadm[keep], pa.int64(), mask=~rows.hadm_ok[keep]),
            pa.array(known, pa.int64()), rows.event_code.take(take),
            pa.array(rows.value[keep], pa.float64()), rows.unit.take(take),
        ], schema=events.EVENT_SCHEMA)
        return table, counts

    def _built_in(self, task: TaskRows, add) -> tuple[pa.Table, list]:
        """The built-in task: cohort.build_cohort over ADMISSIONS / PATIENTS rebuilt from the task codes."""
        adm, pat = task.admissions_and_patients()
        coh = cohort.build_cohort(adm, pat, trigger_offset_seconds=self.trigger_offset_seconds,
                                  min_age_years=self.min_age_years)
        for reason, k in coh.counts.items():
            add(f"cohort/{reason}", k)
        cols = ("SUBJECT_ID", "HADM_ID", "ADMITTIME", "trigger_time", "label", "age_years", "gender",
                "admission_type", "ethnicity", "insurance")
        metas = []
        for row in coh.table.select(list(cols)).to_pylist():
            row["split"] = self._split(row["SUBJECT_ID"])
            metas.append((row["HADM_ID"], row))
        return coh.table.select(["SUBJECT_ID", "HADM_ID", "trigger_time"]), metas

    def _split(self, subject_id: int) -> str | None:
        return None if self.splits is None else self.splits.get(int(subject_id))

    def _labelled(self, task: TaskRows, rows: Rows, add) -> tuple[pa.Table, list]:
        """One example per label row of the block's subjects: its admission (if any), age, gender."""
        subjects = np.unique(rows.subject).tolist()
        adm = task.admission_table()
        metas, seen_keys = [], set()
        for sid in subjects:
            wanted = self.labels.get(int(sid))
            if not wanted:
                continue
            add("labels/seen", len(wanted))
            dob = task.birth.get(sid)
            gender = task.gender.get(sid, "U")
            mine = adm[adm[:, 0] == sid] if adm.size else adm
            per_admission: dict[int, int] = {}
            placed = []
            for t, value in wanted:
                row = _admission_at(mine, t)
                placed.append((t, value, row))
                if row is not None:
                    per_admission[row] = per_admission.get(row, 0) + 1
            for t, value, row in placed:
                if (sid, t) in seen_keys:
                    add(f"labels/{LABEL_DUPLICATE}", 1)
                    continue
                seen_keys.add((sid, t))
                if dob is None:
                    add(f"labels/{LABEL_NO_BIRTH}", 1)
                    continue
                admit = int(mine[row, 1]) if row is not None else t
                raw_age = float(ages.age_years(np.int64(dob), np.int64(admit)))
                if raw_age < 0:
                    add(f"labels/{LABEL_BEFORE_BIRTH}", 1)
                    continue
                hadm = int(mine[row, 3]) if row is not None else -1
                # An admission with one label row keeps its id (the round trip compares them); any
                # other row gets a key from (subject, prediction time).
                key = hadm if row is not None and hadm >= 0 and per_admission[row] == 1 else synthetic_key(sid, t)
                admission_type = task.admission_type_of(sid, int(mine[row, 1])) if row is not None else "UNKNOWN"
                attributes = task.attributes_of(sid, int(mine[row, 1])) if row is not None else \
                    dict.fromkeys(("ethnicity", "insurance"), spec.NOT_RECORDED)
                metas.append((key, {"SUBJECT_ID": int(sid), "HADM_ID": key, "ADMITTIME": admit, "trigger_time": t,
                                    "label": value, "age_years": float(ages.cap_age(raw_age)), "gender": gender,
                                    "admission_type": admission_type, **attributes, "split": self._split(sid)}))
                add(f"labels/{LABEL_EXAMPLE}", 1)
        index = pa.table({"SUBJECT_ID": pa.array([m["SUBJECT_ID"] for _, m in metas], pa.int64()),
                          "HADM_ID": pa.array([k for k, _ in metas], pa.int64()),
                          "trigger_time": pa.array([m["trigger_time"] for _, m in metas], pa.int64())})
        return index, metas


def _admission_at(mine: np.ndarray, t: int) -> int | None:
    """The row of the latest admission (subject, admit, discharge, hadm) with admit <= t <= its discharge."""
    best = None
    for i in range(mine.shape[0]):
        admit, disch = int(mine[i, 1]), int(mine[i, 2])
        if admit <= t and (disch < 0 or t <= disch) and (best is None or admit >= int(mine[best, 1])):
            best = i
    return best


def _next_at_or_after(subject: np.ndarray, time: np.ndarray, d_subject: np.ndarray, d_time: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Per (subject, time): (found, the subject's first discharge time >= time)."""
    order = np.lexsort((d_time, d_subject))
    d_subject, d_time = d_subject[order], d_time[order]
    found = np.zeros(subject.size, dtype=bool)
    out = time.copy()
    lo = np.searchsorted(d_subject, subject, "left")
    hi = np.searchsorted(d_subject, subject, "right")
    for i in np.flatnonzero(hi > lo):  # a handful of discharges per subject
        j = lo[i] + np.searchsorted(d_time[lo[i]:hi[i]], time[i], "left")
        if j < hi[i]:
            found[i], out[i] = True, d_time[j]
    return found, out
