"""The MEDS source of the Beam job: a MEDS dataset's subjects -> examples with their events, as the CSV source's.

MEDS (the Medical Event Data Standard, 0.4) stores ``data/**/*.parquet`` with ``subject_id``,
``time`` (timestamp, null = static), ``code``, ``numeric_value`` (and optional columns, such as
the ``hadm_id`` and ``unit`` the MIMIC-IV ETL writes); each subject's rows lie together in one
file. This module reads it with pyarrow only (the ``meds`` package is not needed to read), one
file at a time and one block of whole subjects at a time, so a worker's memory is one block, not
the dataset:

1. Every code is read once with the code map (``code_map``): an event ('lab:50912' and its unit),
   an admission, a discharge, a death, a birth, a gender, or nothing the model reads.
2. Events are timed when they were known (``bagging.known_time``, and the next discharge for billing
   codes), as the CSV source's extractors time them.
3. The task: without labels, the built-in one (in-hospital death predicted at admission + 24 h),
   computed by the very function the CSV source uses (``cohort.build_cohort``) from ADMISSIONS and
   PATIENTS tables rebuilt from the admission, discharge, death and birth codes. With labels, one
   example per label row (subject, prediction_time, boolean_value), no filter on top.
4. Events are cut to the examples by ``events.filter_to_cohort`` (strictly before the prediction time)
   and split per example, exactly as the CSV source does.

Every file is checked against MEDS' data schema first (``standard``: one line naming the file and
the column). Every row read is counted once, under ``rows/MEDS/*`` (a row without a subject_id or with
a value no float32 holds is a dead letter) and ``events/MEDS/extract/<reason>``, and every kept event
under ``events/MEDS/cohort/<reason>``; every label row (``labels``) under ``labels/<reason>``.
A subject's rows must lie together in one file: apart in a file, or in two files
(``subjects_in_two_files``), they are refused naming the subject.

The prediction-time boundary: MEDS says data up to AND including ``prediction_time`` may be used.
This job uses events strictly BEFORE it, as it does for MIMIC-III (docs/meds.md says why).

A block's rows, read through the code map, and the task rows rebuilt from them are
``ehr_pipeline.meds.rows``.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ehr_pipeline.contract import output_folder, spec
from ehr_pipeline.encode import ages, bagging, previous_stay
from ehr_pipeline.meds import code_map, standard
from ehr_pipeline.meds.labels import LABEL_BEFORE_BIRTH, LABEL_DUPLICATE, LABEL_EXAMPLE, LABEL_NO_BIRTH
from ehr_pipeline.meds.rows import KIND, Rows, TaskRows, synthetic_key, task_rows
from ehr_pipeline.meds.standard import MedsError
from ehr_pipeline.mimic import cohort, events
from ehr_pipeline.reader import dead_letters, is_measurement

logger = logging.getLogger(__name__)

TABLE = "MEDS"  # the manifest's table name of MEDS data rows
DATA_DIR = "data"
METADATA_DIR = "metadata"
CODES_FILE = "codes.parquet"
SPLITS_FILE = "subject_splits.parquet"
# MEDS split names -> the project's (config.SPLIT_NAMES).
SPLITS = {"train": "train", "tuning": "validation", "held_out": "test"}
REQUIRED_COLUMNS = tuple(c.name for c in standard.DATA.columns if c.required)  # subject_id, time, code
BLOCK_ROWS = 1 << 16  # rows per parquet batch: about 4 MB of MEDS rows

# events/MEDS/extract/<reason>: every row, exactly once.
KEPT = events.KEPT
TASK_CODE = "task_code"  # admission, discharge, death, birth, gender: read by the task, not an event
UNMAPPED = "unmapped_code"  # a code no rule of the code map reads
SOURCE_OFF = "source_not_enabled"  # an event of a source the pipeline config leaves out
MISSING_TIME = events.MISSING_TIME  # an event or task row without a time
MISSING_CODE = events.MISSING_CODE
NO_DISCHARGE_AFTER = "no_discharge_after"  # known at the next discharge, and there is none
# Counter prefix of the examples with / without a previous discharge (encode.previous_stay.COUNTS).
PREVIOUS_DISCHARGE_COUNTER = "previous_discharge"
# rows/MEDS/dead_letter/<reason>: a row with a null subject_id belongs to no subject (MEDS: never null);
# a numeric_value of NaN or +-inf is no measurement, nor is one beyond float32, MEDS' type (a float64 column can
# hold one): the CSV reader's rule (reader.columns.is_measurement), so both roads keep and refuse the same values.
NULL_SUBJECT = dead_letters.MISSING_REQUIRED
BAD_NUMBER = dead_letters.BAD_NUMBER


# ----------------------------------------------------------------------------- driver side


def data_files(meds_dir: str | os.PathLike[str], codes: code_map.MedsCodes | None = None) -> list[str]:
    """Every data/**/*.parquet file of a MEDS dataset, sorted, each checked against the MEDS data schema and
    the extra columns `codes` reads (default: the default code map); MedsError naming the first that fails."""
    root = os.path.join(os.fspath(meds_dir), DATA_DIR)
    files = sorted(glob.glob(os.path.join(root, "**", "*.parquet"), recursive=True))
    if not files:
        raise MedsError(f"{root}: no MEDS data files (data/**/*.parquet)")
    # A dataset `to-meds` wrote lists its files (output_folder): a shard it did not write is not read beside them.
    unlisted = output_folder.unlisted_files(meds_dir)
    if unlisted:
        raise MedsError(f"{os.path.join(os.fspath(meds_dir), unlisted[0])}: not among the files "
                        f"{(output_folder.read_marker(meds_dir) or {}).get('command', 'to-meds')} wrote "
                        f"({output_folder.MARKER}): move it out of the dataset")
    codes = codes or code_map.MedsCodes()
    for path in files:
        check_data_schema(path, standard.read_schema(path), codes)
    return files


def _extra_columns(codes: code_map.MedsCodes) -> dict[str, tuple[Any, str]]:
    """Columns beyond MEDS' that the job reads when present: name -> (type test, what it must be)."""
    out = {"hadm_id": (standard.is_integer, "an integer admission id"),
           codes.unit_column: (standard.is_text, "text (a unit)")}
    for columns in codes.admission_attributes.values():
        out.update(dict.fromkeys(columns, (standard.is_text, "text")))
    return out


def check_data_schema(path: str, schema: pa.Schema, codes: code_map.MedsCodes) -> None:
    """MedsError unless `schema` is MEDS data with the extra columns the job reads (hadm_id, unit, ...) readable."""
    standard.check(path, schema, standard.DATA)
    for name, (accepts, want) in _extra_columns(codes).items():
        if name in schema.names:
            got = schema.field(name).type
            if not (accepts(got) or pa.types.is_null(got)):
                raise MedsError(f"{path}: column '{name}' is {got}, the job reads it as {want}")


def read_subject_splits(meds_dir: str | os.PathLike[str]) -> dict[int, str] | None:
    """subject_id -> the project's split name from metadata/subject_splits.parquet; None without the file.

    Subjects absent from it, or in a split other than train / tuning / held_out (logged with their number),
    get the hashed split (splits.assign_split). A subject in two splits is a MedsError.
    """
    path = os.path.join(os.fspath(meds_dir), METADATA_DIR, SPLITS_FILE)
    if not os.path.isfile(path):
        logger.warning("%s not found: splits are assigned by a hash of subject_id", path)
        return None
    standard.check(path, standard.read_schema(path), standard.SPLITS)
    table = standard.read_table(path, ["subject_id", "split"])
    for name in ("subject_id", "split"):
        _no_nulls(path, table.column(name), name)
    ids = standard.as_int64(table.column("subject_id"), f"{path}: column 'subject_id'").to_pylist()
    split_of: dict[int, str] = {}
    for sid, split in zip(ids, table.column("split").to_pylist()):
        before = split_of.setdefault(sid, split)
        if before != split:
            raise MedsError(f"{path}: subject {sid} is in two splits, '{before}' and '{split}'")
    other: dict[str, int] = {}
    for split in split_of.values():
        if split not in SPLITS:
            other[split] = other.get(split, 0) + 1
    if other:
        logger.warning("%s: %d subjects in splits other than %s (%s): their split is a hash of subject_id", path,
                       sum(other.values()), ", ".join(SPLITS), ", ".join(f"{k}: {v}" for k, v in sorted(other.items())))
    return {sid: SPLITS[split] for sid, split in split_of.items() if split in SPLITS}


def _no_nulls(path: str, column: pa.ChunkedArray, name: str) -> None:
    if column.null_count:
        row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        raise MedsError(f"{path}: row {row + 1}: {name} is null (MEDS: never null)")


def lab_loinc_bridge(meds_dir: str | os.PathLike[str], codes: code_map.MedsCodes) -> dict[str, list[str]]:
    """LOINC -> lab item codes from metadata/codes.parquet's parent_codes ('LOINC/2160-0'); {} without them."""
    path = os.path.join(os.fspath(meds_dir), METADATA_DIR, CODES_FILE)
    if not os.path.isfile(path):
        return {}
    schema = standard.read_schema(path)
    standard.check(path, schema, standard.CODES)
    if "parent_codes" not in schema.names:
        logger.info("%s has no parent_codes: no LOINC codes for the lab codes", path)
        return {}
    table = standard.read_table(path, ["code", "parent_codes"])
    _no_nulls(path, table.column("code"), "code")
    mapper = code_map.CodeMapper(codes)
    bridge: dict[str, set[str]] = {}
    for code, parents in zip(table.column("code").to_pylist(), table.column("parent_codes").to_pylist()):
        mapped = mapper(code)
        if mapped.kind != code_map.EVENT or not mapped.code.startswith("lab:"):
            continue
        for parent in parents or []:
            if parent and parent.upper().startswith("LOINC/"):
                bridge.setdefault(parent.split("/", 1)[1].strip(), set()).add(mapped.code.split(":", 1)[1])
    return {loinc: sorted(items) for loinc, items in sorted(bridge.items())}


def subjects_in_two_files(per_file: Sequence[tuple[str, np.ndarray]]) -> str | None:
    """One line naming the first subject whose rows lie in two data files, and both files; None when none does.

    `per_file`: (path, the file's distinct subject ids). MEDS keeps a subject's rows in one file, and the job
    reads a file per worker: a subject in two would be read as two (two examples of one admission, or an
    admission without its discharge). The cost is one id per subject, not per row.
    """
    per_file = sorted(per_file, key=lambda item: item[0])
    if not per_file:
        return None
    ids = np.concatenate([np.asarray(a, dtype=np.int64) for _, a in per_file])
    owner = np.concatenate([np.full(len(a), i) for i, (_, a) in enumerate(per_file)])
    order = np.lexsort((owner, ids))
    ids, owner = ids[order], owner[order]
    again = np.flatnonzero(ids[1:] == ids[:-1])
    if not again.size:
        return None
    first = int(again[0])
    shared = int(np.unique(ids[again]).size)
    more = f"; {shared - 1} more subject(s) likewise" if shared > 1 else ""
    return (f"subject {int(ids[first])}: rows in two MEDS data files, {per_file[owner[first]][0]} and "
            f"{per_file[owner[first + 1]][0]} (MEDS keeps each subject's rows in one file){more}")


# ----------------------------------------------------------------------------- worker side


@dataclasses.dataclass
class SubjectsOut:
    """What one block of a data file gives: examples, unit census, counts, dead letters, its subjects."""

    examples: list  # (key, cohort row dict, times s, codes, values, units)
    units: dict[tuple[str, str], tuple[int, dict[int, int]]]  # events.unit_counts: (rows, magnitude sketch)
    counts: dict[str, int]
    subjects: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, np.int64))  # distinct ids
    dead: list = dataclasses.field(default_factory=list)  # reader.DeadLetter of rows without a subject
    prediction_times: list = dataclasses.field(default_factory=list)  # (example key, subject, prediction time us)


class MedsReader:
    """Reads MEDS data files into examples; pickled to every worker (a plain-dict round trip).

    `labels`: subject -> [(prediction time in microseconds, label 0/1)] (labels.Labels.by_subject), or None
    for the built-in task.
    """

    def __init__(self, *, codes: code_map.MedsCodes, trigger_offset_seconds: int, min_age_years: float,
                 sources: tuple[str, ...] = spec.SOURCES, labels: dict[int, list[tuple[int, int]]] | None = None,
                 splits: dict[int, str] | None = None, block_rows: int = BLOCK_ROWS):
        self.codes = codes
        self.trigger_offset_seconds = int(trigger_offset_seconds)
        self.min_age_years = float(min_age_years)
        self.sources = tuple(sources)
        self.labels = labels
        self.splits = splits
        self.block_rows = int(block_rows)
        self._mapper = code_map.CodeMapper(codes)

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the DoFn (from_dict rebuilds the reader on the worker)."""
        return {"codes": self.codes.to_dict(), "trigger_offset_seconds": self.trigger_offset_seconds,
                "min_age_years": self.min_age_years, "sources": list(self.sources), "labels": self.labels,
                "splits": self.splits, "block_rows": self.block_rows}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MedsReader:
        """Inverse of to_dict."""
        return cls(codes=code_map.MedsCodes.model_validate(d["codes"]),
                   trigger_offset_seconds=d["trigger_offset_seconds"], min_age_years=d["min_age_years"],
                   sources=tuple(d["sources"]), labels=d["labels"], splits=d["splits"], block_rows=d["block_rows"])

    # --- streaming a file

    def read_file(self, path: str) -> Iterator[SubjectsOut]:
        """Every block of whole subjects of one data file, in file order; memory is one block.

        Rows without a subject_id, or with a non-finite value, come out as dead letters (a SubjectsOut with no
        examples), wherever they lie.
        """
        try:
            pf = pq.ParquetFile(path)
        except (OSError, pa.ArrowInvalid) as err:
            raise MedsError(f"{path}: cannot read as parquet ({' '.join(str(err).split())})") from None
        names = pf.schema_arrow.names
        check_data_schema(path, pf.schema_arrow, self.codes)
        wanted = ("numeric_value", "hadm_id", self.codes.unit_column,
                  *(c for cs in self.codes.admission_attributes.values() for c in cs))
        columns = list(REQUIRED_COLUMNS) + [c for c in dict.fromkeys(wanted) if c in names]
        pending: pa.Table | None = None
        done: set[int] = set()
        first_row = 0
        for table in self._tables(pf, path, columns):
            table, dead = self._without_dead_rows(table, path, first_row)
            first_row += table.num_rows + len(dead.dead if dead else ())
            if dead is not None:
                yield dead
            if pending is not None and pending.num_rows:
                table = pa.concat_tables([pending, table])
            if not table.num_rows:
                continue
            subject = np.asarray(table.column("subject_id").to_numpy(), dtype=np.int64)
            # The last subject may go on in the next batch: keep it back.
            cut = int(np.flatnonzero(subject != subject[-1])[-1]) + 1 if np.any(subject != subject[-1]) else 0
            complete, pending = table.slice(0, cut), table.slice(cut)
            if complete.num_rows:
                yield self._block(complete, subject[:cut], done, path)
        if pending is not None and pending.num_rows:
            yield self._block(pending, np.asarray(pending.column("subject_id").to_numpy(), dtype=np.int64), done, path)

    def _tables(self, pf: pq.ParquetFile, path: str, columns: list[str]) -> Iterator[pa.Table]:
        """The file's batches as tables, subject_id and hadm_id as int64; MedsError naming the file on a bad page."""
        batches = pf.iter_batches(batch_size=self.block_rows, columns=columns)
        while True:
            try:
                batch = next(batches, None)
            except (OSError, pa.ArrowInvalid) as err:
                raise MedsError(f"{path}: cannot read as parquet ({' '.join(str(err).split())})") from None
            if batch is None:
                return
            table = pa.Table.from_batches([batch])
            for name in ("subject_id", "hadm_id"):
                if name in table.column_names and not pa.types.is_null(table.schema.field(name).type):
                    at = table.column_names.index(name)
                    table = table.set_column(at, name, standard.as_int64(table.column(name),
                                                                            f"{path}: column '{name}'"))
            yield table

    @staticmethod
    def _without_dead_rows(table: pa.Table, path: str, first_row: int) -> tuple[pa.Table, SubjectsOut | None]:
        """The readable rows, and the others as dead letters (row numbers from 1 in the file): a null subject_id
        (MEDS: never null) belongs to no subject; a numeric_value that is no finite float32 is no measurement."""
        null_subject = np.asarray(pc.is_null(table.column("subject_id")).to_numpy(zero_copy_only=False), dtype=bool)
        bad_number = np.zeros(table.num_rows, dtype=bool)
        if "numeric_value" in table.column_names and not pa.types.is_null(table.schema.field("numeric_value").type):
            value = pc.cast(table.column("numeric_value"), pa.float64())
            readable = is_measurement(value)
            bad_number = ~np.asarray(pc.fill_null(readable, True).to_numpy(zero_copy_only=False), dtype=bool)
            bad_number &= ~null_subject
        dead = null_subject | bad_number
        if not dead.any():
            return table, None
        at = np.flatnonzero(dead)
        letters = []
        for i, row in zip(at.tolist(), table.take(pa.array(at)).to_pylist()):
            reason, detail = ((NULL_SUBJECT, "subject_id is null (MEDS: never null)") if null_subject[i] else
                              (BAD_NUMBER, f"numeric_value is {row['numeric_value']} (MEDS values are finite float32)"))
            letters.append(dead_letters.DeadLetter(file=path, line=first_row + i + 1, reason=reason, detail=detail,
                                                 raw=json.dumps(row, default=str, sort_keys=True)))
        counts = {f"rows/{TABLE}/read": len(letters)}
        for reason, mask in ((NULL_SUBJECT, null_subject), (BAD_NUMBER, bad_number)):
            if mask.any():
                counts[f"rows/{TABLE}/dead_letter/{reason}"] = int(np.count_nonzero(mask))
        return table.filter(pa.array(~dead)), SubjectsOut(examples=[], units={}, counts=counts, dead=letters)

    def _block(self, table: pa.Table, subject: np.ndarray, done: set[int], path: str) -> SubjectsOut:
        starts = np.flatnonzero(np.r_[True, subject[1:] != subject[:-1]])
        runs = subject[starts]
        if len(set(runs.tolist())) != runs.size or done.intersection(runs.tolist()):
            again = next(int(s) for s in runs.tolist() if s in done or runs.tolist().count(s) > 1)
            raise MedsError(f"{path}: the rows of subject {again} are not together (MEDS keeps a subject's rows "
                            "together, sorted by time)")
        done.update(runs.tolist())
        out = self.process(table)
        out.subjects = np.sort(runs)
        return out

    # --- one block of whole subjects

    def process(self, table: pa.Table) -> SubjectsOut:
        """Examples, unit census and counts of a table holding whole subjects (MEDS columns, subject_id not null)."""
        counts: dict[str, int] = {}

        def add(name: str, n: int) -> None:
            counts[name] = counts.get(name, 0) + int(n)

        add(f"rows/{TABLE}/read", table.num_rows)
        add(f"rows/{TABLE}/parsed", table.num_rows)
        rows = Rows.of(table, self._mapper, self.codes.unit_column)
        task = task_rows(rows)
        ev_table, extract_counts = self._events(rows, task)
        for reason, k in extract_counts.items():
            add(f"events/{TABLE}/extract/{reason}", k)
        times: list[tuple[int, int, int]] = []
        if self.labels is None:
            cohort_index, metas = self._built_in(task, add)
        else:
            cohort_index, metas, times = self._labelled(task, rows, add)
        kept, cohort_counts = events.filter_to_cohort(ev_table, cohort_index)
        for reason, k in cohort_counts.items():
            add(f"events/{TABLE}/cohort/{reason}", k)
        chunks = {key: rest for key, *rest in events.split_by_admission(kept)}
        empty = (np.zeros(0, np.int64), np.zeros(0, np.str_), np.zeros(0), np.zeros(0, object))
        examples = [(key, meta, *chunks.get(key, empty)) for key, meta in metas]
        return SubjectsOut(examples=examples, units=events.unit_counts(ev_table), counts=counts,
                           prediction_times=times)

    def _events(self, rows: Rows, task: TaskRows) -> tuple[pa.Table, dict[str, int]]:
        """The rows that are events (EVENT_SCHEMA, timed when known) and every row's reason."""
        kind = rows.kind
        is_event = kind == KIND[code_map.EVENT]
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
            UNMAPPED: ~rows.code_null & (kind == KIND[code_map.UNMAPPED]),
            TASK_CODE: ~rows.code_null & ~is_event & (kind != KIND[code_map.UNMAPPED]) & (
                rows.time_ok | (kind == KIND[code_map.GENDER])),
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
        for reason, k in coh.previous_discharge_counts.items():
            add(f"{PREVIOUS_DISCHARGE_COUNTER}/{reason}", k)
        cols = ("SUBJECT_ID", "HADM_ID", "ADMITTIME", "trigger_time", "label", "age_years", "gender",
                "admission_type", "ethnicity", "insurance", "previous_discharge_seconds")
        metas = []
        for row in coh.table.select(list(cols)).to_pylist():
            row["split"] = self._split(row["SUBJECT_ID"])
            metas.append((row["HADM_ID"], row))
        return coh.table.select(["SUBJECT_ID", "HADM_ID", "trigger_time"]), metas

    def _split(self, subject_id: int) -> str | None:
        return None if self.splits is None else self.splits.get(int(subject_id))

    def _labelled(self, task: TaskRows, rows: Rows, add) -> tuple[pa.Table, list, list]:
        """One example per label row of the block's subjects: its admission (if any), age, gender; and each
        example's (key, subject, prediction time in microseconds).

        A label row's prediction time is microseconds; its trigger time (and the admission it falls in) is the
        whole second it lies in, as data times are read.
        """
        subjects = np.unique(rows.subject).tolist()
        adm = task.admission_table()
        metas, seen_keys, times = [], set(), []
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
            for t_us, value in wanted:
                t = t_us // 1_000_000
                row = _admission_at(mine, t)
                placed.append((t_us, t, value, row))
                if row is not None:
                    per_admission[row] = per_admission.get(row, 0) + 1
            for t_us, t, value, row in placed:
                if (sid, t_us) in seen_keys:
                    add(f"labels/{LABEL_DUPLICATE}", 1)
                    continue
                seen_keys.add((sid, t_us))
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
                key = hadm if row is not None and hadm >= 0 and per_admission[row] == 1 else synthetic_key(sid, t_us)
                admission_type = task.admission_type_of(sid, int(mine[row, 1])) if row is not None else "UNKNOWN"
                attributes = task.attributes_of(sid, int(mine[row, 1])) if row is not None else \
                    dict.fromkeys(("ethnicity", "insurance"), spec.NOT_RECORDED)
                # The same rule as the built-in task's cohort, over the subject's admissions.
                previous = previous_stay.previous_discharges([sid], [admit], mine[:, 0], mine[:, 1], mine[:, 2],
                                                             mine[:, 2] >= 0)
                for reason, k in previous.counts().items():
                    add(f"{PREVIOUS_DISCHARGE_COUNTER}/{reason}", k)
                metas.append((key, {"SUBJECT_ID": int(sid), "HADM_ID": key, "ADMITTIME": admit, "trigger_time": t,
                                    "label": value, "age_years": float(ages.cap_age(raw_age)), "gender": gender,
                                    "admission_type": admission_type, **attributes, "split": self._split(sid),
                                    "previous_discharge_seconds": int(previous.seconds_before(
                                        [t], spec.NO_PREVIOUS_DISCHARGE)[0])}))
                times.append((key, int(sid), t_us))
                add(f"labels/{LABEL_EXAMPLE}", 1)
        index = pa.table({"SUBJECT_ID": pa.array([m["SUBJECT_ID"] for _, m in metas], pa.int64()),
                          "HADM_ID": pa.array([k for k, _ in metas], pa.int64()),
                          "trigger_time": pa.array([m["trigger_time"] for _, m in metas], pa.int64())})
        return index, metas, times


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
