"""Every console script answers a misuse (missing folder, wrong file, bad flag value) with one line, exit 2."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib

import pytest

from ehr_pipeline import cli as pipeline_cli
from ehr_base.cli_args import one_line
from model.cli import ehr_adapt, ehr_analyze, ehr_eval, ehr_train
from serving import cli as serve_cli
from tests.support.ehr_testdata import write_data_dir
from tests.support.paths import REPO_ROOT

MAINS = {"ehr-pipeline": pipeline_cli.main, "ehr-train": ehr_train.main, "ehr-eval": ehr_eval.main,
         "ehr-serve": serve_cli.main, "ehr-analyze": ehr_analyze.main,
         "ehr-adapt": ehr_adapt.main}


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A folder with a pipeline output, a release-less folder, a plain file, a CSV and broken YAMLs."""
    base = tmp_path_factory.mktemp("misuse")
    write_data_dir(base / "data", sizes=(("train", 8), ("validation", 4), ("test", 4)), train_shards=1)
    (base / "empty").mkdir()
    (base / "a-file").write_text("not a folder\n")
    (base / "table.csv").write_text("HADM_ID,RISK\n1,0.5\n")
    (base / "broken.yaml").write_text("model: [unclosed\n")
    (base / "unknown.yaml").write_text("name: x\nnot_a_key: 1\n")
    return base


# (command, argv with {b} for the base folder, words the one line must contain)
CASES = [
    ("ehr-pipeline", "summarize --mimic-dir {b}/missing", ["--mimic-dir", "does not exist"]),
    ("ehr-pipeline", "summarize --mimic-dir {b}/a-file", ["--mimic-dir", "not a folder"]),
    ("ehr-pipeline", "summarize --mimic-dir {b}/empty", ["--mimic-dir", "ADMISSIONS"]),
    ("ehr-pipeline", "run --mimic-dir {b}/missing --out {b}/o", ["--mimic-dir", "does not exist"]),
    ("ehr-pipeline", "run --mimic-dir {b}/empty --out {b}/o", ["ADMISSIONS"]),
    ("ehr-pipeline", "run --mimic-dir {root}/tests --out {b}/o", ["ADMISSIONS"]),
    ("ehr-pipeline", "run --meds-dir {b}/empty --out {b}/o", ["--meds-dir", "no MEDS data files"]),
    ("ehr-pipeline", "run --mimic-dir {b}/empty --labels {b}/a-file --out {b}/o", ["--labels", "--meds-dir"]),
    ("ehr-pipeline", "run --meds-dir {b}/empty --mimic-dir {b}/empty --out {b}/o", ["not allowed with"]),
    ("ehr-pipeline", "to-meds --mimic-dir {b}/empty --out {b}/m", ["--mimic-dir", "ADMISSIONS"]),
    ("ehr-pipeline", "demo --mimic-dir {b}/missing --out {b}/o", ["--mimic-dir", "does not exist"]),
    ("ehr-pipeline", "synth --patients 0 --out {b}/s", ["patients", ">= 1"]),
    ("ehr-pipeline", "synth --patients many --out {b}/s", ["--patients", "'many'"]),
    ("ehr-pipeline", "synth --patients 3 --out {b}/a-file", ["--out", "is a file"]),
    ("ehr-pipeline", "synth --patients 3 --out {b}/s --compresslevel 12", ["compresslevel"]),
    ("ehr-pipeline", "synth-counterfactual --release {b}/missing --out {b}/c", ["--release", "does not exist"]),
    ("ehr-pipeline", "synth-counterfactual --release {b}/empty --out {b}/c", ["SYNTH_MANIFEST.json", "not a synthetic"]),
    ("ehr-pipeline", "synth-counterfactual --release {b}/empty --out {b}/c --change shuffle", ["--change", "shuffle"]),
    ("ehr-pipeline", "shard --mimic-dir {b}/missing", ["--mimic-dir"]),
    ("ehr-pipeline", "shard --mimic-dir {b}/empty --parts 0", ["--parts", ">= 1"]),
    ("ehr-pipeline", "shard --mimic-dir {b}/empty --table NOTATABLE", ["--table", "NOTATABLE"]),
    ("ehr-pipeline", "summarise --mimic-dir {b}/empty", ["invalid choice", "summarise"]),
    ("ehr-pipeline", "summarize --mimic-dir {b}/empty --verbosity 3", ["unrecognized arguments", "--verbosity"]),
    ("ehr-train", "--config {b}/missing.yaml --data {b}/data --out {b}/r", ["--config", "does not exist"]),
    ("ehr-train", "--config {b}/broken.yaml --data {b}/data --out {b}/r", ["broken.yaml", "YAML"]),
    ("ehr-train", "--config {b}/table.csv --data {b}/data --out {b}/r", ["table.csv", "mapping"]),
    ("ehr-train", "--config {b}/unknown.yaml --data {b}/data --out {b}/r", ["unknown.yaml", "not_a_key"]),
    ("ehr-train", "--config {root}/configs/pipeline.yaml --data {b}/data --out {b}/r", ["pipeline.yaml"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/missing --out {b}/r", ["--data"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/empty --out {b}/r", ["empty", "manifest.json"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/data --out {b}/a-file", ["--out", "is a file"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/data --out {b}/r --steps -3", ["--steps"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/data --out {b}/r --truth {b}/no.csv",
     ["--truth", "does not exist"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/data --out {b}/r --set model.rnn_dim",
     ["--set", "SECTION.KEY=VALUE"]),
    ("ehr-train", "--config {root}/configs/ehr_demo.yaml --data {b}/data --out {b}/r --set model.rnn_dim=wide",
     ["rnn_dim"]),
    ("ehr-eval", "--model {b}/missing --data {b}/data", ["missing", "export"]),
    ("ehr-eval", "--model {b}/empty --data {b}/missing", ["--data", "does not exist"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --samples 0", ["--samples", "0"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --samples 101", ["--samples", "101"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --bootstrap -1", ["--bootstrap"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --num-bins 0", ["--num-bins"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --batch-size 0", ["--batch-size"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --referral-rate 2", ["--referral-rate"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --referral-measure variance", ["--referral-measure"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --out {b}/a-file", ["--out", "is a file"]),
    ("ehr-eval", "--model {b}/empty --data {b}/data --truth {b}/no.csv", ["--truth", "does not exist"]),
    ("ehr-pipeline", "to-fhir --mimic-dir {b}/missing --hadm-id 1 --out -", ["--mimic-dir", "does not exist"]),
    ("ehr-pipeline", "to-fhir --mimic-dir {b}/empty --hadm-id first --out -", ["--hadm-id", "'first'"]),
    ("ehr-analyze", "posterior-rank --model {b}/missing --data {b}/data", ["--model", "does not exist"]),
    ("ehr-analyze", "posterior-rank --model {b}/empty --data {b}/data --ranks 1 0", ["--ranks", ">= 1"]),
    ("ehr-analyze", "posterior-rank --model {b}/empty --data {b}/data --out {b}/a-file", ["--out", "is a file"]),
    ("ehr-analyze", "posterior-rank --model {b}/empty --data {b}/data", ["empty"]),
    ("ehr-analyze", "rank --model {b}/empty", ["invalid choice"]),
    ("ehr-adapt", "--model {b}/missing --data {b}/data --out {b}/u", ["--model", "does not exist"]),
    ("ehr-adapt", "--model {b}/empty --data {b}/missing --out {b}/u", ["--data", "does not exist"]),
    ("ehr-adapt", "--model {b}/empty --data {b}/data --out {b}/a-file", ["--out", "is a file"]),
    ("ehr-adapt", "--model {b}/empty --data {b}/data --out {b}/u --method refit", ["--method", "refit"]),
    ("ehr-adapt", "--model {b}/empty --data {b}/data --out {b}/u", ["empty", "manifest.json"]),
    ("ehr-serve", "--model {b}/missing --no-auth", ["bad model directory"]),
    ("ehr-serve", "--model {b}/empty --no-auth --port -1", ["port"]),
    ("ehr-serve", "--model {b}/empty --no-auth --port eighty", ["--port", "'eighty'"]),
    ("ehr-serve", "--model {b}/empty --no-auth --precision float16", ["--precision", "float16"]),
    ("ehr-serve", "--model {b}/empty --no-auth --host 0.0.0.0", ["--no-auth", "loopback"]),
    ("ehr-serve", "--model {b}/empty --api-keys-file {b}/no-keys", ["no-keys"]),
]


@pytest.mark.parametrize("command,argv,words", CASES, ids=[f"{c} {a.split(' ')[0]} {i}" for i, (c, a, _) in
                                                           enumerate(CASES)])
def test_misuse_is_one_line_and_exit_2(command, argv, words, place, capsys, monkeypatch):
    monkeypatch.delenv("EHR_API_KEYS", raising=False)
    args = argv.format(b=place, root=REPO_ROOT).split()
    try:
        code = MAINS[command](args)
    except SystemExit as exit_:  # argparse exits; our own checks return
        code = exit_.code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and lines[0].startswith(f"{command}"), captured.err
    assert "Traceback" not in captured.err and captured.out == ""
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_every_console_script_is_covered():
    scripts = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) == set(MAINS)
    assert {c for c, _, _ in CASES} == set(scripts)


@pytest.mark.parametrize("module,args", [
    ("ehr_pipeline.cli", "run --mimic-dir no/such/folder --out x"),
    ("ehr_pipeline.cli", "run --mimic-dir {release} --out x --runner=NoSuchRunner"),
    ("serving", "--model no/such/export --no-auth --max-batch 0"),
])
def test_the_process_prints_one_line_and_exits_2(module, args, tmp_path):
    release = tmp_path / "release"
    assert pipeline_cli.main(["synth", "--patients", "3", "--out", str(release), "--no-progress"]) == 0
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    env.pop("EHR_API_KEYS", None)
    proc = subprocess.run([sys.executable, "-m", module, *args.format(release=release).split()], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr


def test_one_line_keeps_every_part_of_a_multi_line_message():
    assert one_line("cfg.yaml: invalid experiment config:\n  a: bad\n  b: worse\n") == \
        "cfg.yaml: invalid experiment config: a: bad; b: worse"
