"""The synthetic MIMIC-III generator: format, realism, determinism and its known truth.

Releases are generated once per module into a temporary directory and read back with
the project's own reader, so every check runs against the files as written.
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import pathlib
import re

import numpy as np
import pandas as pd
import pytest

from ehr_pipeline import reader, schemas
from ehr_pipeline.synth import add_arguments, catalog, generate_release, run
from ehr_pipeline.synth.truth import SECONDS_PER_YEAR, MortalityModel, PreTriggerFeatures

DAY = 86_400
SMALL = dict(patients=120, seed=11, events_scale=0.5, show_progress=False)
# ~2,100 admissions: enough for a calibration check; sparse events keep it fast.
BIG = dict(patients=1500, seed=2024, events_scale=0.2, show_progress=False)


def _read(release: pathlib.Path, table: str, columns=None) -> pd.DataFrame:
    path = reader.locate_table(release, table)
    tab, stats = reader.read_table(path, table, columns=columns)
    assert stats.rows_dead == 0, f"{table}: dead letters {stats.dead_lettered}"
    return tab.to_pandas()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "demo"
    return out, generate_release(out, **SMALL)


@pytest.fixture(scope="module")
def small_physionet(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "physionet"
    return out, generate_release(out, dialect="physionet", gzip=False, **SMALL)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    out = tmp_path_factory.mktemp("synth") / "big"
    summary = generate_release(out, **BIG)
    tables = {t: _read(out, t) for t in ("ADMISSIONS", "PATIENTS", "LABEVENTS", "CHARTEVENTS", "DIAGNOSES_ICD")}
    truth = pd.read_csv(out / "SYNTH_TRUTH.csv")
    return out, summary, tables, truth


def _files(directory: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


# ----------------------------------------------------------------------------- determinism
def test_same_seed_gives_byte_identical_files_and_another_seed_differs(tmp_path):
    args = dict(patients=300, events_scale=0.2, show_progress=False)  # two chunks of patients
    generate_release(tmp_path / "a", seed=5, **args)
    generate_release(tmp_path / "b", seed=5, **args)
    generate_release(tmp_path / "c", seed=6, **args)
    a, b, c = (_files(tmp_path / x) for x in "abc")
    assert len(a) == 15 and a == b
    differing = {n for n in a if a[n] != c[n]}
    assert {"ADMISSIONS.csv.gz", "LABEVENTS.csv.gz", "CHARTEVENTS.csv.gz", "SYNTH_TRUTH.csv"} <= differing
    # Whole chunks do not depend on how many patients follow them.
    generate_release(tmp_path / "d", seed=5, **{**args, "patients": 250})
    for name in ("ADMISSIONS.csv.gz", "CHARTEVENTS.csv.gz"):
        whole, part = (gzip.decompress((tmp_path / x / name).read_bytes()) for x in "ad")
        assert whole.startswith(part) and len(whole) > len(part)


# ----------------------------------------------------------------------------- format
@pytest.mark.parametrize("fixture, suffix", [("small", ".csv.gz"), ("small_physionet", ".csv")])
def test_every_table_is_written_with_its_schema_header(fixture, suffix, request):
    out, summary = request.getfixturevalue(fixture)
    names = {p.name for p in out.iterdir()}
    assert names == {f"{t}{suffix}" for t in schemas.TABLES} | {"SYNTH_TRUTH.csv", "SYNTH_MANIFEST.json"}
    for table, schema in schemas.TABLES.items():
        path = out / f"{table}{suffix}"
        opener = gzip.open if suffix.endswith(".gz") else open
        with opener(path, "rt", newline="") as fh:
            head = fh.readline()
        if fixture == "small":
            assert head == ",".join(f'"{c}"' for c in schema.column_names) + "\n"
        else:
            assert head == ",".join(c.lower() for c in schema.column_names) + "\n"
        assert summary.rows[table] > 0, f"{table} is empty"


_FIELD = re.compile(r'("(?:[^"]|"")*"|[^,"\n]*)(,|\n)')


def _raw_fields(line: str) -> list[str]:
    fields = [m.group(1) for m in _FIELD.finditer(line)]
    assert sum(len(f) + 1 for f in fields) == len(line), f"unparsed text in {line!r}"
    return fields


@pytest.mark.parametrize("fixture", ["small", "small_physionet"])
@pytest.mark.parametrize("table", ["ADMISSIONS", "LABEVENTS", "CHARTEVENTS", "PRESCRIPTIONS", "INPUTEVENTS_MV"])
def test_quoting_follows_the_dialect(fixture, table, request):
    out, _ = request.getfixturevalue(fixture)
    schema = schemas.TABLES[table]
    path = reader.locate_table(out, table)
    opener = gzip.open if path.name.endswith(".gz") else open
    seen_quoted = 0
    with opener(path, "rt", newline="") as fh:
        fh.readline()
        for _, line in zip(range(3000), fh):
            for col, raw in zip(schema.columns, _raw_fields(line), strict=True):
                quoted = raw.startswith('"')
                if col.type is not schemas.ColType.STR or raw == "":
                    assert not quoted, f"{table}.{col.name}: {raw!r} must be bare"
                elif fixture == "small":  # the demo quotes every string
                    assert quoted, f"{table}.{col.name}: {raw!r} must be quoted"
                else:  # PhysioNet quotes only what needs it
                    inner = raw[1:-1].replace('""', '"') if quoted else raw
                    assert quoted == bool(re.search(r'[",\r\n]', inner)), f"{table}.{col.name}: {raw!r}"
                seen_quoted += quoted
    assert fixture == "small_physionet" or seen_quoted > 0


@pytest.mark.parametrize("fixture", ["small", "small_physionet"])
def test_reader_reads_every_row_without_dead_letters(fixture, request):
    out, summary = request.getfixturevalue(fixture)
    manifest = json.loads((out / "SYNTH_MANIFEST.json").read_text())
    for table in schemas.TABLES:
        tab, stats = reader.read_table(reader.locate_table(out, table), table)
        assert stats.dead_lettered == {}, f"{table}: {stats.dead_lettered}"
        assert tab.num_rows == stats.rows_read == summary.rows[table] == manifest["rows"][table]


def test_both_dialects_hold_the_same_data(small, small_physionet):
    for table in ("ADMISSIONS", "CHARTEVENTS", "PRESCRIPTIONS"):
        a = _read(small[0], table)
        b = _read(small_physionet[0], table)
        pd.testing.assert_frame_equal(a, b)


def test_ids_are_unique_consistent_and_rows_ordered_by_patient(small):
    out, _ = small
    adm = _read(out, "ADMISSIONS")
    icu = _read(out, "ICUSTAYS")
    pats = _read(out, "PATIENTS")
    assert adm.HADM_ID.is_unique and icu.ICUSTAY_ID.is_unique and pats.SUBJECT_ID.is_unique
    owner = dict(zip(adm.HADM_ID, adm.SUBJECT_ID))
    assert set(adm.SUBJECT_ID) == set(pats.SUBJECT_ID)
    assert (icu.HADM_ID.map(owner) == icu.SUBJECT_ID).all()
    for table in schemas.TABLES:
        if table.startswith("D_"):
            continue
        df = _read(out, table)
        assert (df.ROW_ID.to_numpy() == np.arange(1, len(df) + 1)).all(), table
        assert df.SUBJECT_ID.is_monotonic_increasing, f"{table} is not ordered by patient"
        if "HADM_ID" in df and table != "ADMISSIONS":
            with_hadm = df[df.HADM_ID.notna()]
            assert (with_hadm.HADM_ID.map(owner) == with_hadm.SUBJECT_ID).all(), table
        if "ICUSTAY_ID" in df and table != "ICUSTAYS":
            assert set(df.ICUSTAY_ID.dropna()) <= set(icu.ICUSTAY_ID), table


def test_every_event_item_is_in_the_dictionaries_with_real_units(small):
    out, _ = small
    d_items = set(_read(out, "D_ITEMS").ITEMID)
    d_lab = set(_read(out, "D_LABITEMS").ITEMID)
    for table in ("CHARTEVENTS", "OUTPUTEVENTS", "INPUTEVENTS_CV", "INPUTEVENTS_MV"):
        assert set(_read(out, table, ["ITEMID"]).ITEMID) <= d_items, table
    labs = _read(out, "LABEVENTS")
    assert set(labs.ITEMID) <= d_lab
    units = labs.groupby("ITEMID").VALUEUOM.agg(lambda s: set(s.dropna()))
    assert units[50813] == {"mmol/L"} and units[50912] == {"mg/dL"} and units[51237] == set()
    charts = _read(out, "CHARTEVENTS")
    assert {211, 220045} <= set(charts.ITEMID)


def test_builtin_catalogue_agrees_with_the_real_dictionaries(demo_dir):
    real = catalog.load_dictionaries(demo_dir)
    for name, rows in (("D_ITEMS", catalog.d_items_rows()), ("D_LABITEMS", catalog.d_labitems_rows())):
        by_id = {r["ITEMID"]: r for r in real[name].to_pylist()}
        for i, itemid in enumerate(rows["ITEMID"]):
            for col, values in rows.items():
                assert by_id[itemid][col] == values[i], f"{name} {itemid} {col}"


def test_dictionary_dir_writes_the_real_dictionaries(tmp_path, demo_dir):
    s = generate_release(tmp_path, patients=5, seed=1, events_scale=0.1, show_progress=False,
                         dictionary_dir=demo_dir)
    real = {t: reader.read_table(reader.locate_table(demo_dir, t), t)[0].num_rows for t in ("D_ITEMS", "D_LABITEMS")}
    assert s.rows["D_ITEMS"] == real["D_ITEMS"] and s.rows["D_LABITEMS"] == real["D_LABITEMS"]


# ----------------------------------------------------------------------------- realism
def test_cohort_edge_cases_are_present(big):
    _, _, t, _ = big
    adm, pats, labs, charts = t["ADMISSIONS"], t["PATIENTS"], t["LABEVENTS"], t["CHARTEVENTS"]
    first = adm.groupby("SUBJECT_ID").ADMITTIME.min()
    age = (first - pats.set_index("SUBJECT_ID").DOB) / SECONDS_PER_YEAR
    assert ((age > 295) & (age < 320)).sum() >= 10, "patients over 89 with DOB shifted ~300 years"
    assert (age < 1).sum() >= 20 and ((age >= 15) & (age < 18)).sum() >= 3, "newborns and teenagers"
    assert (adm.ADMISSION_TYPE == "NEWBORN").sum() == (age < 1).sum()
    per_patient = adm.groupby("SUBJECT_ID").size()
    assert per_patient.max() >= 3 and 1.2 < per_patient.mean() < 2.0
    los = adm.DISCHTIME - adm.ADMITTIME
    assert 0.05 < (los < DAY).mean() < 0.2, "some admissions shorter than 24 h"
    assert labs.HADM_ID.isna().mean() > 0.005, "outpatient labs without HADM_ID"
    assert (charts.ERROR == 1).sum() > 10 and charts.ERROR.isna().any() and (charts.ERROR == 0).any()
    assert labs.VALUENUM.isna().any() and (labs.FLAG == "abnormal").any()
    assert (adm.DEATHTIME > adm.DISCHTIME).sum() >= 3, "a few DEATHTIMEs after DISCHTIME"


def test_deaths_are_consistent_across_tables(big):
    _, _, t, truth = big
    adm, pats = t["ADMISSIONS"], t["PATIENTS"]
    dead = adm.HOSPITAL_EXPIRE_FLAG == 1
    assert (dead == adm.DEATHTIME.notna()).all()
    assert (dead == (adm.DISCHARGE_LOCATION == "DEAD/EXPIRED")).all()
    assert (adm.DEATHTIME[dead] - adm.DISCHTIME[dead]).between(0, 2 * 3600).all()
    p = pats.set_index("SUBJECT_ID")
    died_subjects = adm.SUBJECT_ID[dead]
    assert (p.EXPIRE_FLAG[died_subjects] == 1).all()
    assert (p.DOD[died_subjects].to_numpy() == (adm.DEATHTIME[dead] // DAY * DAY).to_numpy()).all()
    assert (p.EXPIRE_FLAG == p.DOD.notna()).all()
    # Nobody is admitted again after dying in hospital.
    last = adm.groupby("SUBJECT_ID").ADMITTIME.transform("max")
    assert (adm.ADMITTIME[dead] == last[dead]).all()
    assert (truth.DIED.to_numpy() == adm.HOSPITAL_EXPIRE_FLAG.to_numpy()).all()


def test_prescriptions_are_date_only(small):
    rx = _read(small[0], "PRESCRIPTIONS")
    assert len(rx) > 100
    assert (rx.STARTDATE % DAY == 0).all() and (rx.ENDDATE % DAY == 0).all()
    assert (rx.ENDDATE > rx.STARTDATE).all()


def test_no_death_before_the_trigger_and_no_event_after_death(big):
    _, _, t, _ = big
    adm, charts, labs = t["ADMISSIONS"], t["CHARTEVENTS"], t["LABEVENTS"]
    long_stay = (adm.DISCHTIME - adm.ADMITTIME) > DAY
    dead_long = adm[long_stay & adm.DEATHTIME.notna()]
    assert len(dead_long) > 100
    assert (dead_long.DEATHTIME > dead_long.ADMITTIME + DAY).all()
    death = adm.set_index("HADM_ID").DEATHTIME.dropna()
    for ev in (charts, labs):
        last = ev.dropna(subset=["HADM_ID"]).groupby("HADM_ID").CHARTTIME.max()
        assert (last.reindex(death.index).dropna() <= death.reindex(last.index).dropna()).all()


# ----------------------------------------------------------------------------- known truth
def test_truth_file_is_keyed_by_the_admissions(big):
    _, summary, t, truth = big
    assert list(truth.columns) == ["HADM_ID", "SUBJECT_ID", "P_DEATH", "DIED", "SEVERITY"]
    assert truth.HADM_ID.tolist() == t["ADMISSIONS"].HADM_ID.tolist()
    assert truth.SUBJECT_ID.tolist() == t["ADMISSIONS"].SUBJECT_ID.tolist()
    assert truth.P_DEATH.between(0, 1).all() and set(truth.DIED) == {0, 1}
    assert summary.admissions == len(truth) and summary.deaths == truth.DIED.sum()


def test_deaths_follow_the_written_probabilities(big):
    _, summary, t, truth = big
    p, died = truth.P_DEATH.to_numpy(), truth.DIED.to_numpy()
    assert len(p) > 1800
    z = (died.sum() - p.sum()) / math.sqrt((p * (1 - p)).sum())
    assert abs(z) < 4, f"observed {died.sum()} deaths, expected {p.sum():.1f} (z={z:.2f})"
    # Hosmer-Lemeshow over probability deciles; chi2(8) exceeds 26.1 with probability 0.001.
    decile = pd.qcut(p, 10, labels=False, duplicates="drop")
    g = pd.DataFrame({"p": p, "d": died, "g": decile}).groupby("g").agg(n=("p", "size"), e=("p", "sum"), o=("d", "sum"))
    hl = (((g.o - g.e) ** 2) / (g.e * (1 - g.e / g.n))).sum()
    assert hl < 26.1, f"Hosmer-Lemeshow chi2 {hl:.1f}\n{g}"
    adm = t["ADMISSIONS"]
    long_stay = ((adm.DISCHTIME - adm.ADMITTIME) > DAY).to_numpy()
    rate = died[long_stay].mean()
    assert 0.08 <= rate <= 0.16, f"death rate among stays > 24 h {rate:.3f}"
    assert summary.long_deaths == died[long_stay].sum()


def _recomputed_probability(tables: dict[str, pd.DataFrame], trigger_offset: int, scale: float) -> pd.Series:
    """P(death) from the written pre-trigger events alone, by the documented formula."""
    adm = tables["ADMISSIONS"].set_index("HADM_ID")
    trigger = adm.ADMITTIME + trigger_offset

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
        age_years=np.minimum((adm.ADMITTIME - dob.reindex(adm.SUBJECT_ID).to_numpy()) / SECONDS_PER_YEAR, 90.0)
        .to_numpy(),
        prior_admissions=order.to_numpy(dtype=float),
        prior_chronic=np.nan_to_num(by_adm(prior_chronic)),
    )
    return pd.Series(MortalityModel(lab_volume_scale=scale).probability(feats), index=adm.index)


def test_probability_is_a_function_of_pre_trigger_events_only(big):
    _, _, t, truth = big
    p = _recomputed_probability(t, DAY, BIG["events_scale"])
    written = truth.set_index("HADM_ID").P_DEATH.reindex(p.index)
    assert np.allclose(p.to_numpy(), written.to_numpy(), rtol=1e-9, atol=1e-12), \
        f"max |diff| {np.abs(p - written).max():.3g}"
    # ... and it is the events that carry it: high-p admissions had higher lactate.
    labs = t["LABEVENTS"]
    adm = t["ADMISSIONS"].set_index("HADM_ID")
    lac = labs[(labs.ITEMID == catalog.LACTATE_ITEMID) & labs.HADM_ID.notna()]
    lac = lac[lac.CHARTTIME.to_numpy() < (adm.ADMITTIME.reindex(lac.HADM_ID) + DAY).to_numpy()]
    mean_lac = lac.groupby("HADM_ID").VALUENUM.mean()
    q = written.reindex(mean_lac.index)
    high, low = mean_lac[q >= q.quantile(0.75)].mean(), mean_lac[q <= q.quantile(0.25)].mean()
    assert high > 1.5 * low, f"pre-trigger lactate {high:.2f} (top p quartile) vs {low:.2f} (bottom)"
    n_labs = labs[labs.HADM_ID.notna()].groupby("HADM_ID").size().reindex(adm.index, fill_value=0)
    sev = truth.set_index("HADM_ID").SEVERITY
    assert np.corrcoef(sev, written)[0, 1] > 0.4 and np.corrcoef(sev, np.log1p(n_labs))[0, 1] > 0.1


# ----------------------------------------------------------------------------- CLI hook
def test_cli_flags_have_help_with_defaults_and_run_writes_a_release(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for action in parser._actions:
        if action.dest != "help":
            assert action.help and ("default" in action.help or "required" in action.help), action.dest
    out = tmp_path / "rel"
    assert run(parser.parse_args(["--patients", "10", "--seed", "3", "--out", str(out), "--events-scale",
                                  "0.1", "--no-progress"])) == 0
    assert "admissions" in capsys.readouterr().out
    assert (out / "ADMISSIONS.csv.gz").exists()
    # Switching to plain CSV replaces the gzipped tables instead of leaving two copies.
    assert run(parser.parse_args(["--patients", "10", "--seed", "3", "--out", str(out), "--no-gzip",
                                  "--dialect", "physionet", "--events-scale", "0.1", "--no-progress"])) == 0
    assert not list(out.glob("*.gz")) and len(list(out.glob("*.csv"))) == 14
    assert run(parser.parse_args(["--patients", "10", "--out", str(out), "--trigger-offset-seconds", "100"])) == 2
