"""MIMIC-III's own unit strings: every one the demo writes, CareVue's chart spellings, through the reader and the job.

The expected UCUM codes are written here from the UCUM specification and MIMIC-III's documentation
(what an item measures), not taken from the module; conversions are checked against unit
definitions (1 in = 2.54 cm, 1 lb = 0.45359237 kg, 1 psi = 6.894757 kPa, 1 cmH2O = 98.0665 Pa,
1 dyn = 1e-5 N) and the Fahrenheit formula.
"""
from __future__ import annotations

import collections
import csv
import gzip
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from ehr_pipeline.contract import PipelineConfig, layout
from ehr_pipeline.encode import unit_strings, units
from ehr_pipeline.job import run_job
from ehr_pipeline.synth import generate_release
from tests.support.job_outputs import CONFIG, read_examples

BLANK, PLACEHOLDER, TEXT = unit_strings.BLANK, unit_strings.PLACEHOLDER, unit_strings.TEXT
# Every distinct unit string of the demo (D_ITEMS.UNITNAME and each unit column of every table) -> its
# UCUM code, or what it is when it is none: a blank, a placeholder, or text deliberately no unit (a
# dosage form, 'units', 'dose', 'Date').
DEMO_UNITS: dict[str, str] = {
    # D_ITEMS.UNITNAME
    "": BLANK, "None": PLACEHOLDER, "mL": "mL", "mmHg": "mm[Hg]", "mg": "mg", "dose": TEXT, "cm": "cm", "%": "%",
    "L/min": "L/min", "cmH2O": "cm[H2O]", "bpm": "/min", "units": TEXT, "grams": "g", "insp/min": "/min",
    "ml/hr": "mL/h", "?C": "Cel", "mEq": "meq", "mA": "mA", "sec": "s", "min": "min", "mV": "mV", "mmol": "mmol",
    "lbs": "[lb_av]", "?F": "[degF]", "kg": "kg", "L/min/m2": "L/min/m2", "dynes*sec/cm5": "dyn.s/cm5",
    "ml/min": "mL/min", "mcg": "ug", "mL SC": "mL{SC}", "mL/m2": "mL/m2", "years": "a", "mL/beat": "mL/{beat}",
    "Liters": "L", "dynes.sec.cm-5/m2": "dyn.s.cm-5/m2", "International Units": "[IU]", "mL/min/m2": "mL/min/m2",
    "dynes*sec/cm5/m2": "dyn.s/cm5/m2", "hour": "h", "mEq.": "meq", "kcal/day": "kcal/d", "mg/hour": "mg/h",
    "ppm": "[ppm]", "psi": "[psi]", "/min": "/min", "Degree": "deg", "kcal/kg": "kcal/kg", "g/kg": "g/kg",
    "ounces": TEXT, "msec": "ms", "g/dl": "g/dL", "ml/kg": "mL/kg", "Inch": "[in_i]",
    "cmH2O/L/seconds": "cm[H2O].s/L",
    # LABEVENTS.VALUEUOM
    "mg/dL": "mg/dL", "mEq/L": "meq/L", "K/uL": "10*3/uL", "IU/L": "U/L", "g/dL": "g/dL", "mm Hg": "mm[Hg]",
    "pg": "pg", "fL": "fL", "m/uL": "10*6/uL", "mmol/L": "mmol/L", "ng/mL": "ng/mL", "#/hpf": "/[HPF]",
    "ug/mL": "ug/mL", " ": BLANK, "EU/dL": "[EU]/dL", "#/uL": "/uL", "ug/dL": "ug/dL", "mOsm/kg": "mosm/kg",
    "SECONDS": "s", "pg/mL": "pg/mL", "uIU/mL": "u[IU]/mL", "#/lpf": "/[LPF]", "umol/L": "umol/L",
    "Ratio": "{ratio}", "ng/ml": "ng/mL", "ng/dL": "ng/dL", "U/mL": "U/mL", "MOSM/KG": "mosm/kg", "MG/DL": "mg/dL",
    "mIU/mL": "m[IU]/mL", "MM HG": "mm[Hg]", "uU/ML": "u[IU]/mL", "+/-": TEXT, "MEQ/L": "meq/L", "UNITS": TEXT,
    "mg/L": "mg/L", "mm/hr": "mm/h", "mg/g": "mg/g", "U/L": "U/L", "Pos/Neg": TEXT, "U/g/Hb": "U/g{Hb}",
    # DATETIMEEVENTS, OUTPUTEVENTS, PROCEDUREEVENTS_MV
    "Date": TEXT, "Date and Time": TEXT, "ml": "mL",
    # INPUTEVENTS_CV: amounts, CareVue's run-together rates, ORIGINALAMOUNTUOM's vials and strengths
    "U": "U", "mcgkgmin": "ug/kg/min", "Uhr": "U/h", "mghr": "mg/h", "mcghr": "ug/h", "mgmin": "mg/min",
    "mgkghr": "mg/kg/h", "Umin": "U/min", "mcgmin": "ug/min", "vl": TEXT, "str": TEXT, "cc": "mL",
    # INPUTEVENTS_MV
    "mL/hour": "mL/h", "mcg/kg/min": "ug/kg/min", "mEq./hour": "meq/h", "mcg/hour": "ug/h", "units/hour": TEXT,
    "grams/hour": "g/h", "mg/min": "mg/min", "mg/kg/hour": "mg/kg/h", "mL/kg/hour": "mL/kg/h", "grams/min": "g/min",
    # PRESCRIPTIONS: doses ('mg PE' is phenytoin equivalents, 'in' inches of ointment) and dosage forms
    "UNIT": TEXT, "gm": "g", "g": "g", "mcg/hr": "ug/h", "mg PE": TEXT, "in": "[in_i]", "million units": TEXT,
    "mcg/h": "ug/h", "L": "L", **{form: TEXT for form in (
        "TAB", "NEB", "VIAL", "Appl", "PUFF", "PKT", "DROP", "BAG", "SYR", "CAP", "PTCH", "INH", "AMP", "LOZ", "SPRY",
        "TROC", "gtt", "UDCUP", "Enema", "BTL", "SUPP", "TUBE", "DBTL", "DEV", "DRP", "CAN", "AERO", "KIT")},
}
# CareVue's chart spellings (CHARTEVENTS.VALUEUOM, absent from the demo) and their UCUM codes.
CAREVUE_UNITS: dict[str, str] = {
    "Deg. F": "[degF]", "Deg. C": "Cel", "BPM": "/min", "cmH2O": "cm[H2O]", "cmH20": "cm[H2O]", "mmHg": "mm[Hg]",
    "insp/min": "/min", "Inches": "[in_i]", "Kg": "kg", "cc/hr": "mL/h", "cc/min": "mL/min", "cc/kg": "mL/kg",
    "mg/hr": "mg/h", "U/hr": "U/h", "mcg/min": "ug/min", "mg/dl": "mg/dL", "lpm": "L/min", "units/hr": TEXT,
    "mL/cmH2O": "mL/cm[H2O]", "ms": "ms", "lb": "[lb_av]", "DEG. F": "[degF]", "deg. c": "Cel",
}
# The columns the demo writes units in.
UNIT_COLUMNS = {"D_ITEMS": ("UNITNAME",), "LABEVENTS": ("VALUEUOM",), "DATETIMEEVENTS": ("VALUEUOM",),
                "OUTPUTEVENTS": ("VALUEUOM",), "PROCEDUREEVENTS_MV": ("VALUEUOM",),
                "INPUTEVENTS_CV": ("AMOUNTUOM", "RATEUOM", "ORIGINALAMOUNTUOM", "ORIGINALRATEUOM"),
                "INPUTEVENTS_MV": ("AMOUNTUOM", "RATEUOM", "TOTALAMOUNTUOM"),
                "PRESCRIPTIONS": ("DOSE_UNIT_RX", "FORM_UNIT_DISP")}
F_TO_C = (5 / 9, -160 / 9)  # Celsius = (Fahrenheit - 32) x 5/9
# (from, to, scale or (scale, offset)) by unit definitions, checked to 1e-6.
DEFINED = [
    ("Deg. F", "Deg. C", F_TO_C), ("?F", "Deg. C", F_TO_C), ("Deg. C", "Deg. F", (9 / 5, 32.0)),
    ("Inches", "cm", 2.54), ("Inch", "cm", 2.54), ("lbs", "Kg", 0.45359237), ("psi", "kPa", 6.894757),
    ("cmH2O", "Pa", 98.0665), ("cmH20", "mmHg", 98.0665 / 133.322387), ("dynes*sec/cm5", "Pa.s/m3", 1e5),
    ("dynes.sec.cm-5/m2", "dynes*sec/cm5/m2", 1.0), ("cmH2O/L/seconds", "Pa.s/m3", 98.0665e3),
    ("cc/hr", "mL/min", 1 / 60), ("mL/hour", "ml/hr", 1.0), ("mcgkgmin", "mg/kg/hour", 0.06),
    ("Uhr", "Umin", 1 / 60), ("mEq./hour", "mEq/min", 1 / 60), ("grams/min", "mg/hour", 60_000.0),
    ("Liters", "mL", 1000.0), ("msec", "sec", 1e-3), ("years", "hour", 365.25 * 24), ("mL SC", "cc", 1.0),
    ("mL/beat", "L/{beat}", 1e-3), ("lpm", "cc/min", 1000.0), ("ppm", "%", 1e-4),
]


@pytest.fixture(scope="module")
def converter():
    return units.Converter()


def _expected(converter, written: str, what: str) -> None:
    reading = converter.reading(written)
    if what in (BLANK, PLACEHOLDER, TEXT):
        assert (reading.kind, reading.ucum) == (what, None), written
        if what == TEXT:  # deliberately no unit, not a string that failed to parse
            assert unit_strings.clean(written).casefold() in unit_strings.NOT_UNITS, written
        return
    assert (reading.kind, reading.ucum) == (unit_strings.UCUM, what), written
    assert converter.ucum(what) == what  # the code reads back as itself: one key on every hop


@pytest.mark.parametrize("written, what", sorted({**DEMO_UNITS, **CAREVUE_UNITS}.items()))
def test_every_mimic_unit_string_reads_as_its_ucum_code_or_is_classified(converter, written, what):
    _expected(converter, written, what)


@pytest.mark.parametrize("src, dst, expected", DEFINED, ids=[f"{s}->{d}" for s, d, _ in DEFINED])
def test_mimic_spellings_convert_by_the_unit_definitions(converter, src, dst, expected):
    scale, offset = expected if isinstance(expected, tuple) else (expected, 0.0)
    conversion, why = converter.conversion(src, dst)
    assert conversion is not None, why
    assert conversion.scale == pytest.approx(scale, rel=1e-6) and conversion.offset == pytest.approx(offset, abs=1e-9)


def test_the_demo_writes_no_unit_string_left_unclassified(demo_dir):
    seen: collections.Counter = collections.Counter()
    for table, columns in UNIT_COLUMNS.items():
        with gzip.open(demo_dir / f"{table}.csv.gz", "rt", newline="") as f:
            rows = csv.reader(f)
            header = next(rows)
            at = [header.index(c) for c in columns]
            for row in rows:
                seen.update(row[i] for i in at)
    assert set(seen) - set(DEMO_UNITS) == set()


@settings(max_examples=200, deadline=None)
@given(f=st.floats(-500.0, 1000.0, allow_nan=False))
def test_fahrenheit_and_celsius_convert_by_the_formula(converter, f):
    to_c, _ = converter.conversion("Deg. F", "Deg. C")
    to_f, _ = converter.conversion("Deg. C", "Deg. F")
    assert to_c.apply(f) == pytest.approx((f - 32) * 5 / 9, abs=1e-9)
    assert to_f.apply((f - 32) * 5 / 9) == pytest.approx(f, abs=1e-9)


# Pieces unit strings are made of, so drawn strings look like units (and like the ones that broke).
PIECES = ["deg", "Deg", ". ", ".", " ", "F", "f", "C", "mg", "MG", "/", "dL", "cc", "hr", "units", "x", "10", "^",
          "*", "3", "mU", "MU", "L", "l", "kg", "IU", "#", "%", "?", "min", "sec", "mmHg", "cmH2O", "a", "b", "z"]


@settings(max_examples=300, deadline=None)
@given(pieces=st.lists(st.sampled_from(PIECES), min_size=1, max_size=5),
       flips=st.lists(st.booleans(), min_size=40, max_size=40))
def test_a_unit_is_the_same_unit_as_its_stored_key_and_as_itself_in_any_case(converter, pieces, flips):
    """A canonical unit is stored as its key: a value in that unit must match it, whatever the grammar reads."""
    written = "".join(pieces)
    key = converter.key(written)
    if key is None:
        return
    assert converter.conversion(written, key)[0] == units.IDENTITY, (written, key)
    recased = "".join(c.upper() if flip else c.lower() for c, flip in zip(written, flips + [False] * len(written)))
    kinds = {converter.reading(written).kind, converter.reading(recased).kind}
    if unit_strings.AMBIGUOUS not in kinds and kinds != {unit_strings.UCUM}:
        # Alike up to case and not two readings of case-sensitive UCUM: one unit, whatever else a parser says.
        assert converter.conversion(written, recased)[0] == units.IDENTITY, (written, recased)


def test_a_text_canonical_unit_stored_folded_matches_its_spelling_where_the_grammar_reads_the_fold(converter):
    """'Deg. V' is no unit as written, and folded, 'deg. v' reads as degree times volt: the failure of 'Deg. F'."""
    c = converter
    written = "Deg. V"
    assert c.reading(written).kind == TEXT and c.reading(c.key(written)).kind == unit_strings.UCUM
    for canonical in (c.key(written), written.upper(), written.casefold(), "deg.v"):
        assert c.conversion(written, canonical)[0] == units.IDENTITY, canonical
        assert units.Harmoniser({"chart:1": canonical}, converter=c).harmonise(
            np.array(["chart:1"], dtype=object), [written], np.array([98.6])).outcomes.tolist() == [units.SAME]
    # Where case decides between two units it still does: 'MU/L' is not taken for 'mU/L'.
    assert c.conversion("MU/L", "mU/L")[0] is None


# ------------------------------------------------------------------------------- the job on CareVue's spellings

# (source item, twin item, spellings): the twin's rows are the source's, each written in the next
# spelling of the list with the source value moved into that unit by the definitions above; the
# first spelling's unit holds most rows, so it is the twin's canonical unit.
TWINS = [
    (678, 676, [("Deg. C", lambda f: (f - 32) * 5 / 9), ("Deg. C", lambda f: (f - 32) * 5 / 9),
                ("Deg. F", lambda f: f)]),
    (678, 900678, [("Deg. F", lambda f: f), ("?F", lambda f: f), ("DEG. F", lambda f: f),
                   ("\u00b0F", lambda f: f), ("Deg. C", lambda f: (f - 32) * 5 / 9)]),
    (211, 900211, [("BPM", lambda v: v), ("bpm", lambda v: v), ("beats/min", lambda v: v), ("/min", lambda v: v)]),
    (618, 900618, [("insp/min", lambda v: v), ("BPM", lambda v: v), ("breaths/min", lambda v: v)]),
    (51, 900051, [("mmHg", lambda v: v), ("mm Hg", lambda v: v), ("MMHG", lambda v: v),
                  ("cmH2O", lambda v: v * 133.322387 / 98.0665)]),
    (51, 900506, [("cmH2O", lambda v: v), ("cmH20", lambda v: v), ("cm H2O", lambda v: v),
                  ("mmHg", lambda v: v * 98.0665 / 133.322387)]),
    (762, 900762, [("Kg", lambda v: v), ("kg", lambda v: v), ("KG", lambda v: v), ("lbs", lambda v: v / 0.45359237)]),
    (762, 900920, [("Inches", lambda v: v), ("Inch", lambda v: v), ("in", lambda v: v), ("cm", lambda v: v * 2.54)]),
    (762, 900224, [("cc/hr", lambda v: v), ("ml/hr", lambda v: v), ("mL/hour", lambda v: v),
                   ("L/min", lambda v: v / 60_000)]),
    (762, 900030, [("mcgkgmin", lambda v: v), ("mcg/kg/min", lambda v: v), ("mg/kg/min", lambda v: v / 1000)]),
]
# The twin's canonical unit, and the source value in it (the map the job's records must show).
CANONICAL = {676: ("Cel", lambda f: (f - 32) * 5 / 9), 900678: ("[degF]", None), 900211: ("/min", None),
             900618: ("/min", None), 900051: ("mm[Hg]", None), 900506: ("cm[H2O]", None), 900762: ("kg", None),
             900920: ("[in_i]", None), 900224: ("mL/h", None), 900030: ("ug/kg/min", None)}


def _with_twins(release: pathlib.Path) -> int:
    """Adds the TWINS' rows to the release's CHARTEVENTS; returns how many."""
    path = release / "CHARTEVENTS.csv.gz"
    with gzip.open(path, "rt", newline="") as f:
        rows = list(csv.DictReader(f))
    added = []
    for source, twin, spellings in TWINS:
        k = 0
        for row in rows:
            if row["ITEMID"] != str(source) or not row["VALUENUM"]:
                continue
            unit, move = spellings[k % len(spellings)]
            value = repr(move(float(row["VALUENUM"])))
            added.append({**row, "ITEMID": str(twin), "VALUE": value, "VALUENUM": value, "VALUEUOM": unit})
            k += 1
    for i, row in enumerate(rows + added, start=1):
        row["ROW_ID"] = str(i)
    with gzip.open(path, "wt", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]), quoting=csv.QUOTE_NONNUMERIC)
        writer.writeheader()
        writer.writerows(rows + added)
    return len(added)


def _bag_stats(examples: dict, code: str) -> dict:
    """(admission, bag) -> (count, min, max, mean, last) of one code's values in the job's records."""
    out = {}
    for hadm, ex in examples.items():
        for b, codes in enumerate(ex["codes"]):
            if code in codes:
                j = codes.index(code)
                out[(hadm, b)] = tuple(ex[f][b][j] for f in ("value_count", "value_min", "value_max", "value_mean",
                                                              "value_last"))
    return out


def test_the_job_uses_every_carevue_spelling_and_converts_deg_c_by_the_formula(tmp_path):
    """CareVue's spellings, 'Deg. C' on item 676 included, through the job: no value set aside for its unit, and
    each twin item's bags are its source's, moved into the twin's canonical unit by the unit definitions."""
    release = tmp_path / "release"
    generate_release(release, patients=12, seed=7, events_scale=0.3, show_progress=False)
    assert _with_twins(release) > 200
    out = tmp_path / "out"
    config = dict(CONFIG, num_shards={"train": 1, "validation": 1, "test": 1}, sources=["chart"])
    manifest = run_job(str(release), str(out), PipelineConfig.model_validate(config))
    chart = manifest["units"]["values"]["chart"]
    assert {o: chart.get(o, 0) for o in units.NOT_USED} == {o: 0 for o in units.NOT_USED}, chart
    assert chart[units.CONVERTED] > 20 and chart[units.SAME] > 0
    dead = out / "dead_letter" / "values_not_convertible.jsonl"
    assert not dead.exists() or dead.read_text() == ""
    canonical = layout.read_json(str(out / layout.UNITS))["canonical"]
    assert {twin: canonical[f"chart:{twin}"] for twin in CANONICAL} == {t: u for t, (u, _) in CANONICAL.items()}
    examples = read_examples(out)
    for source, twin, _ in TWINS:
        move = CANONICAL[twin][1] or (lambda v: v)
        want, got = _bag_stats(examples, f"chart:{source}"), _bag_stats(examples, f"chart:{twin}")
        assert want.keys() == got.keys() and len(want) > 5, twin
        for bag, (n, *stats) in want.items():
            assert got[bag][0] == n, (twin, bag)
            # Records hold float32: moved source values against converted twin values, to its precision.
            np.testing.assert_allclose(got[bag][1:], [move(s) for s in stats], rtol=2e-6, atol=1e-4,
                                       err_msg=f"{twin} {bag}")
