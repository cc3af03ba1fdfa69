"""What reaches the terminal: our own logs and tables, not the libraries' start-up notices.

On a CPU machine TensorFlow's C++ runtime prints oneDNN notices, CUDA probes and "E0000 ... failed
call to cuInit", and Beam logs BigQuery / apitools notices and type-hint conversions, between the
project's own tables. They say nothing wrong, so a command hides them and shows them with ``-v``.
Environment variables must be set before TensorFlow is first imported: ``ehr_base`` calls
``pin_keras``, ``quiet_native_logs`` and ``quiet_tensorflow_import`` on import, and a command's ``-v``
calls ``verbose_native_logs`` before any heavy import.

Two kinds of lines escaped a per-command switch, and are handled where they start instead:

* TensorFlow's "Could not find cuda drivers" comes from a library initialiser and its device probe,
  below Python's logging: it was hidden only when a command imported TensorFlow inside
  ``load_tensorflow``, and any module that imported it earlier (a flag's choices read from a module
  that imports TensorFlow) printed it twice. ``quiet_tensorflow_import`` mutes the process's
  descriptor 2 around the FIRST import of TensorFlow and its device probe, whoever imports it.
* Beam logs its apitools / BigQuery notice with ``logging.warning``, on the root logger, so the
  level of Beam's own loggers does not reach it. ``quiet_library_loggers`` filters the root
  logger's records by the file that logged them: a noisy library's file is held to that library's
  level, whichever logger it used.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

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


def _library_level(name: str, verbose: bool) -> int:
    return logging.DEBUG if verbose else logging.ERROR if name == "apache_beam" else logging.WARNING


def quiet_library_loggers(verbose: bool = False) -> None:
    """Library loggers at WARNING (Beam's at ERROR: its warnings are notices) unless verbose, also when a
    library logs through the root logger (``logging.warning(...)`` in its own file)."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(_library_level(name, verbose))
    root = logging.getLogger()
    for old in [f for f in root.filters if isinstance(f, LibraryFileFilter)]:
        root.removeFilter(old)
    if not verbose:
        root.addFilter(LibraryFileFilter({name: _library_level(name, verbose) for name in NOISY_LOGGERS}))


class LibraryFileFilter(logging.Filter):
    """Drops a root-logger record from a library's own files below that library's level.

    The library is found by the record's file (``record.pathname``) under the folder its package
    is installed in, found without importing it; records of the project's own code pass.
    """

    def __init__(self, levels: dict[str, int]):
        super().__init__()
        self._folders: list[tuple[str, int]] = []
        for name, level in levels.items():
            folder = _package_folder(name)
            if folder:
                self._folders.append((folder, level))

    def filter(self, record: logging.LogRecord) -> bool:
        """False for a record a quiet library logged below its level."""
        path = record.pathname or ""
        return not any(path.startswith(folder) and record.levelno < level for folder, level in self._folders)


def _package_folder(name: str) -> str | None:
    """The folder a top-level package is installed in (with a trailing separator), None if it is not installed."""
    try:
        spec = importlib.util.find_spec(name.split(".")[0])
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return os.path.join(os.path.realpath(locations[0]), "") if locations else None


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


def native_logs_quiet() -> bool:
    """Whether TensorFlow's C++ start-up lines are to be hidden (TF_CPP_MIN_LOG_LEVEL at the quiet default)."""
    return os.environ.get("TF_CPP_MIN_LOG_LEVEL") == _QUIET_TF_CPP


class _QuietFirstImport(importlib.abc.MetaPathFinder):
    """Finds nothing of its own: hands the real loader of `name`'s first import to a muted one.

    It leaves sys.meta_path at that first import, so it costs nothing afterwards.
    """

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        """The real spec of the first `name` import, its loader muted while the TF logs are quiet."""
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if not native_logs_quiet():
            return None
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _MutedLoader(spec.loader)
        return spec


class _MutedLoader(importlib.abc.Loader):
    """Runs a module's loader with descriptor 2 muted, then probes TensorFlow's devices inside the same mute."""

    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        """The real loader's module."""
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        """The real loader's exec_module, muted; the device probe prints the second CUDA line, so it runs here too."""
        with native_stderr_muted():
            self.loader.exec_module(module)
            config = getattr(module, "config", None)
            if config is not None and hasattr(config, "list_physical_devices"):
                config.list_physical_devices()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self.loader, name)


def quiet_tensorflow_import() -> None:
    """The first ``import tensorflow`` of the process, by any module, prints no C++ start-up lines (unless verbose)."""
    if "tensorflow" not in sys.modules and not any(isinstance(f, _QuietFirstImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _QuietFirstImport("tensorflow"))


def load_tensorflow(verbose: bool = False) -> None:
    """Imports TensorFlow and probes its devices quietly (unless verbose); later imports print nothing.

    A command calls this once, after parsing its flags and before its work.
    """
    with native_stderr_muted(verbose):
        import tensorflow as tf

        tf.config.list_physical_devices()
