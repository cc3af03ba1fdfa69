"""Benchmark of the prediction service: latency and throughput over real HTTP, and the vectorised sample pass.

1. Starts ``ehr-serve`` (``python -m serving``) as a separate process on 127.0.0.1 and drives
   it from this process with asyncio + httpx at concurrency 1, 8 and 32 (bounded by a request
   count and a time limit per level). Reports p50/p95/p99 latency, throughput and the mean
   number of examples per forward pass (from /metrics), which shows micro-batching at work.
2. In-process, on the same export: one forward pass with S=25 samples against a loop of 25
   passes with S=1, and one call with 32 admissions against 32 calls with one each.

Writes the "serving" section of docs/benchmarks.md (bench/harness.py; the markdown is
bench/service/latency_report.py). Without --model it benchmarks a tiny UNTRAINED rank-1 export
written by the real exporter (the serving overheads are real, the model size is not); pass
a trained export for real numbers.

    python bench/service/service_latency.py --model runs/demo/export
"""
from __future__ import annotations

import argparse
import asyncio
import os
import pathlib
import statistics
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the repo packages and bench/

import ehr_base  # noqa: E402,F401  (pins the Keras flavour before TensorFlow loads)
import numpy as np  # noqa: E402

from bench import harness  # noqa: E402
from bench.harness import API_KEY, make_request  # noqa: E402
from bench.service.latency_report import to_markdown  # noqa: E402

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


def _median_times(fns: dict, repeats: int) -> dict[str, float]:
    """Median wall time in ms of each fn over `repeats` interleaved rounds (after one untimed call of each)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) * 1000.0)
    return {name: statistics.median(t) for name, t in times.items()}


TABLE7_CONFIG = ROOT / "configs" / "ehr_rank1_normal.yaml"
BAGS = 30  # bags per patient: the pipeline's max_bags


def write_table7_export(directory: pathlib.Path, bags: int = BAGS) -> pathlib.Path:
    """An UNTRAINED export at the paper's Table-7 size (the rank1 config's model section).

    Written by the real exporter like serving.tools.tiny_export's export; only the size differs.
    Timing does not depend on the weights' values, so random initialisations are enough. The
    bag width is the trigger offset / `bags`, so an admission with events all over the
    window fills every bag.
    """
    import json
    import tempfile

    from ehr_pipeline.contract import PipelineConfig, spec, tf_parse
    from model.export import write as export_writer
    from model.export.predict import Predictor
    from model import data_folder
    from model.ehr import inputs
    from model.ehr.config import load_config
    from model.ehr.ehr_model import build_model
    from serving.tools.tiny_export import DEFAULT_VOCABULARY

    config = load_config(TABLE7_CONFIG).model
    base = PipelineConfig()
    pipeline = PipelineConfig.model_validate({**base.to_dict(), "bagging": {
        **base.bagging.model_dump(), "bagging_time_precision": base.trigger_offset_seconds // bags,
        "max_bags": bags}})
    with tempfile.TemporaryDirectory(prefix="ehr-table7-data-") as data:
        data_dir = pathlib.Path(data)
        (data_dir / "vocabulary.json").write_text(json.dumps(
            {"sources": {s: [spec.format_code(s, c) for c in codes] for s, codes in DEFAULT_VOCABULARY.items()}}))
        (data_dir / "numeric_stats.json").write_text(json.dumps({"codes": {}}))
        (data_dir / "manifest.json").write_text(json.dumps({"config": pipeline.to_dict()}))
        featurizer = inputs.Featurizer.from_data_files(data_folder.load_data_files(data_dir))
        model = build_model(config, featurizer.vocab_size)
        metrics_doc = {"test": {"ece": None, "nll": None, "auc_pr": None, "auc_roc": None},
                       "referral": {"measure": "predictive_entropy", "rate": 0.1, "threshold": 0.5},
                       "decision_threshold": 0.5}
        card = export_writer.model_card(
            name="BENCH-untrained-table7-rank1", method="rank1_normal (untrained, timing only)",
            ensemble_size=config.ensemble_size, data_sha256=data_folder.manifest_sha256(data_dir),
            metrics_doc=metrics_doc, config={"model": config.model_dump(mode="json")})
        return export_writer.write_export(directory, Predictor(featurizer, model), data_dir=str(data_dir),
                                          pipeline_config=pipeline.to_dict(), card=card, metrics_doc=metrics_doc)


def model_timings(model_dir: pathlib.Path, bodies: list[dict], num_samples: int, repeats: int,
                  precision: str) -> dict:
    """In-process, after the server has stopped: the model pass in both precisions (1 and 8 patients), 25 vs 25x1.

    precision: the one the server served (with --precision auto, what it chose); the other
    timings run through it.
    """
    from serving.inference.encoding import encode
    from serving.inference.served_model import ServedModel
    from serving.schemas import PredictRequest

    exact = ServedModel.load(model_dir, "float32")
    low = ServedModel.load(model_dir, "bfloat16")
    predictor = low if precision == "bfloat16" else exact
    examples = [encode(PredictRequest.model_validate(b), predictor.export).example for b in bodies[:8]]
    one = examples[0]
    # Interleaved rounds: a load change on the shared machine hits both precisions alike.
    both = _median_times({"float32": lambda: exact.forward([one], num_samples, 1),
                          "bfloat16": lambda: low.forward([one], num_samples, 1)}, repeats)
    out = {
        "pass_1": both[precision],
        "pass_1_float32": both["float32"],
        "pass_1_bfloat16": both["bfloat16"],
        # What bfloat16 moves a probability by, same seed, the 8 timed patients.
        "precision_max_diff": float(np.abs(low.forward(examples, num_samples, 3)
                                           - exact.forward(examples, num_samples, 3)).max()),
        "pass_8": _median_time(lambda: predictor.forward(examples, num_samples, 1), max(repeats // 2, 3)),
        "one_pass_25": _median_time(lambda: predictor.forward([one], 25, 1), repeats),
        "loop_25x1": _median_time(lambda: [predictor.forward([one], 1, s) for s in range(25)], max(repeats // 2, 3)),
        "loop_8x1": _median_time(lambda: [predictor.forward([e], num_samples, 1) for e in examples], 3),
    }
    # Batch independence at this size too: patient 0 alone == patient 0 among 8.
    alone = predictor.forward([one], num_samples, 5)
    among = predictor.forward(examples, num_samples, 5)[:1]
    out["batch_max_diff"] = float(np.abs(alone - among).max())
    import tensorflow as tf

    from ehr_pipeline.contract import spec, tf_parse

    offsets = tf_parse.parse_sequence_examples(tf.constant(examples))[spec.BAG_OFFSET]
    out["bags"] = [int(n) for n in offsets.row_lengths().numpy()]
    return out


def edward2_cell_pass(units: int, input_dim: int, k: int, rows: int, steps: int, repeats: int) -> float:
    """ms of edward2's LSTMCellRank1 unrolled over `steps` in a plain tf.function (rows = S*K sequences)."""
    import tensorflow as tf

    from model.layers import factory
    from model.ehr.config import load_config

    cell = factory.lstm_cell(units, load_config(TABLE7_CONFIG).model.posterior.model_copy(update={"ensemble_size": k}))
    x = tf.random.normal([steps, rows, input_dim])
    cell.build(tf.TensorShape([rows, input_dim]))

    @tf.function
    def run(x):
        h = c = tf.zeros([rows, units])
        cell._sample_weights(batch_size=rows)  # once per sequence, as edward2's RNN wrapper does
        for t in range(steps):  # unrolled at trace time: the plain way to drive a Keras cell
            _, (h, c) = cell(x[t], [h, c])
        return h

    return _median_time(lambda: run(x).numpy(), repeats)


def lstm_layer_pass(units: int, input_dim: int, k: int, rows: int, steps: int, repeats: int) -> dict:
    """ms of our Rank1LSTM alone (noise included) per matmul precision, and the bfloat16 matmul floor."""
    import tensorflow as tf

    from model.layers import factory
    from model.ehr.config import load_config

    layer = factory.lstm(units, load_config(TABLE7_CONFIG).model.posterior.model_copy(update={"ensemble_size": k}))
    x = tf.random.normal([rows, steps, input_dim])
    layer.build(x.shape)
    out = {}
    for dtype in ("float32", "bfloat16"):
        fn = tf.function(lambda x, dtype=dtype: layer(x, matmul_dtype=dtype))
        out[f"lstm_{dtype}"] = _median_time(lambda: fn(x).numpy(), repeats)
    out.update(matmul_floors(units, rows, steps, repeats))
    return out


def matmul_floors(units: int, rows: int, steps: int, repeats: int) -> dict[str, float]:
    """ms of the LSTM's `steps` recurrent matmuls alone, [rows, units] x [units, 4 units] each, per precision.

    Keys floor_float32, floor_bfloat16 and floor (the faster: the floor of the exact computation
    on this CPU, whichever precision the service would run it in).
    """
    import tensorflow as tf

    fns = {}
    for dtype in ("float32", "bfloat16"):
        kernel = tf.cast(tf.random.normal([units, 4 * units]), dtype)

        @tf.function
        def floor(h, kernel=kernel):
            for _ in range(steps):  # the recurrent matmuls only: every sample's state times U
                h = tf.matmul(h, kernel)[:, :units]
            return h

        h0 = tf.zeros([rows, units], dtype)
        fns[dtype] = lambda floor=floor, h0=h0: floor(h0).numpy()
    times = _median_times(fns, repeats)
    return {"floor_float32": times["float32"], "floor_bfloat16": times["bfloat16"], "floor": min(times.values())}


def flops_and_peak(units: int, input_dim: int, hidden: int, context: int, rows: int, steps: int,
                   repeats: int) -> dict:
    """FLOPs of one request's matmuls (LSTM + head) and the machine's measured matmul FLOP/s."""
    import tensorflow as tf

    lstm = steps * rows * 2 * (input_dim + units) * 4 * units
    head = rows * 2 * ((units + context) * hidden + hidden)
    a = tf.random.normal([rows * 8, input_dim + units])
    b = tf.random.normal([input_dim + units, 4 * units])

    @tf.function
    def mm(a, b):
        return tf.reduce_sum(tf.matmul(a, b))

    ms = _median_time(lambda: mm(a, b).numpy(), repeats)
    return {"flops": lstm + head, "matmul_gflops": 2 * rows * 8 * (input_dim + units) * 4 * units / ms / 1e6,
            "matmul_shape": f"[{rows * 8}, {input_dim + units}] x [{input_dim + units}, {4 * units}]"}


def _serve_default(name: str):
    """A default of ehr-serve's Settings (one source of truth for the server's flags)."""
    from serving.settings import Settings

    return Settings.model_fields[name].default


def pass_and_floor(model_dir: pathlib.Path, bodies: list[dict], args: argparse.Namespace) -> dict:
    """In-process ms of the 1-patient model pass (served precision) and the recurrent-matmul floors (same sizes)."""
    from serving.inference.encoding import encode
    from serving.inference.served_model import ServedModel
    from serving.schemas import PredictRequest

    predictor = ServedModel.load(model_dir, args.served_precision)
    one = encode(PredictRequest.model_validate(bodies[0]), predictor.export).example
    card_model = predictor.export.card_raw.get("config", {}).get("model", {})
    units = int(card_model.get("rnn_dim", 8))
    rows = args.num_samples * predictor.export.ensemble_size
    out = {"pass_1": _median_time(lambda: predictor.forward([one], args.num_samples, 1), args.repeats)}
    import tensorflow as tf

    from ehr_pipeline.contract import spec, tf_parse

    steps = int(tf_parse.parse_sequence_examples(tf.constant([one]))[spec.BAG_OFFSET].row_lengths()[0])
    out.update(matmul_floors(units, rows, steps, args.repeats))
    return out


def threads_comparison(model_dir: pathlib.Path, args: argparse.Namespace) -> dict[int, dict]:
    """pass_and_floor per --compare-inter-op-threads value, each in a fresh process (the count is fixed at start)."""
    import json
    import subprocess

    out = {}
    for threads in args.compare_inter_op_threads:
        if threads == args.inter_op_threads:
            continue
        with tempfile.TemporaryDirectory(prefix="ehr-bench-threads-") as tmp:
            path = pathlib.Path(tmp) / "timings.json"
            subprocess.run([sys.executable, __file__, "--model", str(model_dir), "--inter-op-threads", str(threads),
                            "--num-samples", str(args.num_samples), "--events", str(args.events),
                            "--precision", args.served_precision, "--repeats", str(args.repeats),
                            "--pass-and-floor-json", str(path)], check=True, cwd=ROOT)
            out[threads] = json.loads(path.read_text())
    return out


def build_parser() -> argparse.ArgumentParser:
    """Flags of the serving benchmark; every default is shown by --help."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=None,
                   help="export directory; default: an untrained Table-7-size export (timing only)")
    p.add_argument("--tiny", action="store_true", help="without --model: the tiny untrained test fixture instead")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client concurrency levels")
    p.add_argument("--requests", type=int, default=64, help="most requests per concurrency level")
    p.add_argument("--seconds", type=float, default=30.0, help="most seconds per concurrency level")
    p.add_argument("--events", type=int, default=200, help="events per synthetic admission")
    p.add_argument("--num-samples", type=int, default=25, help="samples per ensemble member per request")
    p.add_argument("--max-batch", type=int, default=8, help="server --max-batch")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="server --max-wait-ms")
    p.add_argument("--precision", default=_serve_default("precision"), choices=["auto", "float32", "bfloat16"],
                   help="server --precision (ehr-serve's default); the in-process timings use what the server "
                        "served, and time both precisions' passes and floors either way")
    p.add_argument("--repeats", type=int, default=5, help="repetitions of each in-process timing")
    p.add_argument("--inter-op-threads", type=int, default=_serve_default("inter_op_threads"),
                   help="TensorFlow inter-op threads of the server and of the in-process timings (ehr-serve's "
                        "default; 0 = TensorFlow's)")
    p.add_argument("--compare-inter-op-threads", type=int, nargs="*", default=[1],
                   help="also time the model pass and the floor with these inter-op thread counts (each in a "
                        "fresh process)")
    p.add_argument("--pass-and-floor-json", default=None, help=argparse.SUPPRESS)  # the child of the comparison
    p.add_argument("--no-write", action="store_true", help="print the markdown instead of writing docs/benchmarks.md")
    return p


def main(argv: list[str] | None = None) -> int:
    """Runs the benchmark; returns the exit code."""
    args = build_parser().parse_args(argv)
    args.load_at_start = os.getloadavg()[0]
    args.cmdline = harness.command_line(__file__, argv, drop=("--no-write",))
    from serving.cli import set_tf_threads

    set_tf_threads(args.inter_op_threads)  # before any TensorFlow op, as ehr-serve does
    from model.export.load import read_export
    from serving.tools.server_process import ServerProcess
    from serving.tools.tiny_export import write_tiny_model_export

    with tempfile.TemporaryDirectory(prefix="ehr-bench-serving-") as tmp:
        if args.model:
            model_dir, note = pathlib.Path(args.model), ""
        elif args.tiny:
            model_dir = write_tiny_model_export(pathlib.Path(tmp) / "export")
            note = " - UNTRAINED tiny test fixture: overheads are real, model size is not"
        else:
            model_dir = write_table7_export(pathlib.Path(tmp) / "export")
            note = (" - Table-7 size (rnn_dim 512, hidden 512, embedding_dim 32, K=4) with UNTRAINED weights: "
                    "timings are real, predictions mean nothing")
        export = read_export(model_dir)
        model = {"name": export.card.name, "version": export.card.version, "ensemble_size": export.ensemble_size,
                 "checksum": export.checksum, "note": note}
        rng = np.random.default_rng(0)
        bodies = [make_request(rng, args.events, export.pipeline.trigger_offset_seconds) for _ in range(64)]
        if args.pass_and_floor_json:
            import json

            args.served_precision = args.precision  # the parent passes the precision its server served

            pathlib.Path(args.pass_and_floor_json).write_text(json.dumps(pass_and_floor(model_dir, bodies, args)))
            return 0
        server = ServerProcess(["--model", str(model_dir), "--max-batch", str(args.max_batch),
                                "--max-wait-ms", str(args.max_wait_ms), "--precision", args.precision,
                                "--inter-op-threads", str(args.inter_op_threads),
                                "--log-level", "warning"],
                               env={"EHR_API_KEYS": API_KEY}, log_path=pathlib.Path(tmp) / "server.log", cwd=ROOT,
                               startup_timeout_s=300)
        levels = []
        with server:
            import httpx

            chosen = httpx.get(f"{server.base_url}/v1/model", headers={"X-API-Key": API_KEY},
                               timeout=60).json()["precision"]
            args.served_precision, args.precision_reason = chosen["served"], chosen["reason"]
            print(f"server precision: {chosen['served']} (--precision {chosen['requested']}): {chosen['reason']}",
                  flush=True)
            asyncio.run(load_level(server.base_url, bodies, 4, 8, 30.0, args.num_samples))  # warm the paths
            for c in (int(x) for x in args.concurrency.split(",")):
                level = asyncio.run(load_level(server.base_url, bodies, c, max(args.requests, 2 * c), args.seconds,
                                               args.num_samples))
                print(f"concurrency {c}: {level['throughput']:.2f} req/s, p50 {level['p50']:.1f} ms, "
                      f"p99 {level['p99']:.1f} ms, {level['mean_batch']:.1f} examples/pass, "
                      f"{level['errors']} errors", flush=True)
                levels.append(level)
        timings = model_timings(model_dir, bodies, args.num_samples, args.repeats, args.served_precision)
        print({k: v for k, v in timings.items() if k != "bags"}, flush=True)
        card_model = export.card_raw.get("config", {}).get("model", {})
        units = int(card_model.get("rnn_dim", 8))
        from model.ehr.config import ModelConfig
        from model.ehr.ehr_model import bag_vector_dim
        from model.ehr.inputs import CONTEXT_DIM

        input_dim = bag_vector_dim(ModelConfig.model_validate(card_model))
        rows = args.num_samples * export.ensemble_size
        steps = timings["bags"][0]
        timings["ed2_rows"] = rows
        timings["ed2_cell"] = edward2_cell_pass(units, input_dim, export.ensemble_size, rows, steps, args.repeats)
        timings["units"] = units
        timings.update(lstm_layer_pass(units, input_dim, export.ensemble_size, rows, steps, args.repeats))
        timings.update(flops_and_peak(units, input_dim, int(card_model.get("hidden_layer_dim", 8)), CONTEXT_DIM,
                                      rows, steps, args.repeats))
        timings["by_threads"] = {args.inter_op_threads: {k: timings[k] for k in ("pass_1", "floor")},
                                 **threads_comparison(model_dir, args)}
        print(f"model pass {timings['pass_1']:.1f} ms, edward2 cell {timings['ed2_cell']:.1f} ms", flush=True)
    markdown = to_markdown(model, levels, timings, args)
    harness.publish("serving", markdown, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
