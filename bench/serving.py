"""Benchmark of the prediction service: latency and throughput over real HTTP, and the vectorised sample pass.

1. Starts ``ehr-serve`` (``python -m serving``) as a separate process on 127.0.0.1 and drives
   it from this process with asyncio + httpx at concurrency 1, 8 and 32 (bounded by a request
   count and a time limit per level). Reports p50/p95/p99 latency, throughput and the mean
   number of examples per forward pass (from /metrics), which shows micro-batching at work.
2. In-process, on the same export: one forward pass with S=25 samples against a loop of 25
   passes with S=1, and one call with 32 admissions against 32 calls with one each.

Writes the "serving" section of docs/benchmarks.md (bench/report.py). Without --model it
benchmarks a tiny UNTRAINED rank-1 export written by the real exporter (the serving
overheads are real, the model size is not); pass a trained export for real numbers.

    python bench/serving.py --model runs/demo/export
"""
from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the repo packages and bench/

import ehr_pipeline  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
import numpy as np  # noqa: E402

from bench import report  # noqa: E402

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


_SCRAPED = ("ehr_model_batch_size_count", "ehr_model_batch_size_sum",
            'ehr_http_request_duration_seconds_count{route="/v1/predict"}',
            'ehr_http_request_duration_seconds_sum{route="/v1/predict"}', "ehr_model_forward_seconds_sum")


def _scrape(text: str) -> dict[str, float]:
    """The series of _SCRAPED from a /metrics page (0 when absent)."""
    values = dict.fromkeys(_SCRAPED, 0.0)
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in values:
            values[name] = float(value)
    return values


async def load_level(base_url: str, bodies: list[dict], concurrency: int, max_requests: int, max_seconds: float,
                     num_samples: int) -> dict:
    """Drives the server with `concurrency` workers until max_requests or max_seconds; latencies in ms."""
    import httpx

    latencies: list[float] = []
    errors = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits,
                                 headers={"X-API-Key": API_KEY}) as client:
        before = _scrape((await client.get("/metrics")).text)
        issued = 0
        started = time.perf_counter()
        deadline = started + max_seconds

        async def worker() -> None:
            nonlocal issued, errors
            while issued < max_requests and time.perf_counter() < deadline:
                body = bodies[issued % len(bodies)]
                issued += 1
                t0 = time.perf_counter()
                r = await client.post("/v1/predict", json=body, params={"num_samples": num_samples})
                latencies.append((time.perf_counter() - t0) * 1000.0)
                errors += r.status_code != 200

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
        after = _scrape((await client.get("/metrics")).text)
    delta = {k: after[k] - before[k] for k in _SCRAPED}
    passes, examples, served, server_s, forward_s = (delta[k] for k in _SCRAPED)
    p50, p95, p99 = np.percentile(latencies, [50, 95, 99])
    return {"concurrency": concurrency, "requests": len(latencies), "errors": errors, "wall_s": wall,
            "throughput": len(latencies) / wall, "p50": p50, "p95": p95, "p99": p99,
            "server_mean": server_s / served * 1000.0 if served else float("nan"),
            "forward_share": forward_s / wall,
            "mean_batch": examples / passes if passes else float("nan")}


def _median_time(fn, repeats: int) -> float:
    """Median wall time of fn() in ms over `repeats` runs (after one untimed warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return statistics.median(times)


def vectorised_vs_loop(model_dir: pathlib.Path, body: dict, repeats: int) -> dict:
    """ms per call: one S=25 pass vs 25 S=1 passes; one 32-admission call vs 32 single calls."""
    from serving.encoding import encode
    from serving.predictor import Predictor
    from serving.schemas import PredictRequest

    predictor = Predictor.load(model_dir)
    example = encode(PredictRequest.model_validate(body), predictor.export).example
    return {
        "one_pass_25": _median_time(lambda: predictor.forward([example], 25, 1), repeats),
        "loop_25x1": _median_time(lambda: [predictor.forward([example], 1, s) for s in range(25)], repeats),
        "batch_32": _median_time(lambda: predictor.forward([example] * 32, 25, 1), repeats),
        "loop_32x1": _median_time(lambda: [predictor.forward([example], 25, 1) for _ in range(32)], max(repeats // 2, 1)),
    }


def to_markdown(model: dict, levels: list[dict], vec: dict, args: argparse.Namespace) -> str:
    """The benchmark's markdown section."""
    lines = [
        f"Model: `{model['name']}` {model['version']} (K={model['ensemble_size']}, manifest sha256 "
        f"`{model['checksum'][:12]}`){' - UNTRAINED test fixture: overheads are real, model size is not' if model['fixture'] else ''}.",
        f"Request: one admission with {args.events} events, num_samples={args.num_samples}; server "
        f"`--max-batch {args.max_batch} --max-wait-ms {args.max_wait_ms}`; client (asyncio + httpx) and server "
        f"share the machine. Each level: at most {args.requests} requests or {args.seconds:g} s.",
        "",
        "Latencies are end to end at the client; 'server mean' is the server's own time per request "
        "(from /metrics), so the difference is the client's share of the same cores. 'model busy' is the "
        "share of the wall time the model thread spent in forward passes: when it is low, throughput is "
        "bound by per-request Python work (JSON validation, bagging, the response), not by the model, and "
        "merging passes cannot help much; with a full-size model the pass dominates and micro-batching pays "
        "(see the in-process table).",
        "",
        "| concurrency | requests | errors | throughput (req/s) | p50 (ms) | p95 (ms) | p99 (ms) | server mean (ms) "
        "| examples per forward pass | model busy |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in levels:
        lines.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['throughput']:.1f} | "
                     f"{lv['p50']:.1f} | {lv['p95']:.1f} | {lv['p99']:.1f} | {lv['server_mean']:.1f} | "
                     f"{lv['mean_batch']:.1f} | {100 * lv['forward_share']:.0f} % |")
    lines += [
        "",
        "In-process forward passes (median ms per call):",
        "",
        "| work | vectorised | loop | speed-up |",
        "|---|---:|---:|---:|",
        f"| 25 samples of one admission | {vec['one_pass_25']:.1f} (one pass, S=25) | {vec['loop_25x1']:.1f} "
        f"(25 passes, S=1) | {vec['loop_25x1'] / vec['one_pass_25']:.1f}x |",
        f"| 32 admissions, S=25 | {vec['batch_32']:.1f} (one call) | {vec['loop_32x1']:.1f} (32 calls) | "
        f"{vec['loop_32x1'] / vec['batch_32']:.1f}x |",
        "",
        f"Run on {dt.date.today().isoformat()} with `python bench/serving.py{args.cmdline}` "
        f"(1-minute load average at start: {args.load_at_start:.1f}; other work on the same cores inflates "
        f"the HTTP numbers):",
        "",
        report.machine_info(),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """Flags of the serving benchmark; every default is shown by --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="export directory; default: a tiny untrained export (fixture)")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client concurrency levels")
    p.add_argument("--requests", type=int, default=300, help="most requests per concurrency level")
    p.add_argument("--seconds", type=float, default=20.0, help="most seconds per concurrency level")
    p.add_argument("--events", type=int, default=200, help="events per synthetic admission")
    p.add_argument("--num-samples", type=int, default=25, help="samples per ensemble member per request")
    p.add_argument("--max-batch", type=int, default=32, help="server --max-batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="server --max-wait-ms")
    p.add_argument("--repeats", type=int, default=10, help="repetitions of each in-process timing")
    p.add_argument("--no-write", action="store_true", help="print the markdown instead of writing docs/benchmarks.md")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.load_at_start = os.getloadavg()[0]
    args.cmdline = "".join(f" {a}" for a in (sys.argv[1:] if argv is None else argv) if a != "--no-write")
    from serving.predictor import read_export
    from serving.testing import ServerProcess, write_tiny_model_export

    with tempfile.TemporaryDirectory(prefix="ehr-bench-serving-") as tmp:
        model_dir = pathlib.Path(args.model) if args.model else write_tiny_model_export(pathlib.Path(tmp) / "export")
        export = read_export(model_dir)
        model = {"name": export.card.name, "version": export.card.version, "ensemble_size": export.ensemble_size,
                 "checksum": export.checksum, "fixture": "fixture" in export.card.method.lower()
                 or export.card.name.startswith("TEST-FIXTURE")}
        rng = np.random.default_rng(0)
        bodies = [make_request(rng, args.events, export.pipeline.trigger_offset_seconds) for _ in range(64)]
        server = ServerProcess(["--model", str(model_dir), "--max-batch", str(args.max_batch),
                                "--max-wait-ms", str(args.max_wait_ms), "--log-level", "warning"],
                               env={"EHR_API_KEYS": API_KEY}, log_path=pathlib.Path(tmp) / "server.log", cwd=ROOT,
                               startup_timeout_s=180)
        levels = []
        with server:
            asyncio.run(load_level(server.base_url, bodies, 4, 20, 10.0, args.num_samples))  # warm the paths
            for c in (int(x) for x in args.concurrency.split(",")):
                level = asyncio.run(load_level(server.base_url, bodies, c, args.requests, args.seconds,
                                               args.num_samples))
                print(f"concurrency {c}: {level['throughput']:.1f} req/s, p50 {level['p50']:.1f} ms, "
                      f"p99 {level['p99']:.1f} ms, {level['mean_batch']:.1f} examples/pass", flush=True)
                levels.append(level)
        vec = vectorised_vs_loop(model_dir, bodies[0], args.repeats)
        print(f"S=25 one pass {vec['one_pass_25']:.1f} ms vs 25x S=1 {vec['loop_25x1']:.1f} ms", flush=True)
    markdown = to_markdown(model, levels, vec, args)
    if args.no_write:
        print(markdown)
    else:
        print(f"wrote {report.write_section('serving', markdown)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
