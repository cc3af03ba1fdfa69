"""What reaches the terminal: TensorFlow's C++ start-up lines only with -v (ehr_base.console)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
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


@pytest.mark.slow
def test_tensorflow_start_up_lines_are_hidden_unless_verbose():
    use = "import tensorflow as tf; tf.constant([1.0]) + 1.0"
    plain = _native_lines(_stderr_of(f"import os; os.environ['TF_USE_LEGACY_KERAS'] = '1'; {use}"))
    if not plain:
        pytest.skip("TensorFlow printed no start-up lines on this machine: nothing to hide")
    quiet = _native_lines(_stderr_of(f"from ehr_base import console; console.load_tensorflow(False); {use}"))
    assert not quiet, quiet
    verbose = _native_lines(_stderr_of(
        f"from ehr_base import console; console.verbose_native_logs(); console.load_tensorflow(True); {use}"))
    assert verbose, "with -v the start-up lines must reach the terminal"
