"""No training/serving skew: one admission's events through the Beam job's path and through
the service's path give byte-identical serialized SequenceExamples.

Job path: typed table blocks (as the reader yields them) -> events.extract -> filter_to_cohort
-> split_by_admission -> pack_chunk -> the chunks in a shuffled order -> the job's own
BagExample DoFn. Service path: the same events as a JSON request (shuffled differently, codes
padded with whitespace, times as docs/serving.md tells clients to send them) -> PredictRequest
-> serving.inference.encoding.encode. The ids and label are the ones the service writes (it cannot know
them), so the two protos must match byte for byte.
"""
from __future__ import annotations

import datetime as dt
import functools

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from ehr_pipeline.contract import PipelineConfig, spec
from ehr_pipeline.encode import magnitudes, seqex
from ehr_pipeline.job import bag
from ehr_pipeline.job import chunks as chunks_mod
from ehr_pipeline.job.items import RECORDS
from ehr_pipeline.mimic import cohort as cohort_mod
from ehr_pipeline.mimic import events as ev
from model.export.load import read_export
from serving.inference.encoding import encode
from serving.schemas import InputError, PredictRequest
from tests.support.arrow_rows import batch

DAY = 86400
CONFIG = PipelineConfig()
ADMIT = 5_000_000_000 + 9 * 3600 + 17 * 60  # 2128-06-10 09:17 UTC: not on a day boundary
TRIGGER = ADMIT + CONFIG.trigger_offset_seconds
HADM, PRIOR, OLD = 0, 1, 2  # the predicted admission (the service's id: 0) and two earlier ones
DISCHARGES = {HADM: TRIGGER + 3 * DAY, PRIOR: TRIGGER - 5 * DAY, OLD: TRIGGER - 40 * DAY - 7}
AGE = 67.5
# A stay admitted before HADM but still in hospital when HADM began: the job skips it (encode.previous_stay),
# so PRIOR's discharge is the previous one, and a request names that one.
OVERLAPPING = 3


def job_cohort_row() -> dict:
    """HADM's cohort row (its previous discharge among them), as the job's cohort builds it from ADMISSIONS."""
    admissions = [(HADM, ADMIT, DISCHARGES[HADM]), (PRIOR, DISCHARGES[PRIOR] - 3 * DAY, DISCHARGES[PRIOR]),
                  (OLD, DISCHARGES[OLD] - 9 * DAY, DISCHARGES[OLD]), (OVERLAPPING, ADMIT - 2 * DAY, ADMIT + 3600)]
    coh = cohort_mod.build_cohort(
        batch("ADMISSIONS", [dict(SUBJECT_ID=0, HADM_ID=h, ADMITTIME=a, DISCHTIME=d, DEATHTIME=None,
                                  ADMISSION_TYPE="EMERGENCY", HOSPITAL_EXPIRE_FLAG=0) for h, a, d in admissions]),
        batch("PATIENTS", [dict(SUBJECT_ID=0, GENDER="F", DOB=ADMIT - 68 * 365 * DAY)]),
        trigger_offset_seconds=CONFIG.trigger_offset_seconds)
    (row,) = [r for r in coh.table.to_pylist() if r["HADM_ID"] == HADM]
    return row

# table -> (source, code pool, time column, value column or None); ITEMIDs are integers in
# the release, drug and ICD-9 codes are text (and may carry whitespace there too).
TABLES = {
    "LABEVENTS": ("lab", (50912, 50971), "CHARTTIME", "VALUENUM"),
    "CHARTEVENTS": ("chart", (220045,), "CHARTTIME", "VALUENUM"),
    "OUTPUTEVENTS": ("output", (40055,), "CHARTTIME", "VALUE"),
    "INPUTEVENTS_CV": ("input", (30013,), "CHARTTIME", "AMOUNT"),
    "INPUTEVENTS_MV": ("input", (225158, 30013), "ENDTIME", "AMOUNT"),
    "PRESCRIPTIONS": ("prescription", ("Vancomycin", "Heparin"), "STARTDATE", None),
    "DIAGNOSES_ICD": ("diagnosis", ("4019", "42731"), None, None),
    "PROCEDURES_ICD": ("procedure", ("9604",), None, None),
}
PADDING = st.sampled_from(["", " ", "  ", "\t", "\u00a0", "\u3000", " \n"])
# Units as sites write them: the model's own (any spelling), one to convert, none, and one that
# converts to nothing the model knows (its values must be dropped on both paths alike).
# Ambiguous ('MU/L'), placeholder ('N/A') and conversions the plausibility bound may refuse ('ng/mL',
# 'g/L') must be decided alike too.
UNITS = st.sampled_from([None, "mg/dL", "MG/DL", "umol/L", "\u00b5mol/L", "mmol/L", "bpm", "furlongs", "MU/L",
                         "N/A", "ng/mL", "g/L"])
UNIT_COLUMN = {"LABEVENTS": "VALUEUOM", "CHARTEVENTS": "VALUEUOM", "OUTPUTEVENTS": "VALUEUOM",
               "INPUTEVENTS_CV": "AMOUNTUOM", "INPUTEVENTS_MV": "AMOUNTUOM"}
VALUES = st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.0, 2.0, 1.5]), st.floats(-1e6, 1e6))
# Few distinct times, so one code often has several values at one time.
OFFSETS = st.one_of(st.sampled_from([-1, -60, -3600, -2 * DAY, 0, 5]), st.integers(-4 * DAY, DAY))


@st.composite
def event_sets(draw):
    """(table, code, recorded time s, admission, value, left pad, right pad, unit) rows of one patient."""
    rows = []
    for _ in range(draw(st.integers(0, 25))):
        table = draw(st.sampled_from(sorted(TABLES)))
        source, pool, time_column, value_column = TABLES[table]
        code = draw(st.sampled_from(pool))
        hadm = draw(st.sampled_from([HADM, PRIOR, OLD]))
        if time_column is None:  # ICD-9 codes: known at their admission's discharge
            recorded = DISCHARGES[hadm]
        elif time_column == "STARTDATE":  # a date, written as midnight
            recorded = (TRIGGER + draw(OFFSETS)) // DAY * DAY
        else:
            recorded = TRIGGER + draw(OFFSETS)
        value = draw(VALUES) if value_column else None
        unit = draw(UNITS) if table in UNIT_COLUMN else None
        rows.append((table, code, recorded, hadm, value, draw(PADDING), draw(PADDING), unit))
    # Same-time values of one code (the case where bagging must not follow the input order).
    for _ in range(draw(st.integers(0, 4)) if rows else 0):
        table, code, recorded, hadm, _, left, right, unit = draw(st.sampled_from(rows))
        value = draw(st.sampled_from([0.0, -0.0, 1.0, 2.0])) if TABLES[table][3] else None
        rows.append((table, code, recorded, hadm, value, draw(PADDING), draw(PADDING), unit))
    return rows


@functools.cache
def job_dofn() -> bag.BagExample:
    """The job's BagExample DoFn, set up once as a worker sets it up once for every bundle it processes.

    Its unit Converter is a cache of unit readings (pint's registry takes ~0.7 s CPU to build): set up
    again for every generated example, it was most of this module's time.
    """
    dofn = bag.BagExample(CONFIG.to_dict())
    dofn.setup()
    return dofn


def job_record(rows, chunk_order, export) -> bytes:
    """The job's record for the admission: extraction, cohort cut and packing per table, then its DoFn."""
    cohort_index = pa.table({"SUBJECT_ID": [0], "HADM_ID": [HADM], "trigger_time": [TRIGGER]})
    chunks, census = [], {}
    for table, (_, _, time_column, value_column) in TABLES.items():
        mine = [r for r in rows if r[0] == table]
        if not mine:
            continue
        block_rows = []
        for _, code, recorded, hadm, value, left, right, unit in mine:
            row = {"SUBJECT_ID": 0, "HADM_ID": hadm}
            if table in UNIT_COLUMN:
                row[UNIT_COLUMN[table]] = unit
            if table == "PRESCRIPTIONS":
                row.update(STARTDATE=recorded, FORMULARY_DRUG_CD=f"{left}{code}{right}", DRUG="drug")
            elif table in ev.NEEDS_DISCHARGES:
                row["ICD9_CODE"] = f"{left}{code}{right}"
            else:
                row.update({"ITEMID": code, time_column: recorded, value_column: value})
                row.update({"CHARTEVENTS": {"ERROR": 0}, "OUTPUTEVENTS": {"ISERROR": 0},
                            "INPUTEVENTS_MV": {"STATUSDESCRIPTION": "FinishedRunning"}}.get(table, {}))
            block_rows.append(row)
        extracted, counts = ev.extract(table, batch(table, block_rows), DISCHARGES)
        assert counts[ev.KEPT] == len(mine), counts
        for pair, tally in ev.unit_counts(extracted).items():
            census[pair] = magnitudes.merge_tallies([census.get(pair, (0, {})), tally])
        kept, _ = ev.filter_to_cohort(extracted, cohort_index)
        chunks.extend(chunks_mod.pack_chunk(t, c, v, u) for _, t, c, v, u in ev.split_by_admission(kept))
    meta = {"SUBJECT_ID": 0, "HADM_ID": HADM, "ADMITTIME": ADMIT, "trigger_time": TRIGGER,
            "label": spec.LABEL_UNKNOWN, "age_years": AGE, "gender": "F", "admission_type": "EMERGENCY",
            # What the service writes, as for the ids: a request does not carry them.
            "ethnicity": spec.NOT_RECORDED, "insurance": spec.NOT_RECORDED,
            "previous_discharge_seconds": job_cohort_row()["previous_discharge_seconds"]}
    dofn = job_dofn()
    ordered = [chunks[i] for i in chunk_order(len(chunks))]
    # The job's unit plan for this model (--units-from the export) on a release of this one admission:
    # its canonical units, its labs' LOINC codes, its training medians and the admission's census.
    plan = {**bag.unit_plan(list(census.items()), dict(export.harmoniser.loinc), dict(export.units),
                                   dict(export.unit_medians)), "canonical": dict(export.units)}
    records = [payload for kind, payload in dofn.process((HADM, [*ordered, meta]), plan) if kind == RECORDS]
    (_, (_, record)), = records
    return record


def iso(seconds: int) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")


def request_body(rows, order) -> dict:
    """The request a client builds from the same rows, following the documented event times."""
    events = []
    for table, code, recorded, _, value, left, right, unit in (rows[i] for i in order):
        event = {"time": iso(recorded), "source": TABLES[table][0], "code": f"{left}{code}{right}"}
        if value is not None:
            event["value"] = value
        if unit is not None:
            event["unit"] = unit
        events.append(event)
    return {"patient": {"gender": "F", "age_years": AGE},
            "admission": {"admit_time": iso(ADMIT), "admission_type": "EMERGENCY",
                          "previous_discharge_time": iso(DISCHARGES[PRIOR])}, "events": events}


@pytest.fixture(scope="module")
def export(fixture_export):
    # The session's fixture export: written with the default PipelineConfig (CONFIG); only its contract
    # (vocabulary, units, pipeline) is read here, never its model.
    export = read_export(fixture_export)
    assert export.pipeline == CONFIG
    return export


@settings(max_examples=40, deadline=None)
@given(rows=event_sets(), data=st.data())
def test_job_and_service_write_the_same_bytes(export, rows, data):
    service_order = data.draw(st.permutations(range(len(rows))))
    chunk_perm = data.draw(st.randoms(use_true_random=False))
    record = job_record(rows, lambda n: chunk_perm.sample(range(n), n), export)
    served = encode(PredictRequest.model_validate(request_body(rows, service_order)), export).example
    assert served == record


def test_the_issues_cases_value_last_padded_codes_and_prescriptions(export):
    """Two same-time values of one code, a padded ITEMID, prescriptions sent at their start date."""
    t = TRIGGER - 3600
    today = TRIGGER // DAY * DAY  # before the trigger, but today's order is known only at 23:59:59
    rows = [("LABEVENTS", 50912, t, HADM, 2.0, "", "", "mg/dL"), ("LABEVENTS", 50912, t, HADM, 1.0, " ", "", None),
            ("PRESCRIPTIONS", "Vancomycin", today - DAY, HADM, None, "", " ", None),
            ("PRESCRIPTIONS", "Heparin", today, HADM, None, "", "", None)]
    record = job_record(rows, lambda n: list(range(n))[::-1], export)
    for order in ([0, 1, 2, 3], [3, 2, 1, 0]):
        encoded = encode(PredictRequest.model_validate(request_body(rows, order)), export)
        assert encoded.example == record
        assert encoded.oov_count == 0  # 'lab:50912' and 'prescription:Vancomycin', both in the vocabulary
        assert encoded.ignored["at_or_after_trigger"] == 1  # today's Heparin
    ex = seqex.sequence_example_to_dict(record)
    assert ex[spec.BAG_CODES] == [["lab:50912", "prescription:Vancomycin"]]  # one day-wide bag
    assert ex[spec.BAG_VALUE_LAST] == [[2.0, 0.0]]  # the larger of the two same-time values
    assert ex[spec.BAG_VALUE_MEAN] == [[1.5, 0.0]]
    assert ex[spec.BAG_OFFSET] == [3600.0]


def test_the_previous_discharge_reaches_the_record_alike_and_a_later_one_is_refused(export):
    row = job_cohort_row()
    assert row["previous_discharge_seconds"] == TRIGGER - DISCHARGES[PRIOR]  # OVERLAPPING skipped, OLD older
    record = job_record([], lambda n: list(range(n)), export)
    body = request_body([], [])
    assert encode(PredictRequest.model_validate(body), export).example == record
    assert seqex.sequence_example_to_dict(record)[spec.PREVIOUS_DISCHARGE] == TRIGGER - DISCHARGES[PRIOR]
    # Left out: no previous admission, as the job writes for a first stay.
    del body["admission"]["previous_discharge_time"]
    assert seqex.sequence_example_to_dict(encode(PredictRequest.model_validate(body), export).example)[
        spec.PREVIOUS_DISCHARGE] == spec.NO_PREVIOUS_DISCHARGE
    body["admission"]["previous_discharge_time"] = iso(ADMIT + 1)
    with pytest.raises(InputError, match="previous_discharge_time must not be after"):
        encode(PredictRequest.model_validate(body), export)
