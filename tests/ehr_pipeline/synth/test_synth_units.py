"""Every unit the synthetic generator writes, at every site, is read and its values are used.

A unit the reader does not know sets its values aside (docs/units.md): a release of any site must
lose none, neither with its own canonical units nor prepared with site A's (`--units-from`, a model
trained at site A). The tables are read with the csv module, the census and plausibility medians
recomputed here, and the harmoniser judged on every value the job would read.
"""
from __future__ import annotations

import csv
import gzip
import pathlib

import numpy as np
import pytest

from ehr_pipeline.encode import magnitudes, unit_strings, units
from ehr_pipeline.synth import generate_release
from ehr_pipeline.synth.site import SITES

TINY = dict(patients=8, seed=4, events_scale=0.3, show_progress=False)
# Every column the generator writes a unit in.
UNIT_COLUMNS = {"D_ITEMS": ("UNITNAME",), "LABEVENTS": ("VALUEUOM",), "CHARTEVENTS": ("VALUEUOM",),
                "OUTPUTEVENTS": ("VALUEUOM",), "INPUTEVENTS_CV": ("AMOUNTUOM", "RATEUOM"),
                "INPUTEVENTS_MV": ("AMOUNTUOM", "RATEUOM", "TOTALAMOUNTUOM"),
                "PRESCRIPTIONS": ("DOSE_UNIT_RX", "FORM_UNIT_DISP")}
# The numeric values the job reads: table -> (its source, value column, unit column).
VALUES = {"LABEVENTS": ("lab", "VALUENUM", "VALUEUOM"), "CHARTEVENTS": ("chart", "VALUENUM", "VALUEUOM"),
          "OUTPUTEVENTS": ("output", "VALUE", "VALUEUOM"), "INPUTEVENTS_CV": ("input", "AMOUNT", "AMOUNTUOM"),
          "INPUTEVENTS_MV": ("input", "AMOUNT", "AMOUNTUOM")}


def _rows(release: pathlib.Path, table: str):
    with gzip.open(release / f"{table}.csv.gz", "rt", newline="") as f:
        yield from csv.DictReader(f)


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> dict[str, pathlib.Path]:
    """One tiny release per site, the same seed (under a second each)."""
    out = {}
    for name in sorted(SITES):
        out[name] = tmp_path_factory.mktemp("units") / name
        generate_release(out[name], site=name, **TINY)
    return out


@pytest.fixture(scope="module")
def converter():
    return units.Converter()


def _values(release: pathlib.Path) -> tuple[np.ndarray, list[str], np.ndarray]:
    """(codes, units as written, values) of every row with a value, as the job names its codes."""
    codes, written, values = [], [], []
    for table, (source, value, unit) in VALUES.items():
        for row in _rows(release, table):
            if row[value]:
                codes.append(f"{source}:{row['ITEMID']}")
                written.append(row[unit])
                values.append(float(row[value]))
    return np.array(codes, dtype=object), written, np.array(values)


def _census(codes, written, values, converter) -> tuple[dict, dict]:
    """(rows per code and unit as written, median |value| per code in its canonical unit), as the job counts."""
    counts: dict[str, dict[str, int]] = {}
    for code, unit in zip(codes, written):
        if unit_strings.clean(unit) is not None:
            counts.setdefault(code, {}).setdefault(unit, 0)
            counts[code][unit] += 1
    canonical = units.canonical_units(counts, converter)
    medians = {}
    for code, unit in canonical.items():
        mine = [v for c, u, v in zip(codes, written, values) if c == code and converter.key(u) == unit]
        medians[code] = magnitudes.typical(magnitudes.sketch(np.array(mine)))
    return counts, medians


def _loinc(release: pathlib.Path) -> dict[str, str]:
    return {f"lab:{r['ITEMID']}": r["LOINC_CODE"] for r in _rows(release, "D_LABITEMS") if r["LOINC_CODE"]}


@pytest.mark.parametrize("site", sorted(SITES))
def test_every_unit_the_generator_writes_is_read_or_deliberately_text(releases, converter, site):
    written = {row[c] for table, columns in UNIT_COLUMNS.items() for row in _rows(releases[site], table)
               for c in columns}
    unread = {w for w in written if converter.reading(w).kind not in (unit_strings.UCUM, unit_strings.BLANK)
              and unit_strings.clean(w).casefold() not in unit_strings.NOT_UNITS}
    assert unread == set()
    assert "Deg. F" in written and converter.ucum("Deg. F") == "[degF]"


@pytest.mark.parametrize("site", sorted(SITES))
def test_no_value_of_any_site_is_set_aside_for_its_unit(releases, converter, site):
    """With the site's own units, and with site A's as a model trained there would have them."""
    codes, written, values = _values(releases[site])
    counts, _ = _census(codes, written, values, converter)
    reference_counts, reference_medians = _census(*_values(releases["A"]), converter)
    reference = units.canonical_units(reference_counts, converter)
    loinc = _loinc(releases[site])
    for canonical, medians in ((units.canonical_units(counts, converter), {}),
                               (units.canonical_units(counts, converter, reference), reference_medians)):
        out = units.Harmoniser(canonical, loinc, converter, medians=medians).harmonise(codes, written, values)
        assert out.problems == (), out.problems[:3]
        assert np.count_nonzero(np.isnan(out.values)) == 0
        used = out.counts()
        assert used[units.SAME] + used[units.CONVERTED] + used[units.NO_UNIT] + used[units.UNCHECKED] == len(values)
    if site == "C":  # its SI units meet site A's: converted, and onto site A's values
        assert used[units.CONVERTED] > 100
