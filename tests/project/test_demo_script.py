"""`make demo` (scripts/demo.py): the real release when there is one, a synthetic one when there is none."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import yaml

from tests.support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "demo.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("demo_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args, timeout=600):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_the_real_demo_is_taken_as_a_release_and_an_empty_folder_is_not(demo_dir, tmp_path):
    script = _load_script()
    assert script.has_release(demo_dir)
    assert not script.has_release(tmp_path)
    assert not script.has_release(tmp_path / "absent")


def test_a_folder_without_a_release_is_one_line_and_exit_2(tmp_path):
    proc = _run("--mimic-dir", str(tmp_path), "--out", str(tmp_path / "out"), timeout=120)
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert str(tmp_path) in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_without_data_the_whole_path_runs_on_a_synthetic_release(tmp_path):
    # A tenth of the measurement rate (~30k events instead of ~270k, still ~290 admissions): the same
    # path, and the Beam job, most of this test's time at full rate, has a tenth of the events to bag.
    # The demo's own config with the final evaluation of the training run as small as --samples makes ehr-eval's
    # (2 samples per member, 50 resamples instead of 25 and 1000): the same model and path, a fraction of its time.
    config = yaml.safe_load((REPO_ROOT / "configs" / "ehr_demo.yaml").read_text())
    config["eval"].update(num_samples=2, n_bootstrap=50)
    (tmp_path / "ehr_demo.yaml").write_text(yaml.safe_dump(config))
    out = tmp_path / "out"
    proc = _run("--mimic-dir", str(tmp_path / "no-mimic-here"), "--out", str(out), "--config",
                str(tmp_path / "ehr_demo.yaml"), "--patients", "200", "--events-scale", "0.1", "--steps", "10",
                "--samples", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    first = proc.stdout.splitlines()[0]
    assert first.startswith(f"No MIMIC-III data at {tmp_path / 'no-mimic-here'}") and "synthetic" in first
    release = out / "synthetic" / "release"
    truth = (release / "SYNTH_TRUTH.csv").read_text().splitlines()
    assert truth[0].startswith("HADM_ID") and len(truth) > 200  # ~1.4 admissions per patient
    manifest = json.loads((out / "synthetic" / "data" / "manifest.json").read_text())
    assert manifest["balanced"]
    metrics = json.loads((out / "synthetic" / "eval" / "metrics.json").read_text())
    assert metrics["n"] == manifest["splits"]["test"]["examples"]
    assert "-> 200" in proc.stdout
    answer = json.loads(proc.stdout[proc.stdout.index("-> 200") + len("-> 200"):])
    assert 0.0 <= answer["probability"] <= 1.0 and len(answer["member_probabilities"]) == 4
