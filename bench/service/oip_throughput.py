"""The Open Inference Protocol v2 against /v1/predict: throughput and p99 at one concurrency, same requests, one run.

Starts ``python -m serving`` (the ehr-serve CLI) on 127.0.0.1 with an export (the tiny untrained test
fixture unless --model) and drives it from this process (asyncio + httpx, --concurrency workers) with
the same synthetic admissions (bench/harness.py's ``make_request``): as /v1/predict
bodies, and as the same bodies inside an OIP ``admission_json`` tensor (JSON tensors). The two
protocols alternate for --rounds rounds of --requests requests each, so load from other work on the
machine falls on both alike; the targets are checked as ratios within the run. Then Triton's own
client (tritonclient[http], test requirements) sends --triton-requests valid requests at the same
concurrency and every error is counted.

Writes the "oip" section of docs/benchmarks.md (bench/harness.py).

    python bench/service/oip_throughput.py --rounds 3 --requests 400 --triton-requests 10000
    python bench/service/oip_throughput.py --rounds 1 --requests 128 --triton-requests 500 --no-write
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the repo packages and bench/

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before anything imports TensorFlow)
import httpx  # noqa: E402
import numpy as np  # noqa: E402

from bench import harness  # noqa: E402
from bench.harness import API_KEY, make_request  # noqa: E402

HEADERS = {"X-API-Key": API_KEY}


def oip_body(body: dict, num_samples: int) -> dict:
    """The OIP v2 infer request carrying one /v1/predict body as a JSON tensor."""
    return {"parameters": {"num_samples": num_samples},
            "inputs": [{"name": "admission_json", "shape": [1], "datatype": "BYTES", "data": [json.dumps(body)]}],
            "outputs": [{"name": "probability"}, {"name": "sampled_probabilities"}, {"name": "refer"}]}


async def drive(base_url: str, calls: list[tuple[str, dict, dict]], concurrency: int) -> dict:
    """Sends (path, query, json) calls with `concurrency` workers; throughput (req/s), latency percentiles (ms)."""
    latencies: list[float] = []
    errors, issued = 0, 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits, headers=HEADERS) as client:
        started = time.perf_counter()

        async def worker() -> None:
            nonlocal issued, errors
            while issued < len(calls):
                path, params, body = calls[issued]
                issued += 1
                t0 = time.perf_counter()
                try:
                    r = await client.post(path, params=params, json=body)
                    errors += r.status_code != 200
                except httpx.HTTPError as err:  # a dropped connection is one error of the count, not the end
                    errors += 1
                    print(f"{path}: {type(err).__name__}", flush=True)
                latencies.append((time.perf_counter() - t0) * 1000.0)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - started
    p50, p99 = np.percentile(latencies, [50, 99])
    return {"requests": len(latencies), "errors": errors, "wall_s": wall, "throughput": len(latencies) / wall,
            "p50": float(p50), "p99": float(p99)}


def triton_load(base_url: str, model: str, bodies: list[dict], n: int, concurrency: int, num_samples: int) -> dict:
    """tritonclient (one client per worker thread, JSON tensors) sending n valid requests; errors counted."""
    import tritonclient.http as triton  # why: a test requirement, not one of the service's

    host = base_url.removeprefix("http://")
    errors = 0
    started = time.perf_counter()

    def work(worker: int) -> int:
        failed = 0
        client = triton.InferenceServerClient(host, network_timeout=120.0, connection_timeout=120.0)
        try:
            for i in range(worker, n, concurrency):
                tensor = triton.InferInput("admission_json", [1], "BYTES")
                tensor.set_data_from_numpy(np.array([json.dumps(bodies[i % len(bodies)]).encode()], dtype=object),
                                           binary_data=False)
                try:
                    result = client.infer(model, [tensor], headers=dict(HEADERS),  # tritonclient writes into it
                                          outputs=[triton.InferRequestedOutput("probability", binary_data=False)],
                                          parameters={"num_samples": num_samples})
                    failed += not 0.0 <= float(result.as_numpy("probability")[0]) <= 1.0
                except Exception:  # noqa: BLE001  (every failure is one error of the count)
                    failed += 1
        finally:
            client.close()
        return failed

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        errors = sum(pool.map(work, range(concurrency)))
    wall = time.perf_counter() - started
    return {"requests": n, "errors": errors, "throughput": n / wall}


def to_markdown(model: dict, rounds: dict[str, list[dict]], tri: dict, args: argparse.Namespace) -> str:
    """The section: per-protocol totals over the alternating rounds, the targets as ratios, tritonclient's errors."""
    total = {}
    for name, runs in rounds.items():
        requests = sum(r["requests"] for r in runs)
        total[name] = {"requests": requests, "errors": sum(r["errors"] for r in runs),
                       "throughput": requests / sum(r["wall_s"] for r in runs),
                       "p50": float(np.median([r["p50"] for r in runs])), "p99": max(r["p99"] for r in runs)}
    v1, v2 = total["/v1/predict"], total["OIP v2 infer"]
    ratio, p99_ratio = v2["throughput"] / v1["throughput"], v2["p99"] / v1["p99"]
    lines = [
        "## OIP v2 against /v1/predict (`bench/service/oip_throughput.py`)", "",
        f"Model: `{model['name']}` {model['version']} (K={model['ensemble_size']}){model['note']}; one admission "
        f"of {args.events} events per request, num_samples={args.num_samples}, concurrency {args.concurrency}, "
        f"{args.rounds} alternating round(s) of {args.requests} requests per protocol; server `--max-batch "
        f"{args.max_batch} --max-wait-ms {args.max_wait_ms}`; client and server share the machine.",
        "",
        "| target | measured | bound | met |",
        "| --- | --- | --- | --- |",
        f"| OIP v2 throughput / /v1/predict's | {ratio:.3f} | >= 0.95 | {'yes' if ratio >= 0.95 else 'NO'} |",
        f"| OIP v2 p99 / /v1/predict's | {p99_ratio:.3f} | <= 1.1 | {'yes' if p99_ratio <= 1.1 else 'NO'} |",
        f"| tritonclient errors in {tri['requests']} requests | {tri['errors']} | 0 | "
        f"{'yes' if tri['errors'] == 0 else 'NO'} |",
        "",
        "| protocol | requests | errors | req/s | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
        *[f"| {name} | {t['requests']} | {t['errors']} | {t['throughput']:.1f} | {t['p50']:.1f} | {t['p99']:.1f} |"
          for name, t in total.items()],
        f"| tritonclient (JSON tensors, thread per worker) | {tri['requests']} | {tri['errors']} | "
        f"{tri['throughput']:.1f} | | |",
        "",
        "OIP v2 / /v1/predict throughput, round by round: " + ", ".join(
            f"{b['throughput'] / a['throughput']:.2f}" for a, b in zip(rounds["/v1/predict"], rounds["OIP v2 infer"]))
        + " (their spread is the machine's noise; the target row uses the totals).",
        "",
        *harness.run_footer(args.cmdline, args.load_at_start),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The bench's flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="export directory (default: the tiny untrained test fixture)")
    p.add_argument("--concurrency", type=int, default=32, help="client workers")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds per protocol")
    p.add_argument("--requests", type=int, default=400, help="requests per round and protocol")
    p.add_argument("--triton-requests", type=int, default=10000, help="requests tritonclient sends")
    p.add_argument("--events", type=int, default=200, help="events per synthetic admission")
    p.add_argument("--num-samples", type=int, default=25, help="samples per ensemble member per request")
    p.add_argument("--max-batch", type=int, default=8, help="server --max-batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="server --max-wait-ms")
    p.add_argument("--no-write", action="store_true", help="print the markdown instead of writing docs/benchmarks.md")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.load_at_start = os.getloadavg()[0]
    args.cmdline = harness.command_line(__file__, argv, drop=("--no-write",))
    from model.export.load import read_export
    from serving.tools.server_process import ServerProcess
    from serving.tools.tiny_export import write_tiny_model_export

    with tempfile.TemporaryDirectory(prefix="ehr-bench-oip-") as tmp:
        if args.model:
            model_dir, note = pathlib.Path(args.model), ""
        else:
            model_dir = write_tiny_model_export(pathlib.Path(tmp) / "export")
            note = " - UNTRAINED tiny test fixture: protocol overheads are real, model size is not"
        export = read_export(model_dir)
        model = {"name": export.card.name, "version": export.card.version, "ensemble_size": export.ensemble_size,
                 "note": note}
        rng = np.random.default_rng(0)
        bodies = [make_request(rng, args.events, export.pipeline.trigger_offset_seconds) for _ in range(64)]
        calls = {
            "/v1/predict": [("/v1/predict", {"num_samples": args.num_samples, "include_samples": True}, b)
                            for b in bodies],
            "OIP v2 infer": [(f"/v2/models/{export.card.name}/infer", {}, oip_body(b, args.num_samples))
                             for b in bodies],
        }
        server = ServerProcess(["--model", str(model_dir), "--max-batch", str(args.max_batch),
                                "--max-wait-ms", str(args.max_wait_ms), "--log-level", "warning"],
                               env={"EHR_API_KEYS": API_KEY}, log_path=pathlib.Path(tmp) / "server.log", cwd=ROOT,
                               startup_timeout_s=300)
        rounds: dict[str, list[dict]] = {name: [] for name in calls}
        with server:
            for name, c in calls.items():  # warm both paths
                asyncio.run(drive(server.base_url, c[:8], 4))
            for r in range(args.rounds):
                for name, c in calls.items():
                    run = asyncio.run(drive(server.base_url, [c[i % len(c)] for i in range(args.requests)],
                                            args.concurrency))
                    rounds[name].append(run)
                    print(f"round {r + 1} {name}: {run['throughput']:.1f} req/s, p99 {run['p99']:.1f} ms, "
                          f"{run['errors']} errors", flush=True)
            tri = triton_load(server.base_url, export.card.name, bodies, args.triton_requests, args.concurrency,
                              args.num_samples)
            print(f"tritonclient: {tri['requests']} requests, {tri['errors']} errors", flush=True)
    harness.publish("oip", to_markdown(model, rounds, tri, args), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
