"""`ehr-pipeline synth-counterfactual`: the course reversed, nothing else changed, and the truth's change
equal to the documented formula computed here from the written tables (numpy's polyfit, not recompute)."""
from __future__ import annotations

import gzip
import json

import numpy as np
import pandas as pd
import pytest

from ehr_pipeline.cli.main import main as pipeline_main
from ehr_pipeline.synth import catalog, generate_release
from ehr_pipeline.synth.counterfactual import COUNTERFACTUAL_FILE, CounterfactualError, make_counterfactual
from tests.support.synth_records import read

DAY = 86_400


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("counterfactual")
    generate_release(base / "original", patients=300, seed=41, events_scale=0.2, truth="temporal",
                     show_progress=False)
    assert pipeline_main(["synth-counterfactual", "--release", str(base / "original"), "--change",
                          "reverse-course", "--out", str(base / "reversed")]) == 0
    return base / "original", base / "reversed"


def _lines(path) -> list[str]:
    with gzip.open(path, "rt") as f:
        return f.read().splitlines()


def _course(release) -> pd.DataFrame:
    """Each single-admission patient's numeric course creatinine (no HADM_ID, <= 28 days before ADMITTIME)."""
    adm = read(release, "ADMISSIONS")
    single = adm[adm.SUBJECT_ID.map(adm.SUBJECT_ID.value_counts()).eq(1)]
    labs = read(release, "LABEVENTS")
    cre = labs[labs.HADM_ID.isna() & labs.ITEMID.eq(catalog.CREATININE_ITEMID) & labs.VALUENUM.notna()]
    rows = cre.merge(single[["SUBJECT_ID", "HADM_ID", "ADMITTIME"]], on="SUBJECT_ID", suffixes=("_lab", ""))
    before = rows.ADMITTIME - rows.CHARTTIME
    return rows[(before > 0) & (before <= 28 * DAY)].sort_values(["HADM_ID", "CHARTTIME"])


def test_only_the_course_results_change_order_and_every_other_byte_stays(pair):
    original, reversed_ = pair
    for path in original.iterdir():
        if path.name not in ("LABEVENTS.csv.gz", "SYNTH_TRUTH.csv", "SYNTH_MANIFEST.json", "ehr_output.json"):
            assert path.read_bytes() == (reversed_ / path.name).read_bytes(), path.name
    before, after = _lines(original / "LABEVENTS.csv.gz"), _lines(reversed_ / "LABEVENTS.csv.gz")
    assert len(before) == len(after) and sorted(before) != sorted(after)
    a, b = _course(original), _course(reversed_)
    assert a.ROW_ID.tolist() == b.ROW_ID.tolist()  # the same rows (times, items, owners) ...
    for (_, x), (_, y) in zip(a.groupby("HADM_ID"), b.groupby("HADM_ID")):
        assert y.VALUE.tolist() == x.VALUE.tolist()[::-1]  # ... with their results in reverse order
        assert y.FLAG.tolist() == x.FLAG.tolist()[::-1]
    changed_rows = {int(line.split(",")[0]) for line, old in zip(after[1:], before[1:]) if line != old}
    assert changed_rows and changed_rows <= set(a.ROW_ID)
    # The same values overall: the vocabulary and every statistic the job computes stay.
    labs_a, labs_b = read(original, "LABEVENTS"), read(reversed_, "LABEVENTS")
    key = ["ITEMID", "VALUE", "VALUEUOM", "FLAG"]
    assert labs_a[key].fillna("").value_counts().equals(labs_b[key].fillna("").value_counts())


def test_the_truth_moves_by_the_trend_coefficient_times_the_change_of_the_course_slope(pair):
    original, reversed_ = pair
    cf = pd.read_csv(reversed_ / COUNTERFACTUAL_FILE).set_index("HADM_ID")
    truth = pd.read_csv(original / "SYNTH_TRUTH.csv").set_index("HADM_ID")
    new_truth = pd.read_csv(reversed_ / "SYNTH_TRUTH.csv").set_index("HADM_ID")
    np.testing.assert_allclose(cf.P_DEATH_BEFORE, truth.P_DEATH.reindex(cf.index), rtol=1e-9, atol=1e-12)
    np.testing.assert_array_equal(cf.P_DEATH_AFTER, new_truth.P_DEATH.reindex(cf.index))
    assert (new_truth.DIED == truth.DIED).all()

    def slope(course):  # per week, the documented trend: OLS of ln(creatinine) on days (NaN for one visit)
        def ols(g):
            x, y = (g.CHARTTIME - g.ADMITTIME).to_numpy() / DAY, np.log(g.VALUENUM.to_numpy())
            dx = x - x.mean()
            return 7.0 * (dx @ (y - y.mean())) / (dx @ dx) if len(g) > 1 else np.nan
        return course.groupby("HADM_ID").apply(ols)

    change = (slope(_course(reversed_)) - slope(_course(original))).reindex(cf.index).fillna(0.0)
    coefficient = json.loads((reversed_ / "SYNTH_MANIFEST.json").read_text())["truth"]["trajectory"]["creatinine_trend"]
    np.testing.assert_allclose(cf.LOGIT_AFTER - cf.LOGIT_BEFORE, coefficient * change, atol=1e-9)
    assert cf.CHANGED.sum() == (change.abs() > 0).sum() > 50
    # Reversal flips the trend's sign for evenly spaced visits; it does on average here.
    moved = cf[cf.CHANGED == 1]
    assert np.corrcoef(moved.LOGIT_AFTER - moved.LOGIT_BEFORE, moved.LOGIT_BEFORE)[0, 1] < 0
    manifest = json.loads((reversed_ / "SYNTH_MANIFEST.json").read_text())
    assert manifest["counterfactual"]["change"] == "reverse-course"
    assert manifest["counterfactual"]["admissions_changed"] == int(cf.CHANGED.sum())


def test_a_counterfactual_is_refused_for_a_linear_release_or_a_counterfactual(pair, tmp_path):
    original, reversed_ = pair
    with pytest.raises(CounterfactualError, match="already a counterfactual"):
        make_counterfactual(reversed_, tmp_path / "again", "reverse-course")
    generate_release(tmp_path / "linear", patients=20, seed=1, events_scale=0.2, show_progress=False)
    with pytest.raises(CounterfactualError, match="not temporal"):
        make_counterfactual(tmp_path / "linear", tmp_path / "out", "reverse-course")
    assert not (tmp_path / "out").exists()


def test_a_rerun_writes_the_same_bytes_over_its_own_output(pair):
    original, reversed_ = pair
    before = {f.name: f.read_bytes() for f in sorted(reversed_.iterdir()) if f.is_file()}
    assert pipeline_main(["synth-counterfactual", "--release", str(original), "--change", "reverse-course",
                          "--out", str(reversed_), "--overwrite"]) == 0
    assert {f.name: f.read_bytes() for f in sorted(reversed_.iterdir()) if f.is_file()} == before


@pytest.fixture(scope="module")
def delayed(pair):
    original, _ = pair
    out = original.parent / "delayed"
    assert pipeline_main(["synth-counterfactual", "--release", str(original), "--change", "delay-readmission",
                          "--days", "180", "--out", str(out)]) == 0
    return original, out


def test_each_readmission_moves_180_days_later_with_all_its_rows(delayed):
    original, out = delayed
    a, b = read(original, "ADMISSIONS"), read(out, "ADMISSIONS")
    k = a.groupby("SUBJECT_ID").ADMITTIME.rank(method="first").to_numpy() - 1
    shift = (k * 180 * DAY).astype(np.int64)
    for column in ("ADMITTIME", "DISCHTIME"):
        np.testing.assert_array_equal(b[column].to_numpy() - a[column].to_numpy(), shift)
    by_hadm = dict(zip(a.HADM_ID, shift))
    for table in ("LABEVENTS", "CHARTEVENTS", "ICUSTAYS"):
        x, y = read(original, table), read(out, table)
        time = "INTIME" if table == "ICUSTAYS" else "CHARTTIME"
        assert len(x) == len(y)
        moved = y[time].to_numpy() - x[time].to_numpy()
        with_hadm = x.HADM_ID.notna().to_numpy()
        np.testing.assert_array_equal(moved[with_hadm], x.HADM_ID[with_hadm].astype(int).map(by_hadm).to_numpy())
    np.testing.assert_array_equal(read(original, "PATIENTS").DOB, read(out, "PATIENTS").DOB)
    assert (pd.read_csv(out / "SYNTH_TRUTH.csv").DIED == pd.read_csv(original / "SYNTH_TRUTH.csv").DIED).all()


def test_the_truth_moves_by_the_readmission_term_and_the_age_term(delayed):
    original, out = delayed
    cf = pd.read_csv(out / COUNTERFACTUAL_FILE).set_index("HADM_ID")
    manifest = json.loads((out / "SYNTH_MANIFEST.json").read_text())
    adm = read(original, "ADMISSIONS").sort_values(["SUBJECT_ID", "ADMITTIME"])
    gap = ((adm.ADMITTIME - adm.groupby("SUBJECT_ID").DISCHTIME.shift()) / DAY).set_axis(adm.HADM_ID)
    k = adm.groupby("SUBJECT_ID").cumcount().set_axis(adm.HADM_ID)
    dob = read(original, "PATIENTS").set_index("SUBJECT_ID").DOB.reindex(adm.SUBJECT_ID).to_numpy()
    year = 365.2425 * DAY
    age = pd.Series((adm.ADMITTIME.to_numpy() - dob) / year, index=adm.HADM_ID)
    age_after = age + k * 180 * DAY / year
    readmission = manifest["truth"]["trajectory"]["readmission"] * np.log(gap / (gap + 180)).fillna(0.0)
    ageing = manifest["mortality_model"]["age"] * (np.minimum(age_after, 90) - np.minimum(age, 90))
    expected = (readmission + ageing).reindex(cf.index)
    np.testing.assert_allclose(cf.LOGIT_AFTER - cf.LOGIT_BEFORE, expected, atol=1e-9)
    assert cf.CHANGED.sum() == (k > 0).sum() > 30
    assert (cf.LOGIT_AFTER - cf.LOGIT_BEFORE)[cf.CHANGED == 1].max() < 0  # a later readmission is a safer one
    assert manifest["counterfactual"] == {**manifest["counterfactual"], "change": "delay-readmission", "days": 180}
