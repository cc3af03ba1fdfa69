"""What reaches the terminal: TensorFlow's C++ start-up lines only with -v (ehr_base.console)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.paths import REPO_ROOT

ROOT = REPO_ROOT
# Start-up lines TensorFlow's C++ runtime prints on a CPU machine: absl's prefix ("I0000 ...",
# "E0000 ... failed call to cuInit"), CUDA probes, oneDNN notices.
_NATIVE_MARKS = ("I0000", "E0000", "W0000", "cuda", "oneDNN")


def _stderr_of(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True)
    return done.stderr


def _native_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(mark.lower() in line.lower() for mark in _NATIVE_MARKS)]


_USE_AND_LIST = "import tensorflow as tf; tf.constant([1.0]) + 1.0; tf.config.list_physical_devices()"


@pytest.fixture(scope="module")
def plain_start_up_lines() -> list[str]:
    """The start-up lines TensorFlow prints on this machine when nothing hides them (one process, ~5 s)."""
    # Both tests below ask the same question before theirs (does this machine print any?): one
    # answer for the module. TensorFlow with device listing, the superset of what each test does.
    return _native_lines(_stderr_of(f"import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'; {_USE_AND_LIST}"))


@pytest.mark.slow
def test_tensorflow_start_up_lines_are_hidden_unless_verbose(plain_start_up_lines):
    use = "import tensorflow as tf; tf.constant([1.0]) + 1.0"
    if not plain_start_up_lines:
        pytest.skip("TensorFlow printed no start-up lines on this machine: nothing to hide")
    quiet = _native_lines(_stderr_of(f"from ehr_base import console; console.load_tensorflow(False); {use}"))
    assert not quiet, quiet
    verbose = _native_lines(_stderr_of(
        f"from ehr_base import console; console.verbose_native_logs(); console.load_tensorflow(True); {use}"))
    assert verbose, "with -v the start-up lines must reach the terminal"


@pytest.mark.slow
def test_tensorflow_imported_by_any_module_first_prints_no_start_up_lines(plain_start_up_lines):
    # Not through load_tensorflow: a module that imports TensorFlow at its top, before a command
    # gets to load it quietly (ehr-eval printed the CUDA line twice that way).
    use = _USE_AND_LIST
    if not plain_start_up_lines:
        pytest.skip("TensorFlow printed no start-up lines on this machine: nothing to hide")
    assert not _native_lines(_stderr_of(f"import ehr_base; import model.ehr.inputs; {use}"))
    shown = _native_lines(_stderr_of(f"import ehr_base; from ehr_base import console; console.verbose_native_logs(); "
                                     f"{use}"))
    assert shown, "with -v the start-up lines must reach the terminal"


def test_every_commands_parser_is_built_without_tensorflow():
    # -v is read from the parsed flags: TensorFlow loaded while building the parser would be
    # loaded before -v could let its lines through.
    code = ("import sys, ehr_base\n"
            "from model.cli import ehr_eval, ehr_analyze, ehr_train\n"
            "from serving import cli as serve\n"
            "from ehr_pipeline import cli as pipeline\n"
            "for m in (ehr_eval, ehr_analyze, ehr_train, serve, pipeline): m.build_parser()\n"
            "print('tensorflow' in sys.modules)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False", done.stderr[-2000:]


@pytest.mark.parametrize("verbose", [False, True])
def test_beams_root_logger_notice_shows_only_when_verbose(verbose):
    # Beam logs "apitools not found ..." with logging.warning (the root logger) when its BigQuery
    # client is imported, which the level of Beam's own loggers does not reach.
    code = ("import logging, ehr_base\n"
            "from ehr_base.cli_args import setup_logging\n"
            f"setup_logging({verbose})\n"
            "import apache_beam.io.gcp.internal.clients.bigquery\n"
            "logging.warning('our own root warning')\n")
    err = _stderr_of(code)
    assert "our own root warning" in err
    assert ("apitools" in err) == verbose, err
