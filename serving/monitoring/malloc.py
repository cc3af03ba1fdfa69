"""glibc malloc settings of the service process: few arenas, and free pages handed back.

Measured (bench/soak.py, 8 clients, 5 minutes, /proc/PID/smaps of the server): the growth of the
server's resident memory was all in glibc's per-thread malloc arenas (118 -> 206 MiB), while the
main heap (282 -> 289 MiB), Python's object arenas (24 -> 26 MiB), the mapped libraries and the
thread count (~36) stayed flat. glibc gives each thread that allocates while another holds an
arena its own arena, up to 8 per core; the service's ~36 threads (anyio's worker pool encoding
requests and making reports, the model thread, TensorFlow's pools) spread their short-lived
allocations over many arenas, and freed memory fragments there instead of being reused.
Capping the arenas (``M_ARENA_MAX``, ``Settings.malloc_arenas``) makes threads share them, and
``trim`` returns the free pages of every arena to the system (``malloc_trim``).

On a C library other than glibc (musl, macOS) both are no-ops: the functions are looked up and
skipped when absent.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_ARENA_MAX = -8  # mallopt parameter number in glibc's malloc.h


def _libc():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name) if name else None
    except OSError:
        return None


def cap_arenas(arenas: int) -> bool:
    """Caps glibc's malloc arenas at `arenas` (0 keeps glibc's default); True when set. Call before threads start."""
    libc = _libc()
    if not arenas or libc is None or not hasattr(libc, "mallopt"):
        return False
    ok = bool(libc.mallopt(M_ARENA_MAX, int(arenas)))
    logger.info("malloc arenas capped at %d: %s", arenas, "yes" if ok else "refused by the C library")
    return ok


def trim() -> None:
    """Returns the free pages of every malloc arena to the system (glibc's malloc_trim(0)); a no-op elsewhere."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
