"""A block of MEDS rows as the MEDS source reads it: every code read once through the code map.

``Rows.of`` turns a table of MEDS rows into per-row numpy arrays (the kind of each code, its
event code and unit, times in seconds, the admission id and attributes); ``task_rows`` picks
out the task's codes (admissions, discharges, deaths, births, genders), from which
``TaskRows.admissions_and_patients`` rebuilds MIMIC-III-shaped ADMISSIONS and PATIENTS tables
for ``cohort.build_cohort``. ``ehr_pipeline.meds_source`` streams the files and makes the examples.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline import meds_codes, spec
from ehr_pipeline.meds_schema import MedsError

# Synthetic example keys (no admission id) live above every real HADM_ID: [2^62, 2^63).
_SYNTHETIC_KEY_BASE = 1 << 62


# Units per second of Arrow's timestamp units.
_PER_SECOND = {"s": 1, "ms": 1_000, "us": 1_000_000, "ns": 1_000_000_000}


def _raw_times(column: pa.ChunkedArray | pa.Array, where: str) -> tuple[np.ndarray, np.ndarray, int]:
    """(int64 values in the column's unit, 0 where null; valid mask; units per second) of a timestamp column."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_null(column.type):  # an all-null column (pandas writes one when no row has a time)
        return np.zeros(len(column), np.int64), np.zeros(len(column), bool), 1
    if not pa.types.is_timestamp(column.type):
        raise MedsError(f"{where} is {column.type}, expected a timestamp")
    # A timestamp is int64 in its unit from 1970 UTC whatever its time zone: reinterpret, never convert.
    raw = pc.cast(column, pa.int64())
    valid = np.asarray(pc.is_valid(raw).to_numpy(zero_copy_only=False), dtype=bool)
    values = np.asarray(pc.fill_null(raw, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    return values, valid, _PER_SECOND[column.type.unit]


def seconds(column: pa.ChunkedArray | pa.Array, where: str = "time column") -> pa.Array:
    """Whole seconds since 1970 (floor) of a timestamp column of any unit or time zone; nulls stay null."""
    values, valid, per_second = _raw_times(column, where)
    return pa.array(np.floor_divide(values, per_second), pa.int64(), mask=~valid)


def micros(column: pa.ChunkedArray | pa.Array, where: str = "time column") -> pa.Array:
    """Microseconds since 1970 (MEDS' unit) of a timestamp column; MedsError for a time finer than that."""
    values, valid, per_second = _raw_times(column, where)
    if per_second > 1_000_000:
        factor = per_second // 1_000_000
        finer = valid & (values % factor != 0)
        if finer.any():
            row = int(np.flatnonzero(finer)[0])
            raise MedsError(f"{where}: row {row + 1} is finer than a microsecond (MEDS times are microseconds)")
        out = values // factor
    else:
        factor = 1_000_000 // per_second
        if valid.any() and np.abs(values[valid]).max() > np.iinfo(np.int64).max // factor:
            raise MedsError(f"{where}: a time beyond the year 294,000 (out of range in microseconds)")
        out = values * factor
    return pa.array(out, pa.int64(), mask=~valid)


def synthetic_key(subject_id: int, time: int) -> int:
    """A stable example key in [2^62, 2^63) from a subject and a time: an admission's (s) without an admission id,
    or a label row's (its prediction time in microseconds, so rows a fraction of a second apart differ)."""
    digest = hashlib.sha256(f"{int(subject_id)}:{int(time)}".encode()).digest()
    return _SYNTHETIC_KEY_BASE + (int.from_bytes(digest[:8], "big") % _SYNTHETIC_KEY_BASE)


# A code's kind as a small int, so that a block's kinds are one int8 array.
KIND = {k: i for i, k in enumerate((meds_codes.EVENT, meds_codes.ADMISSION, meds_codes.DISCHARGE, meds_codes.DEATH,
                                    meds_codes.BIRTH, meds_codes.GENDER, meds_codes.UNMAPPED))}


@dataclasses.dataclass
class Rows:
    """A block's rows as numpy arrays, each code read once through the code map."""

    subject: np.ndarray
    time: np.ndarray  # int64 s (0 where null)
    time_ok: np.ndarray
    code_null: np.ndarray
    kind: np.ndarray  # KIND index
    source: np.ndarray  # int8: index into spec.SOURCES, -1 unless an event
    event_code: pa.Array  # 'source:code', '' unless an event
    detail: np.ndarray  # object: admission type, 'died', gender
    next_discharge: np.ndarray
    value: np.ndarray  # float64, NaN = none
    unit: pa.Array  # string, null = none
    hadm: np.ndarray
    hadm_ok: np.ndarray
    attributes: dict[str, np.ndarray]  # 'ethnicity' / 'insurance' -> object [n] as written (None = not recorded)

    @classmethod
    def of(cls, table: pa.Table, mapper: meds_codes.CodeMapper, unit_column: str) -> Rows:
        """The rows of a table of MEDS columns; units from `unit_column` where the code map says so."""
        n = table.num_rows
        code = table.column("code").combine_chunks() if n else pa.array([], pa.string())
        code = pc.cast(code, pa.string())
        encoded = pc.dictionary_encode(code)
        words = encoded.dictionary.to_pylist()
        # Each distinct code is read once; per-row columns are gathered from the per-code answers in C.
        mapped = [mapper(w) for w in words] + [meds_codes.MappedCode(meds_codes.UNMAPPED)]
        idx = np.asarray(pc.fill_null(encoded.indices, len(words)).to_numpy(zero_copy_only=False), dtype=np.int64)
        take = pa.array(idx, pa.int64())
        kinds = np.asarray([KIND[m.kind] for m in mapped], dtype=np.int8)[idx]
        source_id = np.asarray([spec.SOURCES.index(m.code.split(":", 1)[0]) if m.code else -1 for m in mapped],
                               dtype=np.int8)[idx]
        event_code = pa.array([m.code or "" for m in mapped], pa.string()).take(take)
        unit = pa.array([m.unit for m in mapped], pa.string()).take(take)
        from_column = np.asarray([m.unit_from_column for m in mapped], dtype=bool)[idx]
        if from_column.any() and unit_column in table.column_names:
            written = pc.utf8_trim_whitespace(pc.cast(table.column(unit_column), pa.string()))
            if isinstance(written, pa.ChunkedArray):
                written = written.combine_chunks()
            none = pc.or_(pc.equal(written, ""), pc.is_in(written, pa.array(list(mapper.config.unknown_parts),
                                                                               pa.string())))
            written = pc.if_else(pc.fill_null(none, True), pa.scalar(None, pa.string()), written)
            unit = pc.if_else(pa.array(from_column), written, unit)
        elif from_column.any():
            unit = pc.if_else(pa.array(from_column), pa.scalar(None, pa.string()), unit)
        t = seconds(table.column("time"))
        time_ok = np.asarray(pc.is_valid(t).to_numpy(zero_copy_only=False), dtype=bool)
        if "numeric_value" in table.column_names:  # optional in MEDS: without it no row has a value
            value = np.asarray(pc.fill_null(pc.cast(table.column("numeric_value"), pa.float64()), np.nan)
                               .to_numpy(zero_copy_only=False), dtype=np.float64)
        else:
            value = np.full(n, np.nan)
        if "hadm_id" in table.column_names:
            hadm_col = pc.cast(table.column("hadm_id"), pa.int64())
            hadm_ok = np.asarray(pc.is_valid(hadm_col).to_numpy(zero_copy_only=False), dtype=bool)
            hadm = np.asarray(pc.fill_null(hadm_col, 0).to_numpy(zero_copy_only=False), dtype=np.int64)
        else:
            hadm, hadm_ok = np.zeros(n, np.int64), np.zeros(n, bool)
        return cls(
            subject=np.asarray(pc.cast(table.column("subject_id"), pa.int64()).to_numpy(), dtype=np.int64),
            time=np.asarray(pc.fill_null(t, 0).to_numpy(zero_copy_only=False), dtype=np.int64), time_ok=time_ok,
            code_null=np.asarray(pc.is_null(code).to_numpy(zero_copy_only=False), dtype=bool), kind=kinds,
            source=source_id, event_code=event_code,
            detail=np.asarray([m.detail for m in mapped], dtype=object)[idx],
            next_discharge=np.asarray([m.next_discharge for m in mapped], dtype=bool)[idx],
            value=value, unit=unit, hadm=hadm, hadm_ok=hadm_ok,
            attributes=_attributes(table, mapper.config.admission_attributes))


def _attributes(table: pa.Table, columns: dict[str, tuple[str, ...]]) -> dict[str, np.ndarray]:
    """Per attribute, the first of its columns the table has, as written (trimmed; None where null or blank)."""
    out = {}
    for name, candidates in columns.items():
        column = next((c for c in candidates if c in table.column_names), None)
        if column is None:
            out[name] = np.full(table.num_rows, None, dtype=object)
            continue
        text = [None if v is None else (str(v).strip() or None) for v in table.column(column).to_pylist()]
        out[name] = np.asarray(text, dtype=object)
    return out


@dataclasses.dataclass
class TaskRows:
    """The task's codes of a block: admissions, discharges, deaths, births and genders."""

    adm_subject: np.ndarray
    adm_time: np.ndarray
    adm_type: np.ndarray
    adm_hadm: np.ndarray  # -1 = no admission id
    adm_attributes: dict[str, np.ndarray]  # 'ethnicity' / 'insurance' of each admission (None = not recorded)
    disch_subject: np.ndarray
    disch_time: np.ndarray
    disch_died: np.ndarray
    death_subject: np.ndarray
    death_time: np.ndarray
    birth: dict[int, int]
    gender: dict[int, str]
    _discharge_of: np.ndarray | None = None

    def discharge_of(self) -> np.ndarray:
        """Per admission, the index of its discharge (the subject's first at or after it), or -1."""
        if self._discharge_of is None:
            out = np.full(self.adm_subject.size, -1, dtype=np.int64)
            order = np.lexsort((self.disch_time, self.disch_subject))
            ds, dt = self.disch_subject[order], self.disch_time[order]
            lo = np.searchsorted(ds, self.adm_subject, "left")
            hi = np.searchsorted(ds, self.adm_subject, "right")
            for i in np.flatnonzero(hi > lo):
                j = lo[i] + np.searchsorted(dt[lo[i]:hi[i]], self.adm_time[i], "left")
                if j < hi[i]:
                    out[i] = order[j]
            self._discharge_of = out
        return self._discharge_of

    def admission_table(self) -> np.ndarray:
        """[n, 4] int64: subject, admit s, discharge s (-1 = none), admission id (-1 = none)."""
        d = self.discharge_of()
        disch = np.where(d >= 0, self.disch_time[np.maximum(d, 0)], -1) if d.size else np.zeros(0, np.int64)
        return np.stack([self.adm_subject, self.adm_time, disch, self.adm_hadm], axis=1) if d.size \
            else np.zeros((0, 4), np.int64)

    def admission_type_of(self, subject: int, admit: int) -> str:
        """The type of the subject's admission at `admit`."""
        at = np.flatnonzero((self.adm_subject == subject) & (self.adm_time == admit))
        return str(self.adm_type[at[0]]) if at.size else "UNKNOWN"

    def attributes_of(self, subject: int, admit: int) -> dict[str, str]:
        """Ethnicity and insurance of the subject's admission at `admit` (spec.NOT_RECORDED when absent)."""
        at = np.flatnonzero((self.adm_subject == subject) & (self.adm_time == admit))
        return {name: (values[at[0]] if at.size and values[at[0]] is not None else spec.NOT_RECORDED)
                for name, values in self.adm_attributes.items()}

    def admissions_and_patients(self) -> tuple[pa.Table, pa.Table]:
        """MIMIC-III-shaped ADMISSIONS and PATIENTS (cohort.ADMISSION_COLUMNS / PATIENT_COLUMNS), times in s."""
        d = self.discharge_of()
        has = d >= 0
        disch = np.where(has, self.disch_time[np.maximum(d, 0)], 0)
        died = np.where(has, self.disch_died[np.maximum(d, 0)], False)
        # A death code within the stay gives the death time; a 'died' discharge without one dies at discharge.
        death = np.full(d.size, -1, dtype=np.int64)
        for i in np.flatnonzero(has):
            mine = self.death_time[(self.death_subject == self.adm_subject[i]) & (self.death_time >= self.adm_time[i])
                                   & (self.death_time <= disch[i])]
            if mine.size:
                death[i] = mine.min()
        hadm = np.where(self.adm_hadm >= 0, self.adm_hadm,
                        [synthetic_key(s, t) for s, t in zip(self.adm_subject.tolist(), self.adm_time.tolist())]
                        if d.size else np.zeros(0, np.int64)).astype(np.int64)
        adm = pa.table({
            "SUBJECT_ID": pa.array(self.adm_subject, pa.int64()), "HADM_ID": pa.array(hadm, pa.int64()),
            "ADMITTIME": pa.array(self.adm_time, pa.int64()),
            "DISCHTIME": pa.array(disch, pa.int64(), mask=~has),
            "DEATHTIME": pa.array(death, pa.int64(), mask=death < 0),
            "ADMISSION_TYPE": pa.array(self.adm_type.astype(object), pa.string()),
            "HOSPITAL_EXPIRE_FLAG": pa.array(died.astype(np.int64), pa.int64()),
            **{name.upper(): pa.array(values, pa.string()) for name, values in self.adm_attributes.items()},
        })
        subjects = sorted(set(self.adm_subject.tolist()))
        pat = pa.table({
            "SUBJECT_ID": pa.array(subjects, pa.int64()),
            "GENDER": pa.array([self.gender.get(s, "U") for s in subjects], pa.string()),
            "DOB": pa.array([self.birth.get(s) for s in subjects], pa.int64()),
        })
        return adm, pat


def task_rows(rows: Rows) -> TaskRows:
    """The task's codes of a block's rows (births: the earliest; genders: the first; neither needs a time)."""
    def of(kind: str, timed: bool = True) -> np.ndarray:
        return np.flatnonzero((rows.kind == KIND[kind]) & (rows.time_ok if timed else True))

    adm, dis, dth, bir, gen = (of(meds_codes.ADMISSION), of(meds_codes.DISCHARGE), of(meds_codes.DEATH),
                               of(meds_codes.BIRTH), of(meds_codes.GENDER, timed=False))
    birth: dict[int, int] = {}
    for i in bir[np.argsort(rows.time[bir], kind="stable")]:  # the earliest birth code counts
        birth.setdefault(int(rows.subject[i]), int(rows.time[i]))
    gender: dict[int, str] = {}
    for i in gen:
        gender.setdefault(int(rows.subject[i]), str(rows.detail[i]))
    return TaskRows(
        adm_subject=rows.subject[adm], adm_time=rows.time[adm], adm_type=rows.detail[adm].astype(str),
        adm_hadm=np.where(rows.hadm_ok[adm], rows.hadm[adm], -1),
        adm_attributes={name: values[adm] for name, values in rows.attributes.items()},
        disch_subject=rows.subject[dis], disch_time=rows.time[dis],
        disch_died=np.asarray([d == "died" for d in rows.detail[dis]], dtype=bool),
        death_subject=rows.subject[dth], death_time=rows.time[dth], birth=birth, gender=gender)
