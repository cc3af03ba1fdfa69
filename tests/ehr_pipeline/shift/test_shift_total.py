"""The shift statistics are total: any two populations give a report, in words and in strict JSON.

Property tests over generated populations (hypothesis): codes whose values are all one value (the
demo's input:222011 and lab:50819), a single admission, empty bins, NaN and infinite values,
values near the largest and smallest floats, zero and negative values, unknown codes, text in
every case-mix field and unit strings of every kind. The service's monitor and /metrics
summarise whatever requests send through these functions, so no population may make them raise.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ehr_pipeline import shift
from ehr_pipeline.encode import units
from ehr_pipeline.shift import Admission, Distribution, Profile, findings

CONVERTER = units.Converter()  # one unit registry for the module (it takes a second to build)
CODES = ("lab:50819", "lab:50912", "input:222011", "chart:211", "diagnosis:4019", "lab:99999")
# Values a record or a request can carry, the awkward ones on purpose.
AWKWARD = (0.0, -0.0, 5.0, -5.0, 1e-300, 5e-324, 3.4028235e38, -3.4028235e38, 1.7976931348623157e308,
           -1.7976931348623157e308, math.inf, -math.inf, math.nan)
UNITS = ("mg/dL", "MG/DL", "umol/L", "MU/L", "mU/L", "N/A", "", " ", "%", "(((", "10*3/uL", "[degF]", "Cel",
         "{score}", "mEq/L", "µg/L", "1/0", "mg/(24.h)")


def _strict(doc) -> str:
    """JSON as a strict reader takes it: NaN and Infinity are refused."""
    return json.dumps(doc, allow_nan=False)


values = st.one_of(st.sampled_from(AWKWARD), st.floats(allow_nan=True, allow_infinity=True),
                   st.floats(-1e4, 1e4))


@st.composite
def admissions(draw, constant: float | None) -> Admission:
    """One admission: a few codes with events and (maybe) values; `constant`: every value of lab:50819."""
    codes = sorted(draw(st.sets(st.sampled_from(CODES), max_size=len(CODES))))
    vals = [constant if code == "lab:50819" and constant is not None else draw(values) for code in codes]
    return Admission(age_years=draw(st.one_of(st.floats(0, 120), st.sampled_from((math.nan, -1.0, 1e9)))),
                     gender=draw(st.sampled_from(("M", "F", "U", "", "x" * 50))),
                     admission_type=draw(st.text(max_size=12)),
                     codes=np.array(codes, dtype=object),
                     events=np.array([draw(st.integers(0, 10**6)) for _ in codes], dtype=np.int64),
                     values=np.array(vals, dtype=np.float64),
                     mutual_information=draw(st.sampled_from((math.nan, 0.0, 0.01, 0.5, math.inf))))


@st.composite
def populations(draw) -> tuple[list[Admission], list[Admission]]:
    """(training admissions, new admissions): sizes from 0, constant codes in either or both."""
    constant = draw(st.sampled_from((None, 5.0, 0.0, -2.0, 1e38)))
    moved = draw(st.sampled_from((None, 5.0, 10.0, 0.0, 5.001)))
    ref = draw(st.lists(admissions(constant), max_size=40))
    cur = draw(st.lists(admissions(moved if moved is not None else constant), max_size=40))
    return ref, cur


unit_maps = st.dictionaries(st.sampled_from(CODES), st.dictionaries(st.sampled_from(UNITS), st.integers(0, 10**9),
                                                                    max_size=3), max_size=4)
canonical_maps = st.dictionaries(st.sampled_from(CODES), st.sampled_from(UNITS), max_size=4)


def _as_old_export(reference: Profile) -> Profile:
    """The reference as an export made before point masses were closed: a constant code in one bin."""
    import dataclasses

    codes = {}
    for code, stats in reference.codes.items():
        d = stats.values
        if d is not None and d.n and d.median_low == d.median_high:
            d = dataclasses.replace(d, edges=(), counts=(d.n,))
        codes[code] = dataclasses.replace(stats, values=d)
    return dataclasses.replace(reference, codes=codes)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(populations(), unit_maps, unit_maps, canonical_maps, canonical_maps, st.booleans(),
       st.integers(2, 30), st.booleans())
def test_any_two_populations_give_a_report_in_words_and_strict_json(pops, ref_units, cur_units, ref_canonical,
                                                                     cur_canonical, with_mi, min_admissions, old):
    ref_adm, cur_adm = pops
    vocabulary = CODES[:4]
    reference = Profile.build(ref_adm, vocabulary=vocabulary, keep=vocabulary, units=ref_units,
                              canonical=ref_canonical)
    if with_mi:
        reference = reference.with_mutual_information(np.array([a.mutual_information for a in ref_adm]), 5)
    # Through strict JSON, as the export carries it.
    reference = Profile.from_json(json.loads(_strict(reference.to_json())))
    if old:
        reference = _as_old_export(reference)
    current = Profile.build(cur_adm, vocabulary=vocabulary, bins_from=reference, units=cur_units,
                            canonical=cur_canonical)
    assert Profile.from_json(json.loads(_strict(current.to_json()))).n == len(cur_adm)
    thresholds = shift.Thresholds(min_admissions=min_admissions, min_values=1, min_events=1)
    report = shift.compare(reference, current, thresholds=thresholds, converter=CONVERTER,
                           loinc={"lab:50912": "2160-0"})
    assert report.level in shift.SEVERITIES
    assert all(f.severity in shift.SEVERITIES and f.kind in shift.KINDS for f in report.findings)
    assert report.text() and report.markdown()
    _strict(report.to_json())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(AWKWARD[:-3]) | st.floats(allow_nan=False, allow_infinity=False), min_size=1,
                max_size=60))
def test_a_distribution_of_any_finite_values_has_finite_sorted_edges_and_counts_them_all(xs):
    d = Distribution.of(np.array(xs))
    assert sum(d.counts) == d.n == len(xs) and len(d.counts) == len(d.edges) + 1
    assert all(math.isfinite(e) for e in d.edges) and list(d.edges) == sorted(set(d.edges))
    assert d.median_low <= d.median <= d.median_high and math.isfinite(d.median)
    assert Distribution.from_json(json.loads(_strict(d.to_json()))) == d


@pytest.mark.parametrize("value", [5.0, 0.0, -2.0, 1e-300, 3.4e38])
def test_a_constant_code_has_a_bin_of_its_own_so_a_move_off_it_is_a_shift(value):
    ref = Distribution.of(np.full(30, value))
    assert ref.counts == (0, 30, 0)  # below, at, above the one value
    step = abs(value) or 1.0
    for moved, where in ((value + 5e-4 * abs(value), 1), (value - step, 0), (value + step, 2)):
        cur = Distribution.of(np.full(25, moved), ref.edges)
        assert cur.counts[where] == 25, (moved, cur)


def test_the_demos_constant_code_reads_the_same_value_as_no_shift_and_double_as_severe():
    # lab:50819 (PEEP set) is 5 in every training admission of the demo that has it.
    def admission(v: float) -> Admission:
        return Admission(60.0, "M", "EMERGENCY", np.array(["lab:50819"], dtype=object), np.array([1]),
                         np.array([v]))

    reference = Profile.build([admission(5.0)] * 30, keep=["lab:50819"])
    same = shift.compare(reference, Profile.build([admission(5.0)] * 25, bins_from=reference), converter=CONVERTER)
    assert same.level == shift.NONE
    double = shift.compare(reference, Profile.build([admission(10.0)] * 25, bins_from=reference),
                           converter=CONVERTER)
    [finding] = [f for f in double.findings if f.kind == "value_shift"]
    assert finding.severity == shift.SEVERE and finding.message.startswith("lab:50819 values are ~2x the training")


def test_an_old_exports_one_bin_reference_is_described_not_indexed():
    ref = Distribution(30, 5.0, 5.0, 5.0, 5.0, (), (30,))
    cur = Distribution(25, 5.0, 5.0, 5.0, 5.0, (), (25,))
    assert findings.bin_words(ref.edges, 0) == "(all values in one bin)"
    assert "all values in one bin" in findings._moved_bin(ref, cur)
