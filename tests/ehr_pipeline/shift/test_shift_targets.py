"""The shift report's targets on small synthetic releases, each prepared by the Beam job.

Reference: the training split of a site-A release. Against it (issue 22's targets):
* 3 fresh site-A releases (other seeds): no severe finding (no false alarm);
* site B (`synth --site B`): its biased assays (creatinine x1.15, lactate x1.2, glucose x1.1) are named;
* a site-A release rewritten in SI units (the published conventional -> SI factors, written
  here, not taken from the units module), prepared without --units-from: every analyte whose
  unit differs is named, as a unit mismatch and as a value shift.
"""
from __future__ import annotations

import csv
import gzip

import pytest

from ehr_pipeline import shift
from ehr_pipeline.contract import PipelineConfig, layout
from ehr_pipeline.job import run_job
from ehr_pipeline.shift import population
from ehr_pipeline.synth import generate_release

pytestmark = pytest.mark.slow

SMALL = {"events_scale": 0.3, "show_progress": False}
CONFIG = {"num_shards": {"train": 1, "validation": 1, "test": 1}}
# LABEVENTS ITEMID -> (SI per conventional unit, SI unit): clinical SI conversion tables (Young,
# Ann Intern Med 1987;106:114-129), the units most of the world reports these analytes in.
SI = {"50912": (88.4, "umol/L"), "50931": (0.0555, "mmol/L"), "51006": (0.357, "mmol/L"),
      "50893": (0.2495, "mmol/L"), "50960": (0.4114, "mmol/L"), "50970": (0.3229, "mmol/L"),
      "51222": (10.0, "g/L"), "50885": (17.1, "umol/L"), "50862": (10.0, "g/L"),
      "50818": (0.1333, "kPa"), "50821": (0.1333, "kPa")}
BIASED = ("lab:50912", "lab:50813", "lab:50931")  # site B: creatinine, lactate, glucose


def _si_release(site_a, out):
    """site_a with every SI analyte's LABEVENTS values and units rewritten (4 significant digits); the rest linked."""
    out.mkdir()
    for path in site_a.iterdir():
        if path.name != "LABEVENTS.csv.gz":
            (out / path.name).symlink_to(path)
    with gzip.open(site_a / "LABEVENTS.csv.gz", "rt", newline="") as f, \
            gzip.open(out / "LABEVENTS.csv.gz", "wt", newline="", compresslevel=1) as g:
        reader, writer = csv.reader(f), csv.writer(g)
        header = next(reader)
        writer.writerow(header)
        item, num, uom, val = (header.index(c) for c in ("ITEMID", "VALUENUM", "VALUEUOM", "VALUE"))
        for row in reader:
            if row[item] in SI and row[num]:
                factor, unit = SI[row[item]]
                row[num] = row[val] = f"{float(row[num]) * factor:.4g}"
                row[uom] = unit
            writer.writerow(row)
    return out


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    base = tmp_path_factory.mktemp("shift_targets")
    config = PipelineConfig.model_validate(CONFIG)
    generate_release(base / "a0", patients=800, seed=100, **SMALL)
    releases = {"reference": base / "a0"}
    for seed in (101, 102, 103):
        generate_release(base / f"a{seed}", patients=300, seed=seed, **SMALL)
        releases[f"site A seed {seed}"] = base / f"a{seed}"
    generate_release(base / "b", patients=700, seed=104, site="B", **SMALL)
    releases["site B"] = base / "b"
    generate_release(base / "a105", patients=400, seed=105, **SMALL)
    releases["SI units"] = _si_release(base / "a105", base / "si")
    data = {}
    for name, release in releases.items():
        data[name] = base / f"{release.name}-data"
        run_job(str(release), str(data[name]), config)
    vocabulary = {c for codes in layout.read_json(str(data["reference"] / layout.VOCABULARY))["sources"].values()
                  for c in codes}
    loinc = {f"lab:{i}": code for code, items in
             layout.read_json(str(data["reference"] / layout.LAB_LOINC))["codes"].items() for i in items}
    reference = population.profile_of_data(data.pop("reference"), ["train"], vocabulary=vocabulary, keep=vocabulary)
    out = {}
    for name, folder in data.items():
        current = population.profile_of_data(folder, ["train", "validation", "test"], vocabulary=vocabulary,
                                             bins_from=reference)
        out[name] = shift.compare(reference, current, loinc=loinc)
    return out


@pytest.mark.parametrize("seed", [101, 102, 103])
def test_fresh_site_a_releases_raise_no_severe_finding(reports, seed):
    report = reports[f"site A seed {seed}"]
    assert not report.at_least(shift.SEVERE), report.text()
    assert report.summary["codes_compared"] >= 30


def test_site_b_names_its_biased_assays(reports):
    report = reports["site B"]
    named = {f.subject: f for f in report.findings if f.kind == "value_shift"}
    rows = {r["subject"]: r for r in report.distributions}
    for code in BIASED:
        assert code in named, (code, rows.get(code), report.text())
        assert named[code].numbers["ratio"] > 1.05 and "likely" not in named[code].message
    kinds = {f.kind for f in report.findings}
    assert {"oov_share", "code_presence", "events_per_admission", "case_mix"} <= kinds


def test_si_units_name_every_analyte_whose_unit_differs(reports):
    report = reports["SI units"]
    mismatched = {f.subject for f in report.findings if f.kind == "unit_mismatch"}
    shifted = {f.subject for f in report.findings if f.kind == "value_shift" and f.severity == shift.SEVERE}
    assert mismatched == shifted == {f"lab:{item}" for item in SI}, report.text()
    assert report.level == shift.SEVERE
