"""Hostile MEDS input: faulted copies of a small MEDS dataset and its label file through `ehr-pipeline run`.

Every fault (tests/support/hostile_meds.py) ends in one of two ways, and the test says which and exactly how:
exit code 2 and the one exact line naming the file and column (or subject), with no traceback and no
manifest; or exit code 0, every row and label row accounted for, the counts the fault moves where they
belong, and, where the fault changes only how a value is stored, the unfaulted dataset's examples byte
for byte.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from ehr_pipeline import cli
from ehr_pipeline.contract import PipelineConfig
from ehr_pipeline.job import run_meds_job
from ehr_pipeline.meds.labels import PREDICTION_TIMES, exact_prediction_times
from ehr_pipeline.reader import read_dead_letters
from tests.support.job_outputs import job_group_site, read_examples
from tests.support.paths import REPO_ROOT
from tests.support.hostile_meds import DATA0, LABELS, T0, Expect, fault_cases, faulted_meds, write_base

CONFIG = "num_shards: {train: 1, validation: 1, test: 1}\nvocab: {min_count: 1}\n"


def _run(meds, out, config, labels: bool, capsys) -> tuple[int, str]:
    argv = ["run", "--meds-dir", str(meds), "--out", str(out), "--config", str(config)]
    rc = cli.main(argv + (["--labels", str(meds / LABELS)] if labels else []))
    return rc, capsys.readouterr().err


def _entry(manifest: dict, path: str) -> int:
    node = manifest
    for part in path.split("/"):
        node = node[part]
    return node


@pytest.fixture(scope="module")
def unfaulted(tmp_path_factory) -> dict[bool, dict]:
    """The unfaulted dataset's examples, without and with its label file."""
    base = write_base(tmp_path_factory.mktemp("meds") / "base")
    config = PipelineConfig.model_validate(yaml.safe_load(CONFIG))
    out = {}
    for labels in (False, True):
        dest = tmp_path_factory.mktemp("out")
        run_meds_job(str(base), str(dest), config, labels_dir=str(base / LABELS) if labels else None)
        out[labels] = read_examples(dest)
    assert len(out[False]) == len(out[True]) == 6
    return out


@dataclasses.dataclass(frozen=True)
class FaultedRun:
    """One faulted dataset's `ehr-pipeline run`: its folders, what the fault expects, exit code and stderr."""
    meds: pathlib.Path
    out: pathlib.Path
    expect: Expect
    rc: int
    err: str


@pytest.fixture(scope="module")
def faulted_runs() -> dict[str, FaultedRun]:
    """The module's job runs by fault: a fault two tests look at is run once (see _faulted_run)."""
    return {}


def _faulted_run(fault: str, runs: dict[str, FaultedRun], factory, capsys) -> FaultedRun:
    """The fault's run, made by the first test that asks (with its capsys) and read by the others."""
    if fault not in runs:
        base = factory.mktemp(fault)
        meds, out, config = base / "meds", base / "out", base / "pipeline.yaml"
        expect = faulted_meds(meds, fault)
        config.write_text(CONFIG)
        rc, err = _run(meds, out, config, expect.labels, capsys)
        runs[fault] = FaultedRun(meds, out, expect, rc, err)
    return runs[fault]


# Every fault once: alone, or in a group of faults read alike whose one dataset holds them all (TOGETHER).
@pytest.mark.parametrize("fault", fault_cases())
def test_faulted_meds_fails_in_one_exact_line_or_is_accounted_for(fault, unfaulted, faulted_runs, tmp_path_factory,
                                                                   capsys):
    run = _faulted_run(fault, faulted_runs, tmp_path_factory, capsys)
    out, expect, rc, err = run.out, run.expect, run.rc, run.err
    if expect.error is not None:
        assert (rc, err) == (2, expect.error + "\n")
        assert not (out / "manifest.json").exists()
        return
    assert rc == 0 and "Traceback" not in err, err
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["balanced"], manifest["tables"]["MEDS"]["problems"] + manifest.get("labels", {}).get("problems", [])
    for path, value in expect.counts:
        assert _entry(manifest, path) == value, path
    for name, count in manifest["dead_letters"].items():  # what is counted is what is written
        letters = out / "dead_letter" / f"{name}.jsonl"
        assert (len(read_dead_letters(letters)) if letters.exists() else 0) == count, name
    if expect.same_examples:
        got = read_examples(out)
        assert {k: e["raw"] for k, e in got.items()} == {k: e["raw"] for k, e in unfaulted[expect.labels].items()}


# Each of these faults' runs is the one test_faulted_meds_fails_in_one_exact_line_or_is_accounted_for looks at.
@pytest.mark.parametrize("fault, lines, reason", [
    ("null_subject_ids_amid_a_subject", [5, 26], "missing_required"),
    ("non_finite_values", [5, 8, 15], "bad_number")])
def test_unreadable_rows_are_dead_letters_at_their_row(fault, lines, reason, faulted_runs, tmp_path_factory, capsys):
    run = _faulted_run(fault, faulted_runs, tmp_path_factory, capsys)
    meds, out = run.meds, run.out
    assert not run.expect.labels and run.rc == 0
    letters = read_dead_letters(out / "dead_letter" / "MEDS.jsonl")
    assert [(d.file, d.line, d.reason) for d in letters] == [(str(meds / DATA0), n, reason) for n in lines]
    assert json.loads(letters[0].raw)["code"] == "LAB//50912//mg/dL"


def test_label_times_under_a_second_apart_keep_their_microseconds(faulted_runs, tmp_path_factory, capsys):
    """Each example's exact prediction time is written beside the examples (what ehr-eval joins back on)."""
    run = _faulted_run("labels_half_a_second_apart", faulted_runs, tmp_path_factory, capsys)
    meds, out = run.meds, run.out
    assert run.expect.labels and run.rc == 0
    labels = pq.read_table(meds / LABELS)
    want = sorted(zip(labels.column("subject_id").to_pylist(),
                      labels.column("prediction_time").cast("int64").to_pylist()))
    times = pq.read_table(out / PREDICTION_TIMES)
    assert sorted(zip(times.column("subject_id").to_pylist(),
                      times.column("prediction_time").cast("int64").to_pylist())) == want
    examples = read_examples(out)
    keys = times.column("key").to_pylist()
    assert sorted(keys) == sorted(examples) and len(set(keys)) == 7
    got = exact_prediction_times(out, keys, [examples[k]["trigger_time"] for k in keys])
    assert sorted(zip(times.column("subject_id").to_pylist(), got.tolist())) == want
    assert (T0 + 4 * 86400) * 1_000_000 + 500_000 in got.tolist()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["labels"]["prediction_times"]["file"] == PREDICTION_TIMES


def test_the_meds_path_runs_with_only_the_job_group_installed(unfaulted, tmp_path):
    """The schema checks are pyarrow's: with nothing but the `job` group importable (no `meds`), the same records."""
    meds = write_base(tmp_path / "meds")
    site = job_group_site(tmp_path / "site-packages")
    config = tmp_path / "pipeline.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(site)])}
    probe = subprocess.run([sys.executable, "-S", "-c", "import meds"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'meds'" in probe.stderr
    done = subprocess.run([sys.executable, "-S", "-m", "ehr_pipeline.cli", "run", "--meds-dir", str(meds),
                           "--labels", str(meds / LABELS), "--out", str(tmp_path / "out"), "--config", str(config)],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    got = read_examples(tmp_path / "out")
    assert {k: e["raw"] for k, e in got.items()} == {k: e["raw"] for k, e in unfaulted[True].items()}
