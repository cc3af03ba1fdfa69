"""What every family of bench scripts shares (a module, not a script): results file, command line, machine, memory.

bench/ holds one folder per family: methods/ (the method comparison and what builds on its runs),
image_models/, data_jobs/ (the reader and the Beam jobs), service/ and train_speed/. A script runs
from the repo root as ``python bench/FAMILY/NAME.py``, puts the root on sys.path and imports this
module and its family's modules that are not scripts, never another script.

Each bench script owns one section of docs/benchmarks.md, delimited by
``<!-- begin:NAME -->`` / ``<!-- end:NAME -->``, so scripts can be re-run independently
without clobbering each other's numbers.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import importlib.metadata
import math
import os
import pathlib
import platform
import resource
import shlex
import subprocess
import sys
import threading
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_PATH = "docs/benchmarks.md"
_PACKAGES = ("pyarrow", "numpy", "pandas", "tensorflow", "tf-keras", "tensorflow-probability", "apache-beam")


def write_section(name: str, markdown: str, path: str | os.PathLike = DEFAULT_PATH) -> pathlib.Path:
    """Replaces section NAME of the results file (relative paths are under the repo root); returns the file."""
    if not name or any(c in name for c in "<>\n") or "--" in name:
        raise ValueError(f"section name {name!r} cannot be used inside an HTML comment marker")
    target = pathlib.Path(path)
    if not target.is_absolute():
        target = ROOT / target
    begin, end = f"<!-- begin:{name} -->", f"<!-- end:{name} -->"
    block = f"{begin}\n{markdown.strip()}\n{end}"
    text = target.read_text(encoding="utf-8") if target.exists() else "# Benchmarks\n"
    b, e = text.find(begin), text.find(end)
    if b >= 0 and e > b:
        text = text[:b] + block + text[e + len(end):]
    elif b >= 0 or e >= 0:
        # Half a section means someone edited the markers by hand: guessing would eat text.
        raise ValueError(f"{target}: section {name!r} has only one of its markers; fix the file by hand")
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    return target


def publish(name: str, markdown: str, path: str | os.PathLike = DEFAULT_PATH, write: bool = True) -> None:
    """Prints a benchmark's markdown and, unless write is False, puts it in section NAME of path (says where)."""
    print(markdown)
    if write:
        print(f"\nwrote {write_section(name, markdown, path)}")


def command_line(script: str, argv: list[str] | None, drop: tuple[str, ...] = ()) -> str:
    """How to re-run a bench script from the repo root: ``python bench/FAMILY/NAME.py ARGS``; argv None: this
    process's. script is the script's ``__file__``: the command names it by its path under the repo root."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in drop]
    path = pathlib.Path(script).resolve().relative_to(ROOT).as_posix()
    return " ".join(["python", path, *(shlex.quote(a) for a in args)])


def mean_sem(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (n - 1 in the variance); SEM nan for fewer than 2 values."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (n - 1)
    return mean, math.sqrt(var / n)


def cell(values: list[float], digits: int = 4) -> str:
    """A table cell 'mean +- SEM' at `digits` decimals ('mean' alone when there is no SEM)."""
    mean, sem = mean_sem(values)
    return f"{mean:.{digits}f}" + ("" if not math.isfinite(sem) else f" +- {sem:.{digits}f}")


def _cpu_model() -> str:
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# The vector units that decide how fast bfloat16 matmuls run next to float32 ones (ehr-serve --precision).
_MATMUL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def _matmul_flags() -> str:
    """Which of _MATMUL_FLAGS /proc/cpuinfo lists, as 'avx2 yes, avx512f no, ...' ('unknown' off Linux)."""
    try:
        for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in _MATMUL_FLAGS)
    except OSError:
        pass
    return "unknown"


def _memory_gib() -> str:
    try:
        for line in pathlib.Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return f"{int(line.split()[1]) / 2**20:.0f} GiB"
    except OSError:
        pass
    return "unknown"


def machine_info() -> str:
    """One markdown line per fact: CPU model, cores, memory, OS, Python and package versions."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    versions = []
    for pkg in _PACKAGES:
        try:
            versions.append(f"{pkg} {importlib.metadata.version(pkg)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return "\n".join([
        f"- CPU: {_cpu_model()}, {os.cpu_count()} cores ({usable} usable by this process); "
        f"flags: {_matmul_flags()}",
        f"- memory: {_memory_gib()}; OS: {platform.platform()}",
        f"- Python {platform.python_version()}; {', '.join(versions)}",
    ])


def run_footer(cmdline: str, load_at_start: float, detail: str = "") -> list[str]:
    """A section's closing lines: the command, detail and the 1-minute load average at its start, then machine_info."""
    return [f"Run with `{cmdline}` ({detail}1-minute load average at start: {load_at_start:.1f}):", "",
            machine_info()]


def _vm_hwm_mb(status_path: str) -> float | None:
    """VmHWM (peak RSS of the process's current memory image) from a /proc status file, MiB."""
    try:
        with open(status_path) as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        pass
    return None


def peak_rss_mb() -> float:
    """Peak resident memory of this process since it started (exec), in MiB.

    Prefers Linux's VmHWM: ``ru_maxrss`` survives exec, so a child forked from a big parent
    would report the parent's size.
    """
    hwm = _vm_hwm_mb("/proc/self/status")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


@dataclasses.dataclass(frozen=True)
class ChildRun:
    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mb: float | None  # highest VmHWM seen while polling the child; None off Linux


def run_child(argv: list[str], env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
              poll_s: float = 0.02) -> ChildRun:
    """Runs argv in a fresh process; returns its output, wall time (s) and peak RSS (MiB).

    A fresh process per measurement makes peaks comparable: nothing an earlier size or
    variant allocated stays in the allocator. The peak is polled from /proc every
    ``poll_s`` (the kernel's rusage would include the parent's memory at fork, see
    ``peak_rss_mb``), so growth in the child's last ``poll_s`` can be missed: a child that
    can should also report ``peak_rss_mb()`` itself.
    """
    started = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
    peak: list[float] = []
    done = threading.Event()

    def poll() -> None:
        status = f"/proc/{proc.pid}/status"
        while not done.is_set():
            hwm = _vm_hwm_mb(status)
            if hwm is not None:
                peak.append(hwm if not peak else max(hwm, peak[-1]))
            done.wait(poll_s)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    stdout, stderr = proc.communicate()
    done.set()
    poller.join()
    return ChildRun(proc.returncode, stdout, stderr, time.perf_counter() - started, peak[-1] if peak else None)


# The service benches' requests: one key and one synthetic admission builder, shared by every service bench.
API_KEY = "bench-key-0123456789abcdef"
ADMIT = dt.datetime(2150, 3, 1, 8, 30)
# (source, code, value or None): MIMIC-style items; values drawn around these centres.
_ITEMS = [("lab", "50912", 1.1), ("lab", "50971", 4.2), ("lab", "51006", 20.0), ("lab", "50983", 139.0),
          ("chart", "220045", 88.0), ("chart", "220210", 18.0), ("chart", "220277", 96.0),
          ("prescription", "Vancomycin", None), ("prescription", "Heparin", None), ("diagnosis", "4019", None)]


def make_request(rng: np.random.Generator, n_events: int, trigger_offset_s: int) -> dict:
    """A synthetic admission with n_events events spread over the hours before the prediction time."""
    events = []
    for _ in range(n_events):
        source, code, centre = _ITEMS[int(rng.integers(len(_ITEMS)))]
        at = ADMIT + dt.timedelta(seconds=int(rng.integers(0, trigger_offset_s)))
        event = {"time": at.isoformat(), "source": source, "code": code}
        if centre is not None:
            event["value"] = round(float(centre * rng.lognormal(0.0, 0.15)), 2)
        events.append(event)
    return {"patient": {"gender": "F", "age_years": float(rng.uniform(20, 90))},
            "admission": {"admit_time": ADMIT.isoformat(), "admission_type": "EMERGENCY"}, "events": events}
