"""Event extraction: one pure function per MIMIC-III source, then the cut to the cohort.

Every extractor takes one typed block (pyarrow RecordBatch or Table, as
``reader.TableReader`` yields it: UPPERCASE columns, times int64 seconds) and returns
``(events, counts)``:

* ``events``: a Table of ``EVENT_SCHEMA``: SUBJECT_ID, HADM_ID (null for outpatient
  labs), ``time`` = int64 seconds when the information became KNOWN (not when it
  happened), ``code`` = "source:code", ``value`` = float64, NaN when there is none, ``unit`` =
  the value's unit as written (null when the table has no unit column or the field is empty);
  ``units.Harmoniser`` moves values to their code's canonical unit once the job knows it.
* ``counts``: every input row exactly once: ``kept`` or the reason it was dropped.
  Reasons are checked in order; source-specific error flags come first, then
  ``missing_code``, then ``missing_time``.

``filter_to_cohort`` then keeps, per cohort admission, the same patient's events strictly
before its trigger time.

Where the row came from travels with its event when the block carries it (``ORIGIN_COLUMNS``: the
table's ROW_ID and the physical ``LINE`` the reader found the row on, ``reader.TableReader.with_lines``):
the job drops a repeated ROW_ID where an admission's events meet (``job.dedup``), and names the
repeat by its file and line. Blocks without them give the plain schemas. See docs/task.md for the rules and why. The known-time rule of each
source lives in ``bagging.known_time`` (shared with the service and the FHIR mapping); each
extractor picks the time its table records and stamps its events with that rule.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ehr_pipeline.contract import spec
from ehr_pipeline.encode import bagging, magnitudes

logger = logging.getLogger(__name__)

KEPT = "kept"
MISSING_TIME = "missing_time"
MISSING_CODE = "missing_code"
BAD_CODE = "bad_code"  # a code holding a control character (spec.CODE_CONTROL_CHARACTERS)
CHART_ERROR = "chart_error"  # CHARTEVENTS.ERROR = 1
OUTPUT_ERROR = "output_error"  # OUTPUTEVENTS.ISERROR = 1
INPUT_REWRITTEN = "input_rewritten"  # INPUTEVENTS_MV.STATUSDESCRIPTION = 'Rewritten'
UNKNOWN_ADMISSION = "unknown_admission"  # diagnosis/procedure of an HADM_ID not in the discharge map

USED = "used"
NOT_IN_COHORT = "not_in_cohort"
AT_OR_AFTER_TRIGGER = "at_or_after_trigger"
# A row whose ROW_ID an earlier row of its table has (found where the rows meet: job.dedup); counted
# with the cohort filter's reasons in the job, with the extraction's in to-meds.
DUPLICATE_ROW_ID = "duplicate_row_id"

EVENT_SCHEMA = pa.schema([
    pa.field("SUBJECT_ID", pa.int64(), nullable=False),
    pa.field("HADM_ID", pa.int64()),
    pa.field("time", pa.int64(), nullable=False),
    pa.field("code", pa.string(), nullable=False),
    pa.field("value", pa.float64(), nullable=False),
    pa.field("unit", pa.string()),
])

# Output of filter_to_cohort: one row per (cohort admission, event) pair.
COHORT_EVENT_SCHEMA = pa.schema([
    pa.field("HADM_ID", pa.int64(), nullable=False),  # the cohort admission it feeds
    pa.field("SUBJECT_ID", pa.int64(), nullable=False),
    pa.field("EVENT_HADM_ID", pa.int64()),  # the admission the event was recorded in, if any
    pa.field("time", pa.int64(), nullable=False),
    pa.field("code", pa.string(), nullable=False),
    pa.field("value", pa.float64(), nullable=False),
    pa.field("unit", pa.string()),
])

# A row's origin: its ROW_ID (unique within a MIMIC-III table) and the physical line it starts on.
ROW_ID, LINE = "ROW_ID", "LINE"
ORIGIN_COLUMNS = (ROW_ID, LINE)
_ORIGIN_FIELDS = [pa.field(ROW_ID, pa.int64(), nullable=False), pa.field(LINE, pa.int64(), nullable=False)]
ORIGIN_EVENT_SCHEMA = pa.schema(list(EVENT_SCHEMA) + _ORIGIN_FIELDS)
ORIGIN_COHORT_EVENT_SCHEMA = pa.schema(list(COHORT_EVENT_SCHEMA) + _ORIGIN_FIELDS)

Block = pa.RecordBatch | pa.Table


def has_origin(table: Block) -> bool:
    """Whether a block or event table carries ORIGIN_COLUMNS."""
    return all(name in table.schema.names for name in ORIGIN_COLUMNS)
Discharges = pa.Table | Mapping[int, int]


def _col(block: Block, name: str) -> pa.Array | pa.ChunkedArray:
    return block.column(name)


def _flag_set(block: Block, name: str, flag: int = 1) -> np.ndarray:
    """True where an integer flag column equals `flag`; null counts as not set."""
    hit = pc.equal(pc.cast(_col(block, name), pa.int64()), flag)
    return np.asarray(pc.fill_null(hit, False).to_numpy(zero_copy_only=False), dtype=bool)


def _namespaced(source: str, raw: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """'source:code' strings (spec.format_code, vectorised); null where the code is null or blank."""
    text = pc.utf8_trim(pc.cast(raw, pa.string()), characters=spec.CODE_WHITESPACE)
    # A blank code would make a distinct, meaningless vocabulary entry: count it as missing.
    text = pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)
    return pc.binary_join_element_wise(source, text, spec.CODE_SEPARATOR)


def _item_code(block: Block, source: str, column: str = "ITEMID") -> pa.Array | pa.ChunkedArray:
    """'source:ITEMID' strings; null where ITEMID is null."""
    return _namespaced(source, _col(block, column))


def _values(block: Block, column: str | None) -> pa.Array | pa.ChunkedArray:
    """float64 values with null as NaN (NaN = no numeric value)."""
    if column is None:
        return pa.array(np.full(block.num_rows, np.nan))
    return pc.fill_null(pc.cast(_col(block, column), pa.float64()), np.nan)


def _units(block: Block, column: str | None) -> pa.Array | pa.ChunkedArray:
    """The unit column as written, trimmed; null where the table has none or the field is blank.

    A block read without its unit column (a caller that only wants codes and times) has no units.
    """
    if column is None or column not in block.schema.names:
        return pa.nulls(block.num_rows, pa.string())
    text = pc.utf8_trim_whitespace(pc.cast(_col(block, column), pa.string()))
    return pc.if_else(pc.equal(text, ""), pa.scalar(None, pa.string()), text)


def _emit(
    block: Block,
    time: pa.Array | pa.ChunkedArray,
    code: pa.Array | pa.ChunkedArray,
    value: pa.Array | pa.ChunkedArray,
    drops: list[tuple[str, np.ndarray]],
    unit: pa.Array | pa.ChunkedArray | None = None,
) -> tuple[pa.Table, dict[str, int]]:
    """Builds the event table, dropping rows by the first reason that applies, and counts them."""
    n = block.num_rows
    subject = pc.cast(_col(block, "SUBJECT_ID"), pa.int64())
    if subject.null_count:
        # NOT NULL in every source schema: the reader dead-letters such rows, so a null here
        # is a broken contract, to fail loudly rather than be miscounted.
        raise ValueError(f"{subject.null_count} rows with null SUBJECT_ID: expected dead-lettered by the reader")
    reasons = list(drops) + [
        (MISSING_CODE, np.asarray(pc.is_null(code).to_numpy(zero_copy_only=False), dtype=bool)),
        (BAD_CODE, np.asarray(pc.fill_null(pc.match_substring_regex(code, spec.CODE_CONTROL_CHARACTERS), False)
                              .to_numpy(zero_copy_only=False), dtype=bool)),
        (MISSING_TIME, np.asarray(pc.is_null(time).to_numpy(zero_copy_only=False), dtype=bool)),
    ]
    dropped = np.zeros(n, dtype=bool)
    counts: dict[str, int] = {}
    for name, mask in reasons:
        first = mask & ~dropped
        counts[name] = counts.get(name, 0) + int(np.count_nonzero(first))
        dropped |= first
    counts = {KEPT: n - int(np.count_nonzero(dropped)), **counts}
    columns = [
        subject,
        pc.cast(_col(block, "HADM_ID"), pa.int64()),
        pc.cast(time, pa.int64()),
        code,
        value,
        unit if unit is not None else pa.nulls(n, pa.string()),
    ]
    schema = EVENT_SCHEMA
    if has_origin(block):
        columns += [pc.cast(_col(block, name), pa.int64()) for name in ORIGIN_COLUMNS]
        schema = ORIGIN_EVENT_SCHEMA
    table = pa.table(columns, names=schema.names).filter(pa.array(~dropped))
    return table.cast(schema), counts


def lab_events(block: Block) -> tuple[pa.Table, dict[str, int]]:
    """LABEVENTS -> 'lab:ITEMID' at CHARTTIME (s), value VALUENUM; outpatient rows (null HADM_ID) are kept as history."""
    return _emit(block, _known_at("lab", _col(block, "CHARTTIME")), _item_code(block, "lab"),
                 _values(block, "VALUENUM"), [], _units(block, "VALUEUOM"))


def chart_events(block: Block) -> tuple[pa.Table, dict[str, int]]:
    """CHARTEVENTS -> 'chart:ITEMID' at CHARTTIME (s), value VALUENUM; ERROR = 1 rows dropped as chart_error."""
    return _emit(
        block, _known_at("chart", _col(block, "CHARTTIME")), _item_code(block, "chart"), _values(block, "VALUENUM"),
        [(CHART_ERROR, _flag_set(block, "ERROR"))], _units(block, "VALUEUOM"),
    )


def output_events(block: Block) -> tuple[pa.Table, dict[str, int]]:
    """OUTPUTEVENTS -> 'output:ITEMID' at CHARTTIME (s), value VALUE; ISERROR = 1 rows dropped as output_error."""
    return _emit(
        block, _known_at("output", _col(block, "CHARTTIME")), _item_code(block, "output"), _values(block, "VALUE"),
        [(OUTPUT_ERROR, _flag_set(block, "ISERROR"))], _units(block, "VALUEUOM"),
    )


def input_cv_events(block: Block) -> tuple[pa.Table, dict[str, int]]:
    """INPUTEVENTS_CV -> 'input:ITEMID' at CHARTTIME (s), value AMOUNT (CareVue charts an amount when it is recorded)."""
    return _emit(block, _known_at("input", _col(block, "CHARTTIME")), _item_code(block, "input"),
                 _values(block, "AMOUNT"), [], _units(block, "AMOUNTUOM"))


def input_mv_events(block: Block) -> tuple[pa.Table, dict[str, int]]:
    """INPUTEVENTS_MV -> 'input:ITEMID' at ENDTIME (s), value AMOUNT; 'Rewritten' rows dropped as input_rewritten.

    AMOUNT is what was given between STARTTIME and ENDTIME, so it is only known when the
    infusion ends; at STARTTIME it would leak how the infusion went (e.g. stopped early
    because the patient deteriorated). 'Rewritten' rows were replaced by a corrected order.
    """
    rewritten = pc.fill_null(
        pc.equal(pc.cast(_col(block, "STATUSDESCRIPTION"), pa.string()), "Rewritten"), False
    )
    return _emit(
        block, _known_at("input", _col(block, "ENDTIME")), _item_code(block, "input"), _values(block, "AMOUNT"),
        [(INPUT_REWRITTEN, np.asarray(rewritten.to_numpy(zero_copy_only=False), dtype=bool))],
        _units(block, "AMOUNTUOM"),
    )


def _known_at(source: str, recorded: pa.Array | pa.ChunkedArray) -> pa.Array:
    """bagging.known_time over an Arrow column of int64 s whose nulls (missing times) stay null."""
    arr = pc.cast(recorded, pa.int64())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    valid = np.asarray(pc.is_valid(arr).to_numpy(zero_copy_only=False), dtype=bool)
    raw = pc.fill_null(arr, 0).to_numpy(zero_copy_only=False)
    return pa.array(bagging.known_time(source, raw), pa.int64(), mask=~valid)


def prescription_events(block: Block) -> tuple[pa.Table, dict[str, int]]:
    """PRESCRIPTIONS -> 'prescription:<FORMULARY_DRUG_CD, else DRUG>' known at the end (23:59:59) of STARTDATE's day, no value."""
    # FORMULARY_DRUG_CD is the hospital's stable drug code; DRUG (free text) fills gaps.
    blank_to_null = lambda a: pc.if_else(  # noqa: E731
        pc.equal(pc.utf8_trim(a, characters=spec.CODE_WHITESPACE), ""), pa.scalar(None, pa.string()), a)
    name = pc.coalesce(
        blank_to_null(pc.cast(_col(block, "FORMULARY_DRUG_CD"), pa.string())),
        pc.cast(_col(block, "DRUG"), pa.string()),
    )
    code = _namespaced("prescription", name)
    return _emit(block, _known_at("prescription", _col(block, "STARTDATE")), code, _values(block, None), [])


def _discharge_arrays(discharges: Discharges) -> tuple[np.ndarray, np.ndarray]:
    """(HADM_IDs sorted, their discharge times in s) from a Table or a mapping."""
    if isinstance(discharges, pa.Table):
        keys = discharges.column("HADM_ID").to_numpy().astype(np.int64)
        times = discharges.column("DISCHTIME").to_numpy().astype(np.int64)
    else:
        keys = np.fromiter(discharges.keys(), dtype=np.int64, count=len(discharges))
        times = np.fromiter(discharges.values(), dtype=np.int64, count=len(discharges))
    order = np.argsort(keys, kind="stable")
    return keys[order], times[order]


def _icd_events(block: Block, source: str, discharges: Discharges) -> tuple[pa.Table, dict[str, int]]:
    """ICD9 codes of an admission, known at its discharge (billing codes are assigned after the stay)."""
    keys, times = _discharge_arrays(discharges)
    hadm_col = pc.cast(_col(block, "HADM_ID"), pa.int64())
    hadm_ok = np.asarray(pc.is_valid(hadm_col).to_numpy(zero_copy_only=False), dtype=bool)
    hadm = pc.fill_null(hadm_col, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    pos = np.searchsorted(keys, hadm)
    found = hadm_ok & (pos < keys.size)
    found[found] = keys[pos[found]] == hadm[found]
    when = np.zeros(block.num_rows, dtype=np.int64)
    when[found] = times[pos[found]]
    code = _namespaced(source, _col(block, "ICD9_CODE"))
    # An unknown HADM_ID leaves the time unknown; counted apart from a null time because
    # it points at a broken or duplicated ADMISSIONS row, not at this table.
    return _emit(
        block, _known_at(source, pa.array(when, pa.int64(), mask=~found)), code, _values(block, None),
        [(UNKNOWN_ADMISSION, ~found & ~np.asarray(pc.is_null(code).to_numpy(zero_copy_only=False), dtype=bool))],
    )


def diagnosis_events(block: Block, discharges: Discharges) -> tuple[pa.Table, dict[str, int]]:
    """DIAGNOSES_ICD -> 'diagnosis:ICD9' known at the DISCHTIME (s) of its admission (HADM_ID -> DISCHTIME map), no value."""
    return _icd_events(block, "diagnosis", discharges)


def procedure_events(block: Block, discharges: Discharges) -> tuple[pa.Table, dict[str, int]]:
    """PROCEDURES_ICD -> 'procedure:ICD9' known at the DISCHTIME (s) of its admission (HADM_ID -> DISCHTIME map), no value."""
    return _icd_events(block, "procedure", discharges)


# Table -> (extractor, columns it reads). The job reads only these columns. Diagnoses and
# procedures also need the discharge map: call them as extractor(block, discharges).
EXTRACTORS: dict[str, tuple[Callable[..., tuple[pa.Table, dict[str, int]]], tuple[str, ...]]] = {
    "LABEVENTS": (lab_events, ("SUBJECT_ID", "HADM_ID", "ITEMID", "CHARTTIME", "VALUENUM", "VALUEUOM")),
    "CHARTEVENTS": (chart_events, ("SUBJECT_ID", "HADM_ID", "ITEMID", "CHARTTIME", "VALUENUM", "VALUEUOM",
                                    "ERROR")),
    "OUTPUTEVENTS": (output_events, ("SUBJECT_ID", "HADM_ID", "ITEMID", "CHARTTIME", "VALUE", "VALUEUOM",
                                      "ISERROR")),
    "INPUTEVENTS_CV": (input_cv_events, ("SUBJECT_ID", "HADM_ID", "ITEMID", "CHARTTIME", "AMOUNT", "AMOUNTUOM")),
    "INPUTEVENTS_MV": (input_mv_events, ("SUBJECT_ID", "HADM_ID", "ITEMID", "ENDTIME", "AMOUNT", "AMOUNTUOM",
                                          "STATUSDESCRIPTION")),
    "PRESCRIPTIONS": (prescription_events, ("SUBJECT_ID", "HADM_ID", "STARTDATE", "FORMULARY_DRUG_CD", "DRUG")),
    "DIAGNOSES_ICD": (diagnosis_events, ("SUBJECT_ID", "HADM_ID", "ICD9_CODE")),
    "PROCEDURES_ICD": (procedure_events, ("SUBJECT_ID", "HADM_ID", "ICD9_CODE")),
}
# Which table feeds which code namespace (spec.SOURCES).
TABLE_SOURCE: dict[str, str] = {
    "LABEVENTS": "lab",
    "CHARTEVENTS": "chart",
    "OUTPUTEVENTS": "output",
    "INPUTEVENTS_CV": "input",
    "INPUTEVENTS_MV": "input",
    "PRESCRIPTIONS": "prescription",
    "DIAGNOSES_ICD": "diagnosis",
    "PROCEDURES_ICD": "procedure",
}
NEEDS_DISCHARGES = frozenset({"DIAGNOSES_ICD", "PROCEDURES_ICD"})
def unit_counts(events: pa.Table) -> dict[tuple[str, str], magnitudes.Tally]:
    """(code 'source:code', unit as written) -> (events with a numeric value in that unit, their magnitude sketch).

    The census of units the job picks each code's canonical unit from, and the typical
    magnitudes its plausibility bound judges conversions by (``magnitudes``). It counts the
    events the job keeps, not every row of the table: a superseded MetaVision row ('Rewritten')
    or a charting error must not vote for a unit, and a MEDS dataset, which holds only kept
    events, counts alike.
    """
    value = events.column("value")
    valid = pc.and_(pc.invert(pc.is_nan(value)), pc.is_valid(events.column("unit")))
    kept = events.filter(valid)
    if kept.num_rows == 0:
        return {}
    # Integer keys and one np.unique: grouping by three columns in arrow cost 3x the rest of the census.
    codes = pc.dictionary_encode(kept.column("code")).combine_chunks()
    units = pc.dictionary_encode(kept.column("unit")).combine_chunks()
    bins = magnitudes.magnitude_bins(kept.column("value").to_numpy(zero_copy_only=False)) - magnitudes.ZERO_BIN
    n_units, n_bins = len(units.dictionary), magnitudes.INFINITE_BIN - magnitudes.ZERO_BIN + 1
    keys = (codes.indices.to_numpy().astype(np.int64) * n_units + units.indices.to_numpy()) * n_bins + bins
    found, counts = np.unique(keys, return_counts=True)
    code_names, unit_names = codes.dictionary.to_pylist(), units.dictionary.to_pylist()
    out: dict[tuple[str, str], magnitudes.Tally] = {}
    for key, n in zip(found.tolist(), counts.tolist()):
        pair_key, b = divmod(key, n_bins)
        pair = (code_names[pair_key // n_units], unit_names[pair_key % n_units])
        rows, sketch = out.get(pair, (0, {}))
        sketch[b + magnitudes.ZERO_BIN] = n
        out[pair] = (rows + n, sketch)
    return out


def extract(table: str, block: Block, discharges: Discharges | None = None) -> tuple[pa.Table, dict[str, int]]:
    """Runs the extractor of `table` (e.g. 'LABEVENTS') on one block; diagnoses/procedures need `discharges`."""
    name = table.upper()
    if name not in EXTRACTORS:
        raise KeyError(f"no event extractor for table {table!r}; known: {', '.join(EXTRACTORS)}")
    fn, _ = EXTRACTORS[name]
    if name in NEEDS_DISCHARGES:
        if discharges is None:
            raise ValueError(f"{name} needs the HADM_ID -> DISCHTIME map (cohort.Cohort.discharges)")
        return fn(block, discharges)
    return fn(block)


def filter_to_cohort(events: pa.Table, cohort: pa.Table) -> tuple[pa.Table, dict[str, int]]:
    """Pairs each event with every cohort admission of its subject whose trigger_time (s) is strictly later.

    Returns (COHORT_EVENT_SCHEMA rows sorted by cohort HADM_ID, time, with ORIGIN_COLUMNS when the
    events carry them; counts). One event
    may feed several admissions of one patient, so counts are per EVENT, each exactly
    once: ``used`` (reaches at least one admission), ``not_in_cohort`` (its subject has
    no cohort admission), ``at_or_after_trigger`` (subject in the cohort, but the event
    is at or after every one of its triggers). They sum to ``events.num_rows``.
    """
    c_subject = cohort.column("SUBJECT_ID").to_numpy().astype(np.int64)
    c_hadm = cohort.column("HADM_ID").to_numpy().astype(np.int64)
    c_trigger = cohort.column("trigger_time").to_numpy().astype(np.int64)
    order = np.lexsort((c_trigger, c_subject))
    c_subject, c_hadm, c_trigger = c_subject[order], c_hadm[order], c_trigger[order]

    e_subject = events.column("SUBJECT_ID").to_numpy().astype(np.int64)
    e_time = events.column("time").to_numpy().astype(np.int64)
    lo = np.searchsorted(c_subject, e_subject, "left")
    hi = np.searchsorted(c_subject, e_subject, "right")
    n_adm = hi - lo
    # Expand each event against all cohort admissions of its subject (1.3 on average in
    # MIMIC-III, a few dozen at most), then keep the pairs strictly before the trigger.
    pair_event = np.repeat(np.arange(events.num_rows), n_adm)
    starts = np.cumsum(n_adm) - n_adm
    pair_adm = np.repeat(lo, n_adm) + (np.arange(pair_event.size) - np.repeat(starts, n_adm))
    before = e_time[pair_event] < c_trigger[pair_adm]
    pair_event, pair_adm = pair_event[before], pair_adm[before]

    used = np.zeros(events.num_rows, dtype=bool)
    used[pair_event] = True
    n_used = int(np.count_nonzero(used))
    n_not_in_cohort = int(np.count_nonzero(n_adm == 0))
    counts = {
        USED: n_used,
        NOT_IN_COHORT: n_not_in_cohort,
        AT_OR_AFTER_TRIGGER: events.num_rows - n_used - n_not_in_cohort,
    }

    pair_hadm = c_hadm[pair_adm]
    # Deterministic order regardless of block layout: admission, then time, then input order.
    sort = np.lexsort((pair_event, e_time[pair_event], pair_hadm))
    take = pa.array(pair_event[sort], pa.int64())
    origin = has_origin(events)
    out = pa.table(
        [
            pa.array(pair_hadm[sort], pa.int64()),
            events.column("SUBJECT_ID").take(take),
            events.column("HADM_ID").take(take),
            events.column("time").take(take),
            events.column("code").take(take),
            events.column("value").take(take),
            events.column("unit").take(take),
        ] + ([events.column(name).take(take) for name in ORIGIN_COLUMNS] if origin else []),
        schema=ORIGIN_COHORT_EVENT_SCHEMA if origin else COHORT_EVENT_SCHEMA,
    )
    return out, counts


def split_by_admission(cohort_events: pa.Table, origin: bool = False) -> Iterator[tuple]:
    """Yields (cohort HADM_ID, times s int64, codes, values float64, units (None = no unit)) per admission.

    Its input is filter_to_cohort's output. With ``origin`` (the events must carry ORIGIN_COLUMNS),
    each tuple ends with the events' ROW_IDs and physical lines (int64).
    """
    hadm = cohort_events.column("HADM_ID").to_numpy().astype(np.int64)
    if hadm.size == 0:
        return
    if np.any(hadm[1:] < hadm[:-1]):
        raise ValueError("cohort events must be sorted by HADM_ID (as filter_to_cohort returns them)")
    times = cohort_events.column("time").to_numpy().astype(np.int64)
    # Decode via a dictionary: one Python str per DISTINCT code, not one per event.
    encoded = pc.dictionary_encode(cohort_events.column("code").combine_chunks())
    codes = encoded.dictionary.to_numpy(zero_copy_only=False)[encoded.indices.to_numpy()]
    values = cohort_events.column("value").to_numpy().astype(np.float64)
    units = _decoded(cohort_events.column("unit"))
    extra = [cohort_events.column(name).to_numpy().astype(np.int64) for name in ORIGIN_COLUMNS] if origin else []
    # One Python step per admission, never per event.
    bounds = np.concatenate([[0], np.flatnonzero(hadm[1:] != hadm[:-1]) + 1, [hadm.size]])
    for start, stop in zip(bounds[:-1], bounds[1:]):
        yield (int(hadm[start]), times[start:stop], codes[start:stop], values[start:stop], units[start:stop],
               *(a[start:stop] for a in extra))


def _decoded(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """An object array of a string column (None for null), decoded once per distinct value."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    encoded = pc.dictionary_encode(column)
    words = np.asarray(encoded.dictionary.to_pylist() + [None], dtype=object)
    index = pc.fill_null(encoded.indices, len(encoded.dictionary)).to_numpy(zero_copy_only=False)
    return words[index]
