"""Runs a console command in a process that dies (SIGKILL) or fails (a full disk) at a named point of its work.

  python -m tests.support.fault_injection MODULE:QUALNAME[@N] {kill,enospc} ENTRY -- ARGS...

The callable MODULE:QUALNAME (a function, or a method as Class.method) is wrapped in this process before
the command starts: its N-th call (1 by default) kills the process with SIGKILL, as an operator's
`kill -9` or the OOM killer would, or raises OSError(ENOSPC), as a full disk would. ENTRY is the
command's main function (MODULE:FUNCTION), called with ARGS. The local Beam runner with one worker runs
every DoFn in this process, so a DoFn's method is a point like any other.

``FaultServer`` runs many such commands, each in a process of its own, for the price of one start: a
server process imports the commands' modules once (Beam alone takes ~5 s on 2 cores) and forks a fresh
child per run, which arms its fault and runs the command exactly as the one-shot form does. The
server never runs a command itself, so every child starts from the same untouched state.
"""
from __future__ import annotations

import errno
import functools
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import traceback


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


def run_armed(point: str, fault: str, entry: str, args: list[str]) -> int:
    """Arms the fault and runs the command in this process; returns its exit code."""
    assert fault in ("kill", "enospc"), "usage: POINT {kill,enospc} ENTRY -- ARGS..."
    arm(point, fault)
    owner, name = _resolve(entry)
    return int(getattr(owner, name)(args) or 0)


def main(argv: list[str]) -> int:
    """Arms the fault and runs the command; returns its exit code."""
    if argv[:1] == ["--serve"]:
        return serve(argv[1:])
    point, fault, entry, sep, *args = argv
    assert sep == "--", "usage: POINT {kill,enospc} ENTRY -- ARGS..."
    import ehr_base  # noqa: F401  (the environment every console script sets up first)

    return run_armed(point, fault, entry, args)


# ----------------------------------------------------------------------------- many runs, one start


def _child(request: dict, out_fd: int, err_fd: int) -> None:
    """In a forked child: the command's output to the given files, its exit code as the process's; never returns."""
    code = 1
    try:
        os.dup2(out_fd, 1)
        os.dup2(err_fd, 2)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        code = run_armed(request["point"], request["fault"], request["entry"], request["args"])
    except SystemExit as stop:  # as the interpreter ends a process that raised it
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001  (as the interpreter reports an uncaught exception: traceback, exit 1)
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(preload: list[str]) -> int:
    """Imports `preload`, then forks one child per request line on stdin and answers each with a JSON line."""
    import ehr_base  # noqa: F401  (the environment every console script sets up first)

    for module in preload:
        importlib.import_module(module)
    replies = sys.stdout
    print(json.dumps({"ready": os.getpid()}), file=replies, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _child(request, out.fileno(), err.fileno())
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            out.seek(0)
            err.seek(0)
            reply = {"returncode": code, "stdout": out.read().decode(errors="replace"),
                     "stderr": err.read().decode(errors="replace")}
        print(json.dumps(reply), file=replies, flush=True)
    return 0


class FaultServer:
    """A server process (``--serve``) that runs each faulty command in a forked child of its own."""

    def __init__(self, preload: list[str], cwd: str | os.PathLike[str], timeout: float = 300.0):
        self.timeout = timeout
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, "--serve", *preload], cwd=cwd,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._reply()  # the imports done: later runs pay none of them

    def _reply(self) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], self.timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(f"the fault server gave no answer within {self.timeout:.0f} s (exit {self.proc.poll()})")
        return json.loads(line)

    def run(self, point: str, fault: str, entry: str, *args: str) -> subprocess.CompletedProcess:
        """Runs ENTRY with ARGS in a new process with `fault` ('kill' or 'enospc') armed at `point`."""
        request = {"point": point, "fault": fault, "entry": entry, "args": list(args)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        reply = self._reply()
        return subprocess.CompletedProcess([point, fault, entry, *args], reply["returncode"], reply["stdout"],
                                           reply["stderr"])

    def close(self) -> None:
        """Ends the server (its stdin closed: it returns) and waits for it."""
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
