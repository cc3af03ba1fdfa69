"""ehr_pipeline.units against independent numbers: published SI conversion factors, not its own maths."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ehr_pipeline import units

# Conventional -> SI factors as printed in clinical reference tables (e.g. the AMA Manual of Style's
# SI conversion table; Young, Ann Intern Med 1987;106:114-129), rounded there to 3-4 digits: each
# is checked to 0.5%, which the rounding allows and a wrong molar mass or a missing 10x does not.
PUBLISHED = [
    # (from unit, to unit, LOINC of the analyte, SI per conventional)
    ("mg/dL", "umol/L", "2160-0", 88.4),  # creatinine
    ("mg/dL", "mmol/L", "2345-7", 0.0555),  # glucose
    ("mg/dL", "mmol/L", "3094-0", 0.357),  # urea nitrogen -> urea
    ("mg/dL", "mmol/L", "17861-6", 0.2495),  # calcium
    ("mg/dL", "mmol/L", "2601-3", 0.4114),  # magnesium
    ("mg/dL", "mmol/L", "2777-1", 0.3229),  # phosphate (as phosphorus)
    ("mg/dL", "umol/L", "1975-2", 17.1),  # bilirubin
    ("mg/dL", "mmol/L", "32693-4", 0.111),  # lactate
    ("mg/dL", "umol/L", "3084-1", 59.48),  # urate
    ("mg/dL", "mmol/L", "2093-3", 0.02586),  # cholesterol
    ("mg/dL", "mmol/L", "2571-8", 0.01129),  # triglycerides
    ("ug/dL", "umol/L", "2498-4", 0.1791),  # iron
    ("ug/dL", "umol/L", "16362-6", 0.5872),  # ammonia
    ("g/dL", "mmol/L", "718-7", 0.6206),  # haemoglobin (monomer), as the Netherlands report it
    ("g/dL", "g/L", "718-7", 10.0),
    ("g/dL", "g/L", "1751-7", 10.0),  # albumin
    ("mEq/L", "mmol/L", "17861-6", 0.5),  # calcium is divalent
    ("mEq/L", "mmol/L", "2951-2", 1.0),  # sodium is not
    ("K/uL", "x10^9/L", None, 1.0),
    ("m/uL", "10*12/L", None, 1.0),
    ("IU/L", "ukat/L", None, 0.01667),  # enzyme activity
    ("[IU]/L", "U/L", None, 1.0),  # UCUM's IU, for an enzyme, is the enzyme unit
    ("mm Hg", "kPa", None, 0.1333),
    ("cmH2O", "mm Hg", None, 0.7356),
    ("lbs", "kg", None, 0.4536),
    ("inches", "cm", None, 2.54),
    ("%", "L/L", None, 0.01),  # haematocrit as a fraction
    ("SECONDS", "sec", None, 1.0),
    ("EU/dL", "mg/dL", "5818-0", 1.0),  # urobilinogen: an Ehrlich unit is 1 mg of it (MIMIC writes both)
    ("uIU/mL", "mIU/L", None, 1.0),
]


@pytest.fixture(scope="module")
def converter():
    """One converter for the module: building pint's registry costs a second or more."""
    return units.Converter()


@pytest.mark.parametrize("src, dst, loinc, factor", PUBLISHED)
def test_conversions_match_published_si_factors(converter, src, dst, loinc, factor):
    conversion, why = converter.conversion(src, dst, loinc)
    assert conversion is not None, why
    assert conversion.offset == 0.0
    assert conversion.scale == pytest.approx(factor, rel=5e-3)


def test_temperature_is_affine(converter):
    c = converter
    to_f, _ = c.conversion("?C", "?F")  # MIMIC writes the degree sign as '?'
    assert to_f.apply(37.0) == pytest.approx(98.6) and to_f.apply(-40.0) == pytest.approx(-40.0)
    back, _ = c.conversion("\u00b0F", "Cel")
    assert back.apply(212.0) == pytest.approx(100.0)


@pytest.mark.parametrize("written, code", [
    ("mg/dL", "mg/dL"), ("MG/DL", "mg/dL"), ("mEq/L", "meq/L"), ("MEQ/L", "meq/L"), ("mEq.", "meq"),
    ("K/uL", "10*3/uL"), ("m/uL", "10*6/uL"), ("#/uL", "/uL"), ("#/hpf", "/[HPF]"), ("IU/L", "U/L"),
    ("mm Hg", "mm[Hg]"), ("MM HG", "mm[Hg]"), ("sec", "s"), ("SECONDS", "s"), ("?C", "Cel"), ("?F", "[degF]"),
    ("uIU/mL", "u[IU]/mL"), ("uU/ML", "u[IU]/mL"), ("mOsm/kg", "mosm/kg"), ("MOSM/KG", "mosm/kg"),
    ("Ratio", "{ratio}"), ("ml", "mL"), ("mcg", "ug"), ("grams", "g"), ("\u00b5mol/L", "umol/L"),
    ("\u03bcmol/L", "umol/L"), (" mmol/L ", "mmol/L"), ("U/g/Hb", "U/g{Hb}"), ("x10^9/L", "10*9/L"),
    ("mmol/mol", "mmol/mol"), ("kPa", "kPa"), ("ng/mL", "ng/mL"), ("pg/mL", "pg/mL"),
    # MIMIC's 'units' (pH and drug units alike), MetaVision's 'dose', text answers: not units.
    ("units", None), ("UNITS", None), ("dose", None), ("+/-", None), ("Pos/Neg", None), ("", None), (None, None),
])
def test_unit_strings_of_mimic_and_ehr_exports_read_as_ucum(converter, written, code):
    assert converter.ucum(written) == code


def test_what_cannot_convert_never_does(converter):
    c = converter
    cases = [
        ("mmol/L", "mg/dL", None),  # mass <-> substance without an analyte
        ("mmol/L", "mg/dL", "1-8"),  # a LOINC code with no molar mass in the table
        ("mg/dL", "%", "2160-0"),  # another quantity altogether
        ("#/hpf", "%", None),  # counts per microscope field are not a fraction
        ("[IU]/L", "/L", None),  # an arbitrary unit converts to nothing but itself
        ("u[IU]/mL", "10*3/L", None),
        ("EU/dL", "mg/dL", None),
        ("furlongs", "mg/dL", None),  # not a unit
        ("dose", "mg", None),
    ]
    for src, dst, loinc in cases:
        conversion, why = c.conversion(src, dst, loinc)
        assert conversion is None and why, (src, dst)
    # A string that is no unit still matches itself, in any case: MIMIC's 'units' for pH.
    assert c.conversion("UNITS", "units")[0] == units.IDENTITY


PAIRS = [(s, d, l) for s, d, l, _ in PUBLISHED] + [("?C", "?F", None)]


@settings(max_examples=60, deadline=None)
@given(pair=st.sampled_from(PAIRS), value=st.floats(-1e6, 1e6, allow_nan=False))
def test_there_and_back_is_the_identity(converter, pair, value):
    c = converter
    src, dst, loinc = pair
    there, _ = c.conversion(src, dst, loinc)
    back, _ = c.conversion(dst, src, loinc)
    assert back.apply(there.apply(value)) == pytest.approx(value, rel=1e-9, abs=1e-9)


def test_canonical_unit_is_the_most_common_unit_whatever_its_spelling():
    c = units.Converter()
    counts = {
        "lab:50912": {"mg/dL": 40, "MG/DL": 30, "umol/L": 60},  # 70 rows in mg/dL spelled two ways
        "lab:50820": {"units": 9, "UNITS": 2},  # no UCUM code: kept as written, case-folded
        "lab:1": {"mmol/L": 5, "mEq/L": 5},  # a tie: the first key
    }
    assert units.canonical_units(counts, c) == {"lab:1": "meq/L", "lab:50820": "units", "lab:50912": "mg/dL"}
    reference = {"lab:50912": "umol/L", "lab:7": "g/L"}
    assert units.canonical_units(counts, c, reference) == {
        "lab:1": "meq/L", "lab:50820": "units", "lab:50912": "umol/L", "lab:7": "g/L"}


def test_harmoniser_converts_drops_and_counts_every_value():
    h = units.Harmoniser({"lab:50912": "mg/dL", "lab:50820": "units"}, {"lab:50912": "2160-0"})
    codes = np.array(["lab:50912"] * 5 + ["lab:50820", "lab:999", "lab:50912"], dtype=object)
    written = ["mg/dL", "umol/L", None, "furlongs", "MG/DL", "UNITS", "mg/dL", "umol/L"]
    values = np.array([1.0, 88.4, 2.0, 3.0, 4.0, 7.4, 5.0, np.nan])
    out = h.harmonise(codes, written, values)
    expected = [1.0, 88.4 * 113.12 / 10000, 2.0, np.nan, 4.0, 7.4, 5.0, np.nan]
    np.testing.assert_allclose(out.values, expected, rtol=1e-12)
    assert out.outcomes.tolist() == [units.SAME, units.CONVERTED, units.NO_UNIT, units.NOT_CONVERTIBLE,
                                     units.SAME, units.SAME, units.UNCHECKED, ""]
    assert out.counts() == {units.SAME: 3, units.CONVERTED: 1, units.NO_UNIT: 1, units.UNCHECKED: 1,
                            units.NOT_CONVERTIBLE: 1}
    assert out.counts(codes) == {"lab/same_unit": 3, "lab/converted": 1, "lab/no_unit": 1, "lab/unchecked": 1,
                                 "lab/not_convertible": 1}
    (i, unit, canonical, why), = out.problems
    assert (i, unit, canonical) == (3, "furlongs", "mg/dL") and "furlongs" in why
    assert math.isclose(values[1], 88.4)  # the caller's array is left alone


def test_a_release_in_one_set_of_units_never_loads_the_unit_grammar():
    c = units.Converter()
    h = units.Harmoniser({"lab:50912": "mg/dL", "lab:50971": "meq/L"}, converter=c)
    h.harmonise(np.array(["lab:50912", "lab:50971", "lab:50912"], dtype=object), ["mg/dL", "mEq/L", "MG/DL"],
                np.array([1.0, 4.0, 2.0]))
    assert c._registry is None  # the start-up cost of pint is paid only when a value needs converting
