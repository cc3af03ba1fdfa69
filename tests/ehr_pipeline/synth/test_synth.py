"""The synthetic MIMIC-III generator: format, realism, determinism and its known truth.

Releases are generated once per module into a temporary directory and read back with
the project's own reader, so every check runs against the files as written.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import pathlib
import re

import numpy as np
import pandas as pd
import pytest

from ehr_pipeline import reader
from ehr_pipeline.encode.units import NOT_USED
from ehr_pipeline.contract import output_folder
from ehr_pipeline.contract.output_folder import OutputFolderError
from ehr_pipeline.reader import table_schemas
from ehr_pipeline.synth import SynthConfig, add_arguments, catalog, generate_release, recompute, run
from ehr_pipeline.synth.site import SITES
from ehr_pipeline.synth.truth import SECONDS_PER_YEAR, MortalityModel
from tests.support.synth_records import as_site_a_records
from tests.support.synth_records import read as _read

DAY = 86_400
SMALL = dict(patients=120, seed=11, events_scale=0.5, show_progress=False)
# ~2,100 admissions: enough for a calibration check; sparse events keep it fast.
BIG = dict(patients=1500, seed=2024, events_scale=0.2, show_progress=False)


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
    assert len(a) == 16 and a == b  # 13 tables, the truth, the manifest and the output marker
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
    assert names == {f"{t}{suffix}" for t in table_schemas.TABLES} | {"SYNTH_TRUTH.csv", "SYNTH_MANIFEST.json",
                                                                       output_folder.MARKER}
    for table, schema in table_schemas.TABLES.items():
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
    schema = table_schemas.TABLES[table]
    path = reader.locate_table(out, table)
    opener = gzip.open if path.name.endswith(".gz") else open
    seen_quoted = 0
    with opener(path, "rt", newline="") as fh:
        fh.readline()
        for _, line in zip(range(3000), fh):
            for col, raw in zip(schema.columns, _raw_fields(line), strict=True):
                quoted = raw.startswith('"')
                if col.type is not table_schemas.ColType.STR or raw == "":
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
    for table in table_schemas.TABLES:
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
    for table in table_schemas.TABLES:
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
    hadm_ids, feats = recompute.pre_trigger_features(tables, trigger_offset)
    return pd.Series(MortalityModel(lab_volume_scale=scale).probability(feats), index=hadm_ids)


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
    # A second release into the same folder is refused without --overwrite, and leaves the first whole.
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with pytest.raises(OutputFolderError, match="--overwrite"):
        run(parser.parse_args(["--patients", "10", "--seed", "4", "--out", str(out), "--no-progress"]))
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # Switching to plain CSV replaces the gzipped tables instead of leaving two copies.
    assert run(parser.parse_args(["--patients", "10", "--seed", "3", "--out", str(out), "--no-gzip", "--overwrite",
                                  "--dialect", "physionet", "--events-scale", "0.1", "--no-progress"])) == 0
    assert not list(out.glob("*.gz")) and len(list(out.glob("*.csv"))) == 14
    assert run(parser.parse_args(["--patients", "10", "--out", str(out), "--trigger-offset-seconds", "100"])) == 2


# ----------------------------------------------------------------------------- sites
# Digests (sha256, first 16 hex digits) of a tiny uncompressed site-A release, taken from the
# generator before sites existed: site A must keep writing exactly these bytes. If a change
# to the generator is meant to alter site A's data, update them and say so in the change.
# SYNTH_TRUTH.csv's changed once: P_DEATH is now computed with the C library's log and exp
# (truth.libm), because numpy's rounded the last bit differently on AVX-512 and AVX2 machines.
SITE_A_DIGESTS = {
    "ADMISSIONS.csv": "c1f2dbb2046c0ef6",
    "CHARTEVENTS.csv": "105865bcfc04b77f",
    "DIAGNOSES_ICD.csv": "fc0160ba3ee2badc",
    "D_ITEMS.csv": "dfe26aabf3fecea4",
    "D_LABITEMS.csv": "9d40828529faa8b3",
    "ICUSTAYS.csv": "2b5c5413dd8b0ab8",
    "INPUTEVENTS_CV.csv": "131a3c36ec6d71bb",
    "INPUTEVENTS_MV.csv": "2a2731da32ee130c",
    "LABEVENTS.csv": "dc28566b3f9a40dd",
    "OUTPUTEVENTS.csv": "61d14ab9c05c4256",
    "PATIENTS.csv": "bfe1244432a0015e",
    "PRESCRIPTIONS.csv": "dbb3b0621138c156",
    "PROCEDURES_ICD.csv": "633b33a5c72c5564",
    "SYNTH_TRUTH.csv": "723082f294ccad01",
}
SITES_ARGS = dict(patients=600, seed=5, events_scale=0.2, show_progress=False)
SITE_TABLES = ("ADMISSIONS", "PATIENTS", "ICUSTAYS", "LABEVENTS", "CHARTEVENTS", "PRESCRIPTIONS",
               "DIAGNOSES_ICD", "D_ITEMS", "D_LABITEMS")


# The default truth family, by default and when named: the linear family's releases keep their bytes.
@pytest.mark.parametrize("truth", [{}, {"truth": "linear"}])
def test_site_a_writes_the_bytes_it_always_wrote(tmp_path, truth):
    generate_release(tmp_path, patients=20, seed=1, events_scale=0.1, gzip=False, show_progress=False, **truth)
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest()[:16]
               for p in sorted(tmp_path.iterdir()) if p.name not in ("SYNTH_MANIFEST.json", output_folder.MARKER)}
    assert digests == SITE_A_DIGESTS
    manifest = json.loads((tmp_path / "SYNTH_MANIFEST.json").read_text())
    assert manifest["site"]["name"] == "A" and manifest["site"]["lab_bias"] == {}
    assert manifest["site"]["chart_rate"] == 1.0 and manifest["site"]["id_offset"] == 0
    assert "truth" not in manifest and "truth" not in manifest["site"]  # absent: the linear family, site A's truth


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """The same seed generated at sites A, B and C, read back."""
    out = {}
    for name in ("A", "B", "C"):
        rel = tmp_path_factory.mktemp("site") / name
        summary = generate_release(rel, site=name, **SITES_ARGS)
        tables = {t: _read(rel, t) for t in SITE_TABLES}
        tables["truth"] = pd.read_csv(rel / "SYNTH_TRUTH.csv")
        tables["manifest"] = json.loads((rel / "SYNTH_MANIFEST.json").read_text())
        out[name] = (rel, summary, tables)
    return out


def _first_admission_ages(t: dict) -> pd.Series:
    first = t["ADMISSIONS"].groupby("SUBJECT_ID").ADMITTIME.min()
    return (first - t["PATIENTS"].set_index("SUBJECT_ID").DOB.reindex(first.index)) / SECONDS_PER_YEAR


def test_site_b_admits_older_more_emergent_patients(sites):
    shares = {}
    for name in "AB":
        t = sites[name][2]
        age = _first_admission_ages(t)
        adm = t["ADMISSIONS"]
        adults = adm[adm.ADMISSION_TYPE != "NEWBORN"].ADMISSION_TYPE.value_counts(normalize=True)
        shares[name] = dict(age=age[(age >= 18) & (age < 90)].mean(), newborn=(age < 1).mean(),
                            emergency=adults["EMERGENCY"], elective=adults["ELECTIVE"])
    mix = {n: sites[n][2]["manifest"]["site"]["case_mix"] for n in "AB"}
    for name in "AB":  # the documented shares, within ~3 binomial standard errors
        p_em, p_el, _ = mix[name]["admission_type_p"]
        assert abs(shares[name]["emergency"] - p_em) < 0.045, (name, shares[name])
        assert abs(shares[name]["elective"] - p_el) < 0.04, (name, shares[name])
        assert abs(shares[name]["newborn"] - mix[name]["kind_p"][1]) < 0.03, (name, shares[name])
    # Clipping to 18-89 pulls both means in; the gap stays near the 7 years between the means.
    assert 4.0 < shares["B"]["age"] - shares["A"]["age"] < 10.0, shares
    assert shares["B"]["elective"] < shares["A"]["elective"] - 0.05, shares


def test_site_b_ids_do_not_collide_with_site_a(sites):
    a, b = sites["A"][2], sites["B"][2]
    offset = b["manifest"]["site"]["id_offset"]
    assert offset > 0
    for table, col in (("PATIENTS", "SUBJECT_ID"), ("ADMISSIONS", "HADM_ID"), ("ICUSTAYS", "ICUSTAY_ID")):
        assert not set(a[table][col]) & set(b[table][col]), col
        assert b[table][col].min() == a[table][col].min() + offset, col


def _pre_trigger(df: pd.DataFrame, adm: pd.DataFrame) -> pd.DataFrame:
    """Rows of an admission (HADM_ID set) charted before its trigger (ADMITTIME + 1 day)."""
    df = df.dropna(subset=["HADM_ID"]).astype({"HADM_ID": "int64"})
    trigger = adm.set_index("HADM_ID").ADMITTIME + DAY
    return df[df.CHARTTIME.to_numpy() < trigger.reindex(df.HADM_ID).to_numpy()]


@pytest.mark.parametrize("itemid", [catalog.CREATININE_ITEMID, catalog.LACTATE_ITEMID, 50931, 51006])
def test_site_b_assays_read_high_for_the_same_physiology(sites, itemid):
    # A log-scale lab is ln(value) = centre + shift * severity + noise at both sites: the
    # intercept of ln(VALUENUM) on SEVERITY (the same physiology) moves by ln(bias).
    intercept = {}
    for name in "AB":
        t = sites[name][2]
        labs = _pre_trigger(t["LABEVENTS"], t["ADMISSIONS"])
        labs = labs[(labs.ITEMID == itemid) & labs.VALUENUM.notna()]
        sev = t["truth"].set_index("HADM_ID").SEVERITY.reindex(labs.HADM_ID).to_numpy()
        assert len(labs) > 300, (name, len(labs))
        slope, intercept[name] = np.polyfit(sev, np.log(labs.VALUENUM.to_numpy()), 1)
    bias = sites["B"][2]["manifest"]["site"]["lab_bias"].get(str(itemid), 1.0)
    assert bias != 1.0 or itemid == 51006  # urea nitrogen: the unbiased control
    assert intercept["B"] - intercept["A"] == pytest.approx(math.log(bias), abs=0.05), intercept


def test_site_b_uses_its_own_item_and_drug_codes(sites):
    a, b = sites["A"][2], sites["B"][2]
    site = b["manifest"]["site"]
    for table, dictionary, codes in (("LABEVENTS", "D_LABITEMS", site["lab_codes"]),
                                     ("CHARTEVENTS", "D_ITEMS", site["chart_codes"])):
        old, new = {int(k) for k in codes}, set(codes.values())
        assert len(old) >= 4 and not old & new
        seen_a, seen_b = set(a[table].ITEMID), set(b[table].ITEMID)
        assert new <= seen_b and not new & seen_a, table
        assert not old & seen_b and old <= seen_a, table
        assert seen_b <= set(b[dictionary].ITEMID), f"{table} item missing from {dictionary}"
        # A local code is the same measurement: its dictionary row copies the original's.
        d = b[dictionary].set_index("ITEMID").drop(columns="ROW_ID")
        for k, v in codes.items():
            assert d.loc[v].equals(d.loc[int(k)]), (dictionary, k)
    drugs = site["drug_codes"]
    rx_a, rx_b = set(a["PRESCRIPTIONS"].FORMULARY_DRUG_CD), set(b["PRESCRIPTIONS"].FORMULARY_DRUG_CD)
    local = {v["formulary_drug_cd"] for v in drugs.values()}
    assert local <= rx_b and not local & rx_a and not set(drugs) & rx_b
    names = {v["drug"] for v in drugs.values()}
    assert names <= set(b["PRESCRIPTIONS"].DRUG) and not names & set(a["PRESCRIPTIONS"].DRUG)


def test_site_b_charts_at_its_documented_rate(sites):
    rate = {}
    for name in "AB":
        t = sites[name][2]
        icu_hours = (t["ICUSTAYS"].OUTTIME - t["ICUSTAYS"].INTIME).sum() / 3600
        rate[name] = t["CHARTEVENTS"].ICUSTAY_ID.notna().sum() / icu_hours
        labs_per_hour = len(t["LABEVENTS"]) / ((t["ADMISSIONS"].DISCHTIME - t["ADMISSIONS"].ADMITTIME).sum() / 3600)
        rate[name + "_labs"] = labs_per_hour
    chart_rate = sites["B"][2]["manifest"]["site"]["chart_rate"]
    assert chart_rate == 0.5
    # Vital rounds grow as exp(0.15 severity), and site B is a little sicker: a few % leeway.
    assert rate["B"] / rate["A"] == pytest.approx(chart_rate, rel=0.12), rate
    # Labs are drawn as often as at site A (they grow faster with severity: exp(0.35 s)).
    assert rate["B_labs"] / rate["A_labs"] == pytest.approx(1.0, rel=0.2), rate


def test_site_b_truth_is_the_same_formula_of_the_true_values(sites):
    a, b = sites["A"][2], sites["B"][2]
    assert a["manifest"]["mortality_model"] == b["manifest"]["mortality_model"]
    written = b["truth"].set_index("HADM_ID").P_DEATH
    p = _recomputed_probability(as_site_a_records(b), DAY, SITES_ARGS["events_scale"])
    assert np.allclose(p.to_numpy(), written.reindex(p.index).to_numpy(), rtol=1e-9, atol=1e-12), \
        f"max |diff| {np.abs(p - written.reindex(p.index)).max():.3g}"
    # The recorded values are not the truth's inputs: read as written, lactate and
    # creatinine overstate the risk of the admissions that had them measured.
    naive = _recomputed_probability(b, DAY, SITES_ARGS["events_scale"])
    ratio = naive / written.reindex(naive.index)
    assert (ratio > 1 + 1e-6).mean() > 0.8 and (ratio < 1 - 1e-6).sum() == 0


# Published conversion factors (SI per conventional unit), the textbook numbers the
# catalogue's molar masses must reproduce: creatinine, glucose, BUN -> urea, calcium,
# magnesium, phosphorus, bilirubin, albumin, hemoglobin.
PUBLISHED_SI_FACTORS = {50912: 88.4, 50931: 0.0555, 51006: 0.357, 50893: 0.2495, 50960: 0.4114,
                        50970: 0.3229, 50885: 17.1, 50862: 10.0, 51222: 10.0}


def test_si_factors_come_from_molar_masses_and_match_published_tables():
    assert catalog.molar_mass("C4H7N3O") == pytest.approx(113.12, abs=0.01)  # creatinine
    assert catalog.molar_mass("C6H12O6") == pytest.approx(180.16, abs=0.01)  # glucose
    assert catalog.molar_mass("C33H36N4O6") == pytest.approx(584.7, abs=0.05)  # bilirubin
    with pytest.raises(ValueError, match="not a molecular formula"):
        catalog.molar_mass("C4h7")
    factors = {itemid: factor for itemid, _, factor, _ in catalog.SI_LAB_UNITS}
    assert set(factors) == set(PUBLISHED_SI_FACTORS)
    for itemid, published in PUBLISHED_SI_FACTORS.items():
        assert factors[itemid] == pytest.approx(published, rel=1e-3), itemid


def test_site_c_writes_its_analytes_in_si_units_and_the_rest_as_site_a(sites):
    a, c = sites["A"][2], sites["C"][2]
    units = {int(k): v for k, v in c["manifest"]["site"]["lab_units"].items()}
    assert {i: u["unit"] for i, u in units.items()} == {i: u for i, u, _, _ in catalog.SI_LAB_UNITS}
    seen_a = a["LABEVENTS"].dropna(subset=["VALUENUM"]).groupby("ITEMID").VALUEUOM.unique()
    seen_c = c["LABEVENTS"].dropna(subset=["VALUENUM"]).groupby("ITEMID").VALUEUOM.unique()
    assert set(seen_a.index) == set(seen_c.index)
    for itemid in seen_a.index:
        expected = [units[itemid]["unit"]] if itemid in units else list(seen_a[itemid])
        assert list(seen_c[itemid]) == expected, itemid
    # Same case mix, charting and codes as site A; its own patients and ids.
    site_a, site_c = a["manifest"]["site"], c["manifest"]["site"]
    assert site_c["case_mix"] == site_a["case_mix"] and site_c["chart_rate"] == site_a["chart_rate"]
    assert not site_c["lab_bias"] and not site_c["lab_codes"] and not site_c["chart_codes"]
    assert set(c["LABEVENTS"].ITEMID) == set(a["LABEVENTS"].ITEMID)
    for other in "AB":
        assert not set(c["ADMISSIONS"].HADM_ID) & set(sites[other][2]["ADMISSIONS"].HADM_ID)
    assert c["ADMISSIONS"].HADM_ID.min() == a["ADMISSIONS"].HADM_ID.min() + site_c["id_offset"]


def test_site_c_values_are_the_site_a_values_converted_and_rounded_as_si_labs_report(sites):
    c = sites["C"][2]
    labs = c["LABEVENTS"].dropna(subset=["VALUENUM"])
    items = {i.itemid: i for i in catalog.LAB_ITEMS}
    for itemid, unit in c["manifest"]["site"]["lab_units"].items():
        item, factor, decimals = items[int(itemid)], unit["factor"], unit["decimals"]
        v = labs.VALUENUM[labs.ITEMID == int(itemid)].to_numpy()
        assert len(v) > 100, itemid
        assert np.array_equal(v, np.round(v, decimals)), itemid  # the SI lab's decimals
        # Back on the site-A grid (the item's decimals, within its clip range) ...
        back = np.round(v / factor, item.decimals)
        assert back.min() >= item.lo - 10.0 ** -item.decimals and back.max() <= item.hi + 10.0 ** -item.decimals
        # ... and where an SI step is finer than half a site-A step, exactly invertible: the
        # site-A value converted again gives the recorded one (glucose, 0.1 mmol/L = 1.8 mg/dL, is not).
        if 10.0 ** -decimals / factor < 10.0 ** -item.decimals:
            assert np.array_equal(np.round(back * factor, decimals), v), itemid


# Items on every arrival panel (bilirubin's 0.1 mg/dL steps at site A distort its log mean).
@pytest.mark.parametrize("itemid", [catalog.CREATININE_ITEMID, 50931, 51006])
def test_site_c_reports_the_same_physiology_scaled_by_the_unit_factor(sites, itemid):
    # As for site B's bias: ln(value) on SEVERITY moves its intercept by ln(factor).
    intercept = {}
    for name in "AC":
        t = sites[name][2]
        labs = _pre_trigger(t["LABEVENTS"], t["ADMISSIONS"])
        labs = labs[(labs.ITEMID == itemid) & labs.VALUENUM.notna()]
        sev = t["truth"].set_index("HADM_ID").SEVERITY.reindex(labs.HADM_ID).to_numpy()
        _, intercept[name] = np.polyfit(sev, np.log(labs.VALUENUM.to_numpy()), 1)
    factor = sites["C"][2]["manifest"]["site"]["lab_units"][str(itemid)]["factor"]
    assert intercept["C"] - intercept["A"] == pytest.approx(math.log(factor), abs=0.05), intercept


def test_site_c_truth_is_the_site_a_formula_of_the_values_converted_back(sites):
    a, c = sites["A"][2], sites["C"][2]
    assert a["manifest"]["mortality_model"] == c["manifest"]["mortality_model"]
    written = c["truth"].set_index("HADM_ID").P_DEATH
    p = _recomputed_probability(as_site_a_records(c), DAY, SITES_ARGS["events_scale"])
    assert np.allclose(p.to_numpy(), written.reindex(p.index).to_numpy(), rtol=1e-9, atol=1e-12), \
        f"max |diff| {np.abs(p - written.reindex(p.index)).max():.3g}"
    # Creatinine in umol/L read as if it were mg/dL: the formula's ln(creatinine) term adds
    # 0.8 ln(88.4) ~ 3.6 to every logit with a creatinine before the trigger.
    naive = _recomputed_probability(c, DAY, SITES_ARGS["events_scale"])
    assert (naive / written.reindex(naive.index) > 2).mean() > 0.8


@pytest.mark.parametrize("site_name", ["B", "C"])
def test_beam_job_runs_on_another_sites_release(tmp_path, site_name):
    from ehr_pipeline.contract import PipelineConfig
    from ehr_pipeline.job import run_job

    release = tmp_path / "release"
    generate_release(release, patients=60, seed=3, events_scale=0.2, show_progress=False, site=site_name)
    manifest = run_job(str(release), str(tmp_path / "data"),
                       PipelineConfig.model_validate({"num_shards": {"train": 1, "validation": 1, "test": 1},
                                                      "vocab": {"min_count": 1}}))
    assert manifest["balanced"]
    assert sum(s["examples"] for s in manifest["splits"].values()) > 40
    # No value is set aside for its unit: the job reads every unit the generator writes.
    assert {s: {o: n for o, n in v.items() if o in NOT_USED and n} for s, v in manifest["units"]["values"].items()} \
        == {s: {} for s in manifest["units"]["values"]}
    vocab = json.loads((tmp_path / "data" / "vocabulary.json").read_text())["sources"]
    site = json.loads((release / "SYNTH_MANIFEST.json").read_text())["site"]
    assert {f"lab:{v}" for v in site["lab_codes"].values()} <= set(vocab["lab"])
    assert {f"chart:{v}" for v in site["chart_codes"].values()} <= set(vocab["chart"])
    # The job records the unit each lab's values came in: site C's SI units, as written.
    units = json.loads((tmp_path / "data" / "units.json").read_text())["codes"]
    for itemid, unit in site.get("lab_units", {}).items():
        assert set(units[f"lab:{itemid}"]) == {unit["unit"]}, itemid


def test_site_is_a_validated_cli_flag(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--patients", "5", "--out", str(tmp_path), "--site", "Z"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="site must be one of"):
        SynthConfig(patients=5, seed=0, site="Z")
    help_text = " ".join(parser.format_help().split())
    for name in SITES:  # every site is offered, each with its one-line description
        assert f"{name}: " in help_text
    for name in ("B", "C"):
        assert run(parser.parse_args(["--patients", "5", "--out", str(tmp_path), "--site", name, "--events-scale",
                                      "0.1", "--no-progress", "--overwrite"])) == 0
        assert json.loads((tmp_path / "SYNTH_MANIFEST.json").read_text())["site"]["name"] == name


# ----------------------------------------------------------------------------- planted subgroup


def test_a_planted_subgroup_dies_by_the_reversed_physiology(tmp_path):
    """--plant-subgroup URGENT: URGENT admissions' P_DEATH counts the physiology terms PLANTED_FACTOR times."""
    from ehr_pipeline.synth.truth import PLANTED_FACTOR, PLANTED_TERMS

    args = dict(patients=250, seed=4, events_scale=0.2, show_progress=False)
    generate_release(tmp_path / "planted", plant_subgroup="URGENT", **args)
    planted = pd.read_csv(tmp_path / "planted" / "SYNTH_TRUTH.csv")
    tables = {t: _read(tmp_path / "planted", t) for t in recompute.TABLES}
    # Recomputed from the written tables by the documented rule, as a matrix product (not the generator's loop).
    ids, feats = recompute.pre_trigger_features(tables, DAY)
    model = MortalityModel(lab_volume_scale=args["events_scale"])
    weights = np.where(np.isin(MortalityModel.TERMS, PLANTED_TERMS), PLANTED_FACTOR, 1.0)
    logit = model.intercept + model.design(feats) @ model.coefficients()
    logit_planted = model.intercept + model.design(feats) @ (model.coefficients() * weights)
    urgent = tables["ADMISSIONS"].set_index("HADM_ID").ADMISSION_TYPE.reindex(ids).eq("URGENT").to_numpy()
    assert 0 < urgent.sum() < urgent.size
    expected = pd.Series(1.0 / (1.0 + np.exp(-np.where(urgent, logit_planted, logit))), index=ids)
    np.testing.assert_allclose(expected.reindex(planted.HADM_ID), planted.P_DEATH, atol=1e-9)
    # The plant is real: the population's formula misses URGENT admissions by a wide margin.
    unplanted = pd.Series(1.0 / (1.0 + np.exp(-logit)), index=ids).reindex(planted.HADM_ID).to_numpy()
    written = planted.P_DEATH.to_numpy()
    mask = pd.Series(urgent, index=ids).reindex(planted.HADM_ID).to_numpy()
    assert np.mean(np.abs(unplanted - written)[mask]) > 0.05
    manifest = json.loads((tmp_path / "planted" / "SYNTH_MANIFEST.json").read_text())
    assert manifest["planted_subgroup"] == {"admission_type": "URGENT", "terms": list(PLANTED_TERMS),
                                            "factor": PLANTED_FACTOR}
