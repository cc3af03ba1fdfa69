"""What reaches the terminal: our own logs and tables, not the libraries' start-up notices.

On a CPU machine TensorFlow's C++ runtime prints oneDNN notices, CUDA probes and "E0000 ... failed
call to cuInit", and Beam logs BigQuery / apitools notices and type-hint conversions, between the
project's own tables. They say nothing wrong, so a command hides them and shows them with ``-v``.
Environment variables must be set before TensorFlow is first imported: ``ehr_base`` calls
``pin_keras`` and ``quiet_native_logs`` on import, and a command's ``-v`` calls ``verbose_native_logs``
before any heavy import.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator

# A value the user set wins: these are defaults, never overrides.
_QUIET_TF_CPP = "3"  # TensorFlow's C++ logs: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR either
# Python loggers of libraries whose INFO / WARNING lines are notices, not news, in our commands.
NOISY_LOGGERS = ("absl", "tensorflow", "apache_beam", "apitools", "google.auth", "h5py", "numexpr")


def pin_keras() -> None:
    """TF_USE_LEGACY_KERAS=1: edward2 and TFP need Keras 2, which TensorFlow reads on its first import."""
    os.environ["TF_USE_LEGACY_KERAS"] = "1"


def quiet_native_logs() -> None:
    """Hides TensorFlow's C++ start-up lines unless the user asked for them (TF_CPP_MIN_LOG_LEVEL set)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", _QUIET_TF_CPP)


def verbose_native_logs() -> None:
    """Shows TensorFlow's C++ warnings and errors (a command's -v): call before TensorFlow is imported."""
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"


def quiet_library_loggers(verbose: bool = False) -> None:
    """Library loggers at WARNING (Beam's at ERROR: its warnings are notices) unless verbose."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.DEBUG if verbose else
                                         logging.ERROR if name == "apache_beam" else logging.WARNING)


@contextlib.contextmanager
def native_stderr_muted(verbose: bool = False) -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null inside the block (nothing changes when verbose).

    TensorFlow prints "Could not find cuda drivers" from a library initialiser before its logging is
    set up, so TF_CPP_MIN_LOG_LEVEL cannot hide it, and its device probe prints a second one: they
    go to the process's descriptor 2, below Python. Restored on the way out, so an error raised
    inside (an import that fails) still reaches the terminal with its traceback.
    """
    if verbose:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def load_tensorflow(verbose: bool = False) -> None:
    """Imports TensorFlow and probes its devices quietly (unless verbose); later imports print nothing.

    A command calls this once, after parsing its flags and before its work.
    """
    with native_stderr_muted(verbose):
        import tensorflow as tf

        tf.config.list_physical_devices()
