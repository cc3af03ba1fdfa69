"""``ServerProcess``: runs ``python -m serving`` (the ehr-serve CLI) on 127.0.0.1 with a free port,
waits for /readyz, and stops it. The demo and the quickstart notebook start the service with it."""
from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """`python -m serving ARGS` on 127.0.0.1 and a free port; use as a context manager."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str] | None = None,
                 log_path: str | os.PathLike, startup_timeout_s: float = 300.0, cwd: str | os.PathLike | None = None):
        # 300 s: TensorFlow's import, the export's load and the warm-up took over 120 s on 2 cores shared
        # with other work (the soak's server failed to start so); a healthy start returns as soon as it is ready.
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.log_path = pathlib.Path(log_path)
        self.startup_timeout_s = startup_timeout_s
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.base_url = ""

    def log(self) -> str:
        """Everything the server wrote so far (stdout and stderr)."""
        return self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""

    def start(self) -> ServerProcess:
        """Starts the server and waits until /readyz answers 200; raises RuntimeError with its log if not."""
        import httpx

        port = free_port()  # chosen here, not by --port 0: the log level may hide uvicorn's "running on"
        argv = [sys.executable, "-m", "serving", "--host", "127.0.0.1", "--port", str(port), *self.args]
        self.base_url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.cwd)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/readyz", timeout=2.0).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"server not ready within {self.startup_timeout_s} s:\n{self.log()}")

    def stop(self) -> int | None:
        """SIGTERM (uvicorn's graceful shutdown), then SIGKILL after 10 s; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
