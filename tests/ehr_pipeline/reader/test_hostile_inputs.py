"""Hostile inputs: faulted copies of the demo through `ehr-pipeline summarize` and `run`.

Every fault is either one line naming the file (and line) with exit code 2, or dead letters
at the lines the generator faulted, with every physical record of the table accounted for.
"""
from __future__ import annotations

import contextlib
import io
import json
import re
import os
import subprocess
import sys

import pytest

from ehr_pipeline import cli
from ehr_pipeline.reader.dead_letters import read_dead_letters
from tests.support.paths import REPO_ROOT
from tests.support.hostile_data import FAULTS, TOGETHER, faulted_copy, faulted_together

# Two sources keep each job run short; LABEVENTS and DIAGNOSES_ICD carry the faults.
JOB_CONFIG = """\
sources: [lab, diagnosis]
num_shards: {train: 1, validation: 1, test: 1}
"""
ONE_LINE_ERROR = re.compile(r"ehr-pipeline( [a-z-]+)?: error: ")
JOB_FAULTS = ["truncated_gzip", "missing_column", "empty_file", "plain_beside_gzip", "dead_letters_at_end",
              "non_finite_numbers", "stray_quote_physionet", "stray_quote_quoted", "nul_in_code"]


def _strict_json(text: str):
    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")
    return json.loads(text, parse_constant=refuse)


def _check_fatal(expect, rc: int, err: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 2, err
    # "ehr-pipeline: error: ..." from the reader, "ehr-pipeline summarize: error: ..." from the
    # checks made before any work starts: one line either way.
    assert len(lines) == 1 and ONE_LINE_ERROR.match(lines[0]), err
    assert expect.file in lines[0] and expect.message in lines[0], lines[0]
    if expect.line is not None:
        assert f"line {expect.line:,}" in lines[0], lines[0]


def _summary_row(out: str, table: str) -> tuple[int, int, int]:
    """(rows read, parsed, dead) of a table from the summary's text table."""
    row = next(line.split() for line in out.splitlines() if line.split()[:1] == [table])
    return tuple(int(v.replace(",", "")) for v in row[2:5])


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_summarize_accounts_for_every_record_or_fails_in_one_line(fault, demo_dir, tmp_path, capsys):
    expect = faulted_copy(demo_dir, tmp_path / "release", fault)
    rc = cli.main(["summarize", "--mimic-dir", str(tmp_path / "release"), "--dead-letter-dir", str(tmp_path / "dl")])
    out, err = capsys.readouterr()
    if expect.exit_code:
        _check_fatal(expect, rc, err)
        return
    assert rc == 0, err
    read, parsed, dead = _summary_row(out, expect.table)
    assert read == expect.records and read == parsed + dead
    letters = [d for d in read_dead_letters(tmp_path / "dl" / "dead_letters.jsonl") if d.file.endswith(expect.file)]
    assert sorted((d.line, d.reason) for d in letters) == list(expect.dead)
    assert dead == len(letters)


def _job(release, out_dir, config) -> tuple[int, str]:
    """`ehr-pipeline run` on a release in this process: (exit code, what it wrote to stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["run", "--mimic-dir", str(release), "--out", str(out_dir), "--config", str(config)])
    return rc, err.getvalue()


@pytest.fixture(scope="module")
def together(demo_dir, tmp_path_factory):
    """One job on the demo with every TOGETHER fault at once (each on lines of its own, its dead letters its
    own): (what each fault expects, exit code, stderr, output folder). A job each would cost ~5 s apiece."""
    base = tmp_path_factory.mktemp("together")
    expects = faulted_together(demo_dir, base / "release")
    (base / "pipeline.yaml").write_text(JOB_CONFIG)
    rc, err = _job(base / "release", base / "out", base / "pipeline.yaml")
    return expects, rc, err, base / "out"


@pytest.mark.parametrize("fault", JOB_FAULTS)
def test_job_accounts_for_every_record_or_fails_in_one_line(fault, demo_dir, tmp_path, request):
    if fault in TOGETHER:  # the run is the module's one run of these faults together
        expects, rc, err, out_dir = request.getfixturevalue("together")
        expect = expects[fault]
        # The table's dead letters: this fault's and those of the others written into the same table.
        want = sorted(d for e in expects.values() if e.table == expect.table for d in e.dead)
        assert set(expect.dead) <= set(want)
    else:
        expect = faulted_copy(demo_dir, tmp_path / "release", fault)
        config = tmp_path / "pipeline.yaml"
        config.write_text(JOB_CONFIG)
        out_dir = tmp_path / "out"
        rc, err = _job(tmp_path / "release", out_dir, config)
        want = list(expect.dead)
    if expect.exit_code:
        _check_fatal(expect, rc, err)
        assert not (out_dir / "manifest.json").exists()
        return
    assert rc == 0, err
    manifest = _strict_json((out_dir / "manifest.json").read_text())
    table = manifest["tables"][expect.table]
    assert table["rows_read"] == expect.records and table["balanced"]
    for name, count in manifest["dead_letters"].items():  # what is counted is what is written
        path = out_dir / "dead_letter" / f"{name}.jsonl"
        assert (len(read_dead_letters(path)) if path.exists() else 0) == count, name
    letters = read_dead_letters(out_dir / "dead_letter" / f"{expect.table}.jsonl")
    assert sorted((d.line, d.reason) for d in letters) == want
    for name in ("numeric_stats.json", "vocabulary.json"):
        _strict_json((out_dir / name).read_text())


def test_error_inside_a_beam_worker_is_one_line_from_the_real_process(demo_dir, tmp_path):
    expect = faulted_copy(demo_dir, tmp_path / "release", "truncated_gzip")
    config = tmp_path / "pipeline.yaml"
    config.write_text(JOB_CONFIG)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "ehr_pipeline.cli", "run", "--mimic-dir", str(tmp_path / "release"),
         "--out", str(tmp_path / "out"), "--config", str(config), "--workers", "2"],  # a small input: ask for workers
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=300)
    ours = [line for line in proc.stderr.splitlines() if ONE_LINE_ERROR.match(line)]
    assert "Traceback" not in proc.stderr and ours == proc.stderr.strip().splitlines()[-1:], proc.stderr[-2000:]
    _check_fatal(expect, proc.returncode, ours[0])
