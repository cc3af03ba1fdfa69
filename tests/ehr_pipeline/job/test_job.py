"""The Beam job end to end on the real MIMIC-III demo, checked against the raw tables."""
from __future__ import annotations

import csv
import gzip
import json
import os
import pathlib

import pytest

from ehr_pipeline.contract import PipelineConfig, layout, spec
from ehr_pipeline.encode import units
from ehr_pipeline.job import run_job
from tests.support.job_outputs import (CONFIG, independent_cohort, job_group_closure, job_group_site,
                                       output_digests, raw_rows, read_examples, utc_seconds)
from tests.support.paths import REPO_ROOT

GROUPED = json.loads((pathlib.Path(__file__).parent / "data" / "grouped_road_sha256.json").read_text())

# demo_run (tests/conftest.py): the real demo through the job with CONFIG, once per session.


def test_examples_and_labels_equal_independent_cohort(demo_run, demo_dir):
    _, manifest, examples = demo_run
    expected = independent_cohort(demo_dir)
    got = {h: ex[spec.LABEL] for h, ex in examples.items()}
    assert got == expected
    assert manifest["cohort"]["counts"]["kept"] == len(expected)


def test_no_patient_in_two_splits(demo_run):
    _, _, examples = demo_run
    split_of = {}
    for ex in examples.values():
        sid = ex[spec.SUBJECT_ID]
        assert split_of.setdefault(sid, ex["split"]) == ex["split"]


def test_no_information_at_or_after_trigger(demo_run, demo_dir):
    """Per example, the lab events bagged equal the raw lab rows strictly before the trigger."""
    _, _, examples = demo_run
    by_subject: dict[str, list[float]] = {}
    for r in raw_rows(demo_dir, "LABEVENTS"):
        by_subject.setdefault(r["SUBJECT_ID"], []).append(utc_seconds(r["CHARTTIME"]))
    rx_by_subject: dict[str, list[float]] = {}
    for r in raw_rows(demo_dir, "PRESCRIPTIONS"):
        rx_by_subject.setdefault(r["SUBJECT_ID"], []).append(utc_seconds(r["STARTDATE"]))
    for hadm, ex in examples.items():
        trigger = ex[spec.TRIGGER_TIME]
        sid = str(ex[spec.SUBJECT_ID])
        bags = ex
        assert all(off > 0 for off in bags[spec.BAG_OFFSET]), hadm
        n_lab = sum(n for codes, counts in zip(bags[spec.BAG_CODES], bags[spec.BAG_COUNTS])
                    for c, n in zip(codes, counts) if c.startswith("lab:"))
        assert n_lab == sum(t < trigger for t in by_subject.get(sid, [])), hadm
        # A date-only prescription is known at the end of its day.
        n_rx = sum(n for codes, counts in zip(bags[spec.BAG_CODES], bags[spec.BAG_COUNTS])
                   for c, n in zip(codes, counts) if c.startswith("prescription:"))
        assert n_rx == sum(t + 86399 < trigger for t in rx_by_subject.get(sid, [])), hadm


def test_every_row_is_accounted_for(demo_run, demo_dir):
    _, manifest, _ = demo_run
    assert manifest["balanced"]
    for table, acc in manifest["tables"].items():
        with gzip.open(demo_dir / f"{table}.csv.gz", "rt", newline="") as f:
            n_rows = sum(1 for _ in csv.reader(f)) - 1
        assert acc["rows_read"] == n_rows, table
        assert acc["rows_read"] == acc["rows_parsed"] + sum(acc["dead_lettered"].values())
        if "cohort_filter" in acc:
            assert acc["rows_parsed"] == sum(acc["extract"].values())
            assert acc["extract"]["kept"] == sum(acc["cohort_filter"].values())
    assert manifest["tables"]["LABEVENTS"]["rows_read"] == 76074


def test_outputs_vocabulary_stats_and_checksums(demo_run):
    out, manifest, examples = demo_run
    vocab = layout.read_json(str(out / layout.VOCABULARY))
    stats = layout.read_json(str(out / layout.NUMERIC_STATS))
    train_codes = {c for ex in examples.values() if ex["split"] == "train"
                   for codes in ex[spec.BAG_CODES] for c in codes}
    vocab_codes = {c for codes in vocab["sources"].values() for c in codes}
    assert vocab_codes == train_codes  # min_count 1: exactly the training split's codes
    assert set(stats["codes"]) <= vocab_codes
    total = sum(s["examples"] for s in manifest["splits"].values())
    assert total == len(examples)
    for split, s in manifest["splits"].items():
        for name, f in s["files"].items():
            assert layout.sha256_of(str(out / name)) == f["sha256"]


def test_rerun_on_synthetic_release_is_byte_identical(pinned_release, tmp_path):
    """A run writes the bytes pinned from earlier runs of its release; with CHARTEVENTS in parts: identical records.

    The pin (data/grouped_road_sha256.json, every file but run_info.json, the manifest without its input
    paths) stands for the second run: a rerun that wrote other bytes would differ from it as well.
    """
    from ehr_pipeline.mimic import table_parts

    config = PipelineConfig.model_validate(CONFIG)
    out1 = tmp_path / "a"
    m1 = run_job(str(pinned_release), str(out1), config)
    assert output_digests(out1) == GROUPED["synthetic"]

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for f in pinned_release.iterdir():
        if not f.name.startswith("CHARTEVENTS"):
            (sharded / f.name).symlink_to(f)
    table_parts.write_table_parts(pinned_release / "CHARTEVENTS.csv.gz", "CHARTEVENTS", sharded, parts=3,
                                  show_progress=False)
    m3 = run_job(str(sharded), str(tmp_path / "c"), config)
    assert m3["tables"]["CHARTEVENTS"] == m1["tables"]["CHARTEVENTS"]
    assert sorted(ex["raw"] for ex in read_examples(tmp_path / "c").values()) == sorted(
        ex["raw"] for ex in read_examples(out1).values())
    assert m1["balanced"] and m1["tables"]["CHARTEVENTS"]["rows_read"] > 0
    assert sum(s["examples"] for s in m1["splits"].values()) > 50


def test_dask_cluster_produces_the_same_records(demo_run, demo_dir, tmp_path, monkeypatch):
    """A real dask.distributed cluster (2 worker processes on 127.0.0.1) gives the same records.

    Given relative paths from a driver whose working directory is not the workers': they resolve
    a relative path against their own (where they were started), so the job must not hand them one.
    """
    from dask.distributed import LocalCluster

    _, _, local = demo_run
    workers_cwd, driver_cwd = tmp_path / "workers", tmp_path / "driver"
    workers_cwd.mkdir()
    driver_cwd.mkdir()
    monkeypatch.chdir(workers_cwd)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        monkeypatch.chdir(driver_cwd)
        manifest = run_job(os.path.relpath(demo_dir), "out", PipelineConfig.model_validate(CONFIG), [
            "--runner=DaskRunner", f"--dask_client_address={cluster.scheduler_address}",
            "--dask_npartitions=2"])  # one partition per worker: the runner makes tasks per partition at every stage
    dask = read_examples(driver_cwd / "out")
    assert sorted(ex["raw"] for ex in dask.values()) == sorted(ex["raw"] for ex in local.values())
    assert manifest["balanced"] and manifest["input"]["mimic_dir"] == str(demo_dir)
    assert not any(workers_cwd.iterdir())  # nothing written where the workers stand


def test_local_paths_are_made_absolute_and_urls_kept():
    assert layout.absolute("out/data") == os.path.join(os.getcwd(), "out", "data")
    assert layout.absolute(pathlib.Path("../x/./y")) == os.path.normpath(os.path.join(os.getcwd(), "..", "x", "y"))
    assert layout.absolute("/data/mimic/") == "/data/mimic"
    for url in ("gs://bucket/seqex", "s3://b/k", "hdfs://namenode/seqex"):
        assert layout.absolute(url) == url


def test_event_chunks_round_trip_exactly():
    import numpy as np

    from ehr_pipeline.job.chunks import pack_chunk, unpack_chunk

    times = np.array([5_000_000_000, 4_000_000_000, 5_000_000_001], dtype=np.int64)
    codes = np.array(["lab:1", "chart:2", "lab:1"], dtype=object)
    values = np.array([1.5, np.nan, 1e-300])
    units = np.array(["mg/dL", None, "\u00b5mol/L"], dtype=object)
    t, c, v, u = unpack_chunk(pack_chunk(times, codes, values, units))
    assert t.tolist() == times.tolist() and c.tolist() == codes.tolist() and u.tolist() == units.tolist()
    assert np.array_equal(v, values, equal_nan=True)
    assert unpack_chunk(pack_chunk(times, codes, values))[3].tolist() == [None] * 3  # no units at all
    far = np.array([0, 2**33], dtype=np.int64)  # a span beyond 32-bit seconds falls back to int64
    assert unpack_chunk(pack_chunk(far, codes[:2], values[:2]))[0].tolist() == far.tolist()


def test_units_and_lab_loinc_side_files_equal_a_plain_read(demo_run, demo_dir):
    """units.json counts each (lab code, unit) pair with a value, as a csv-module read of LABEVENTS does;
    lab_loinc.json is D_LABITEMS' LOINC column; both are pinned in the manifest."""
    out, manifest, _ = demo_run
    expected: dict[str, dict[str, int]] = {}
    for row in raw_rows(demo_dir, "LABEVENTS"):
        unit = row["VALUEUOM"].strip()
        if row["VALUENUM"].strip() and unit:
            per = expected.setdefault(f"lab:{row['ITEMID']}", {})
            per[unit] = per.get(unit, 0) + 1
    units = layout.read_json(str(out / layout.UNITS))["codes"]
    assert {c: u for c, u in units.items() if c.startswith("lab:")} == expected
    loinc = layout.read_json(str(out / layout.LAB_LOINC))["codes"]
    pairs = {(r["LOINC_CODE"].strip(), r["ITEMID"]) for r in raw_rows(demo_dir, "D_LABITEMS") if r["LOINC_CODE"].strip()}
    assert {(k, i) for k, items in loinc.items() for i in items} == pairs
    for name, key in ((layout.UNITS, "units"), (layout.LAB_LOINC, "lab_loinc")):
        assert manifest[key]["sha256"] == layout.sha256_of(str(out / name))


def test_every_value_bagged_is_counted_by_what_its_unit_needed(demo_run, demo_dir):
    """units/<source>/<outcome> counts each numeric value that reached an admission exactly once; the
    values that could not be converted are the dead-letter file's lines, each naming both units."""
    out, manifest, examples = demo_run
    values = manifest["units"]["values"]
    triggers: dict[str, list[float]] = {}
    for ex in examples.values():
        triggers.setdefault(str(ex[spec.SUBJECT_ID]), []).append(ex[spec.TRIGGER_TIME])
    # A lab value feeds every cohort admission of its patient whose trigger is later (one pair each).
    pairs = sum(sum(t < trig for trig in triggers.get(r["SUBJECT_ID"], []))
                for r in raw_rows(demo_dir, "LABEVENTS") if r["VALUENUM"].strip()
                for t in [utc_seconds(r["CHARTTIME"])])
    assert sum(values["lab"].values()) == pairs
    dead = [json.loads(line) for line in (out / "dead_letter" / "values_not_convertible.jsonl").read_text().splitlines()]
    assert len(dead) == sum(v.get("not_convertible", 0) for v in values.values()) > 0
    canonical = layout.read_json(str(out / layout.UNITS))["canonical"]
    for d in dead:
        assert d["canonical_unit"] == canonical[d["code"]] and d["unit"] and d["detail"]
    # Fentanyl (MetaVision 221744) comes in mcg and mg: among the rows the job keeps mcg is the more
    # common (148 mg rows against 141 mcg only while the superseded 'Rewritten' rows counted), so mg converts.
    assert canonical["input:221744"] == "ug" and values["input"]["converted"] > 0


def _si_copy(demo_dir, out, factor: float, unit: str):
    """The demo with every creatinine (50912) value written in another unit; the other tables linked."""
    out.mkdir()
    for path in demo_dir.glob("*.csv.gz"):
        if path.name != "LABEVENTS.csv.gz":
            (out / path.name).symlink_to(path)
    with gzip.open(demo_dir / "LABEVENTS.csv.gz", "rt", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        rows = list(reader)
    item, num, uom, val = (header.index(c) for c in ("ITEMID", "VALUENUM", "VALUEUOM", "VALUE"))
    changed = 0
    for row in rows:
        if row[item] == "50912" and row[num]:
            row[num] = repr(float(row[num]) * factor)
            row[val], row[uom] = row[num], unit
            changed += 1
    with gzip.open(out / "LABEVENTS.csv.gz", "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return changed


def _creatinine(examples) -> dict[int, list]:
    """Per admission, the creatinine aggregates of every bag (mean, last, min, max)."""
    out = {}
    for hadm, ex in examples.items():
        out[hadm] = [[agg[i] for agg in (mean, last, lo, hi)]
                     for codes, mean, last, lo, hi in zip(ex[spec.BAG_CODES], ex[spec.BAG_VALUE_MEAN],
                                                          ex[spec.BAG_VALUE_LAST], ex[spec.BAG_VALUE_MIN],
                                                          ex[spec.BAG_VALUE_MAX])
                     for i, c in enumerate(codes) if c == "lab:50912"]
    return out


@pytest.mark.slow
def test_another_sites_units_are_converted_to_the_models(demo_run, demo_dir, tmp_path):
    """The demo with creatinine in umol/L, prepared with --units-from the mg/dL run: the same examples, the
    creatinine values equal to the mg/dL ones; prepared without it, the release keeps its own unit and says so."""
    import math

    reference_dir, _, reference = demo_run
    release = tmp_path / "si"
    assert _si_copy(demo_dir, release, 10000 / 113.12, "umol/L") > 100
    # Labs only: the cohort (every admission) is the same, a lab value's bag is set by its own time (CONFIG keeps
    # every bag), and which unit a lab code is judged in is the lab table's census alone; half the demo's events.
    config = PipelineConfig.model_validate({**CONFIG, "sources": ["lab"]})
    model_units = layout.read_json(str(reference_dir / layout.UNITS))
    converted = tmp_path / "converted"
    # As `--units-from` passes them: the canonical units, and the training medians the conversions must land near.
    manifest = run_job(str(release), str(converted), config, reference_units=model_units["canonical"],
                       reference_medians=model_units["medians"])
    examples = read_examples(converted)
    assert manifest["balanced"] and examples.keys() == reference.keys()
    got, want = _creatinine(examples), _creatinine(reference)
    assert sum(len(v) for v in want.values()) > 50
    for hadm in want:
        assert len(got[hadm]) == len(want[hadm])
        for a, b in zip(got[hadm], want[hadm]):
            assert all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9) for x, y in zip(a, b)), hadm
    written = layout.read_json(str(converted / layout.UNITS))
    assert written["canonical"]["lab:50912"] == "mg/dL"
    assert written["medians"]["lab:50912"] == model_units["medians"]["lab:50912"]
    assert manifest["units"]["values"]["lab"]["converted"] > 100
    assert not manifest["units"]["values"]["lab"].get(units.IMPLAUSIBLE)

    own = tmp_path / "own"
    run_job(str(release), str(own), config)
    units_doc = layout.read_json(str(own / layout.UNITS))
    assert units_doc["canonical"]["lab:50912"] == "umol/L" and units_doc["canonical_from"] == "this release"


def test_the_job_group_holds_no_tensorflow():
    closure = job_group_closure()
    assert "apache-beam" in closure and "pyarrow" in closure
    assert not closure & {"tensorflow", "tf-keras", "keras", "edward2", "tensorflow-probability", "scikit-learn"}


def _renamed_copy(demo_dir, release):
    """Another site's export: LABEVENTS.csv.gz holding plain text, ADMISSIONS.csv holding gzip; the rest linked."""
    release.mkdir()
    for f in demo_dir.iterdir():
        if f.name.startswith(("LABEVENTS", "ADMISSIONS")):
            continue
        (release / f.name).symlink_to(f)
    (release / "LABEVENTS.csv.gz").write_bytes(gzip.decompress((demo_dir / "LABEVENTS.csv.gz").read_bytes()))
    (release / "ADMISSIONS.csv").write_bytes((demo_dir / "ADMISSIONS.csv.gz").read_bytes())
    return release


def test_the_job_runs_with_only_the_job_group_installed_and_reads_files_by_content(demo_run, demo_dir, tmp_path):
    """Writing SequenceExamples needs protobuf only: with nothing but the `job` group importable, the same records.

    The release is another site's export whose files' names do not say what they hold (_renamed_copy): the
    files are read by their content, whatever their names. One job for both: each alone must give demo_run's
    records and table accounting, and the two are separate stages (imports, opening a file).
    """
    import subprocess
    import sys

    root = REPO_ROOT
    release = _renamed_copy(demo_dir, tmp_path / "release")
    site = job_group_site(tmp_path / "site-packages")
    config = tmp_path / "job.yaml"
    config.write_text(json.dumps(CONFIG))  # JSON is YAML
    out = tmp_path / "out"
    # -S: no site-packages but the worker's; the project from its checkout, as --no-deps installs it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(site)])}
    probe = subprocess.run([sys.executable, "-S", "-c", "import tensorflow"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'tensorflow'" in probe.stderr
    done = subprocess.run([sys.executable, "-S", "-m", "ehr_pipeline.cli", "run", "--mimic-dir", str(release),
                           "--out", str(out), "--config", str(config)], cwd=root, env=env, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    _, expected, examples = demo_run
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["tables"] == expected["tables"] and manifest["balanced"]
    assert {h: ex["raw"] for h, ex in read_examples(out).items()} == {h: ex["raw"] for h, ex in examples.items()}
