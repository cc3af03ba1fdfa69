"""Events: per-source extraction rules, the cut to the cohort, and no leakage on the real demo."""
import csv
import datetime as dt
import gzip
import math

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ehr_pipeline.encode import bagging
from ehr_pipeline.mimic import cohort, events
from ehr_pipeline.reader import TableReader, locate_table, table_schemas
from tests.support.arrow_rows import batch

DAY = 86400
T0 = 5_000_000_000  # 2128-06-10 14:13:20 UTC, a time in the shifted MIMIC era, seconds
MIDNIGHT = T0 - T0 % DAY




def rows_of(table: pa.Table) -> list[tuple]:
    """Event rows as tuples, NaN replaced by None so they compare."""
    return [(r["SUBJECT_ID"], r["HADM_ID"], r["time"], r["code"],
             None if math.isnan(r["value"]) else r["value"]) for r in table.to_pylist()]


def check_counts(block, result):
    ev, counts = result
    assert sum(counts.values()) == block.num_rows and counts["kept"] == ev.num_rows
    assert ev.schema == events.EVENT_SCHEMA
    return ev, counts


# --- per-source rules ---------------------------------------------------------------------

def test_lab_keeps_outpatient_rows_and_counts_missing_time():
    b = batch("LABEVENTS", [
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=50912, CHARTTIME=T0, VALUENUM=1.2),
        dict(SUBJECT_ID=1, HADM_ID=None, ITEMID=50912, CHARTTIME=T0 - 30 * DAY, VALUENUM=0.9),
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=51000, CHARTTIME=T0 + 5, VALUENUM=None),
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=51000, CHARTTIME=None, VALUENUM=3.0),
    ])
    ev, counts = check_counts(b, events.lab_events(b))
    assert counts == {"kept": 3, "missing_code": 0, "bad_code": 0, "missing_time": 1}
    assert rows_of(ev) == [(1, 10, T0, "lab:50912", 1.2), (1, None, T0 - 30 * DAY, "lab:50912", 0.9),
                           (1, 10, T0 + 5, "lab:51000", None)]


def test_chart_error_rows_are_skipped_and_counted_first():
    b = batch("CHARTEVENTS", [
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=220045, CHARTTIME=T0, VALUENUM=80.0, ERROR=0),
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=220045, CHARTTIME=T0, VALUENUM=800.0, ERROR=1),
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=220045, CHARTTIME=T0, VALUENUM=81.0, ERROR=None),
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=None, CHARTTIME=T0, VALUENUM=1.0, ERROR=1),
        dict(SUBJECT_ID=1, HADM_ID=10, ITEMID=None, CHARTTIME=T0, VALUENUM=1.0, ERROR=0),
    ])
    ev, counts = check_counts(b, events.chart_events(b))
    assert counts == {"kept": 2, "chart_error": 2, "missing_code": 1, "bad_code": 0, "missing_time": 0}
    assert ev["value"].to_pylist() == [80.0, 81.0] and set(ev["code"].to_pylist()) == {"chart:220045"}


def test_output_and_inputevents_cv():
    o = batch("OUTPUTEVENTS", [
        dict(SUBJECT_ID=2, HADM_ID=20, ITEMID=40055, CHARTTIME=T0, VALUE=150.0, ISERROR=None),
        dict(SUBJECT_ID=2, HADM_ID=20, ITEMID=40055, CHARTTIME=T0, VALUE=9e9, ISERROR=1),
        dict(SUBJECT_ID=2, HADM_ID=20, ITEMID=40055, CHARTTIME=T0, VALUE=None, ISERROR=0),
    ])
    ev, counts = check_counts(o, events.output_events(o))
    assert counts == {"kept": 2, "output_error": 1, "missing_code": 0, "bad_code": 0, "missing_time": 0}
    assert rows_of(ev) == [(2, 20, T0, "output:40055", 150.0), (2, 20, T0, "output:40055", None)]
    cv = batch("INPUTEVENTS_CV", [
        dict(SUBJECT_ID=2, HADM_ID=20, ITEMID=30013, CHARTTIME=T0, AMOUNT=250.0),
        dict(SUBJECT_ID=2, HADM_ID=None, ITEMID=30013, CHARTTIME=None, AMOUNT=1.0),
    ])
    ev, counts = check_counts(cv, events.input_cv_events(cv))
    assert counts == {"kept": 1, "missing_code": 0, "bad_code": 0, "missing_time": 1}
    assert rows_of(ev) == [(2, 20, T0, "input:30013", 250.0)]


def test_inputevents_mv_known_at_end_and_rewritten_skipped():
    b = batch("INPUTEVENTS_MV", [
        dict(SUBJECT_ID=3, HADM_ID=30, ITEMID=225158, STARTTIME=T0, ENDTIME=T0 + 7200, AMOUNT=500.0,
             STATUSDESCRIPTION="FinishedRunning"),
        dict(SUBJECT_ID=3, HADM_ID=30, ITEMID=225158, STARTTIME=T0, ENDTIME=T0 + 3600, AMOUNT=250.0,
             STATUSDESCRIPTION="Rewritten"),
        dict(SUBJECT_ID=3, HADM_ID=30, ITEMID=221906, STARTTIME=T0, ENDTIME=T0 + 60, AMOUNT=1.5,
             STATUSDESCRIPTION="Stopped"),
        dict(SUBJECT_ID=3, HADM_ID=30, ITEMID=221906, STARTTIME=T0, ENDTIME=None, AMOUNT=1.5,
             STATUSDESCRIPTION=None),
    ])
    ev, counts = check_counts(b, events.input_mv_events(b))
    assert counts == {"kept": 2, "input_rewritten": 1, "missing_code": 0, "bad_code": 0, "missing_time": 1}
    assert rows_of(ev) == [(3, 30, T0 + 7200, "input:225158", 500.0), (3, 30, T0 + 60, "input:221906", 1.5)]


def test_every_job_source_has_a_rule_and_the_job_uses_it():
    """Each event table's extractor stamps times through bagging.known_time: prescriptions end on their day."""
    assert set(bagging.KNOWN_TIME_RULES) == set(events.TABLE_SOURCE.values())
    block = pa.table({"SUBJECT_ID": [1], "HADM_ID": [2], "STARTDATE": [3 * DAY], "FORMULARY_DRUG_CD": ["X"],
                      "DRUG": ["x"]})
    out, _ = events.extract("PRESCRIPTIONS", block)
    assert out.column("time").to_pylist() == bagging.known_time("prescription", [3 * DAY]).tolist()


def test_prescriptions_codes_and_end_of_day_against_triggers():
    b = batch("PRESCRIPTIONS", [
        dict(SUBJECT_ID=4, HADM_ID=40, STARTDATE=MIDNIGHT, FORMULARY_DRUG_CD="ASA81", DRUG="Aspirin"),
        dict(SUBJECT_ID=4, HADM_ID=40, STARTDATE=MIDNIGHT, FORMULARY_DRUG_CD=None, DRUG=" Heparin "),
        dict(SUBJECT_ID=4, HADM_ID=40, STARTDATE=MIDNIGHT, FORMULARY_DRUG_CD="  ", DRUG="NS"),
        dict(SUBJECT_ID=4, HADM_ID=40, STARTDATE=MIDNIGHT, FORMULARY_DRUG_CD=None, DRUG=None),
        dict(SUBJECT_ID=4, HADM_ID=40, STARTDATE=None, FORMULARY_DRUG_CD="ASA81", DRUG="Aspirin"),
    ])
    ev, counts = check_counts(b, events.prescription_events(b))
    assert counts == {"kept": 3, "missing_code": 1, "bad_code": 0, "missing_time": 1}
    assert ev["code"].to_pylist() == ["prescription:ASA81", "prescription:Heparin", "prescription:NS"]
    assert set(ev["time"].to_pylist()) == {MIDNIGHT + DAY - 1}
    assert all(math.isnan(v) for v in ev["value"].to_pylist())
    # Written on day D: unknown to a trigger at noon or 23:59:59 of D, known from D+1 00:00:00.
    cut = pa.table({"SUBJECT_ID": [4, 4, 4], "HADM_ID": [1, 2, 3],
                    "trigger_time": [MIDNIGHT + 12 * 3600, MIDNIGHT + DAY - 1, MIDNIGHT + DAY]})
    kept, fc = events.filter_to_cohort(ev, cut)
    assert set(kept["HADM_ID"].to_pylist()) == {3} and fc == {"used": 3, "not_in_cohort": 0, "at_or_after_trigger": 0}


def test_diagnoses_and_procedures_known_at_discharge():
    disch = pa.table({"SUBJECT_ID": [5, 5], "HADM_ID": [50, 51], "DISCHTIME": [T0, T0 + 99 * DAY]})
    d = batch("DIAGNOSES_ICD", [
        dict(SUBJECT_ID=5, HADM_ID=50, ICD9_CODE="4280"),
        dict(SUBJECT_ID=5, HADM_ID=51, ICD9_CODE="V4581"),
        dict(SUBJECT_ID=5, HADM_ID=52, ICD9_CODE="4019"),  # no such admission
        dict(SUBJECT_ID=5, HADM_ID=50, ICD9_CODE=None),
    ])
    ev, counts = check_counts(d, events.diagnosis_events(d, disch))
    assert counts == {"kept": 2, "unknown_admission": 1, "missing_code": 1, "bad_code": 0, "missing_time": 0}
    assert rows_of(ev) == [(5, 50, T0, "diagnosis:4280", None), (5, 51, T0 + 99 * DAY, "diagnosis:V4581", None)]
    # A plain mapping works the same (e.g. a Beam AsDict side input).
    ev2, _ = events.diagnosis_events(d, {50: T0, 51: T0 + 99 * DAY})
    assert rows_of(ev2) == rows_of(ev)
    p = batch("PROCEDURES_ICD", [dict(SUBJECT_ID=5, HADM_ID=51, ICD9_CODE="9604")])
    ev3, _ = check_counts(p, events.procedure_events(p, disch))
    assert rows_of(ev3) == [(5, 51, T0 + 99 * DAY, "procedure:9604", None)]


def test_extract_dispatch_and_declared_columns_suffice():
    for table, (fn, columns) in events.EXTRACTORS.items():
        sch = table_schemas.get(table)
        assert set(columns) <= set(sch.column_names), table
        row = {c: (1 if sch.column(c).type is not table_schemas.ColType.STR else "x") for c in columns}
        row.update({c: 0 for c in ("ERROR", "ISERROR") if c in row})  # error flags off
        b = batch(table, [row])  # exactly the declared columns: nothing else may be read
        ev, counts = events.extract(table.lower(), b, {1: T0})
        assert ev.num_rows == 1 and ev["code"][0].as_py().startswith(events.TABLE_SOURCE[table] + ":")
    with pytest.raises(ValueError, match="SUBJECT_ID"):
        events.lab_events(batch("LABEVENTS", [dict(SUBJECT_ID=None, HADM_ID=1, ITEMID=1, CHARTTIME=1, VALUENUM=1.0)]))
    with pytest.raises(KeyError, match="NOTEEVENTS"):
        events.extract("NOTEEVENTS", b)
    with pytest.raises(ValueError, match="DISCHTIME"):
        events.extract("DIAGNOSES_ICD", batch("DIAGNOSES_ICD", [dict(SUBJECT_ID=1, HADM_ID=1, ICD9_CODE="1")]))


# --- the cut to the cohort ------------------------------------------------------------------

def ev_table(rows):
    """Events from (subject, hadm, time, code) tuples; every third one has a unit."""
    s, h, t, c = zip(*rows)
    return pa.table([pa.array(s, pa.int64()), pa.array(h, pa.int64()), pa.array(t, pa.int64()),
                     pa.array(c, pa.string()), pa.array([float(i) for i in range(len(rows))]),
                     pa.array([None if i % 3 else f"u{i}" for i in range(len(rows))], pa.string())],
                    schema=events.EVENT_SCHEMA)


def test_filter_pairs_and_counts_one_event_once():
    cut = pa.table({"SUBJECT_ID": [1, 1, 2], "HADM_ID": [11, 12, 21],
                    "trigger_time": [T0, T0 + 10 * DAY, T0]})
    ev = ev_table([
        (1, None, T0 - 100 * DAY, "lab:a"),  # outpatient, before both of subject 1's triggers
        (1, 11, T0 - 1, "lab:b"),  # one second before the first trigger: both
        (1, 11, T0, "lab:c"),  # AT the first trigger: only the second admission
        (1, 12, T0 + 10 * DAY, "lab:d"),  # at the second trigger: nowhere
        (2, 21, T0 + 1, "lab:e"),  # after subject 2's only trigger
        (3, 31, T0 - DAY, "lab:f"),  # subject 3 has no cohort admission
    ])
    kept, counts = events.filter_to_cohort(ev, cut)
    assert counts == {"used": 3, "not_in_cohort": 1, "at_or_after_trigger": 2}
    assert sum(counts.values()) == ev.num_rows
    got = list(zip(kept["HADM_ID"].to_pylist(), kept["code"].to_pylist(), kept["EVENT_HADM_ID"].to_pylist()))
    assert got == [(11, "lab:a", None), (11, "lab:b", 11), (12, "lab:a", None), (12, "lab:b", 11),
                   (12, "lab:c", 11)]
    assert kept.schema == events.COHORT_EVENT_SCHEMA


def test_split_by_admission_groups_sorted_output():
    cut = pa.table({"SUBJECT_ID": [1, 2], "HADM_ID": [11, 21], "trigger_time": [T0, T0]})
    ev = ev_table([(2, 21, T0 - 5, "lab:x"), (1, 11, T0 - 9, "lab:y"), (1, 11, T0 - 10, "lab:z")])
    kept, _ = events.filter_to_cohort(ev, cut)
    groups = list(events.split_by_admission(kept))
    assert [(h, t.tolist(), list(c), list(u)) for h, t, c, _, u in groups] == [
        (11, [T0 - 10, T0 - 9], ["lab:z", "lab:y"], [None, None]), (21, [T0 - 5], ["lab:x"], ["u0"])]
    assert list(events.split_by_admission(kept.slice(0, 0))) == []
    with pytest.raises(ValueError, match="sorted"):
        list(events.split_by_admission(kept.take([2, 0])))


@settings(max_examples=150, deadline=None)
@given(
    triggers=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 20)), max_size=6, unique_by=lambda x: x),
    evs=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 21)), max_size=40),
)
def test_filter_matches_brute_force(triggers, evs):
    cut = pa.table({"SUBJECT_ID": pa.array([s for s, _ in triggers], pa.int64()),
                    "HADM_ID": pa.array(list(range(100, 100 + len(triggers))), pa.int64()),
                    "trigger_time": pa.array([t for _, t in triggers], pa.int64())})
    ev = ev_table([(s, None, t, f"lab:{i}") for i, (s, t) in enumerate(evs)]) if evs else \
        events.EVENT_SCHEMA.empty_table()
    kept, counts = events.filter_to_cohort(ev, cut)
    want = sorted((100 + j, t, f"lab:{i}") for i, (s, t) in enumerate(evs)
                  for j, (cs, ct) in enumerate(triggers) if cs == s and t < ct)
    got = list(zip(kept["HADM_ID"].to_pylist(), kept["time"].to_pylist(), kept["code"].to_pylist()))
    assert sorted(got) == want and got == sorted(got, key=lambda g: (g[0], g[1]))
    used = {c for _, _, c in want}
    subjects = {s for s, _ in triggers}
    assert counts == {"used": len(used), "not_in_cohort": sum(s not in subjects for s, _ in evs),
                      "at_or_after_trigger": len(evs) - len(used) - sum(s not in subjects for s, _ in evs)}


def test_diagnoses_only_reach_later_admissions():
    adms = pa.table({
        "SUBJECT_ID": [7, 7, 7], "HADM_ID": [71, 72, 73],
        "ADMITTIME": [T0, T0 + 20 * DAY, T0 + 23 * DAY + 3600],
        "DISCHTIME": [T0 + 5 * DAY, T0 + 23 * DAY, T0 + 30 * DAY],
        "DEATHTIME": pa.array([None, None, None], pa.int64()), "ADMISSION_TYPE": ["EMERGENCY"] * 3,
        "HOSPITAL_EXPIRE_FLAG": [0, 0, 0]})
    pats = pa.table({"SUBJECT_ID": [7], "GENDER": ["M"], "DOB": [T0 - 60 * 365 * DAY]})
    c = cohort.build_cohort(adms, pats)
    diag = batch("DIAGNOSES_ICD", [dict(SUBJECT_ID=7, HADM_ID=h, ICD9_CODE=str(h)) for h in (71, 72, 73)])
    ev, _ = events.diagnosis_events(diag, c.discharges)
    kept, counts = events.filter_to_cohort(ev, c.table)
    got = sorted(zip(kept["HADM_ID"].to_pylist(), kept["code"].to_pylist()))
    # 73 is a readmission 1 h after 72's discharge: 72's codes are known by 73's trigger.
    assert got == [(72, "diagnosis:71"), (73, "diagnosis:71"), (73, "diagnosis:72")]
    assert counts == {"used": 2, "not_in_cohort": 0, "at_or_after_trigger": 1}


# --- the real demo --------------------------------------------------------------------------

def raw_rows(demo_dir, name):
    with gzip.open(demo_dir / f"{name}.csv.gz", "rt", newline="") as f:
        return list(csv.DictReader(f))


def when(text):
    return dt.datetime.fromisoformat(text) if text else None


@pytest.fixture(scope="module")
def demo(demo_dir):
    """Runs cohort + extraction + cut block by block, as the job does, on the reader's output."""
    def read(table, columns):
        return TableReader(locate_table(demo_dir, table), table, columns, block_size_bytes=1 << 18)

    c = cohort.build_cohort(read("ADMISSIONS", cohort.ADMISSION_COLUMNS), read("PATIENTS", cohort.PATIENT_COLUMNS))
    out = {}
    for table, (_, columns) in events.EXTRACTORS.items():
        if locate_table(demo_dir, table) is None:  # CHARTEVENTS: absent from the public demo
            continue
        reader = read(table, columns)
        ext_counts, cut_counts, kept_blocks, n_blocks = {}, {}, [], 0
        for block in reader:
            n_blocks += 1
            ev, ext = events.extract(table, block, c.discharges)
            kept, cut = events.filter_to_cohort(ev, c.table)
            for total, part in ((ext_counts, ext), (cut_counts, cut)):
                for k, v in part.items():
                    total[k] = total.get(k, 0) + v
            kept_blocks.append(kept)
        assert reader.stats.rows_dead == 0
        out[table] = (reader.stats.rows_read, ext_counts, cut_counts,
                      pa.concat_tables(kept_blocks), n_blocks)
    # Triggers and subjects from the raw CSV, by hand: the cohort's own times are not trusted.
    raw_adm = {int(a["HADM_ID"]): a for a in raw_rows(demo_dir, "ADMISSIONS")}
    return c, out, raw_adm


def test_demo_counting_invariant_and_documented_counts(demo):
    _, out, _ = demo
    table = {}
    assert out["LABEVENTS"][4] > 1  # several blocks: counts add up across them
    for name, (n_rows, ext, cut, kept, _) in out.items():
        assert sum(ext.values()) == n_rows  # every row read: kept or dropped by reason
        assert sum(cut.values()) == ext["kept"]  # every event: used or filtered by reason
        table[name] = (n_rows, {k: v for k, v in ext.items() if k != "kept" and v}, cut, kept.num_rows)
    # These numbers are quoted in docs/task.md; change both together.
    assert table == {
        "LABEVENTS": (76074, {}, {"used": 34023, "not_in_cohort": 2937, "at_or_after_trigger": 39114}, 74410),
        "OUTPUTEVENTS": (11320, {}, {"used": 3307, "not_in_cohort": 582, "at_or_after_trigger": 7431}, 11609),
        "INPUTEVENTS_CV": (34799, {}, {"used": 4687, "not_in_cohort": 3071, "at_or_after_trigger": 27041}, 5515),
        "INPUTEVENTS_MV": (13224, {"input_rewritten": 2910},
                           {"used": 4160, "not_in_cohort": 114, "at_or_after_trigger": 6040}, 19611),
        "PRESCRIPTIONS": (10398, {}, {"used": 4355, "not_in_cohort": 493, "at_or_after_trigger": 5550}, 12594),
        "DIAGNOSES_ICD": (1761, {}, {"used": 425, "not_in_cohort": 102, "at_or_after_trigger": 1234}, 1731),
        "PROCEDURES_ICD": (506, {}, {"used": 101, "not_in_cohort": 46, "at_or_after_trigger": 359}, 490),
    }


def test_demo_no_event_at_or_after_trigger_against_raw_tables(demo):
    _, out, raw_adm = demo
    epoch = dt.datetime(1970, 1, 1)
    trigger = {h: when(a["ADMITTIME"]) + dt.timedelta(days=1) for h, a in raw_adm.items()}
    for name, (_, _, _, kept, _) in out.items():
        for h, s, t in zip(kept["HADM_ID"].to_pylist(), kept["SUBJECT_ID"].to_pylist(), kept["time"].to_pylist()):
            assert int(raw_adm[h]["SUBJECT_ID"]) == s, name
            assert epoch + dt.timedelta(seconds=t) < trigger[h], (name, h, t)


def test_demo_labs_and_prescriptions_equal_hand_count(demo, demo_dir):
    c, out, raw_adm = demo
    kept_adm = {h: (int(raw_adm[h]["SUBJECT_ID"]), when(raw_adm[h]["ADMITTIME"]) + dt.timedelta(days=1))
                for h in c.table["HADM_ID"].to_pylist()}
    by_subject = {}
    for h, (s, trig) in kept_adm.items():
        by_subject.setdefault(s, []).append(trig)

    def pairs(table, time_of):
        n = 0
        for r in raw_rows(demo_dir, table):
            t = time_of(r)
            n += sum(t < trig for trig in by_subject.get(int(r["SUBJECT_ID"]), []))
        return n

    assert out["LABEVENTS"][3].num_rows == pairs("LABEVENTS", lambda r: when(r["CHARTTIME"]))
    # Date-only STARTDATE: known at 23:59:59 of that day.
    assert out["PRESCRIPTIONS"][3].num_rows == pairs(
        "PRESCRIPTIONS", lambda r: dt.datetime.combine(when(r["STARTDATE"]).date(), dt.time(23, 59, 59)))
    # Outpatient labs reach examples (they are the patient's history).
    assert pc.sum(pc.is_null(out["LABEVENTS"][3]["EVENT_HADM_ID"])).as_py() > 0


def test_demo_diagnoses_only_from_earlier_discharged_admissions(demo):
    _, out, raw_adm = demo
    for name in ("DIAGNOSES_ICD", "PROCEDURES_ICD"):
        kept = out[name][3]
        assert kept.num_rows > 0
        for h, src in zip(kept["HADM_ID"].to_pylist(), kept["EVENT_HADM_ID"].to_pylist()):
            assert src != h
            end = max(filter(None, [when(raw_adm[src]["DISCHTIME"]), when(raw_adm[src]["DEATHTIME"])]))
            assert end < when(raw_adm[h]["ADMITTIME"]) + dt.timedelta(days=1)


def test_codes_with_control_characters_are_dropped_and_counted():
    b = batch("DIAGNOSES_ICD", [
        dict(SUBJECT_ID=1, HADM_ID=10, SEQ_NUM=1, ICD9_CODE="4019"),
        dict(SUBJECT_ID=1, HADM_ID=10, SEQ_NUM=2, ICD9_CODE="40\x0119"),
        dict(SUBJECT_ID=1, HADM_ID=10, SEQ_NUM=3, ICD9_CODE="4\t019"),
    ])
    ev, counts = check_counts(b, events.diagnosis_events(b, {10: T0}))
    assert counts["bad_code"] == 2 and counts["kept"] == 1
    assert [r[3] for r in rows_of(ev)] == ["diagnosis:4019"]
