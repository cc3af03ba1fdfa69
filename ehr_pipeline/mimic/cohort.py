"""The cohort: which admissions become examples, their trigger time, label and context.

Pure functions over ADMISSIONS and PATIENTS (pyarrow Tables, RecordBatches or iterables
of RecordBatches, typed as ``reader.TableReader`` yields them: times are int64 seconds).
Every ADMISSIONS row is either kept or counted under exactly one exclusion reason, in
the order of ``REASONS`` (the first reason that applies wins). See docs/task.md.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import ages, previous_stay

logger = logging.getLogger(__name__)

DEFAULT_TRIGGER_OFFSET_SECONDS = 86400
DEFAULT_MIN_AGE_YEARS = 18.0

# The columns build_cohort reads (the job asks the reader for just these).
ADMISSION_COLUMNS = ("SUBJECT_ID", "HADM_ID", "ADMITTIME", "DISCHTIME", "DEATHTIME",
                     "ADMISSION_TYPE", "HOSPITAL_EXPIRE_FLAG", "ETHNICITY", "INSURANCE")
# Columns that only describe who was admitted (subgroup reports): a table without them (an
# ADMISSIONS rebuilt from FHIR, a unit test's rows) gives spec.NOT_RECORDED for every row.
RECORDED_AS_WRITTEN = {"ETHNICITY": "ethnicity", "INSURANCE": "insurance"}
PATIENT_COLUMNS = ("SUBJECT_ID", "GENDER", "DOB")

KEPT = "kept"
# Exclusion reasons in order of precedence: data that cannot be placed first, then the
# population (adults), then admissions for which the prediction task is undefined.
MISSING_REQUIRED = "missing_required"  # null SUBJECT_ID / HADM_ID / ADMITTIME / DISCHTIME
DUPLICATE_HADM_ID = "duplicate_hadm_id"  # all rows of an HADM_ID seen more than once
NO_PATIENT_RECORD = "no_patient_record"  # SUBJECT_ID absent from PATIENTS (or DOB null)
DUPLICATE_PATIENT_RECORD = "duplicate_patient_record"  # SUBJECT_ID twice in PATIENTS
ADMITTED_BEFORE_BIRTH = "admitted_before_birth"  # ADMITTIME < DOB: broken dates
UNDER_AGE = "under_age"  # age at ADMITTIME < min_age_years
DIED_BEFORE_TRIGGER = "died_before_trigger"  # death time <= trigger time
DISCHARGED_BEFORE_TRIGGER = "discharged_before_trigger"  # alive, DISCHTIME <= trigger time
REASONS = (
    MISSING_REQUIRED,
    DUPLICATE_HADM_ID,
    NO_PATIENT_RECORD,
    DUPLICATE_PATIENT_RECORD,
    ADMITTED_BEFORE_BIRTH,
    UNDER_AGE,
    DIED_BEFORE_TRIGGER,
    DISCHARGED_BEFORE_TRIGGER,
)

COHORT_SCHEMA = pa.schema([
    pa.field("SUBJECT_ID", pa.int64(), nullable=False),
    pa.field("HADM_ID", pa.int64(), nullable=False),
    pa.field("ADMITTIME", pa.int64(), nullable=False),  # seconds since 1970
    pa.field("DISCHTIME", pa.int64(), nullable=False),  # seconds, as recorded
    pa.field("trigger_time", pa.int64(), nullable=False),  # seconds; events must be < it
    pa.field("label", pa.int64(), nullable=False),  # 1 = in-hospital death after trigger
    pa.field("age_years", pa.float64(), nullable=False),  # at ADMITTIME, capped at 90
    pa.field("gender", pa.string(), nullable=False),
    pa.field("admission_type", pa.string(), nullable=False),
    pa.field("ethnicity", pa.string(), nullable=False),  # as written; null -> spec.NOT_RECORDED
    pa.field("insurance", pa.string(), nullable=False),
    # Admissions of the same subject whose (effective) discharge is strictly before this
    # trigger: their diagnoses and procedures are known at prediction time.
    pa.field("prior_hadm_ids", pa.list_(pa.int64()), nullable=False),
    pa.field("prior_dischtimes", pa.list_(pa.int64()), nullable=False),
    # trigger_time minus the previous admission's discharge, s (ehr_pipeline.encode.previous_stay),
    # spec.NO_PREVIOUS_DISCHARGE when there is none: the record's spec.PREVIOUS_DISCHARGE.
    pa.field("previous_discharge_seconds", pa.int64(), nullable=False),
])

DISCHARGES_SCHEMA = pa.schema([
    pa.field("SUBJECT_ID", pa.int64(), nullable=False),
    pa.field("HADM_ID", pa.int64(), nullable=False),
    pa.field("DISCHTIME", pa.int64(), nullable=False),  # effective: max(DISCHTIME, DEATHTIME)
])


@dataclasses.dataclass(frozen=True)
class Cohort:
    """The cohort table, the count of every ADMISSIONS row by outcome, and the discharge map."""

    table: pa.Table  # COHORT_SCHEMA, one row per kept admission, sorted by SUBJECT_ID, ADMITTIME
    counts: dict[str, int]  # "kept" + every reason in REASONS; sums to the ADMISSIONS rows
    # Every admission that can be placed in time (cohort or not): the HADM_ID -> DISCHTIME
    # map that puts diagnoses and procedures at the moment they became known.
    discharges: pa.Table  # DISCHARGES_SCHEMA, sorted by HADM_ID
    # previous_stay.COUNTS -> kept admissions: with / without a previous discharge, and those
    # that had an earlier stay without a usable discharge (skipped, previous_stay's docstring).
    previous_discharge_counts: dict[str, int] = dataclasses.field(default_factory=dict)


def as_table(data: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch]) -> pa.Table:
    """A pyarrow Table from a Table, one RecordBatch or an iterable of RecordBatches."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    batches = list(data)
    if not batches:
        raise ValueError("no record batches given: cannot tell the columns")
    return pa.Table.from_batches(batches)


def _int_column(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(int64 values with nulls as 0, validity mask) of an integer/seconds column."""
    col = pc.cast(table.column(name), pa.int64())
    valid = pc.is_valid(col).to_numpy(zero_copy_only=False)
    return pc.fill_null(col, 0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _duplicated(values: np.ndarray) -> np.ndarray:
    """True for every element whose value occurs more than once."""
    _, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    return counts[inverse] > 1


def _patient_lookup(patients: pa.Table, subject: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each admission subject: (its row in PATIENTS or -1, whether PATIENTS has it twice)."""
    p_subject, p_subject_ok = _int_column(patients, "SUBJECT_ID")
    _, p_dob_ok = _int_column(patients, "DOB")
    # A patient row without DOB cannot give an age: as good as no record.
    rows = np.flatnonzero(p_subject_ok & p_dob_ok)
    keys = p_subject[rows]
    order = np.argsort(keys, kind="stable")
    keys_sorted, rows_sorted = keys[order], rows[order]
    pos = np.searchsorted(keys_sorted, subject)
    found = pos < keys_sorted.size
    found[found] = keys_sorted[pos[found]] == subject[found]
    row = np.full(subject.shape, -1, dtype=np.int64)
    row[found] = rows_sorted[pos[found]]
    return row, np.isin(subject, keys[_duplicated(keys)])


def _recorded_text(adm: pa.Table, column: str, keep: np.ndarray) -> pa.Array:
    """A descriptive text column of the kept rows as written (whitespace trimmed), spec.NOT_RECORDED where null or absent."""
    if column not in adm.column_names:
        return pa.array([spec.NOT_RECORDED] * keep.size, pa.string())
    text = pc.utf8_trim_whitespace(pc.cast(adm.column(column), pa.string()))
    # An empty string says as little as a null; the spec needs a non-empty value.
    text = pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)
    return pc.fill_null(text, spec.NOT_RECORDED).take(pa.array(keep, pa.int64())).combine_chunks()


def _prior_lists(
    subject: np.ndarray,
    hadm: np.ndarray,
    trigger: np.ndarray,
    d_subject: np.ndarray,
    d_hadm: np.ndarray,
    d_time: np.ndarray,
) -> tuple[pa.Array, pa.Array]:
    """Per kept admission, the other admissions of its subject discharged before its trigger (oldest first)."""
    order = np.lexsort((d_hadm, d_time, d_subject))
    d_subject, d_hadm, d_time = d_subject[order], d_hadm[order], d_time[order]
    lo = np.searchsorted(d_subject, subject, "left")
    hi = np.searchsorted(d_subject, subject, "right")
    n = hi - lo
    # Expand every kept admission against all admissions of its subject (a handful each).
    owner = np.repeat(np.arange(subject.size), n)
    starts = np.cumsum(n) - n
    cand = np.repeat(lo, n) + (np.arange(n.sum()) - np.repeat(starts, n))
    take = (d_time[cand] < trigger[owner]) & (d_hadm[cand] != hadm[owner])
    owner, cand = owner[take], cand[take]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=subject.size))]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(d_hadm[cand], pa.int64()))
    times = pa.ListArray.from_arrays(pa.array(offsets), pa.array(d_time[cand], pa.int64()))
    return ids, times


def _first_reasons(conditions: list[np.ndarray]) -> tuple[np.ndarray, dict[str, int]]:
    """Per admission 0 (kept) or 1 + the index of the first condition that holds; and the count of each outcome."""
    reason = np.select(conditions, np.arange(1, len(REASONS) + 1), default=0)
    counts = {KEPT: int(np.count_nonzero(reason == 0))}
    for i, name in enumerate(REASONS, start=1):
        counts[name] = int(np.count_nonzero(reason == i))
    return reason, counts


def _discharge_map(subject: np.ndarray, hadm: np.ndarray, discharged: np.ndarray
                   ) -> tuple[pa.Table, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The discharges (DISCHARGES_SCHEMA, sorted by HADM_ID) and their subject, HADM_ID, time (s) arrays."""
    d_order = np.argsort(hadm, kind="stable")
    d_subject = subject[d_order]
    d_hadm = hadm[d_order]
    d_time = discharged[d_order]
    discharges = pa.table(
        [pa.array(d_subject, pa.int64()), pa.array(d_hadm, pa.int64()), pa.array(d_time, pa.int64())],
        schema=DISCHARGES_SCHEMA,
    )
    return discharges, (d_subject, d_hadm, d_time)


def _cohort_table(adm: pa.Table, pat: pa.Table, keep: np.ndarray, p_row: np.ndarray,
                  numbers: dict[str, np.ndarray], discharged: tuple[np.ndarray, np.ndarray, np.ndarray],
                  previous: np.ndarray) -> pa.Table:
    """COHORT_SCHEMA rows of the admissions `keep` (in its order): `numbers` by column, then text and prior stays."""
    prior_ids, prior_times = _prior_lists(numbers["SUBJECT_ID"], numbers["HADM_ID"], numbers["trigger_time"],
                                          *discharged)
    # The spec allows M / F / U; anything else (or null) says "unknown", not a new category.
    p_gender = pc.utf8_upper(pc.utf8_trim_whitespace(pc.cast(pat.column("GENDER"), pa.string())))
    p_gender = pc.if_else(pc.is_in(p_gender, pa.array(["M", "F"])), p_gender, "U")
    gender = pc.fill_null(p_gender, "U").take(pa.array(p_row[keep], pa.int64()))
    adm_type = pc.fill_null(pc.cast(adm.column("ADMISSION_TYPE"), pa.string()), "UNKNOWN").take(
        pa.array(keep, pa.int64())
    )
    return pa.table(
        [
            pa.array(numbers["SUBJECT_ID"], pa.int64()),
            pa.array(numbers["HADM_ID"], pa.int64()),
            pa.array(numbers["ADMITTIME"], pa.int64()),
            pa.array(numbers["DISCHTIME"], pa.int64()),
            pa.array(numbers["trigger_time"], pa.int64()),
            pa.array(numbers["label"], pa.int64()),
            pa.array(numbers["age_years"], pa.float64()),
            gender,
            adm_type,
            *(_recorded_text(adm, column, keep) for column in RECORDED_AS_WRITTEN),
            prior_ids,
            prior_times,
            pa.array(previous, pa.int64()),
        ],
        schema=COHORT_SCHEMA,
    )


def build_cohort(
    admissions: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
    patients: pa.Table | pa.RecordBatch | Iterable[pa.RecordBatch],
    *,
    trigger_offset_seconds: int = DEFAULT_TRIGGER_OFFSET_SECONDS,
    min_age_years: float = DEFAULT_MIN_AGE_YEARS,
) -> Cohort:
    """Cohort of adult admissions alive and in hospital at ADMITTIME + trigger_offset_seconds (s); age cut-off in years."""
    adm = as_table(admissions)
    pat = as_table(patients)
    n = adm.num_rows

    subject, subject_ok = _int_column(adm, "SUBJECT_ID")
    hadm, hadm_ok = _int_column(adm, "HADM_ID")
    admit, admit_ok = _int_column(adm, "ADMITTIME")
    disch, disch_ok = _int_column(adm, "DISCHTIME")
    death, death_ok = _int_column(adm, "DEATHTIME")
    expire, expire_ok = _int_column(adm, "HOSPITAL_EXPIRE_FLAG")

    missing_required = ~(subject_ok & hadm_ok & admit_ok & disch_ok)
    # Rows of an HADM_ID seen twice are all dropped: we cannot tell which copy is right,
    # and the HADM_ID -> DISCHTIME map would be ambiguous for its diagnoses.
    duplicate_hadm = np.zeros(n, bool)
    ok_rows = np.flatnonzero(hadm_ok)
    duplicate_hadm[ok_rows] = _duplicated(hadm[ok_rows])

    p_row, p_duplicated = _patient_lookup(pat, subject)
    no_patient = p_row < 0
    dob, _ = _int_column(pat, "DOB")
    dob_adm = np.where(no_patient, 0, dob[np.maximum(p_row, 0)]) if pat.num_rows else np.zeros(n, np.int64)
    raw_age = ages.age_years(dob_adm, admit)

    trigger = admit + np.int64(trigger_offset_seconds)
    # In-hospital death: either signal counts. With no DEATHTIME the patient died at
    # discharge (that is what HOSPITAL_EXPIRE_FLAG = 1 records). DEATHTIME may be after
    # DISCHTIME (129273 in the demo): the death still counts, at DEATHTIME.
    died = death_ok | (expire_ok & (expire == 1))
    death_time = np.where(death_ok, death, disch)
    died_before = died & (death_time <= trigger)
    # A patient who dies after the trigger is in hospital until death whatever DISCHTIME says.
    discharged_before = ~died & (disch <= trigger)

    conditions = [
        missing_required,
        duplicate_hadm,
        no_patient,
        p_duplicated,
        raw_age < 0,
        raw_age < min_age_years,
        died_before,
        discharged_before,
    ]
    reason, counts = _first_reasons(conditions)

    # Discharge map: every admission placeable in time, kept or not (an earlier admission
    # excluded from the cohort still contributes its diagnoses to later ones). The
    # effective discharge is at death when DEATHTIME is later, so an admission's own
    # codes can never appear before its own trigger.
    placeable = ~(missing_required | duplicate_hadm)
    eff_disch = np.where(death_ok, np.maximum(disch, death), disch)
    discharges, discharged = _discharge_map(subject[placeable], hadm[placeable], eff_disch[placeable])

    keep = np.flatnonzero(reason == 0)
    keep = keep[np.lexsort((hadm[keep], admit[keep], subject[keep]))]
    numbers = {"SUBJECT_ID": subject[keep], "HADM_ID": hadm[keep], "ADMITTIME": admit[keep],
               "DISCHTIME": disch[keep], "trigger_time": trigger[keep], "label": died[keep].astype(np.int64),
               "age_years": ages.cap_age(raw_age[keep])}
    # Previous stays: every row that names its subject and admission time (an HADM_ID seen twice
    # is not placeable), with its effective discharge where DISCHTIME is recorded.
    stays = subject_ok & admit_ok & ~duplicate_hadm
    previous = previous_stay.previous_discharges(numbers["SUBJECT_ID"], numbers["ADMITTIME"], subject[stays],
                                                 admit[stays], eff_disch[stays], disch_ok[stays])
    table = _cohort_table(adm, pat, keep, p_row, numbers, discharged,
                          previous.seconds_before(numbers["trigger_time"], spec.NO_PREVIOUS_DISCHARGE))
    # DEBUG: the job's closing summary reports the cohort (manifest.summary_lines).
    logger.debug("cohort: %d of %d admissions kept; %s", counts[KEPT], n,
                {k: v for k, v in counts.items() if k != KEPT and v})
    return Cohort(table=table, counts=counts, discharges=discharges, previous_discharge_counts=previous.counts())
