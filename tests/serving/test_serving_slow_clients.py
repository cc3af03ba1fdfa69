"""Slow and vanishing clients against the real `ehr-serve` process on 127.0.0.1.

Hundreds of connections that send a partial body must not stop real requests, must be cut off
by the body timeout (or at once without a key), must be counted as what they are, and must
not hold SIGTERM beyond the shutdown timeout.
"""
from __future__ import annotations

import re
import signal
import socket
import threading
import time

import httpx
import pytest

import ehr_base  # noqa: F401  (pins the Keras flavour before TensorFlow loads)
from serving.tools.server_process import ServerProcess
from tests.support.paths import REPO_ROOT

REPO = REPO_ROOT
KEY = "slow-clients-key-0123456789abcdef"
HELD = 300  # slow connections held at once: bounded, so the test stays a few seconds
BODY_TIMEOUT_S = 2.0
SHUTDOWN_TIMEOUT_S = 2.0
REQUEST = {"patient": {"gender": "F", "age_years": 70.0},
           "admission": {"admit_time": "2150-01-01T00:00:00", "admission_type": "EMERGENCY"},
           "events": [{"time": "2150-01-01T01:00:00", "source": "lab", "code": "50912", "value": 1.0}]}


@pytest.fixture(scope="module")
def export_dir(fixture_export):
    return fixture_export


def _server(export_dir, tmp_path) -> ServerProcess:
    # A failure budget above the 50 keyless connections: all come from 127.0.0.1, like the keyed requests
    # that must get through meanwhile (test_auth_budget.py tests the budget itself).
    return ServerProcess(["--model", str(export_dir), "--max-wait-ms", "1", "--no-warmup", "--auth-failures", "100",
                          "--body-timeout-s", str(BODY_TIMEOUT_S), "--shutdown-timeout-s", str(SHUTDOWN_TIMEOUT_S)],
                         env={"EHR_API_KEYS": KEY}, log_path=tmp_path / "server.log", cwd=REPO,
                         startup_timeout_s=240)  # TensorFlow's import alone is slow on a busy machine


def _slow(base_url: str, key: str | None) -> socket.socket:
    """A connection that declares a 1000-byte body and sends 10 bytes of it."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    auth = f"X-API-Key: {key}\r\n" if key else ""
    sock.sendall(f"POST /v1/predict HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
                 f"Content-Length: 1000\r\n\r\n{{\"patient\"".encode())
    return sock


def _status(sock: socket.socket) -> int | None:
    """The status code the server answered on sock (None if it closed without one)."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    sock.close()
    match = re.match(rb"HTTP/1\.1 (\d{3})", data)
    return int(match.group(1)) if match else None


def _metrics(base_url: str) -> str:
    return httpx.get(f"{base_url}/metrics", headers={"X-API-Key": KEY}, timeout=30).text


@pytest.mark.slow  # a server process: TensorFlow's import dominates, minutes on a busy machine
def test_held_slow_bodies_neither_block_requests_nor_stay_nor_hold_sigterm(export_dir, tmp_path):
    # One server for both claims (its start is most of the test): the slow bodies first, then SIGTERM
    # with a trickling client, once every held connection above has been answered or closed.
    server = _server(export_dir, tmp_path).start()
    try:
        started = time.monotonic()
        keyed = [_slow(server.base_url, KEY) for _ in range(HELD)]
        anonymous = [_slow(server.base_url, None) for _ in range(50)]
        with httpx.Client(base_url=server.base_url, timeout=30) as c:
            for _ in range(5):  # real requests while every slow connection is still held
                assert c.post("/v1/predict", json=REQUEST, headers={"X-API-Key": KEY}).status_code == 200
        assert [_status(s) for s in anonymous] == [401] * 50  # refused before any body was read
        assert [_status(s) for s in keyed] == [408] * HELD
        assert time.monotonic() - started < BODY_TIMEOUT_S + 20
        # Clients that leave mid-body are disconnects, not server errors.
        gone = [_slow(server.base_url, KEY) for _ in range(20)]
        for sock in gone:
            sock.close()
        time.sleep(1.0)
        text = _metrics(server.base_url)
        assert 'ehr_http_errors_total{kind="client_disconnect",route="/v1/predict"} 20.0' in text, text
        assert 'kind="server"' not in text
        assert not [line for line in server.log().splitlines() if "Too many open files" in line]
        took = _sigterm_with_a_trickling_client(server)
    finally:
        server.stop()
    assert took < SHUTDOWN_TIMEOUT_S + 5, f"SIGTERM took {took:.1f} s"


def _sigterm_with_a_trickling_client(server: ServerProcess) -> float:
    """Seconds from SIGTERM to the server's exit while one client trickles a body within the body timeout."""
    sock = _slow(server.base_url, KEY)
    stop = threading.Event()

    def trickle():  # one byte well within the body timeout, for as long as it is allowed to
        while not stop.is_set():
            try:
                sock.sendall(b" ")
            except OSError:
                return
            time.sleep(BODY_TIMEOUT_S / 4)

    thread = threading.Thread(target=trickle, daemon=True)
    thread.start()
    try:
        time.sleep(BODY_TIMEOUT_S)  # longer than the body timeout: only the trickle keeps it open
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        server.proc.wait(timeout=SHUTDOWN_TIMEOUT_S + 15)
        return time.monotonic() - sent
    finally:
        stop.set()
