"""Two versions of the model behind a 90/10 traffic split: the share each gets over distinct admissions, and
whether an admission sent twice (the second time by another protocol) reaches the same version.

Starts ``python -m serving`` (the ehr-serve CLI) on 127.0.0.1 with a model repository of three versions: two
copies of one export (the tiny untrained test fixture unless --model) and a third whose ``metrics.json`` no
longer matches its manifest, which the server must skip while the two others serve. --admissions distinct
synthetic admissions (bench/harness.py's ``make_request``, patient i aged 20 + 70 i / N years, so no two share a
routing key) go to /v1/predict with the first half of their events, then again, with all of them, as an OIP
``admission_json`` tensor to /v2/models/NAME/infer; every answer names its version. The share is read from the
answers and cross-checked with /metrics' ``ehr_model_version_requests_total``.

Writes the "version_split" section of docs/benchmarks.md (bench/harness.py).

    python bench/service/version_split.py --admissions 2000
    python bench/service/version_split.py --admissions 200 --no-write
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import re
import shutil
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
NAME = "mortality"
SPLIT = {"1": 90, "2": 10}


def admissions(n: int, events: int, trigger_offset_s: int) -> list[dict]:
    """n synthetic admissions with distinct routing keys (ages 20 + 70 i / n years)."""
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        body = make_request(rng, events, trigger_offset_s)
        body["patient"]["age_years"] = 20.0 + 70.0 * i / n
        out.append(body)
    return out


def oip_body(body: dict, num_samples: int) -> dict:
    """The OIP v2 infer request carrying one /v1/predict body as a JSON tensor."""
    return {"parameters": {"num_samples": num_samples},
            "inputs": [{"name": "admission_json", "shape": [1], "datatype": "BYTES", "data": [json.dumps(body)]}],
            "outputs": [{"name": "probability"}]}


async def send(base_url: str, calls: list[tuple[str, dict, dict]], concurrency: int) -> list[str | None]:
    """Each (path, query, json) call's answering version, in call order (None for a failed call)."""
    versions: list[str | None] = [None] * len(calls)
    next_call = 0
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=60.0, limits=limits, headers=HEADERS) as client:

        async def worker() -> None:
            nonlocal next_call
            while next_call < len(calls):
                i = next_call
                next_call += 1
                path, params, body = calls[i]
                try:
                    r = await client.post(path, params=params, json=body)
                except httpx.HTTPError as err:  # one failed call of the count, not the end
                    print(f"{path}: {type(err).__name__}", flush=True)
                    continue
                if r.status_code == 200:
                    answer = r.json()
                    versions[i] = answer["model"]["version"] if "model" in answer else answer["model_version"]

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return versions


def metrics_counts(base_url: str) -> dict[tuple[str, str], float]:
    """(version, selected_by) -> ehr_model_version_requests_total, from /metrics."""
    text = httpx.get(f"{base_url}/metrics", headers=HEADERS, timeout=30.0).text
    pattern = r'^ehr_model_version_requests_total\{name="[^"]*",selected_by="([^"]*)",version="([^"]*)"\} (\S+)$'
    return {(m.group(2), m.group(1)): float(m.group(3)) for m in re.finditer(pattern, text, re.M)}


def to_markdown(result: dict, args: argparse.Namespace) -> str:
    """The section: the share against its bound, stickiness, the metrics' counts and the broken version's line."""
    n = args.admissions
    share = result["first"].count("2") / n
    ok_share = abs(share - 0.10) <= 0.02
    lines = [
        "## Two versions behind a 90/10 split (`bench/service/version_split.py`)", "",
        f"Model repository: `{NAME}/1` and `{NAME}/2`, two copies of `{result['model']}`{result['note']}, and "
        f"`{NAME}/3` with a tampered `metrics.json`; `--traffic-split 1=90,2=10`. {n} distinct admissions "
        f"({args.events} events each, num_samples={args.num_samples}, concurrency {args.concurrency}), each sent "
        "to /v1/predict with the first half of its events, then to OIP's /v2/models/NAME/infer with all of them.",
        "",
        "| target | measured | bound | met |",
        "| --- | --- | --- | --- |",
        f"| share of admissions answered by version 2 | {share:.4f} ({result['first'].count('2')} of {n}) | "
        f"0.10 +- 0.02 | {'yes' if ok_share else 'NO'} |",
        f"| admissions whose second answer came from another version | {result['moved']} | 0 | "
        f"{'yes' if result['moved'] == 0 else 'NO'} |",
        f"| failed calls | {result['failed']} | 0 | {'yes' if result['failed'] == 0 else 'NO'} |",
        "",
        "| version | answers (both sends) | /metrics requests, selected_by=split |",
        "| --- | --- | --- |",
        *[f"| {v} | {result['first'].count(v) + result['second'].count(v)} | "
          f"{result['metrics'].get((v, 'split'), 0):.0f} |" for v in SPLIT],
        "",
        f"The broken version, as the server logged it: `{result['skipped']}`; /v2/models/{NAME}/versions/3/ready "
        f"answered {result['ready_3']}.",
        "",
        *harness.run_footer(args.cmdline, args.load_at_start, f"{result['wall_s']:.0f} s of requests; "),
    ]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The bench's flags."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None, help="export directory (default: the tiny untrained test fixture)")
    p.add_argument("--admissions", type=int, default=2000, help="distinct admissions, each sent twice")
    p.add_argument("--concurrency", type=int, default=16, help="client workers")
    p.add_argument("--events", type=int, default=20, help="events per synthetic admission")
    p.add_argument("--num-samples", type=int, default=2, help="samples per ensemble member per request")
    p.add_argument("--no-write", action="store_true", help="print the markdown instead of writing docs/benchmarks.md")
    return p


def serve_and_send(repository: pathlib.Path, bodies: list[dict], args: argparse.Namespace,
                   log_path: pathlib.Path) -> dict:
    """Starts the server on the repository and sends every admission twice; what the section reports."""
    from serving.tools.server_process import ServerProcess

    server = ServerProcess(["--model-repository", str(repository), "--traffic-split", "1=90,2=10",
                            "--precision", "float32", "--max-wait-ms", "1"],
                           env={"EHR_API_KEYS": API_KEY}, log_path=log_path, cwd=ROOT, startup_timeout_s=300)
    half = [{**b, "events": b["events"][:len(b["events"]) // 2]} for b in bodies]
    with server:
        started = time.perf_counter()
        first = asyncio.run(send(server.base_url, [("/v1/predict", {"num_samples": args.num_samples}, b)
                                                   for b in half], args.concurrency))
        second = asyncio.run(send(server.base_url, [(f"/v2/models/{NAME}/infer", {}, oip_body(b, args.num_samples))
                                                    for b in bodies], args.concurrency))
        wall = time.perf_counter() - started
        counts = metrics_counts(server.base_url)
        r = httpx.get(f"{server.base_url}/v2/models/{NAME}/versions/3/ready", headers=HEADERS)
        ready_3 = f"{r.status_code} `{r.text}`"
    skipped = [line for line in server.log().splitlines() if "skipped:" in line]
    return {"first": first, "second": second, "metrics": counts, "wall_s": wall,
            "failed": sum(v is None for v in first + second),
            "moved": sum(a != b for a, b in zip(first, second) if a is not None and b is not None),
            # The line from its message on, the temporary folder written as the repository's name.
            "skipped": skipped[0][skipped[0].index("model repository:"):].replace(str(repository), "models")
            if skipped else "(no line)", "ready_3": ready_3}


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.load_at_start = os.getloadavg()[0]
    args.cmdline = harness.command_line(__file__, argv, drop=("--no-write",))
    from model.export.load import read_export
    from serving.tools.tiny_export import write_tiny_model_export

    with tempfile.TemporaryDirectory(prefix="ehr-bench-versions-") as tmp:
        if args.model:
            model_dir, note = pathlib.Path(args.model), ""
        else:
            model_dir = write_tiny_model_export(pathlib.Path(tmp) / "export")
            note = " (the UNTRAINED tiny test fixture: the routing is real, the model is not)"
        export = read_export(model_dir)
        repository = pathlib.Path(tmp) / "models"
        for version in ("1", "2", "3"):
            shutil.copytree(model_dir, repository / NAME / version)
        with open(repository / NAME / "3" / "metrics.json", "a", encoding="utf-8") as f:
            f.write(" ")  # no longer what manifest.json's SHA-256 says
        bodies = admissions(args.admissions, args.events, export.pipeline.trigger_offset_seconds)
        result = serve_and_send(repository, bodies, args, pathlib.Path(tmp) / "server.log")
        result.update(model=f"{export.card.name} {export.card.version}", note=note)
    print(f"version 2: {result['first'].count('2')} of {args.admissions}; moved {result['moved']}; "
          f"failed {result['failed']}", flush=True)
    harness.publish("version_split", to_markdown(result, args), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
