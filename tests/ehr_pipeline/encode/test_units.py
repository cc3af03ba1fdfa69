"""ehr_pipeline.encode.units against independent numbers: published SI conversion factors, not its own maths."""
from __future__ import annotations

import collections
import csv
import dataclasses
import datetime as dt
import gzip
import json
import math
import pathlib
import re

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from ehr_pipeline.contract import PipelineConfig, layout, spec, tfrecord
from ehr_pipeline.encode import magnitudes, seqex, unit_strings, units
from ehr_pipeline.job import manifest as manifest_mod
from ehr_pipeline.job import run_job
from ehr_pipeline.mimic import events

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
                            units.NOT_CONVERTIBLE: 1, units.AMBIGUOUS: 0, units.PLACEHOLDER: 0, units.IMPLAUSIBLE: 0}
    assert out.counts(codes) == {"lab/same_unit": 3, "lab/converted": 1, "lab/no_unit": 1, "lab/unchecked": 1,
                                 "lab/not_convertible": 1}
    (i, outcome, unit, canonical, why), = out.problems
    assert (i, outcome, unit, canonical) == (3, units.NOT_CONVERTIBLE, "furlongs", "mg/dL")
    assert why == "'furlongs' is not a unit this converter reads (UCUM or a known spelling)"
    assert math.isclose(values[1], 88.4)  # the caller's array is left alone


def test_a_release_in_one_set_of_units_never_loads_the_unit_grammar():
    c = units.Converter()
    h = units.Harmoniser({"lab:50912": "mg/dL", "lab:50971": "meq/L"}, converter=c)
    h.harmonise(np.array(["lab:50912", "lab:50971", "lab:50912"], dtype=object), ["mg/dL", "mEq/L", "MG/DL"],
                np.array([1.0, 4.0, 2.0]))
    assert c._registry is None  # the start-up cost of pint is paid only when a value needs converting


# ------------------------------------------------------------------------------- hostile unit strings

# The codes the hostile table writes values for: canonical unit and LOINC (None: no analyte known).
CODES = {
    "lab:glucose": ("mg/dL", "2345-7"), "lab:tsh": ("mU/L", None), "lab:sodium": ("mmol/L", "2951-2"),
    "lab:wbc": ("10*3/uL", None), "chart:temp": ("Cel", None), "chart:abp": ("mm[Hg]", None), "lab:ptt": ("s", None),
    "input:volume": ("mL", None), "input:dose": ("mg", None), "lab:ige": ("kU/L", None), "lab:crp": ("mg/L", None),
    "lab:casts": ("/[LPF]", None), "lab:egfr": ("mL/min/{1.73_m2}", None), "lab:ph": ("units", None),
}


@dataclasses.dataclass(frozen=True)
class NotUsed:
    """What a refused value is counted as: its outcome and the exact reason given."""

    outcome: str
    why: str


def ambiguous(text, *readings):
    return NotUsed(units.AMBIGUOUS, f"{text!r} reads as {' or '.join(map(repr, readings))} depending on its letter "
                                    "case, which this spelling does not show")


def placeholder(text, canonical="mg/dL"):
    return NotUsed(units.PLACEHOLDER, f"{text!r} is a placeholder, not a unit; the code's values are in {canonical!r}")


def not_a_unit(text):
    return NotUsed(units.NOT_CONVERTIBLE, f"{text!r} is not a unit this converter reads (UCUM or a known spelling)")


def different(src, dst):
    return NotUsed(units.NOT_CONVERTIBLE, f"{src!r} and {dst!r} measure different quantities")


ARBITRARY = NotUsed(units.NOT_CONVERTIBLE, "arbitrary units (IU, per field, annotations) convert only to themselves")
NO_MOLAR_MASS = NotUsed(units.NOT_CONVERTIBLE,
                        "mass <-> substance needs the analyte's molar mass: no LOINC with one known for this code")
F_TO_C = (5 / 9, -160 / 9)  # (scale, offset): Celsius = (Fahrenheit - 32) x 5/9
K_TO_C = (1.0, -273.15)
# (unit as written, code, expected): a factor (1.0 is the code's own unit), (scale, offset), or NotUsed.
# Factors are SI prefixes, unit definitions and published clinical ones (glucose 18.0 mg/dL per mmol/L,
# sodium 23.0 mg per mmol, 1 mm Hg = 0.1333 kPa, 1 cm H2O = 0.7356 mm Hg), checked to 0.5%.
HOSTILE = [
    # case variants and spellings of the code's own unit
    *[(w, "lab:glucose", 1.0) for w in ("mg/dL", "MG/DL", "mg/dl", "Mg/dL", "MG/dL", "mg / dL", "MG / DL", "mg%",
                                        "MG%")],
    *[(w, "lab:tsh", 1.0) for w in ("mU/L", "mU/l", "mIU/L", "uIU/mL", "UIU/ML", "uU/mL", "\u00b5IU/mL", "uU/ML")],
    *[(w, "lab:sodium", 1.0) for w in ("mmol/L", "MMOL/L", "mmol/l", "Mmol/L", "mEq/L", "MEQ/L", "meq/l", "mEq/l")],
    *[(w, "lab:wbc", 1.0) for w in ("K/uL", "k/ul", "K/UL", "THOU/UL", "x10^3/uL", "X10E3/UL", "10^3/uL",
                                    "10*3/\u00b5L", "K/mm3", "x10^9/L", "X10E9/L", "10*9/L", "10*9/l", "10^9/L",
                                    "10E9/L", "Gpt/L", "/nL")],
    *[(w, "chart:temp", 1.0) for w in ("?C", "\u00b0C", "C", "CEL", "Cel", "degC", "deg C", "DEG C")],
    *[(w, "chart:abp", 1.0) for w in ("mm Hg", "MM HG", "mmHg", "MMHG", "mmhg", "mm[Hg]", "MM[HG]")],
    *[(w, "lab:ptt", 1.0) for w in ("sec", "SEC", "secs", "seconds", "SECONDS", "s", "S")],
    *[(w, "input:volume", 1.0) for w in ("mL", "ml", "ML", "cc", "CC")],
    *[(w, "input:dose", 1.0) for w in ("mg", "MG")],
    *[(w, "lab:ige", 1.0) for w in ("kU/L", "KU/L", "ku/l", "KU/l", "kIU/L", "KIU/L", "IU/mL", "IU/ML", "U/mL")],
    *[(w, "lab:casts", 1.0) for w in ("#/lpf", "/lpf", "#/LPF", "/LPF")],
    *[(w, "lab:egfr", 1.0) for w in ("mL/min/1.73m2", "ML/MIN/1.73M2", "mL/min/1.73 m2")],
    *[(w, "lab:ph", 1.0) for w in ("units", "UNITS", "Units")],  # text no reader knows still matches itself
    # other units of the same quantity: converted
    *[(w, "lab:glucose", 18.016) for w in ("mmol/L", "MMOL/L", "mmol/l", "Mmol/L")],
    *[(w, "lab:glucose", 0.018016) for w in ("umol/L", "UMOL/L", "\u00b5mol/L", "\u03bcmol/L")],
    ("g/L", "lab:glucose", 100.0), ("G/L", "lab:glucose", 100.0), ("g/dL", "lab:glucose", 1000.0),
    ("g%", "lab:glucose", 1000.0), ("mg/L", "lab:glucose", 0.1), ("MG/L", "lab:glucose", 0.1),
    ("mg/mL", "lab:glucose", 100.0), ("ug/mL", "lab:glucose", 0.1), ("MCG/ML", "lab:glucose", 0.1),
    ("ng/mL", "lab:glucose", 1e-4), ("NG/ML", "lab:glucose", 1e-4),
    ("mU/mL", "lab:tsh", 1000.0), ("U/L", "lab:tsh", 1000.0), ("IU/L", "lab:tsh", 1000.0),
    ("KU/L", "lab:tsh", 1e6), ("uIU/L", "lab:tsh", 1e-3),
    ("umol/L", "lab:sodium", 1e-3), ("mg/dL", "lab:sodium", 10 / 22.99), ("MG/DL", "lab:sodium", 10 / 22.99),
    ("/uL", "lab:wbc", 1e-3), ("cells/uL", "lab:wbc", 1e-3), ("#/uL", "lab:wbc", 1e-3), ("/mm3", "lab:wbc", 1e-3),
    ("cells/mm3", "lab:wbc", 1e-3), ("m/uL", "lab:wbc", 1000.0), ("x10^12/L", "lab:wbc", 1000.0),
    *[(w, "chart:temp", F_TO_C) for w in ("?F", "\u00b0F", "F", "[degF]", "degF", "DEG F")],
    ("K", "chart:temp", K_TO_C), ("k", "chart:temp", K_TO_C),  # one case variant parses: the kelvin
    *[(w, "chart:abp", 7.5006) for w in ("kPa", "KPA", "kpa")],
    *[(w, "chart:abp", 0.73556) for w in ("cmH2O", "CMH2O", "cm H2O", "cm[H2O]")],
    ("Pa", "chart:abp", 0.0075006), ("PA", "chart:abp", 0.0075006),
    ("min", "lab:ptt", 60.0), ("MIN", "lab:ptt", 60.0), ("ms", "lab:ptt", 1e-3), ("MS", "lab:ptt", 1e-3),
    ("hr", "lab:ptt", 3600.0), ("HR", "lab:ptt", 3600.0), ("h", "lab:ptt", 3600.0),
    ("L", "input:volume", 1000.0), ("l", "input:volume", 1000.0), ("dL", "input:volume", 100.0),
    ("DL", "input:volume", 100.0), ("uL", "input:volume", 1e-3), ("UL", "input:volume", 1e-3),
    *[(w, "input:dose", 1e-3) for w in ("mcg", "MCG", "ug", "UG", "\u00b5g", "\u03bcg")],
    *[(w, "input:dose", 1000.0) for w in ("g", "G", "gm", "GM", "grams", "GRAMS")],
    ("kg", "input:dose", 1e6), ("KG", "input:dose", 1e6), ("ng", "input:dose", 1e-6), ("NG", "input:dose", 1e-6),
    ("lb", "input:dose", 453592.37), ("U/L", "lab:ige", 1e-3), ("mg/dL", "lab:crp", 10.0), ("MG/DL", "lab:crp", 10.0),
    # ambiguous under case folding: milli or mega, or whatever the grammar could make of one case
    ("MU/L", "lab:tsh", ambiguous("MU/L", "MU/L", "mU/L")), ("mu/l", "lab:tsh", ambiguous("mu/l", "MU/L", "mU/L")),
    ("Mu/L", "lab:tsh", ambiguous("Mu/L", "MU/L", "mU/L")), ("MU/ML", "lab:tsh", ambiguous("MU/ML", "MU/mL", "mU/mL")),
    ("MIU/L", "lab:tsh", ambiguous("MIU/L", "M[IU]/L", "m[IU]/L")),
    ("miu/l", "lab:tsh", ambiguous("miu/l", "M[IU]/L", "m[IU]/L")),
    ("MIU/ML", "lab:tsh", ambiguous("MIU/ML", "M[IU]/mL", "m[IU]/mL")),
    ("A", "lab:glucose", ambiguous("A", "A", "a")), ("T", "chart:temp", ambiguous("T", "T", "t")),
    ("MV", "lab:glucose", ambiguous("MV", "MV", "mV")), ("MA", "lab:glucose", ambiguous("MA", "MA", "mA")),
    ("PU/L", "lab:tsh", ambiguous("PU/L", "PU/L", "Pu/L", "pU/L", "pu/L")),
    ("GU/L", "lab:tsh", ambiguous("GU/L", "GU/L", "Gu/L")),
    # placeholders: never parsed ('N/A' is newton per ampere to the grammar), not used where the code has a unit
    *[(w, "lab:glucose", placeholder(w)) for w in (
        "N/A", "n/a", "NA", "N.A.", "NULL", "null", "(null)", "<null>", "None", "none", "NONE", "nil", "NaN", "-",
        "--", "---", "?", "??", ".", "...", "_", "*", "/", "unknown", "Unknown", "UNK", "not applicable",
        "Not Available", "no unit", "missing", "undefined")],
    ("N/A", "lab:ph", placeholder("N/A", "units")), ("NULL", "lab:tsh", placeholder("NULL", "mU/L")),
    # text that is no unit: matches only itself
    *[(w, "lab:glucose", not_a_unit(w)) for w in (
        "see comment", "SEE NOTE", "pos", "NEG", "Pos/Neg", "+/-", "#", "trace", "TNTC", "mg per dl", "milligrams",
        "Units/L", "units/L", "score", "points", "x")],
    ("oz", "input:volume", not_a_unit("oz")), ("units", "input:dose", not_a_unit("units")),
    ("dose", "input:dose", not_a_unit("dose")), ("mg/dL", "lab:ph", not_a_unit("units")),
    # units that do not convert to the code's
    ("%", "lab:glucose", different("%", "mg/dL")), ("mmol", "lab:glucose", different("mmol", "mg/dL")),
    ("mg", "lab:glucose", different("mg", "mg/dL")), ("V", "lab:glucose", different("V", "mg/dL")),
    ("mV", "lab:glucose", different("mV", "mg/dL")), ("pmol/L", "lab:tsh", different("pmol/L", "mU/L")),
    ("mEq.", "lab:sodium", different("meq", "mmol/L")), ("%", "lab:wbc", different("%", "10*3/uL")),
    ("U", "input:dose", different("U", "mg")), ("Ratio", "lab:glucose", not_a_unit("{ratio}")),
    ("msec", "lab:glucose", different("ms", "mg/dL")),  # MetaVision's pacer intervals (item 220194)
    ("#/hpf", "lab:casts", ARBITRARY), ("%", "lab:casts", ARBITRARY),
    ("mmol", "input:dose", NO_MOLAR_MASS), ("nmol/L", "lab:crp", NO_MOLAR_MASS),
]


@pytest.fixture(scope="module")
def hostile_harmoniser(converter):
    return units.Harmoniser({c: u for c, (u, _) in CODES.items()},
                            {c: loinc for c, (_, loinc) in CODES.items() if loinc}, converter)


def test_the_hostile_table_is_large_and_every_outcome_is_in_it():
    assert len(HOSTILE) >= 250 and len({(w, c) for w, c, _ in HOSTILE}) == len(HOSTILE)
    outcomes = {e.outcome for _, _, e in HOSTILE if isinstance(e, NotUsed)}
    assert outcomes == {units.AMBIGUOUS, units.PLACEHOLDER, units.NOT_CONVERTIBLE}


@pytest.mark.parametrize("written, code, expected", HOSTILE, ids=[f"{c}:{w}" for w, c, _ in HOSTILE])
def test_every_hostile_unit_string_gets_its_outcome_and_reason(hostile_harmoniser, written, code, expected):
    out = hostile_harmoniser.harmonise(np.array([code], dtype=object), [written], np.array([2.0]))
    if isinstance(expected, NotUsed):
        (problem,), = [out.problems]
        assert (problem.outcome, problem.why) == (expected.outcome, expected.why)
        assert (problem.unit, problem.canonical) == (unit_strings.clean(written), CODES[code][0])
        assert math.isnan(out.values[0]) and units.NOT_USED[problem.outcome]
        return
    scale, offset = expected if isinstance(expected, tuple) else (expected, 0.0)
    assert out.outcomes.tolist() == [units.SAME if (scale, offset) == (1.0, 0.0) else units.CONVERTED]
    assert out.values[0] == pytest.approx(2.0 * scale + offset, rel=5e-3) and not out.problems


@pytest.mark.parametrize("written", sorted({w for w, _, _ in HOSTILE}))
def test_a_unit_read_as_ucum_reads_back_as_itself(converter, written):
    """Reading the UCUM code a string was read as gives that code again, and one key: no drift between hops."""
    code = converter.ucum(written)
    if code is not None:
        assert converter.ucum(code) == code and converter.key(code) == converter.key(written)


def test_no_known_spelling_hides_a_case_ambiguity(converter):
    """A whole-string spelling must not settle what the atoms leave open ('MIU/ML': milli or million IU)."""
    for spelling in unit_strings.SPELLINGS:
        for written in (spelling, spelling.upper()):
            assert converter.reading(written).kind == unit_strings.UCUM, written


# ------------------------------------------------------------------------------- plausibility


def _lower_median(values: np.ndarray) -> float:
    return float(np.sort(np.abs(values))[(len(values) - 1) // 2])


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just(0.0), st.floats(-1e12, 1e12, allow_nan=False)), min_size=1, max_size=60))
def test_the_typical_magnitude_is_the_median_to_within_its_bin(values):
    values = np.array(values)
    typical, exact = magnitudes.typical(magnitudes.sketch(values)), _lower_median(values)
    if exact == 0.0:
        assert typical == 0.0
    elif exact < 1e-300:
        assert typical > 0
    else:
        # A bin is 1/20 decade: its centre is within 1/40 decade of any value in it (plus 4-digit rounding).
        assert abs(math.log10(typical) - math.log10(exact)) <= 0.5 / magnitudes.BINS_PER_DECADE + 1e-4


@settings(max_examples=100, deadline=None)
@given(a=st.lists(st.floats(-1e6, 1e6, allow_nan=False)), b=st.lists(st.floats(-1e6, 1e6, allow_nan=False)))
def test_census_entries_of_two_files_add_up_to_the_census_of_both(a, b):
    parts = [(len(part), magnitudes.sketch(np.array(part))) for part in (a, b)]
    tally = magnitudes.merge_tallies(parts)
    assert tally == (len(a) + len(b), magnitudes.sketch(np.array(a + b)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["lab:1", "lab:2"]), st.sampled_from([None, "mg/dL", "MG/DL", "N/A"]),
                          st.one_of(st.just(math.nan), st.just(0.0), st.just(-0.0),
                                    st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False))), max_size=40))
def test_the_census_counts_each_value_once_in_its_magnitude_bin(rows):
    """events.unit_counts against a loop over the rows: rows per (code, unit as written) and their |value| bins."""
    table = pa.table({"code": [c for c, _, _ in rows], "unit": pa.array([u for _, u, _ in rows], pa.string()),
                      "value": pa.array([v for _, _, v in rows], pa.float64())})
    expected: dict = {}
    for code, unit, value in rows:
        if unit is None or math.isnan(value):
            continue
        b = magnitudes.ZERO_BIN if value == 0 else math.floor(magnitudes.BINS_PER_DECADE * np.log10(abs(value)))
        n, sketch = expected.get((code, unit), (0, {}))
        sketch[b] = sketch.get(b, 0) + 1
        expected[(code, unit)] = (n + 1, sketch)
    assert events.unit_counts(table) == expected


def test_the_bound_is_a_factor_of_a_thousand_either_way():
    assert magnitudes.plausible(1e3) and magnitudes.plausible(1e-3) and magnitudes.plausible(None)
    assert not magnitudes.plausible(1e3 * 1.001) and not magnitudes.plausible(1e-3 / 1.001)
    assert magnitudes.moved_ratio(5.0, 2.0) == 2.5 and magnitudes.moved_ratio(-5.0, 2.0) == 2.5
    assert magnitudes.moved_ratio(0.0, 2.0) is None and magnitudes.moved_ratio(5.0, 0.0) is None
    assert magnitudes.moved_ratio(5.0, None) is None and magnitudes.moved_ratio(math.inf, 2.0) is None


IMPLAUSIBLE_WHY = re.compile(r"once converted, its values \(median about (\S+)\) would lie at (\S+) times the code's "
                             r"training median \((\S+) mg/dL\), outside the plausible 0\.001 to 1000 times")


def test_a_unit_that_does_not_describe_its_values_is_not_converted():
    """Creatinine in mg/dL (training median 1.0) written as 'ng/mL': a factor 1e-4 lands it 10,000x too low;
    the same values in g/L (x100) or umol/L (x0.0113) land where training values lie and are used."""
    h = units.Harmoniser({"lab:50912": "mg/dL"}, {"lab:50912": "2160-0"}, medians={"lab:50912": 1.0})
    codes = np.array(["lab:50912"] * 7, dtype=object)
    written = ["ng/mL", "NG/ML", "ng/mL", "g/L", "g/L", "umol/L", "mg/dL"]
    values = np.array([0.9, 1.1, 1.3, 0.012, 0.009, 88.4, 1.2])
    out = h.harmonise(codes, written, values)
    assert out.outcomes.tolist() == [units.IMPLAUSIBLE] * 3 + [units.CONVERTED] * 3 + [units.SAME]
    np.testing.assert_allclose(out.values[3:], [1.2, 0.9, 1.0, 1.2], rtol=5e-3)
    assert [p.index for p in out.problems] == [0, 1, 2]
    median, ratio, training = (float(x) for x in IMPLAUSIBLE_WHY.fullmatch(out.problems[0].why).groups())
    # The spellings are one sample (median 1.1 of 0.9, 1.1, 1.3), as in the job's census.
    assert median == pytest.approx(1.1, rel=0.13) and ratio == pytest.approx(1.1e-4, rel=0.13) and training == 1.0
    assert len({p.why for p in out.problems}) == 1


def test_the_job_judges_a_unit_by_its_census_over_the_release():
    """One admission's creatinine in ng/mL near 1 looks 10,000x off alone; in a release whose ng/mL values
    lie near 10,000 (so that they convert onto the training median) it is converted like the rest."""
    canonical, loinc, medians = {"lab:50912": "mg/dL"}, {"lab:50912": "2160-0"}, {"lab:50912": 1.0}
    alone = units.Harmoniser(canonical, loinc, medians=medians)
    census = units.Harmoniser(canonical, loinc, medians=medians, unit_medians={"lab:50912": {"ng/mL": 1e4}})
    args = np.array(["lab:50912"], dtype=object), ["ng/mL"], np.array([1.0])
    assert alone.harmonise(*args).outcomes.tolist() == [units.IMPLAUSIBLE]
    judged = census.harmonise(*args)
    assert judged.outcomes.tolist() == [units.CONVERTED] and judged.values[0] == pytest.approx(1e-4)
    # Without a training median there is nothing to judge against: converted, as before medians existed.
    assert units.Harmoniser(canonical, loinc).harmonise(*args).outcomes.tolist() == [units.CONVERTED]


def test_a_placeholder_on_a_code_without_a_unit_is_used_as_recorded():
    h = units.Harmoniser({"lab:50912": "mg/dL"})
    out = h.harmonise(np.array(["lab:51000", "lab:50912"], dtype=object), ["N/A", "N/A"], np.array([3.0, 3.0]))
    assert out.outcomes.tolist() == [units.UNCHECKED, units.PLACEHOLDER] and out.values[0] == 3.0
    # Placeholders never vote for a canonical unit, whatever their count.
    assert units.canonical_units({"lab:1": {"N/A": 90, "mg/dL": 10}, "lab:2": {"NULL": 5}}, units.Converter()) == {
        "lab:1": "mg/dL"}


# ------------------------------------------------------------------------------- the job on hostile units

TSH, CREATININE, GLUCOSE = "50993", "50912", "50931"
GLUCOSE_MG_PER_MMOL = 18.016  # published: 1 mmol/L of glucose is 18.0 mg/dL


def _hostile_labevents(demo_dir, dest) -> list[dict]:
    """The demo with hostile units on TSH, creatinine and glucose rows; returns the rewritten rows."""
    dest.mkdir()
    for path in demo_dir.glob("*.csv.gz"):
        if path.name != "LABEVENTS.csv.gz":
            (dest / path.name).symlink_to(path)
    with gzip.open(demo_dir / "LABEVENTS.csv.gz", "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    seen: dict[str, int] = {}
    changed = []
    for row in rows:
        item = row["ITEMID"]
        if not row["VALUENUM"] or item not in (TSH, CREATININE, GLUCOSE):
            continue
        k = seen[item] = seen.get(item, -1) + 1
        unit = None
        if item == TSH and row["VALUEUOM"] == "uIU/mL" and k % 3 == 0:
            unit = "MU/L"  # milli or mega: a third of the rows, so the canonical unit stays uIU/mL
        elif item == CREATININE and k % 5 == 0:
            unit = "N/A"
        elif item == CREATININE and k % 7 == 0:
            unit = "ng/mL"  # the values stay mg/dL ones: the unit does not describe them
        elif item == GLUCOSE and k % 11 == 0:
            unit = "see comment"
        elif item == GLUCOSE and k % 13 == 0:
            unit = "MMOL/L"
            row["VALUENUM"] = row["VALUE"] = repr(float(row["VALUENUM"]) / GLUCOSE_MG_PER_MMOL)
        if unit is not None:
            row["VALUEUOM"] = unit
            changed.append(row)
    with gzip.open(dest / "LABEVENTS.csv.gz", "wt", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), quoting=csv.QUOTE_NONNUMERIC)
        writer.writeheader()
        writer.writerows(rows)
    return changed


def _triggers(out_dir) -> dict[int, list[int]]:
    """SUBJECT_ID -> trigger times (s) of its examples, read from the job's records."""
    out: dict[int, list[int]] = {}
    for path in sorted(pathlib.Path(out_dir).glob(f"*{spec.TFRECORD_SUFFIX}")):
        with open(path, "rb") as f:
            for rec in tfrecord.read_records(f):
                ex = seqex.sequence_example_to_dict(rec)
                out.setdefault(ex[spec.SUBJECT_ID], []).append(ex[spec.TRIGGER_TIME])
    return out


def _seconds(text: str) -> int:
    return int(dt.datetime.fromisoformat(text).replace(tzinfo=dt.timezone.utc).timestamp())


def test_the_job_counts_and_dead_letters_every_value_its_unit_refuses(demo_dir, tmp_path):
    """Hostile units on real demo rows: each refused value is one dead letter per admission it would have fed,
    with its reason and exact detail; the manifest counts them by outcome and the summary names them."""
    changed = _hostile_labevents(demo_dir, tmp_path / "release")
    config = PipelineConfig.model_validate({"sources": ["lab"], "num_shards": {"train": 1, "validation": 1,
                                                                                "test": 1}})
    out = tmp_path / "out"
    manifest = run_job(str(tmp_path / "release"), str(out), config)
    triggers = _triggers(out)
    reasons = {"MU/L": ("unit_ambiguous", "'MU/L' reads as 'MU/L' or 'mU/L' depending on its letter case, which "
                                          "this spelling does not show"),
               "N/A": ("unit_placeholder", "'N/A' is a placeholder, not a unit; the code's values are in 'mg/dL'"),
               "ng/mL": ("conversion_implausible", None),
               "see comment": ("unit_not_convertible", "'see comment' is not a unit this converter reads (UCUM or a "
                                                       "known spelling)")}
    expected: collections.Counter = collections.Counter()
    converted = 0
    for row in changed:
        feeds = sum(_seconds(row["CHARTTIME"]) < t for t in triggers.get(int(row["SUBJECT_ID"]), []))
        if row["VALUEUOM"] == "MMOL/L":
            converted += feeds
        else:
            expected[(f"lab:{row['ITEMID']}", _seconds(row["CHARTTIME"]), float(row["VALUENUM"]),
                      row["VALUEUOM"], reasons[row["VALUEUOM"]][0])] += feeds
    dead_file = out / "dead_letter" / "values_not_convertible.jsonl"
    dead = [json.loads(line) for line in dead_file.read_text().splitlines()]
    got = collections.Counter((d["code"], d["time"], d["value"], d["unit"], d["reason"]) for d in dead)
    assert got == +expected
    by_reason = collections.Counter(d["reason"] for d in dead)
    assert all(by_reason[r] > 5 for r, _ in reasons.values()), by_reason
    for d in dead:
        reason, detail = reasons[d["unit"]]
        if detail is not None:
            assert d["detail"] == detail
    # The implausible conversion's detail: its values' median and the training median, each to within a bin.
    creatinine = [float(r["VALUENUM"]) for r in _csv_rows(tmp_path / "release", "LABEVENTS")
                  if r["ITEMID"] == CREATININE and r["VALUENUM"] and r["VALUEUOM"] in ("mg/dL", "MG/DL")]
    moved = [float(r["VALUENUM"]) for r in changed if r["VALUEUOM"] == "ng/mL"]
    details = {d["detail"] for d in dead if d["unit"] == "ng/mL"}
    (detail,) = details
    median, ratio, training = (float(x) for x in IMPLAUSIBLE_WHY.fullmatch(detail).groups())
    assert median == pytest.approx(_lower_median(np.array(moved)), rel=0.13)
    assert training == pytest.approx(_lower_median(np.array(creatinine)), rel=0.13)
    assert ratio == pytest.approx(median * 1e-4 / training, rel=1e-2)
    # The manifest counts what the dead letters hold, by outcome; the summary names every reason.
    lab = manifest["units"]["values"]["lab"]
    assert (lab[units.AMBIGUOUS], lab[units.PLACEHOLDER], lab[units.IMPLAUSIBLE], lab[units.NOT_CONVERTIBLE]) == (
        by_reason["unit_ambiguous"], by_reason["unit_placeholder"], by_reason["conversion_implausible"],
        by_reason["unit_not_convertible"])
    assert lab[units.CONVERTED] == 1 + converted and converted > 5  # the demo's one CRP value in mg/dL, and glucose
    summary = manifest_mod.format_manifest_summary(manifest)
    assert (f"lab values: {lab[units.CONVERTED]:,} converted to their code's canonical unit, "
            f"{lab[units.NOT_CONVERTIBLE]:,} not convertible, {lab[units.AMBIGUOUS]:,} in an ambiguous unit, "
            f"{lab[units.PLACEHOLDER]:,} with a placeholder for a unit, {lab[units.IMPLAUSIBLE]:,} implausibly far "
            "from the training median once converted (not used; dead_letter/values_not_convertible.jsonl)"
            ) in summary.splitlines()
    assert manifest["balanced"]
    written = layout.read_json(str(out / layout.UNITS))
    assert written["canonical"][f"lab:{TSH}"] == "u[IU]/mL"
    assert written["medians"][f"lab:{CREATININE}"] == pytest.approx(training, rel=5e-3)  # the detail's 3 digits


def _csv_rows(folder, table):
    with gzip.open(pathlib.Path(folder) / f"{table}.csv.gz", "rt", newline="") as f:
        yield from csv.DictReader(f)
