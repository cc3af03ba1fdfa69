"""The shift statistics (ehr_pipeline.shift.population, shift_stats, shift) against independent computations.

Admissions are summarised from parsed SequenceExamples by a plain loop; the chi-square test is
checked against scipy's contingency test, Holm against its textbook loop, PSI against its
formula; comparisons are run on populations drawn with a known difference.
"""
from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ehr_pipeline import shift
from ehr_pipeline.contract import spec
from ehr_pipeline.encode import seqex, units
from ehr_pipeline.shift import population as pop
from ehr_pipeline.shift import Admission, Distribution, Profile, findings, stats

CREATININE = "lab:50912"
LOINC = {CREATININE: "2160-0", "lab:50931": "2345-7", "lab:51222": "718-7"}
CONVERTER = units.Converter()  # one unit registry for the module (it takes a second to build)


# ------------------------------------------------------------------------ one admission


def _naive_admission(example: dict) -> dict[str, tuple[int, float]]:
    """code -> (events, median of the bag means that have a value), by a loop over the parsed proto."""
    events: dict[str, int] = {}
    means: dict[str, list[float]] = {}
    for codes, counts, value_count, value_mean in zip(example[spec.BAG_CODES], example[spec.BAG_COUNTS],
                                                      example[spec.BAG_VALUE_COUNT], example[spec.BAG_VALUE_MEAN]):
        for c, n, k, m in zip(codes, counts, value_count, value_mean):
            events[c] = events.get(c, 0) + n
            if k:
                means.setdefault(c, []).append(m)
    return {c: (n, float(np.median(means[c])) if c in means else math.nan) for c, n in events.items()}


def test_admissions_from_the_jobs_records_equal_a_loop_over_the_parsed_protos(synthetic_data):
    records = pop.read_records(synthetic_data, "train")
    admissions = pop.admissions_from_examples(records, batch_size=37)  # batches that do not divide the split
    assert len(admissions) == len(records) == 160
    for record, a in zip(records, admissions):
        example = seqex.sequence_example_to_dict(record)
        want = _naive_admission(example)
        assert list(a.codes) == sorted(want)
        for code, n, value in zip(a.codes, a.events, a.values):
            assert n == want[code][0]
            assert (math.isnan(value) and math.isnan(want[code][1])) or value == pytest.approx(want[code][1], rel=1e-6)
        assert a.age_years == pytest.approx(example[spec.AGE_YEARS])
        assert (a.gender, a.admission_type) == (example[spec.GENDER], example[spec.ADMISSION_TYPE])


def test_an_admission_from_bags_equals_the_same_admission_from_its_proto():
    from ehr_pipeline.contract import PipelineConfig
    from ehr_pipeline.encode import bagging

    times = np.array([100, 200, 90_000, 90_100, 170_000], dtype=np.int64)
    codes = np.array(["lab:50912", "lab:50912", "lab:50912", "chart:211", "diagnosis:4019"], dtype=object)
    values = np.array([1.0, 3.0, 2.0, 80.0, np.nan])
    bags = bagging.bag_events(times, codes, values, 200_000, PipelineConfig().bagging)
    context = {spec.SUBJECT_ID: 1, spec.HADM_ID: 2, spec.LABEL: 0, spec.TRIGGER_TIME: 200_000,
               spec.ADMIT_OFFSET: 0, spec.AGE_YEARS: 70.0, spec.GENDER: "F", spec.ADMISSION_TYPE: "URGENT",
               spec.ETHNICITY: spec.NOT_RECORDED, spec.INSURANCE: spec.NOT_RECORDED}
    [from_proto] = pop.admissions_from_examples([seqex.make_sequence_example(context, bags).SerializeToString()])
    from_bags = pop.admission_from_bags(70.0, "F", "URGENT", bags)
    assert list(from_bags.codes) == list(from_proto.codes) == ["chart:211", "diagnosis:4019", "lab:50912"]
    assert list(from_bags.events) == list(from_proto.events) == [1, 1, 3]
    # Creatinine: bag means 2.0 (1.0 and 3.0 in one day) and 2.0: median 2.0; no value for the diagnosis.
    np.testing.assert_allclose(from_bags.values, [80.0, np.nan, 2.0])
    np.testing.assert_allclose(from_proto.values, from_bags.values)


# ------------------------------------------------------------------------ distributions


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=300))
def test_distribution_counts_every_value_once_and_brackets_its_median(values):
    d = Distribution.of(np.array(values))
    assert sum(d.counts) == d.n == len(values)
    assert d.median == pytest.approx(float(np.median(values)))
    assert d.median_low <= d.median <= d.median_high
    assert list(d.edges) == sorted(set(d.edges))
    again = Distribution.of(np.array(values), d.edges)  # binned on its own edges: the same counts
    assert again.counts == d.counts
    assert Distribution.from_json(d.to_json()) == d


def test_bins_keep_a_converted_value_with_the_tie_it_came_from():
    # Magnesium in mg/dL: one decimal, 40% of admissions at exactly 2.0 (and float noise around it).
    rng = np.random.default_rng(0)
    values = rng.choice([1.8, 1.9, 2.0, 2.0, 2.0, 2.0, 2.1, 2.2, 2.3, 2.4], size=2000)
    values[:50] = 2.0000000000000004
    d = Distribution.of(values)
    assert len(d.edges) < 9  # tied deciles merged
    # The same admissions reported in mmol/L with 4 significant digits and converted back.
    round_trip = np.array([float(f"{v * 10 / 24.305:.4g}") * 24.305 / 10 for v in values])
    assert np.max(np.abs(round_trip - values)) > 1e-5  # not the same numbers ...
    assert Distribution.of(round_trip, d.edges).counts == d.counts  # ... in the same bins
    assert stats.psi(d.counts, Distribution.of(round_trip, d.edges).counts) < 1e-9


def test_psi_chi_square_and_holm_against_their_definitions():
    from scipy.stats import chi2_contingency

    r, c = np.array([120, 80, 100, 100]), np.array([60, 70, 90, 180])
    rs, cs = (r + 0.5) / (r + 0.5).sum(), (c + 0.5) / (c + 0.5).sum()
    assert stats.psi(r, c) == pytest.approx(float(np.sum((cs - rs) * np.log(cs / rs))))
    assert stats.psi(r, r * 3) == pytest.approx(0.0, abs=1e-3)
    # Every bin expects >= 5: no merging, exactly the contingency test (without continuity correction).
    assert stats.homogeneity_p(r, c) == pytest.approx(chi2_contingency(np.array([r, c]), correction=False)[1])
    assert stats.homogeneity_p([10, 0], [0, 0]) == 1.0
    # The rank test on counts is the Mann-Whitney test of the values with each bin's values tied.
    from scipy.stats import mannwhitneyu

    x, y = np.repeat(np.arange(4), r), np.repeat(np.arange(4), c)
    want = mannwhitneyu(y, x, use_continuity=False, method="asymptotic").pvalue
    assert stats.rank_p(r, c) == pytest.approx(want, rel=1e-9)
    assert stats.distribution_p(r, c, ordered=True) == pytest.approx(
        min(1.0, 2 * min(want, stats.homogeneity_p(r, c))))
    p = np.array([0.01, 0.04, 0.03, 0.2, 0.001])
    m, order = len(p), np.argsort(p)
    want, running = np.empty(m), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        want[i] = running
    np.testing.assert_allclose(stats.holm(p), want)


def test_small_samples_merge_bins_so_chance_is_not_significant():
    rng = np.random.default_rng(1)
    draws = [(rng.multinomial(2000, [0.1] * 10), rng.multinomial(25, [0.1] * 10)) for _ in range(400)]
    # A valid test rejects about alpha of true nulls.
    for test in (stats.homogeneity_p, stats.rank_p, lambda r, c: stats.distribution_p(r, c, True)):
        assert np.mean(np.array([test(r, c) for r, c in draws]) < 0.05) < 0.09


# ------------------------------------------------------------------------ populations


def _population(rng, n, *, creatinine_scale=1.0, glucose_scale=1.0, charts=300, oov_share=0.0,
                age_mean=63.0, emergency=0.8, mi_scale=1.0) -> list[Admission]:
    """Admissions drawn from a known population; the keywords move one aspect of it."""
    out = []
    for _ in range(n):
        codes = ["chart:211", "chart:220045", CREATININE, "lab:50931", "diagnosis:4019"]
        events = [rng.poisson(charts), rng.poisson(charts), 2, 2, 1]
        values = [rng.normal(85, 12), rng.normal(85, 12),
                  round(rng.lognormal(0.0, 0.35), 1) * creatinine_scale,
                  round(rng.lognormal(np.log(128), 0.3)) * glucose_scale, math.nan]
        if rng.random() < oov_share * 6:
            codes.append("lab:99999")  # a code the vocabulary lacks
            events.append(60)
            values.append(math.nan)
        order = np.argsort(codes)
        out.append(Admission(float(np.clip(rng.normal(age_mean, 16), 18, 90)), str(rng.choice(["M", "F"])),
                             "EMERGENCY" if rng.random() < emergency else "ELECTIVE",
                             np.array(codes, dtype=object)[order], np.array(events, dtype=np.int64)[order],
                             np.array(values)[order], float(rng.gamma(2.0, 0.01 * mi_scale))))
    return out


VOCABULARY = ["chart:211", "chart:220045", CREATININE, "lab:50931", "diagnosis:4019"]
CANONICAL = {CREATININE: "mg/dL", "lab:50931": "mg/dL"}


@functools.lru_cache(maxsize=None)
def _reference(seed: int = 3, n: int = 1500) -> Profile:
    rng = np.random.default_rng(seed)
    admissions = _population(rng, n)
    profile = Profile.build(admissions, vocabulary=VOCABULARY, keep=VOCABULARY,
                            units={CREATININE: {"mg/dL": 3000}, "lab:50931": {"mg/dL": 3000}}, canonical=CANONICAL)
    return profile.with_mutual_information(np.array([a.mutual_information for a in _population(rng, 400)]), 25)


def _report(reference, admissions, units=None, canonical=None) -> shift.ShiftReport:
    current = Profile.build(admissions, vocabulary=VOCABULARY, bins_from=reference,
                            units=units or {CREATININE: {"mg/dL": 2000}}, canonical=canonical or CANONICAL)
    return shift.compare(reference, current, loinc=LOINC, converter=CONVERTER)


def test_a_profile_survives_json():
    import json

    reference = _reference(2, 300)
    again = Profile.from_json(json.loads(json.dumps(reference.to_json(), allow_nan=False)))
    assert again == reference
    with pytest.raises(ValueError, match="codes.lab:50912"):
        doc = reference.to_json()
        doc["codes"][CREATININE]["values"]["counts"] = [1, 2]
        Profile.from_json(doc)


@pytest.mark.parametrize("seed", [10, 11, 12])
def test_a_fresh_sample_of_the_same_population_raises_no_finding(seed):
    reference = _reference()
    report = _report(reference, _population(np.random.default_rng(seed), 800))
    assert report.level == shift.NONE, report.text()
    assert report.summary["tests"] >= 10 and report.summary["mi_compared"]


def test_creatinine_in_umol_per_litre_read_as_mg_per_dl_is_named_with_its_likely_unit():
    reference = _reference()
    report = _report(reference, _population(np.random.default_rng(4), 150, creatinine_scale=88.4))
    [finding] = [f for f in report.findings if f.subject == CREATININE]
    assert (finding.kind, finding.severity) == ("value_shift", shift.SEVERE)
    assert finding.message.startswith(f"{CREATININE} values are ~88x the training median")
    assert finding.message.endswith("likely umol/L labelled as mg/dL")
    assert finding.numbers["ratio_low"] < 88.4 < finding.numbers["ratio_high"]
    assert report.level == shift.SEVERE and report.findings[0] is finding


@pytest.mark.parametrize("code, scale, unit", [("lab:50931", 1 / 18.016, "mmol/L"), (CREATININE, 88.4, "umol/L")])
def test_values_of_another_unit_named_by_the_data_are_a_unit_mismatch(code, scale, unit):
    reference = _reference()
    admissions = _population(np.random.default_rng(5), 300, **{
        "glucose_scale" if code == "lab:50931" else "creatinine_scale": scale})
    report = _report(reference, admissions, units={code: {unit: 900}}, canonical={**CANONICAL, code: unit})
    kinds = {(f.kind, f.subject): f for f in report.findings}
    mismatch = kinds[("unit_mismatch", code)]
    assert mismatch.severity == shift.SEVERE and "--units-from" in mismatch.message
    assert f"the data is in {unit}" in kinds[("value_shift", code)].message


def test_values_converted_at_the_door_are_a_moderate_finding_and_unconvertible_ones_are_counted():
    reference = _reference()
    report = _report(reference, _population(np.random.default_rng(6), 300),
                     units={CREATININE: {"umol/L": 950, "mg/dL": 50}, "lab:50931": {"mg/dL": 700, "mg": 300}})
    found = {(f.kind, f.subject): f for f in report.findings}
    converted = found[("units_converted", CREATININE)]
    assert converted.severity == shift.MODERATE and converted.numbers["share"] == pytest.approx(0.95)
    assert "umol/L" in converted.message
    lost = found[("not_convertible", "lab:50931")]
    assert lost.severity == shift.MODERATE and lost.numbers["values"] == 300
    assert report.summary["converted_share"] == pytest.approx(950 / 2000)
    assert report.level == shift.MODERATE


@pytest.mark.parametrize("scale, severity", [(1.3, shift.SEVERE), (1.15, shift.MODERATE)])
def test_a_biased_assay_is_named_with_its_ratio(scale, severity):
    reference = _reference()
    report = _report(reference, _population(np.random.default_rng(7), 1500, glucose_scale=scale))
    [finding] = [f for f in report.findings if f.subject == "lab:50931"]
    assert finding.severity == severity
    assert finding.numbers["ratio"] == pytest.approx(scale, rel=0.04)
    assert "likely" not in finding.message  # a bias is not a unit


def test_oov_codes_charting_case_mix_and_uncertainty_are_each_named():
    reference = _reference()
    report = _report(reference, _population(np.random.default_rng(8), 600, charts=150, oov_share=0.1, age_mean=72,
                                            emergency=0.95, mi_scale=4.0))
    found = {(f.kind, f.subject): f for f in report.findings}
    assert found[("oov_share", "lab")].severity == shift.SEVERE and "lab:99999" in found[("oov_share", "lab")].message
    assert found[("events_per_admission", "chart")].numbers["ratio"] == pytest.approx(0.5, rel=0.05)
    assert ("case_mix", "age_band") in found and ("case_mix", "admission_type") in found
    mi = found[("uncertainty", "model")]
    assert mi.severity == shift.SEVERE and mi.numbers["share_above_p95"] > 0.25


def test_a_known_code_gone_missing_is_named_once_per_source():
    reference = _reference()
    admissions = []
    for a in _population(np.random.default_rng(9), 400):
        keep = a.codes != "chart:211"
        admissions.append(Admission(a.age_years, a.gender, a.admission_type, a.codes[keep], a.events[keep],
                                    a.values[keep], a.mutual_information))
    report = _report(reference, admissions)
    [finding] = [f for f in report.findings if f.kind == "code_presence"]
    assert finding.subject == "chart" and finding.numbers["codes"] == ["chart:211"]
    assert "chart:211 100% -> 0.0%" in finding.message


def test_the_current_profile_must_use_the_references_bins():
    reference = _reference()
    own_bins = Profile.build(_population(np.random.default_rng(4), 300), vocabulary=VOCABULARY)
    with pytest.raises(ValueError, match="bins_from=reference"):
        shift.compare(reference, own_bins)


@pytest.mark.parametrize("model_unit, data_unit, loinc, factor", [
    ("mg/dL", "umol/L", "2160-0", 88.4), ("mg/dL", "mmol/L", "2345-7", 0.0555), ("g/dL", "g/L", "718-7", 10.0),
    ("Cel", "[degF]", None, None), ("mm[Hg]", "kPa", None, 0.1333)])
def test_unit_hints_find_the_unit_a_shifted_median_is_in(model_unit, data_unit, loinc, factor):
    conv = CONVERTER
    median = 37.0 if model_unit == "Cel" else 1.0
    reading = 98.6 if model_unit == "Cel" else median * factor  # the same quantity, read in the other unit
    ref, cur = (Distribution(100, m, m, m * 0.98, m * 1.02, (), (100,)) for m in (median, reading))
    hint = findings.unit_hint("x", ref, cur, model_unit, loinc, conv, shift.Thresholds())
    assert hint is not None and conv.key(hint[0]) == conv.key(data_unit)
    biased = Distribution(100, 1.15, 1.15, 1.1, 1.2, (), (100,))
    assert findings.unit_hint("x", ref, biased, model_unit, loinc, conv, shift.Thresholds()) is None
