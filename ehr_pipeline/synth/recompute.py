"""The truth's inputs recomputed from a written release's tables alone (pandas).

The generator computes P_DEATH from the events before it writes them; this module reads the
written tables back and recomputes the same ``PreTriggerFeatures`` by the documented formula
(docs/synthetic.md). Tests use it to prove P_DEATH is a function of pre-trigger events only,
and bench/methods/compare_methods.py to fit the well-specified logistic model (the truth's own
design, coefficients learned) that bounds what any model can reach at a training-set size.
``trajectory_features`` does the same for the temporal family's trajectory terms.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from ehr_pipeline import reader
from ehr_pipeline.synth import catalog
from ehr_pipeline.synth.temporal import COURSE_WINDOW_DAYS, TrajectoryFeatures
from ehr_pipeline.synth.truth import AGE_CAP_YEARS, SECONDS_PER_YEAR, PreTriggerFeatures

DAY = 86_400

# The tables the features are read from.
TABLES = ("ADMISSIONS", "PATIENTS", "LABEVENTS", "CHARTEVENTS", "DIAGNOSES_ICD")


def pre_trigger_features(tables: dict[str, pd.DataFrame], trigger_offset_seconds: int
                         ) -> tuple[pd.Index, PreTriggerFeatures]:
    """(HADM_IDs in ADMISSIONS order, their features) from typed TABLES (times in seconds since 1970)."""
    adm = tables["ADMISSIONS"].set_index("HADM_ID")
    trigger = adm.ADMITTIME + trigger_offset_seconds

    def pre(df: pd.DataFrame) -> pd.DataFrame:
        df = df.dropna(subset=["HADM_ID"]).astype({"HADM_ID": "int64"})
        return df[df.CHARTTIME.to_numpy() < trigger.reindex(df.HADM_ID).to_numpy()]

    labs = pre(tables["LABEVENTS"])
    charts = pre(tables["CHARTEVENTS"])
    charts = charts[(charts.ERROR != 1) & charts.VALUENUM.notna()]
    lab_num = labs[labs.VALUENUM.notna()]
    dob = tables["PATIENTS"].set_index("SUBJECT_ID").DOB
    order = adm.groupby("SUBJECT_ID").ADMITTIME.rank(method="first") - 1
    dx = tables["DIAGNOSES_ICD"]
    chronic = dx[dx.ICD9_CODE.isin(catalog.CHRONIC_DX)].merge(adm[["ADMITTIME"]], left_on="HADM_ID",
                                                             right_index=True)
    pairs = adm.reset_index()[["HADM_ID", "SUBJECT_ID", "ADMITTIME"]].merge(
        chronic[["SUBJECT_ID", "ADMITTIME", "ICD9_CODE"]], on="SUBJECT_ID", suffixes=("", "_dx"))
    prior_chronic = pairs[pairs.ADMITTIME_dx < pairs.ADMITTIME].groupby("HADM_ID").ICD9_CODE.nunique()

    def by_adm(s: pd.Series) -> np.ndarray:
        return s.reindex(adm.index).to_numpy(dtype=float)

    feats = PreTriggerFeatures(
        lactate_mean=by_adm(lab_num[lab_num.ITEMID == catalog.LACTATE_ITEMID].groupby("HADM_ID").VALUENUM.mean()),
        creatinine_max=by_adm(lab_num[lab_num.ITEMID == catalog.CREATININE_ITEMID].groupby("HADM_ID").VALUENUM.max()),
        hr_mean=by_adm(charts[charts.ITEMID.isin(catalog.HR_ITEMIDS)].groupby("HADM_ID").VALUENUM.mean()),
        sbp_min=by_adm(charts[charts.ITEMID.isin(catalog.SBP_ITEMIDS)].groupby("HADM_ID").VALUENUM.min()),
        n_labs=np.nan_to_num(by_adm(labs.groupby("HADM_ID").size())),
        age_years=np.minimum((adm.ADMITTIME - dob.reindex(adm.SUBJECT_ID).to_numpy()) / SECONDS_PER_YEAR,
                             AGE_CAP_YEARS).to_numpy(),
        prior_admissions=order.to_numpy(dtype=float),
        prior_chronic=np.nan_to_num(by_adm(prior_chronic)),
    )
    return adm.index, feats


def trajectory_features(tables: dict[str, pd.DataFrame]) -> tuple[pd.Index, TrajectoryFeatures]:
    """(HADM_IDs in ADMISSIONS order, the temporal family's trajectory inputs) from typed TABLES.

    The course: numeric creatinine rows without HADM_ID of the same patient in the
    COURSE_WINDOW_DAYS before ADMITTIME; its trend is the least-squares slope of ln(value) on
    days, per week. The gap: days from the patient's previous DISCHTIME to this ADMITTIME.
    """
    adm = tables["ADMISSIONS"].set_index("HADM_ID")
    labs = tables["LABEVENTS"]
    cre = labs[labs.HADM_ID.isna() & (labs.ITEMID == catalog.CREATININE_ITEMID) & labs.VALUENUM.notna()]
    pairs = adm.reset_index()[["HADM_ID", "SUBJECT_ID", "ADMITTIME"]].merge(
        cre[["SUBJECT_ID", "CHARTTIME", "VALUENUM"]], on="SUBJECT_ID")
    before = pairs.ADMITTIME - pairs.CHARTTIME
    pairs = pairs[(before > 0) & (before <= COURSE_WINDOW_DAYS * DAY)].assign(
        x=lambda d: (d.CHARTTIME - d.ADMITTIME) / DAY, y=lambda d: np.log(d.VALUENUM))
    centred = pairs.assign(dx=pairs.x - pairs.groupby("HADM_ID").x.transform("mean"),
                           dy=pairs.y - pairs.groupby("HADM_ID").y.transform("mean"))
    sums = centred.assign(sxx=centred.dx ** 2, sxy=centred.dx * centred.dy).groupby("HADM_ID")[["sxx", "sxy"]].sum()
    trend = (sums.sxy / sums.sxx.where(sums.sxx > 0)) * 7.0
    ordered = adm.reset_index().sort_values(["SUBJECT_ID", "ADMITTIME"])
    gap = (ordered.ADMITTIME - ordered.groupby("SUBJECT_ID").DISCHTIME.shift()) / DAY
    gap = gap.set_axis(ordered.HADM_ID).reindex(adm.index)
    feats = TrajectoryFeatures(creatinine_trend=trend.reindex(adm.index).to_numpy(dtype=float),
                               discharge_gap_days=gap.to_numpy(dtype=float))
    return adm.index, feats


def read_tables(release) -> dict[str, pd.DataFrame]:
    """TABLES of a release as typed pandas frames, through the project's reader (a dead letter is an error)."""
    out = {}
    for table in TABLES:
        frame, stats = reader.read_table(reader.locate_table(release, table), table)
        if stats.rows_dead:
            raise ValueError(f"{release}: {table} has {stats.rows_dead} dead-lettered rows")
        out[table] = frame.to_pandas()
    return out
