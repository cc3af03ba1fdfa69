"""ehr-adapt's flags: every one explained with its default, and bad input refused in one line naming the flag or file."""
from __future__ import annotations

import subprocess
import sys

import pytest

from model.adapt.config import METHODS, AdaptConfig
from model.cli import ehr_adapt
from tests.support.paths import REPO_ROOT as ROOT


def test_help_explains_every_flag_with_its_default_and_loads_no_tensorflow():
    code = ("import sys; from model.cli import ehr_adapt; ehr_adapt.build_parser().print_help(); "
            "print('TF', 'tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    flat = " ".join(out.split())  # argparse wraps at the terminal's width: compare the words, not the lines
    for flag, field in ehr_adapt._FLAGS.items():
        assert flag in flat
    assert "(default: closed-test)" in flat and "(default: 0.05)" in flat
    assert all(m in flat for m in METHODS)
    assert "TF False" in flat


def test_the_flags_defaults_are_the_configs():
    args = ehr_adapt.build_parser().parse_args(["--model", ".", "--data", ".", "--out", "x"])
    assert ehr_adapt.config_of(args) == AdaptConfig()


@pytest.mark.parametrize("flags, named", [
    (["--sample-size", "5"], "--sample-size"),
    (["--alpha", "1.5"], "--alpha"),
    (["--validation-fraction", "0.9"], "--validation-fraction"),
])
def test_a_bad_setting_is_one_line_naming_its_flag(tmp_path, capsys, flags, named):
    code = ehr_adapt.main(["--model", str(tmp_path), "--data", str(tmp_path), "--out", str(tmp_path / "o"), *flags])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and err.startswith(f"ehr-adapt: error: {named}:")


def test_a_folder_that_is_not_an_export_is_named(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    code = ehr_adapt.main(["--model", str(tmp_path / "m"), "--data", str(tmp_path / "m"), "--out",
                           str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and str(tmp_path / "m") in err and "manifest.json" in err


def test_a_data_folder_that_is_not_the_jobs_output_is_named(trained_rank1, tmp_path, capsys):
    (tmp_path / "d").mkdir()
    code = ehr_adapt.main(["--model", str(trained_rank1["export"]), "--data", str(tmp_path / "d"),
                           "--out", str(tmp_path / "o"), "--no-progress"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and str(tmp_path / "d") in err and "inside an input" not in err
