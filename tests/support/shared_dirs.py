"""A folder built once per test session, however many pytest-xdist workers ask for it.

Each xdist worker runs a session fixture on its own, so a fixture that ran the demo job or trained
a model would pay for it once per worker. ``built_once`` lets the first worker build the folder
under the run's common temporary root while the others wait on a file lock, then read it. Without
xdist it is a plain ``tmp_path_factory.mktemp``. Everything it returns is read-only by contract.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import pathlib
import shutil
from collections.abc import Callable, Iterator

import pytest


@contextlib.contextmanager
def _locked(path: pathlib.Path) -> Iterator[None]:
    """An exclusive POSIX lock on path for the block (released if the holder dies)."""
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def built_once(factory: pytest.TempPathFactory, name: str, build: Callable[[pathlib.Path], None]) -> pathlib.Path:
    """The folder `name`, filled by `build(folder)` once per session (once for all xdist workers)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = factory.mktemp(name)
        build(folder)
        return folder
    # xdist gives each worker <root>/popen-gwN as its basetemp; <root> is common to the run.
    root = factory.getbasetemp().parent
    folder, done = root / name, root / f"{name}.done"
    with _locked(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed in another worker
            folder.mkdir()
            build(folder)
            done.touch()
    return folder
