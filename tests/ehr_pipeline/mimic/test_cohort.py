"""Cohort: who is kept, the label, every exclusion counted once, and the real demo against a hand count."""
import csv
import datetime as dt
import gzip

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from ehr_pipeline.contract import spec
from ehr_pipeline.mimic import cohort
from ehr_pipeline.reader import TableReader, locate_table
from tests.support.arrow_rows import batch

DAY = 86400
T0 = 5_000_000_000  # an admission time in the shifted MIMIC era (year 2128), seconds


def secs(text: str) -> int:
    """'YYYY-MM-DD[ HH:MM:SS]' (UTC) -> seconds since 1970, by the standard library."""
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp())




def adm(subject, hadm, admit, disch, death=None, flag=None, kind="EMERGENCY"):
    flag = (1 if death is not None else 0) if flag is None else flag
    return dict(SUBJECT_ID=subject, HADM_ID=hadm, ADMITTIME=admit, DISCHTIME=disch, DEATHTIME=death,
                ADMISSION_TYPE=kind, HOSPITAL_EXPIRE_FLAG=flag)


def pat(subject, dob, gender="F"):
    return dict(SUBJECT_ID=subject, GENDER=gender, DOB=dob)


ADULT = T0 - 50 * 365 * DAY


def build(adm_rows, pat_rows, **kw):
    return cohort.build_cohort(batch("ADMISSIONS", adm_rows), batch("PATIENTS", pat_rows), **kw)


def test_each_reason_counted_once_and_counts_sum_to_rows():
    born_18 = secs("2110-03-01")  # 18th birthday on 2128-03-01
    adms = [
        adm(1, 100, T0, T0 + 5 * DAY),  # kept, survivor
        adm(2, 200, T0, T0 + 5 * DAY, death=T0 + 3 * DAY),  # kept, death after trigger
        adm(3, 300, T0, T0 + 5 * DAY), adm(3, 300, T0, T0 + 6 * DAY),  # duplicate_hadm_id x2
        adm(4, 400, T0, T0 + 5 * DAY),  # no_patient_record
        adm(5, 500, T0, T0 + 5 * DAY),  # duplicate_patient_record
        adm(6, 600, T0, T0 + 5 * DAY),  # admitted_before_birth
        adm(7, 700, T0, T0 + 5 * DAY),  # under_age
        adm(8, 800, T0, T0 + 5 * DAY, death=T0 + DAY),  # died_before_trigger (exactly at it)
        adm(9, 900, T0, T0 + DAY),  # discharged_before_trigger (exactly at it)
        adm(10, 1000, T0, None),  # missing_required
        adm(11, 1100, secs("2128-03-01"), secs("2128-03-09")),  # kept: 18 today
        adm(12, 1200, secs("2128-02-29"), secs("2128-03-09")),  # under_age: 18 tomorrow
    ]
    pats = [pat(s, ADULT) for s in (1, 2, 3, 5, 5, 8, 9, 10)] + [
        pat(6, T0 + DAY), pat(7, T0 - 10 * 365 * DAY), pat(11, born_18), pat(12, born_18)]
    got = build(adms, pats)
    assert got.counts == {
        "kept": 3, "missing_required": 1, "duplicate_hadm_id": 2, "no_patient_record": 1,
        "duplicate_patient_record": 1, "admitted_before_birth": 1, "under_age": 2,
        "died_before_trigger": 1, "discharged_before_trigger": 1,
    }
    assert sum(got.counts.values()) == len(adms)
    assert got.table.column("HADM_ID").to_pylist() == [100, 200, 1100]
    assert got.table.column("label").to_pylist() == [0, 1, 0]
    assert got.table.column("age_years").to_pylist()[2] == 18.0
    assert got.table.schema == cohort.COHORT_SCHEMA


def test_trigger_boundaries_and_offset():
    adms = [
        adm(1, 1, T0, T0 + 9 * DAY, death=T0 + DAY),  # death at trigger: excluded
        adm(2, 2, T0, T0 + 9 * DAY, death=T0 + DAY + 1),  # one second later: label 1
        adm(3, 3, T0, T0 + DAY),  # discharged at trigger: excluded
        adm(4, 4, T0, T0 + DAY + 1),  # one second later: kept, label 0
    ]
    pats = [pat(s, ADULT) for s in (1, 2, 3, 4)]
    got = build(adms, pats)
    assert dict(zip(got.table["HADM_ID"].to_pylist(), got.table["label"].to_pylist())) == {2: 1, 4: 0}
    assert got.table["trigger_time"].to_pylist() == [T0 + DAY, T0 + DAY]
    # With a 0-second offset everyone is alive and in hospital at the trigger.
    got0 = build(adms, pats, trigger_offset_seconds=0)
    assert got0.counts["kept"] == 4 and got0.table["trigger_time"].to_pylist() == [T0] * 4
    assert got0.table["label"].to_pylist() == [1, 1, 0, 0]
    got2 = build(adms, pats, trigger_offset_seconds=2 * DAY)
    assert got2.counts["kept"] == 0 and got2.counts["died_before_trigger"] == 2


def test_death_signals_and_death_after_discharge():
    adms = [
        # Flag without DEATHTIME: died at discharge, after the trigger -> label 1.
        adm(1, 1, T0, T0 + 4 * DAY, death=None, flag=1),
        # DEATHTIME without flag still counts as death.
        adm(2, 2, T0, T0 + 4 * DAY, death=T0 + 4 * DAY, flag=0),
        # Like demo 129273 but sharper: discharged BEFORE the trigger, died after it.
        adm(3, 3, T0, T0 + DAY // 2, death=T0 + 3 * DAY, flag=1),
        # Flag with a discharge before the trigger: died before it.
        adm(4, 4, T0, T0 + DAY // 2, death=None, flag=1),
    ]
    got = build(adms, [pat(s, ADULT) for s in (1, 2, 3, 4)])
    assert dict(zip(got.table["HADM_ID"].to_pylist(), got.table["label"].to_pylist())) == {1: 1, 2: 1, 3: 1}
    assert got.counts["died_before_trigger"] == 1
    # Admission 3's own codes are placed at its death, after its trigger: they cannot leak back.
    disch = dict(zip(got.discharges["HADM_ID"].to_pylist(), got.discharges["DISCHTIME"].to_pylist()))
    assert disch[3] == T0 + 3 * DAY > T0 + DAY
    assert got.table.filter(pc.equal(got.table["HADM_ID"], 3))["DISCHTIME"].to_pylist() == [T0 + DAY // 2]


def test_prior_admissions_include_excluded_ones_and_only_before_the_trigger():
    adms = [
        adm(1, 10, T0, T0 + DAY // 2),  # excluded (discharged before trigger) but still history
        adm(1, 11, T0 + 10 * DAY, T0 + 15 * DAY),
        adm(1, 12, T0 + 15 * DAY + 3600, T0 + 20 * DAY),  # readmitted 1 h after 11's discharge
        adm(2, 20, T0, T0 + 5 * DAY),
    ]
    got = build(adms, [pat(1, ADULT), pat(2, ADULT, "M")])
    rows = {r["HADM_ID"]: r for r in got.table.to_pylist()}
    assert rows[11]["prior_hadm_ids"] == [10] and rows[11]["prior_dischtimes"] == [T0 + DAY // 2]
    assert rows[12]["prior_hadm_ids"] == [10, 11]
    assert rows[20]["prior_hadm_ids"] == [] and rows[20]["gender"] == "M"
    assert got.discharges.num_rows == 4


def test_accepts_table_batch_and_batch_iterables_alike():
    adms = [adm(1, 1, T0, T0 + 3 * DAY), adm(2, 2, T0, T0 + 3 * DAY, death=T0 + 2 * DAY)]
    pats = [pat(1, ADULT), pat(2, ADULT)]
    a, p = batch("ADMISSIONS", adms), batch("PATIENTS", pats)
    one = cohort.build_cohort(a, p)
    many = cohort.build_cohort([a.slice(0, 1), a.slice(1)], iter([p.slice(0, 1), p.slice(1)]))
    table = cohort.build_cohort(pa.Table.from_batches([a]), pa.Table.from_batches([p]))
    assert one.table.equals(many.table) and one.table.equals(table.table)
    assert one.counts == many.counts == table.counts


# --- the real demo -------------------------------------------------------------------------

def demo_table(demo_dir, name: str, columns=None) -> pa.Table:
    """A demo table as the job reads it: reader.TableReader's typed blocks (times int64 s)."""
    return pa.Table.from_batches(list(TableReader(locate_table(demo_dir, name), name, columns)))


def hand_cohort(demo_dir) -> dict[int, int]:
    """HADM_ID -> label from the raw CSVs with csv/datetime only (no project code, no Arrow)."""
    def rows(name):
        with gzip.open(demo_dir / f"{name}.csv.gz", "rt", newline="") as f:
            return list(csv.DictReader(f))

    def when(text):
        return dt.datetime.fromisoformat(text) if text else None

    dob = {int(p["SUBJECT_ID"]): when(p["DOB"]) for p in rows("PATIENTS")}
    kept = {}
    for a in rows("ADMISSIONS"):
        admit, disch, death = when(a["ADMITTIME"]), when(a["DISCHTIME"]), when(a["DEATHTIME"])
        b = dob[int(a["SUBJECT_ID"])]
        years = admit.year - b.year - ((admit.month, admit.day, admit.time()) < (b.month, b.day, b.time()))
        if years < 18:
            continue
        trigger = admit + dt.timedelta(days=1)
        died = death is not None or a["HOSPITAL_EXPIRE_FLAG"] == "1"
        death_at = death or disch
        if died and death_at <= trigger:
            continue
        if not died and disch <= trigger:
            continue
        kept[int(a["HADM_ID"])] = int(died)
    return kept


@pytest.fixture(scope="module")
def demo_cohort(demo_dir):
    # Straight from the reader's block iterators, only the columns the cohort declares it reads.
    return cohort.build_cohort(
        TableReader(locate_table(demo_dir, "ADMISSIONS"), "ADMISSIONS", cohort.ADMISSION_COLUMNS),
        TableReader(locate_table(demo_dir, "PATIENTS"), "PATIENTS", cohort.PATIENT_COLUMNS))


def test_demo_cohort_equals_hand_count(demo_dir, demo_cohort):
    expected = hand_cohort(demo_dir)
    got = dict(zip(demo_cohort.table["HADM_ID"].to_pylist(), demo_cohort.table["label"].to_pylist()))
    assert got == expected


def test_demo_counts_as_documented(demo_cohort):
    # These numbers are quoted in docs/task.md; change both together.
    assert demo_cohort.counts == {
        "kept": 117, "missing_required": 0, "duplicate_hadm_id": 0, "no_patient_record": 0,
        "duplicate_patient_record": 0, "admitted_before_birth": 0, "under_age": 1,
        "died_before_trigger": 9, "discharged_before_trigger": 2,
    }
    assert sum(demo_cohort.counts.values()) == 129
    assert sum(demo_cohort.table["label"].to_pylist()) == 31  # 40 deaths - 9 before the trigger
    assert demo_cohort.discharges.num_rows == 129


def test_demo_shifted_dobs_and_death_after_discharge(demo_dir, demo_cohort):
    adm, pats = demo_table(demo_dir, "ADMISSIONS"), demo_table(demo_dir, "PATIENTS")
    dob = dict(zip(pats["SUBJECT_ID"].to_pylist(), pats["DOB"].to_pylist()))
    raw_years = {h: (t - dob[s]) / (365.25 * DAY) for s, h, t in
                 zip(adm["SUBJECT_ID"].to_pylist(), adm["HADM_ID"].to_pylist(), adm["ADMITTIME"].to_pylist())}
    shifted = {h for h, y in raw_years.items() if y > 200}
    assert len(shifted) == 9  # PROVENANCE.md
    rows = {r["HADM_ID"]: r for r in demo_cohort.table.to_pylist()}
    kept_shifted = shifted & rows.keys()
    assert len(kept_shifted) == 7 and all(rows[h]["age_years"] == 90.0 for h in kept_shifted)
    assert 159647 not in rows  # discharged alive exactly at the trigger (24 h): excluded
    assert max(r["age_years"] for r in rows.values()) == 90.0
    assert rows[129273]["label"] == 1  # DEATHTIME after DISCHTIME: kept, died after the trigger
    # Subjects with several admissions: the prior lists agree with the admissions table.
    multi = [r for r in rows.values() if r["prior_hadm_ids"]]
    assert multi
    disch = dict(zip(demo_cohort.discharges["HADM_ID"].to_pylist(), demo_cohort.discharges["DISCHTIME"].to_pylist()))
    subj = dict(zip(adm["HADM_ID"].to_pylist(), adm["SUBJECT_ID"].to_pylist()))
    for r in rows.values():
        want = sorted(h for h, s in subj.items() if s == r["SUBJECT_ID"] and h != r["HADM_ID"]
                      and disch[h] < r["trigger_time"])
        assert sorted(r["prior_hadm_ids"]) == want
        assert np.all(np.diff(r["prior_dischtimes"]) >= 0)


def test_ethnicity_and_insurance_are_carried_as_written_and_unrecorded_when_null():
    rows = [dict(adm(1, 11, T0, T0 + 3 * DAY), ETHNICITY=" WHITE - RUSSIAN ", INSURANCE="Medicare"),
            dict(adm(2, 21, T0, T0 + 3 * DAY), ETHNICITY=None, INSURANCE="")]
    c = build(rows, [pat(1, ADULT), pat(2, ADULT)])
    assert c.table.column("ethnicity").to_pylist() == ["WHITE - RUSSIAN", spec.NOT_RECORDED]
    assert c.table.column("insurance").to_pylist() == ["Medicare", spec.NOT_RECORDED]
    # Tables without the columns (an ADMISSIONS rebuilt from FHIR) give NOT_RECORDED for every row.
    without = build([adm(1, 11, T0, T0 + 3 * DAY)], [pat(1, ADULT)])
    assert without.table.column("ethnicity").to_pylist() == [spec.NOT_RECORDED]


def test_previous_discharge_of_each_admission_and_the_stays_skipped():
    # Subject 1: three admissions (40 and 30 days apart); subject 2: its second stay has no DISCHTIME,
    # and its fourth begins before the third ends; subject 3: one admission.
    adms = [adm(1, 10, T0, T0 + 5 * DAY), adm(1, 11, T0 + 40 * DAY, T0 + 45 * DAY, kind="ELECTIVE"),
            adm(1, 12, T0 + 75 * DAY, T0 + 80 * DAY + 3600),
            adm(2, 20, T0, T0 + 3 * DAY), adm(2, 21, T0 + 50 * DAY, None),
            adm(2, 22, T0 + 100 * DAY, T0 + 110 * DAY), adm(2, 23, T0 + 105 * DAY, T0 + 120 * DAY),
            adm(3, 30, T0, T0 + 4 * DAY)]
    coh = build(adms, [pat(s, ADULT) for s in (1, 2, 3)])
    rows = {r["HADM_ID"]: r for r in coh.table.to_pylist()}
    none = spec.NO_PREVIOUS_DISCHARGE
    # trigger (admit + 1 day) minus the previous discharge
    assert {h: r["previous_discharge_seconds"] for h, r in rows.items()} == {
        10: none, 11: 36 * DAY, 12: 31 * DAY, 20: none,
        22: 98 * DAY,  # 21 has no DISCHTIME (excluded, missing_required): 20's discharge is the previous one
        23: 103 * DAY,  # 22 ends after 23 began: skipped too
        30: none}
    assert coh.previous_discharge_counts == {"with_previous_discharge": 4, "without_previous_discharge": 3,
                                             "earlier_stay_without_discharge": 2,
                                             "earlier_stay_discharged_after_admit": 1}
