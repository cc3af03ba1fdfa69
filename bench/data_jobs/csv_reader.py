"""Benchmark of ehr_pipeline.reader.TableReader against a bare pyarrow streaming CSV read.

Generates CHARTEVENTS-shaped files in the demo dialect (quoted UPPERCASE header, quoted
strings, unquoted numbers, ``.207`` decimals, gzipped) in a temporary folder, then reads each
in a fresh process pinned to one core: once with TableReader (typed, validated, all columns)
and once with ``pyarrow.csv.open_csv`` at its defaults (type inference, no validation).

    python bench/data_jobs/csv_reader.py [--sizes 1000000 10000000] [--no-write]

Targets, as ratios within one run: TableReader rows/s >= 45% of the bare read's, and peak
RSS at the largest size <= 1.2x the peak at the smallest (memory must not grow with the file).
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import pathlib
import shlex
import shutil
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script: make `bench` and `ehr_pipeline` importable
    sys.path.insert(0, str(ROOT))

from bench.harness import machine_info, peak_rss_mb, publish, run_child  # noqa: E402

SPEED_TARGET = 0.45
MEMORY_TARGET = 1.2
_GEN_CHUNK_ROWS = 500_000
_BASE_TIME = 4102444800  # 2100-01-01 00:00:00, where MIMIC's shifted dates start
_UNITS = ["mmHg", "bpm", "%", "insp/min", "mg/dL", "cmH2O", "Deg. F", "kg", None]
_TEXT_VALUES = ["Normal <3 secs", "Sinus Rhythm", "Moves all extremities", "Clear", "Diminished", "None"]


def _chunk(start: int, n: int, seed: int):
    """A pyarrow Table of n CHARTEVENTS-like rows with ROW_IDs from start (vectorised)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    rng = np.random.default_rng(seed)

    def maybe_null(values, fraction):
        return pa.array(values, mask=rng.random(n) < fraction)

    charttime = _BASE_TIME + rng.integers(0, 100 * 365 * 86400, n) // 60 * 60
    storetime = charttime + rng.integers(0, 3600, n)
    numeric = rng.random(n) < 0.8
    scale = rng.choice(np.array([1.0, 10.0, 100.0, 0.01]), n)
    valuenum = np.round(rng.gamma(2.0, 20.0, n) * scale, 3)
    text_value = pa.array(np.array(_TEXT_VALUES, dtype=object)[rng.integers(0, len(_TEXT_VALUES), n)])
    value = pc.if_else(pa.array(numeric), pc.cast(pa.array(valuenum), pa.string()), text_value)
    units = np.array(_UNITS, dtype=object)[rng.integers(0, len(_UNITS), n)]
    metavision = rng.random(n) < 0.4
    return pa.table({
        "ROW_ID": pa.array(np.arange(start, start + n, dtype=np.int64)),
        "SUBJECT_ID": pa.array(rng.integers(10_000, 99_999, n)),
        "HADM_ID": maybe_null(rng.integers(100_000, 199_999, n), 0.02),
        "ICUSTAY_ID": maybe_null(rng.integers(200_000, 299_999, n), 0.05),
        "ITEMID": pa.array(rng.choice(np.array([211, 618, 646, 220045, 220210, 220277, 223761, 51, 8368, 455]), n)),
        "CHARTTIME": pa.array(charttime.astype("datetime64[s]")),
        "STORETIME": pa.array(storetime.astype("datetime64[s]"), mask=rng.random(n) < 0.03),
        "CGID": maybe_null(rng.integers(14_000, 21_000, n), 0.03),
        "VALUE": value,
        "VALUENUM": pa.array(valuenum, mask=~numeric),
        "VALUEUOM": pa.array(units),
        # CareVue rows leave WARNING/ERROR empty, MetaVision rows carry 0/1.
        "WARNING": pa.array((rng.random(n) < 0.01).astype(np.int64), mask=~metavision),
        "ERROR": pa.array(np.zeros(n, np.int64), mask=~metavision),
        "RESULTSTATUS": pa.array(np.full(n, "Manual", dtype=object), mask=rng.random(n) > 0.01),
        "STOPPED": pa.array(np.full(n, "NotStopd", dtype=object), mask=metavision),
    })


def generate(path: pathlib.Path, rows: int, seed: int = 0) -> None:
    """Writes a gzipped CHARTEVENTS-like CSV of ``rows`` rows in the demo dialect."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    with gzip.open(path, "wb", compresslevel=6) as out:
        for i, start in enumerate(range(0, rows, _GEN_CHUNK_ROWS)):
            n = min(_GEN_CHUNK_ROWS, rows - start)
            sink = pa.BufferOutputStream()
            # Arrow's default quoting is the demo's: strings quoted, numbers and times bare.
            pacsv.write_csv(_chunk(start + 1, n, seed * 1_000_003 + i), sink,
                            pacsv.WriteOptions(include_header=(i == 0), batch_size=65536))
            data = sink.getvalue().to_pybytes()
            # The demo writes .207, not 0.207 (only unquoted numbers start a field with 0.).
            data = data.replace(b",0.", b",.").replace(b",-0.", b",-.")
            out.write(data)


# ------------------------------------------------------------------ child process side


def _pin_one_core() -> int:
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})
    return cpu


def child(mode: str, path: str, block_size: int) -> dict:
    """Reads ``path`` once in this process and returns rows, seconds and rows/s."""
    _pin_one_core()
    import pyarrow as pa
    import pyarrow.csv as pacsv

    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    if mode == "ours":
        from ehr_pipeline.reader import TableReader

        started = time.perf_counter()
        reader = TableReader(path, "CHARTEVENTS", block_size_bytes=block_size)
        rows = sum(b.num_rows for b in reader)
        elapsed = time.perf_counter() - started
        if reader.stats.rows_dead:
            raise SystemExit(f"unexpected dead letters {reader.stats.dead_lettered}")
    elif mode == "bare":
        started = time.perf_counter()
        stream = pacsv.open_csv(path, read_options=pacsv.ReadOptions(block_size=block_size))
        rows = sum(b.num_rows for b in stream)
        elapsed = time.perf_counter() - started
    else:
        raise SystemExit(f"unknown mode {mode}")
    return {"rows": rows, "seconds": elapsed, "rows_per_s": rows / elapsed, "peak_rss_mb": peak_rss_mb()}


# ------------------------------------------------------------------ parent side


def measure(mode: str, path: pathlib.Path, block_size: int) -> dict:
    run = run_child([sys.executable, str(pathlib.Path(__file__).resolve()), "_child", mode, str(path),
                     str(block_size)], cwd=str(ROOT))
    if run.returncode != 0:
        raise SystemExit(f"{mode} read of {path} failed:\n{run.stderr[-3000:]}")
    result = json.loads(run.stdout.strip().splitlines()[-1])
    result["peak_rss_polled_mb"] = run.peak_rss_mb  # cross-check of the child's own report
    return result


def render(results: list[dict], command: str, block_size: int, gen_seconds: dict, repeat: int) -> tuple[str, bool]:
    """Markdown section and whether both targets were met."""
    lines = [
        "## CSV reader (`bench/data_jobs/csv_reader.py`)",
        "",
        f"Command: `{command}`  ",
        f"Input: CHARTEVENTS-shaped, demo dialect, gzip level 6; block size {block_size // 1024} KiB; "
        f"each read in a fresh process pinned to one core; median of {repeat} interleaved runs, highest peak.",
        "",
        "| rows | file (MB gz) | reader | seconds | rows/s | peak RSS (MiB) |",
        "|---:|---:|---|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['size']:,} | {r['file_mb']:.0f} | {r['mode']} | {r['seconds']:.2f} | "
            f"{r['rows_per_s']:,.0f} | {r['peak_rss_mb']:.0f} |")
    sizes = sorted({r["size"] for r in results})
    by = {(r["size"], r["mode"]): r for r in results}
    ok = True
    lines += ["", "| check | value | target | met |", "|---|---:|---:|---|"]
    for size in sizes:
        ratio = by[(size, "ours")]["rows_per_s"] / by[(size, "bare")]["rows_per_s"]
        met = ratio >= SPEED_TARGET
        ok &= met
        lines.append(f"| TableReader / bare pyarrow rows/s at {size:,} rows | {ratio:.0%} | >= {SPEED_TARGET:.0%} | "
                     f"{'yes' if met else 'NO'} |")
    if len(sizes) > 1:
        growth = by[(sizes[-1], "ours")]["peak_rss_mb"] / by[(sizes[0], "ours")]["peak_rss_mb"]
        met = growth <= MEMORY_TARGET
        ok &= met
        lines.append(f"| TableReader peak RSS {sizes[-1]:,} / {sizes[0]:,} rows | {growth:.2f}x | "
                     f"<= {MEMORY_TARGET}x | {'yes' if met else 'NO'} |")
    lines += ["", "Generating the inputs took " + ", ".join(f"{s:,} rows: {t:.0f} s" for s, t in gen_seconds.items())
              + " (not part of the measurement).", "", "Machine:", "", machine_info(), ""]
    return "\n".join(lines), ok


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns 0 when both targets are met, 1 otherwise."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_child":
        print(json.dumps(child(argv[1], argv[2], int(argv[3]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000], help="rows per file")
    parser.add_argument("--block-size", type=int, default=None, help="bytes per block (default: the reader's)")
    parser.add_argument("--repeat", type=int, default=3, help="reads per reader and size; the median time is kept")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args(argv)
    from ehr_pipeline.reader import DEFAULT_BLOCK_SIZE

    block_size = args.block_size or DEFAULT_BLOCK_SIZE
    command = "python bench/data_jobs/csv_reader.py " + shlex.join(argv) if argv else "python bench/data_jobs/csv_reader.py"
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="ehr-bench-reader-"))
    results, gen_seconds = [], {}
    try:
        for size in args.sizes:
            path = workdir / f"CHARTEVENTS_{size}.csv.gz"
            started = time.perf_counter()
            generate(path, size)
            gen_seconds[size] = time.perf_counter() - started
            runs: dict[str, list[dict]] = {"bare": [], "ours": []}
            for _ in range(args.repeat):  # interleaved, so load from other processes hits both alike
                for mode in runs:
                    r = measure(mode, path, block_size)
                    if r["rows"] != size:
                        raise SystemExit(f"{mode} read {r['rows']} rows of {size}")
                    runs[mode].append(r)
            for mode, rs in runs.items():
                seconds = statistics.median(r["seconds"] for r in rs)
                r = {"size": size, "mode": mode, "file_mb": path.stat().st_size / 1e6, "seconds": seconds,
                     "rows_per_s": size / seconds, "peak_rss_mb": max(r["peak_rss_mb"] for r in rs),
                     "peak_rss_polled_mb": max(r["peak_rss_polled_mb"] or 0 for r in rs)}
                results.append(r)
                print(f"{size:>11,} {mode:5} {r['seconds']:7.2f} s {r['rows_per_s']:>12,.0f} rows/s "
                      f"{r['peak_rss_mb']:7.0f} MiB (polled {r['peak_rss_polled_mb']:.0f})", flush=True)
            path.unlink()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    markdown, ok = render(results, command, block_size, gen_seconds, args.repeat)
    publish("reader", markdown, write=not args.no_write)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
