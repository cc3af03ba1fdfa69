"""Runs a console command in a process that dies (SIGKILL) or fails (a full disk) at a named point of its work.

  python -m tests.support.fault_injection MODULE:QUALNAME[@N] {kill,enospc} ENTRY -- ARGS...

The callable MODULE:QUALNAME (a function, or a method as Class.method) is wrapped in this process before
the command starts: its N-th call (1 by default) kills the process with SIGKILL, as an operator's
`kill -9` or the OOM killer would, or raises OSError(ENOSPC), as a full disk would. ENTRY is the
command's main function (MODULE:FUNCTION), called with ARGS. The local Beam runner with one worker runs
every DoFn in this process, so a DoFn's method is a point like any other.
"""
from __future__ import annotations

import errno
import functools
import importlib
import os
import signal
import sys


def _resolve(spec: str):
    """(owner object, attribute name) of MODULE:QUALNAME."""
    module_name, _, qualname = spec.partition(":")
    owner = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def arm(point: str, fault: str) -> None:
    """Wraps the callable at `point` (MODULE:QUALNAME[@N]) so that its N-th call injects `fault`."""
    spec, _, nth = point.partition("@")
    owner, name = _resolve(spec)
    original = getattr(owner, name)
    calls = {"n": 0}
    target = int(nth or 1)

    @functools.wraps(original)
    def faulty(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == target:
            if fault == "kill":
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "injected")
        return original(*args, **kwargs)

    setattr(owner, name, faulty)


def main(argv: list[str]) -> int:
    """Arms the fault and runs the command; returns its exit code."""
    point, fault, entry, sep, *args = argv
    assert sep == "--" and fault in ("kill", "enospc"), "usage: POINT {kill,enospc} ENTRY -- ARGS..."
    import ehr_base  # noqa: F401  (the environment every console script sets up first)

    arm(point, fault)
    owner, name = _resolve(entry)
    return int(getattr(owner, name)(args) or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
