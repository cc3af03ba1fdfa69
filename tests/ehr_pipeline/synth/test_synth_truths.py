"""The generator's other truths: the temporal family (``--truth temporal``) and sites D and E.

Releases are generated once per module and read back with the project's reader. P_DEATH is
recomputed from the written tables by the formulas of docs/synthetic.md, as matrix products of
the manifest's coefficients. That is another computation than the generator's term-by-term sums,
on other inputs: the tables, not the generator's arrays.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from ehr_pipeline.contract import BaggingConfig, PipelineConfig, spec, tfrecord
from ehr_pipeline.encode import bagging, seqex
from ehr_pipeline.job import run_job
from ehr_pipeline.synth import SynthConfig, add_arguments, catalog, generate_release, recompute, run
from ehr_pipeline.synth.site import SITES
from ehr_pipeline.synth.truth import PLANTED_FACTOR, PLANTED_TERMS, MortalityModel
from tests.support.synth_records import as_site_a_records, read

DAY = 86_400
TEMPORAL = dict(patients=1500, seed=35, events_scale=0.2, truth="temporal", show_progress=False)
SITES_ARGS = dict(patients=2000, seed=34, events_scale=0.2, show_progress=False)


def _release(path, **kwargs) -> dict:
    generate_release(path, **kwargs)
    out = {t: read(path, t) for t in recompute.TABLES}
    out["truth"] = pd.read_csv(path / "SYNTH_TRUTH.csv").set_index("HADM_ID")
    out["manifest"] = json.loads((path / "SYNTH_MANIFEST.json").read_text())
    return out


@pytest.fixture(scope="module")
def temporal(tmp_path_factory):
    return _release(tmp_path_factory.mktemp("temporal") / "A", **TEMPORAL)


@pytest.fixture(scope="module")
def sites(tmp_path_factory):
    """The same seed at site A and at the two sites whose truth differs."""
    return {name: _release(tmp_path_factory.mktemp("site") / name, site=name, **SITES_ARGS) for name in "ADE"}


def _linear_logit(t: dict, manifest: dict) -> tuple[pd.Index, np.ndarray, object]:
    """(HADM_IDs, the linear logit by the manifest's coefficients, the features) from the tables."""
    ids, feats = recompute.pre_trigger_features(t, manifest["trigger_offset_seconds"])
    m = manifest["mortality_model"]
    coef = np.array([m[term] for term in MortalityModel.TERMS])
    design = MortalityModel(lab_volume_scale=m["lab_volume_scale"]).design(feats)
    return ids, design, coef


def _trajectory_terms(t: dict, manifest: dict, ids: pd.Index) -> np.ndarray:
    """[N, 2]: the trend and readmission terms by the documented definitions (0 where undefined)."""
    traj_ids, feats = recompute.trajectory_features(t)
    assert traj_ids.equals(ids)
    ref = manifest["truth"]["trajectory"]["reference_gap_days"]
    gap = feats.discharge_gap_days
    assert np.nanmin(gap) >= 30.0, "a readmission comes at least 30 days after the previous discharge"
    return np.column_stack([np.nan_to_num(feats.creatinine_trend), np.where(np.isnan(gap), 0.0, np.log(ref / gap))])


def _temporal_probability(t: dict, planted: np.ndarray | None = None) -> pd.Series:
    manifest = t["manifest"]
    ids, design, coef = _linear_logit(t, manifest)
    if planted is not None:  # [N, terms]: the planted admissions' physiology counts PLANTED_FACTOR times
        weights = np.where(np.isin(MortalityModel.TERMS, PLANTED_TERMS), PLANTED_FACTOR, 1.0)
        coef = np.where(planted[:, None], coef * weights, coef)
    linear = manifest["mortality_model"]["intercept"] + (design * coef).sum(axis=1)
    traj = manifest["truth"]["trajectory"]
    logit = linear + _trajectory_terms(t, manifest, ids) @ np.array([traj["creatinine_trend"], traj["readmission"]])
    return pd.Series(1.0 / (1.0 + np.exp(-logit)), index=ids)


def _adult_stays_reaching_the_trigger(t: dict, ids: pd.Index) -> np.ndarray:
    adm = t["ADMISSIONS"].set_index("HADM_ID").reindex(ids)
    dob = t["PATIENTS"].set_index("SUBJECT_ID").DOB.reindex(adm.SUBJECT_ID).to_numpy()
    age = (adm.ADMITTIME.to_numpy() - dob) / (365.2425 * DAY)
    return ((adm.DISCHTIME - adm.ADMITTIME).to_numpy() > DAY) & (age >= 18)


def _assert_matches(recomputed: pd.Series, written: pd.Series) -> None:
    written = written.reindex(recomputed.index)
    assert np.allclose(recomputed.to_numpy(), written.to_numpy(), rtol=1e-9, atol=1e-12), \
        f"max |diff| {np.abs(recomputed - written).max():.3g}"


# ----------------------------------------------------------------------------- the temporal family
def test_temporal_truth_is_the_documented_formula_of_the_written_tables(temporal):
    manifest = temporal["manifest"]
    assert manifest["truth"]["family"] == "temporal"
    assert set(manifest["truth"]) == {"family", "trajectory", "clinic_course"}
    _assert_matches(_temporal_probability(temporal), temporal["truth"].P_DEATH)
    # The linear part alone (the same coefficients, trajectory terms dropped) misses by a wide margin:
    ids, design, coef = _linear_logit(temporal, manifest)
    linear = pd.Series(1 / (1 + np.exp(-(manifest["mortality_model"]["intercept"] + design @ coef))), index=ids)
    assert np.mean(np.abs(linear - temporal["truth"].P_DEATH.reindex(ids))) > 0.05


def test_trajectory_terms_carry_most_of_the_signal_and_are_defined_for_most_admissions(temporal):
    manifest = temporal["manifest"]
    ids, design, coef = _linear_logit(temporal, manifest)
    traj = _trajectory_terms(temporal, manifest, ids)
    cohort = _adult_stays_reaching_the_trigger(temporal, ids)
    t = manifest["truth"]["trajectory"]
    trajectory_part = (traj @ np.array([t["creatinine_trend"], t["readmission"]]))[cohort]
    linear_part = (design @ coef)[cohort]
    share = trajectory_part.var() / (trajectory_part.var() + linear_part.var())
    print(f"{cohort.sum()} adult stays reaching the trigger: var(trajectory part) {trajectory_part.var():.2f}, "
          f"var(linear part) {linear_part.var():.2f}, share {share:.2f}")
    assert share > 0.5, share
    assert abs(np.corrcoef(trajectory_part, linear_part)[0, 1]) < 0.1
    _, feats = recompute.trajectory_features(temporal)
    assert 0.65 < np.isfinite(feats.creatinine_trend[cohort]).mean() < 0.9  # the course: 80% of admissions
    assert 0.2 < np.isfinite(feats.discharge_gap_days[cohort]).mean() < 0.45  # readmissions
    rate = temporal["truth"].DIED.reindex(ids)[cohort].mean()
    assert 0.08 < rate < 0.17, f"share of deaths among adult stays reaching the trigger {rate:.3f}"


def _per_code_aggregates(t: dict, ids: pd.Index) -> pd.DataFrame:
    """Per admission: count, mean, min, max and newest value of every lab and chart code before the trigger."""
    adm = t["ADMISSIONS"].set_index("HADM_ID")
    frames = []
    for table in ("LABEVENTS", "CHARTEVENTS"):
        ev = t[table].dropna(subset=["HADM_ID", "VALUENUM"]).astype({"HADM_ID": "int64"})
        ev = ev[ev.CHARTTIME.to_numpy() < (adm.ADMITTIME.reindex(ev.HADM_ID) + DAY).to_numpy()]
        g = ev.sort_values("CHARTTIME", kind="stable").groupby(["HADM_ID", "ITEMID"]).VALUENUM
        agg = pd.concat({"count": g.size(), "mean": g.mean(), "min": g.min(), "max": g.max(), "last": g.last()}, axis=1)
        wide = agg.unstack("ITEMID")
        wide.columns = [f"{table}:{stat}:{itemid}" for stat, itemid in wide.columns]
        frames.append(wide)
    return pd.concat(frames, axis=1).reindex(ids)


def test_trajectory_terms_are_nearly_uncorrelated_with_every_first_day_aggregate(temporal):
    manifest = temporal["manifest"]
    ids, design, coef = _linear_logit(temporal, manifest)
    aggs = _per_code_aggregates(temporal, ids)
    aggs = aggs.loc[:, aggs.notna().mean() > 0.5]  # codes most admissions have
    traj = pd.DataFrame(_trajectory_terms(temporal, manifest, ids), index=ids)
    r = aggs.corrwith(traj[0]).abs().max(), aggs.corrwith(traj[1]).abs().max()
    print(f"{len(ids)} admissions, {aggs.shape[1]} first-day aggregates: largest |r| with the trend {r[0]:.3f}, "
          f"with the readmission term {r[1]:.3f}")
    # ~2,000 admissions and ~100 columns: chance alone gives a largest |r| of about 0.08.
    assert max(r) < 0.15, r
    # The check can fail: the linear part of the same truth is carried by these aggregates.
    assert aggs.corrwith(pd.Series(design @ coef, index=ids)).abs().max() > 0.4


def test_each_course_value_gets_a_bag_of_its_own_older_than_the_48h_window(temporal):
    adm = temporal["ADMISSIONS"]
    labs = temporal["LABEVENTS"]
    course = labs[labs.HADM_ID.isna()].merge(adm[["SUBJECT_ID", "HADM_ID", "ADMITTIME"]].rename(
        columns={"HADM_ID": "ADM"}), on="SUBJECT_ID")
    course = course[(course.CHARTTIME < course.ADMITTIME) & (course.CHARTTIME >= course.ADMITTIME - 28 * DAY)]
    assert course.groupby("ADM").CHARTTIME.nunique().between(2, 4).all()
    visit_times = course.drop_duplicates(["ADM", "CHARTTIME"]).sort_values(["ADM", "CHARTTIME"])
    gaps = visit_times.groupby("ADM").CHARTTIME.diff()
    assert gaps.dropna().min() >= 2 * DAY + 16 * 3600, "visits are more than one 1-day bag apart"
    current = labs.dropna(subset=["HADM_ID"]).astype({"HADM_ID": "int64"})
    admit_of = adm.set_index("HADM_ID").ADMITTIME
    creatinine = f"lab:{catalog.CREATININE_ITEMID}"
    seen = 0
    for hadm, visits in list(course.groupby("ADM"))[:300]:
        admit = int(admit_of[hadm])
        # the admission's labs between ADMITTIME and the trigger (ED draws before ADMITTIME aside)
        own = current[(current.HADM_ID == hadm) & (current.CHARTTIME > admit) & (current.CHARTTIME < admit + DAY)]
        times = np.concatenate([visits.CHARTTIME.to_numpy(), own.CHARTTIME.to_numpy()]).astype(np.int64)
        codes = np.array([f"lab:{i}" for i in (*visits.ITEMID, *own.ITEMID)])
        values = np.concatenate([visits.VALUENUM.to_numpy(), own.VALUENUM.to_numpy()])
        bags = bagging.bag_events(times, codes, values, admit + DAY, BaggingConfig())
        n_course = visits.CHARTTIME.nunique()
        assert bags.num_bags == n_course + int(len(own) > 0), hadm
        assert (bags.offset_seconds[:n_course] > 48 * 3600).all()
        kept = []
        for i in range(n_course):
            entry = bags.bag_slice(i).start + np.flatnonzero(bags.codes[bags.bag_slice(i)] == creatinine)
            kept += [bags.value_mean[e] for e in entry if bags.value_count[e] == 1]
        cre = visits[(visits.ITEMID == catalog.CREATININE_ITEMID) & visits.VALUENUM.notna()]
        assert sorted(kept) == sorted(cre.VALUENUM), "every course creatinine survives as its own bag's value"
        seen += 1
    assert seen >= 200


def _records(data_dir, split: str):
    """The serialized examples of one split of a job's output."""
    for path in sorted(data_dir.glob(spec.split_file_pattern(split))):
        with open(path, "rb") as fh:
            yield from tfrecord.read_records(fh)


def test_the_beam_job_keeps_what_the_trajectory_terms_read(tmp_path):
    """Through the real job: each course creatinine is a bag of its own with its value, and the newest
    bag holding the previous admission's diagnoses lies at the previous discharge (within a day)."""
    # 250 patients: the job's local runner takes ~20 s; fewer leave too few readmissions to count.
    release = tmp_path / "release"
    t = _release(release, **{**TEMPORAL, "patients": 250})
    # The sources the checks read: labs (the course), diagnoses and the prescriptions that may share their bag;
    # a bag is set by its events' own times, so the other sources' events change none of these bags.
    run_job(str(release), str(tmp_path / "data"), PipelineConfig.model_validate(
        {"num_shards": {"train": 1, "validation": 1, "test": 1}, "vocab": {"min_count": 1},
         "sources": ["lab", "diagnosis", "prescription"]}))
    _, feats = recompute.trajectory_features(t)
    ids = t["ADMISSIONS"].HADM_ID.to_numpy()
    gap = dict(zip(ids, feats.discharge_gap_days))
    labs = t["LABEVENTS"]
    course = labs[labs.HADM_ID.isna() & (labs.ITEMID == catalog.CREATININE_ITEMID) & labs.VALUENUM.notna()].merge(
        t["ADMISSIONS"][["SUBJECT_ID", "HADM_ID", "ADMITTIME"]].rename(columns={"HADM_ID": "ADM"}), on="SUBJECT_ID")
    course = course[(course.CHARTTIME < course.ADMITTIME) & (course.CHARTTIME >= course.ADMITTIME - 28 * DAY)]
    values = course.groupby("ADM").VALUENUM.apply(sorted).to_dict()
    creatinine = f"lab:{catalog.CREATININE_ITEMID}"
    n_course = n_readmissions = 0
    for split in ("train", "validation", "test"):
        for record in _records(tmp_path / "data", split):
            ex = seqex.sequence_example_to_dict(record)
            offsets, admit_offset = np.array(ex["bag_offset_seconds"]), ex["admit_offset_seconds"]
            in_course = (offsets > 48 * 3600) & (offsets <= admit_offset + 28 * DAY)
            kept = sorted(ex["value_mean"][k][ex["codes"][k].index(creatinine)] for k in np.flatnonzero(in_course)
                          if creatinine in ex["codes"][k] and ex["value_count"][k][ex["codes"][k].index(creatinine)] == 1)
            assert np.allclose(kept, values.get(ex["hadm_id"], []), rtol=1e-6), ex["hadm_id"]  # float32 in the proto
            n_course += bool(kept)
            if np.isfinite(gap[ex["hadm_id"]]):
                older = [k for k in np.flatnonzero(offsets > admit_offset + 28 * DAY)
                         if any(c.startswith("diagnosis:") for c in ex["codes"][k])]
                # Its newest event is the discharge, or a prescription of that day known at its end;
                # float32 offsets round by up to 32 s at ten years (docs/spec.md).
                lag = admit_offset + gap[ex["hadm_id"]] * DAY - offsets[max(older)]
                assert older and -64 <= lag < DAY, (ex["hadm_id"], lag)
                n_readmissions += 1
    assert n_course > 100 and n_readmissions > 30, (n_course, n_readmissions)


def test_temporal_release_is_deterministic_and_shares_the_linear_release_s_people_and_course(tmp_path):
    args = dict(patients=250, seed=8, events_scale=0.2, show_progress=False)
    generate_release(tmp_path / "t1", truth="temporal", **args)
    generate_release(tmp_path / "t2", truth="temporal", **args)
    assert all((tmp_path / "t1" / p.name).read_bytes() == p.read_bytes() for p in (tmp_path / "t2").iterdir())
    generate_release(tmp_path / "lin", **args)
    generate_release(tmp_path / "dense", truth="temporal", **{**args, "events_scale": 0.6})
    lin, tem, dense = ({t: read(tmp_path / x, t) for t in ("PATIENTS", "ADMISSIONS", "LABEVENTS")}
                       for x in ("lin", "t1", "dense"))
    pd.testing.assert_series_equal(lin["PATIENTS"].DOB, tem["PATIENTS"].DOB)
    first = {k: v["ADMISSIONS"].groupby("SUBJECT_ID").ADMITTIME.min() for k, v in (("lin", lin), ("tem", tem))}
    pd.testing.assert_series_equal(first["lin"], first["tem"])
    assert "truth" not in json.loads((tmp_path / "lin" / "SYNTH_MANIFEST.json").read_text())

    def course(t):  # outpatient labs of each subject's first admission
        labs = t["LABEVENTS"][t["LABEVENTS"].HADM_ID.isna()]
        admit = labs.SUBJECT_ID.map(t["ADMISSIONS"].groupby("SUBJECT_ID").ADMITTIME.min())
        rows = labs[(labs.CHARTTIME < admit) & (labs.CHARTTIME >= admit - 28 * DAY)]
        return rows[["SUBJECT_ID", "CHARTTIME", "ITEMID", "VALUENUM"]].reset_index(drop=True)

    # The course comes from a stream of its own: the same whatever --events-scale draws elsewhere.
    assert len(course(tem)) > 500
    pd.testing.assert_frame_equal(course(tem), course(dense))


def test_temporal_truth_with_site_b_a_planted_subgroup_and_the_physionet_dialect(tmp_path):
    t = _release(tmp_path / "b", site="B", plant_subgroup="URGENT", dialect="physionet", gzip=False, **TEMPORAL)
    assert t["manifest"]["planted_subgroup"]["admission_type"] == "URGENT"
    records = as_site_a_records(t)
    ids, _ = recompute.pre_trigger_features(records, DAY)
    urgent = t["ADMISSIONS"].set_index("HADM_ID").ADMISSION_TYPE.reindex(ids).eq("URGENT").to_numpy()
    assert 0 < urgent.sum() < urgent.size
    _assert_matches(_temporal_probability(records, planted=urgent), t["truth"].P_DEATH)
    # The recorded (biased) values are not the truth's inputs.
    assert not np.allclose(_temporal_probability(t, planted=urgent).to_numpy(),
                           t["truth"].P_DEATH.reindex(ids).to_numpy(), rtol=1e-9, atol=1e-12)


def test_temporal_truth_at_a_site_whose_truth_differs(tmp_path):
    t = _release(tmp_path / "e", site="E", **{**TEMPORAL, "patients": 400})
    # The site's factors apply to the temporal family's linear part (0.7 of site A's strength).
    assert t["manifest"]["mortality_model"]["age"] == pytest.approx(0.7 * 0.03 * 2.0, abs=1e-12)
    assert t["manifest"]["truth"]["trajectory"]["creatinine_trend"] == 10.0
    _assert_matches(_temporal_probability(t), t["truth"].P_DEATH)


# ----------------------------------------------------------------------------- sites D and E
def test_sites_d_and_e_record_as_site_a_and_state_their_truth_in_the_manifest(sites):
    a = sites["A"]["manifest"]
    assert "truth" not in a["site"]
    for name, t in sites.items():
        site = t["manifest"]["site"]
        assert site["case_mix"] == a["site"]["case_mix"] and site["chart_rate"] == a["site"]["chart_rate"]
        assert not site["lab_bias"] and not site["lab_codes"] and not site["chart_codes"] and "lab_units" not in site
        if name == "A":
            continue
        shift, factors = site["truth"]["intercept_shift"], site["truth"]["coefficient_factors"]
        model = t["manifest"]["mortality_model"]
        assert model["intercept"] == pytest.approx(a["mortality_model"]["intercept"] + shift, abs=1e-12)
        for term in MortalityModel.TERMS:
            assert model[term] == pytest.approx(a["mortality_model"][term] * factors.get(term, 1.0), abs=1e-12), term
        assert t["ADMISSIONS"].HADM_ID.min() == sites["A"]["ADMISSIONS"].HADM_ID.min() + site["id_offset"]
    assert sites["D"]["manifest"]["site"]["truth"] == {"intercept_shift": math.log(2.0), "coefficient_factors": {}}


def test_a_site_truth_must_name_terms_of_the_model():
    with pytest.raises(ValueError, match=r"site Z: truth_factors name unknown terms \['lactose'\]"):
        dataclasses.replace(SITES["E"], name="Z", truth_factors=(("lactose", 0.5),))


@pytest.mark.parametrize("name", ["D", "E"])
def test_a_site_s_truth_is_its_own_formula_of_the_written_tables(sites, name):
    t = sites[name]
    ids, design, coef = _linear_logit(t, t["manifest"])
    recomputed = pd.Series(1 / (1 + np.exp(-(t["manifest"]["mortality_model"]["intercept"] + design @ coef))), index=ids)
    _assert_matches(recomputed, t["truth"].P_DEATH)


def _site_a_logit_and_truth(t: dict, site_a_manifest: dict):
    """(site A's logit of each adult stay reaching the trigger, the site's P_DEATH, its DIED, its design)."""
    ids, design, coef = _linear_logit(t, site_a_manifest)
    cohort = _adult_stays_reaching_the_trigger(t, ids)
    truth = t["truth"].reindex(ids)
    logit_a = site_a_manifest["mortality_model"]["intercept"] + design @ coef
    return logit_a[cohort], truth.P_DEATH.to_numpy()[cohort], truth.DIED.to_numpy()[cohort], design[cohort]


def _fit(x: np.ndarray, y: np.ndarray, offset: np.ndarray | None) -> np.ndarray:
    """Maximum-likelihood logistic coefficients of [1, x] (plus a fixed offset), by Newton's method."""
    design = np.column_stack([np.ones(len(y)), x])
    offset = np.zeros(len(y)) if offset is None else offset
    w = np.zeros(design.shape[1])
    for _ in range(50):
        p = 1 / (1 + np.exp(-(offset + design @ w)))
        step = np.linalg.solve(design.T @ (design * (p * (1 - p))[:, None]) + 1e-8 * np.eye(len(w)),
                               design.T @ (y - p))
        w += step
        if np.abs(step).max() < 1e-10:
            break
    return w


def test_the_updating_ladder_finds_site_d_with_an_intercept_and_site_e_only_by_revision(sites):
    site_a = sites["A"]["manifest"]
    logit_a, p_d, _, _ = _site_a_logit_and_truth(sites["D"], site_a)
    np.testing.assert_allclose(np.log(p_d / (1 - p_d)) - logit_a, math.log(2.0), atol=1e-9)
    logit_a, p_e, died_e, design = _site_a_logit_and_truth(sites["E"], site_a)
    slope, intercept = np.polyfit(logit_a, np.log(p_e / (1 - p_e)), 1)
    residual = np.log(p_e / (1 - p_e)) - (intercept + slope * logit_a)
    print(f"site E, {len(p_e)} adult stays reaching the trigger: logit_E = {intercept:+.3f} + {slope:.3f} logit_A, "
          f"residual SD {residual.std():.3f}")
    assert residual.std() > 0.4, "no intercept and slope on site A's logit gives site E's"
    # On local outcomes (half the stays to fit, the other half to score against P_DEATH):
    half = len(died_e) // 2
    fit, test = slice(0, half), slice(half, None)

    def error(logit):
        return np.mean(np.abs(1 / (1 + np.exp(-logit[test])) - p_e[test]))

    none = error(logit_a)
    in_the_large = error(logit_a + _fit(np.zeros((half, 0)), died_e[fit], logit_a[fit])[0])
    a, b = _fit(logit_a[fit, None], died_e[fit], None)
    recalibrated = error(a + b * logit_a)
    w = _fit(design[fit], died_e[fit], None)
    revision = error(w[0] + design @ w[1:])
    print(f"site E, {half} local outcomes: abs(p - P) none {none:.4f}, intercept {in_the_large:.4f}, "
          f"intercept + slope {recalibrated:.4f}, revision {revision:.4f}")
    assert in_the_large > 0.85 * none, "a new intercept does not find site E's shift"
    assert recalibrated > 0.75 * none, "nor does an intercept and a slope"
    assert revision < 0.75 * recalibrated, "refitting the coefficients does"


# ----------------------------------------------------------------------------- CLI
def test_truth_is_a_validated_cli_flag_that_combines_with_the_sites(tmp_path, capsys):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(["--patients", "5", "--out", str(tmp_path), "--truth", "quadratic"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(ValueError, match="truth must be one of"):
        SynthConfig(patients=5, seed=0, truth="quadratic")
    help_text = " ".join(parser.format_help().split())
    assert "--truth {linear,temporal}" in help_text and "(default: linear)" in help_text
    assert all(f"{name}: " in help_text for name in "DE")
    assert run(parser.parse_args(["--patients", "30", "--out", str(tmp_path), "--truth", "temporal", "--site", "E",
                                  "--events-scale", "0.1", "--no-progress"])) == 0
    manifest = json.loads((tmp_path / "SYNTH_MANIFEST.json").read_text())
    assert manifest["truth"]["family"] == "temporal" and manifest["site"]["truth"]["intercept_shift"] == 0.7
