"""The markdown section of bench/service/service_latency.py: what was served, the issue's targets checked on
ratios of one run, the in-process timings of the model's parts and the HTTP load levels.
"""
from __future__ import annotations

import argparse
import datetime as dt

from bench import harness


def units_of(t: dict) -> int:
    """Hidden size recorded with the timings."""
    return int(t["units"])


def to_markdown(model: dict, levels: list[dict], t: dict, args: argparse.Namespace) -> str:
    """The benchmark's markdown section, with the issue's targets checked on ratios of this run."""
    lines = ["## Service latency (`bench/service/service_latency.py`)", "", *_targets(model, levels, t, args), *_threads_table(t, args), *_model_work_table(model, t, args),
             *_http_table(levels)]
    lines += [
        "",
        f"Run on {dt.date.today().isoformat()} with `{args.cmdline}` "
        f"(1-minute load average at start: {args.load_at_start:.1f}; other work on the same cores inflates "
        f"every number, which is why the targets are checked as ratios within one run):",
        "",
        harness.machine_info(),
    ]
    return "\n".join(lines)


def _faster_floor(t: dict) -> str:
    """The precision whose recurrent-matmul floor is the faster here."""
    return "bfloat16" if t["floor_bfloat16"] < t["floor_float32"] else "float32"


def _targets(model: dict, levels: list[dict], t: dict, args: argparse.Namespace) -> list[str]:
    """What was served and how, then the issue's targets checked on ratios of this run."""
    per_patient_8 = 8000.0 / t["pass_8"]  # patients/s of an 8-patient pass: the batched model's own limit
    by_c = {lv["concurrency"]: lv for lv in levels}
    served = args.served_precision
    faster_floor = _faster_floor(t)
    checks = [(f"model pass ({served}) >= 2.5x faster than edward2's LSTMCellRank1",
               t["ed2_cell"] / t["pass_1"], 2.5, ">="),
              (f"model pass ({served}) <= 2x the recurrent-matmul floor (the faster one here: {faster_floor})",
               t["pass_1"] / t["floor"], 2.0, "<=")]
    if 1 in by_c:
        checks.append(("request p50 (concurrency 1) <= 1.3x the model pass", by_c[1]["p50"] / t["pass_1"], 1.3, "<="))
    if 32 in by_c:
        checks.append(("concurrency-32 throughput >= 90 % of the 8-patient pass's patients/s",
                       by_c[32]["throughput"] / per_patient_8, 0.9, ">="))
        checks.append(("no errors at any level", float(sum(lv["errors"] for lv in levels)), 0.0, "<="))
    lines = [
        f"Model: `{model['name']}` {model['version']} (K={model['ensemble_size']}, manifest sha256 "
        f"`{model['checksum'][:12]}`){model['note']}.",
        f"Request: one admission with {args.events} events over {t['bags'][0]} bags (bags of the 8 timed patients: "
        f"{min(t['bags'])}-{max(t['bags'])}), num_samples={args.num_samples}; server `--max-batch {args.max_batch} "
        f"--max-wait-ms {args.max_wait_ms}`; client (asyncio + httpx) and server share the machine. Each level: at "
        f"most {args.requests} requests or {args.seconds:g} s. In-process timings run after the server stopped.",
        f"Server `--precision {args.precision}` served {served}: {args.precision_reason}.",
        "",
        "Targets (ratios measured in this run):",
        "",
        "| target | measured | met |",
        "|---|---:|:---:|",
    ]
    for name, value, bound, op in checks:
        met = value >= bound if op == ">=" else value <= bound
        lines.append(f"| {name} | {value:.2f} | {'yes' if met else '**no**'} |")
    return lines


def _threads_table(t: dict, args: argparse.Namespace) -> list[str]:
    """The model pass and the floor per TensorFlow inter-op thread setting."""
    lines = [
        "",
        f"TensorFlow inter-op threads, in process as in the server (`ehr-serve --inter-op-threads`): the model "
        f"pass and the floor below, each setting in its own process on the same export "
        f"({args.repeats} repeats, median):",
        "",
        "| inter-op threads | model pass (ms) | recurrent-matmul floor, the faster precision (ms) | pass / floor |",
        "|---|---:|---:|---:|",
    ]
    for threads, row in sorted(t["by_threads"].items()):
        label = f"{threads}" + (" (TensorFlow's default: one per core)" if threads == 0 else "")
        label += " - this run" if threads == args.inter_op_threads else ""
        lines.append(f"| {label} | {row['pass_1']:.1f} | {row['floor']:.1f} | {row['pass_1'] / row['floor']:.2f} |")
    return lines


def _model_work_table(model: dict, t: dict, args: argparse.Namespace) -> list[str]:
    """The in-process timings of the model's parts against edward2's cell, and the FLOP rates (ms, GFLOP/s)."""
    served = args.served_precision
    faster_floor = _faster_floor(t)
    per_patient_8 = 8000.0 / t["pass_8"]  # patients/s of an 8-patient pass: the batched model's own limit
    return [
        "",
        "| model work (in process, median ms) | ms | note |",
        "|---|---:|---|",
        f"| model pass, 1 patient, S={args.num_samples}, served precision {served} | {t['pass_1']:.1f} | "
        f"{args.num_samples * model['ensemble_size']} sequences in one vectorised pass; "
        f"{t['ed2_cell'] / t['pass_1']:.2f}x edward2's cell |",
        f"| model pass, 1 patient, float32 / bfloat16 (interleaved) | {t['pass_1_float32']:.1f} / "
        f"{t['pass_1_bfloat16']:.1f} | {t['ed2_cell'] / t['pass_1_float32']:.2f}x / "
        f"{t['ed2_cell'] / t['pass_1_bfloat16']:.2f}x edward2's cell; bfloat16 vs float32, same seed, 8 patients: "
        f"max |probability diff| {t['precision_max_diff']:.1e} |",
        f"| our Rank1LSTM alone, float32 / bfloat16 | {t['lstm_float32']:.1f} / {t['lstm_bfloat16']:.1f} | "
        f"LSTM only (noise included), {t['ed2_cell'] / t['lstm_float32']:.2f}x / "
        f"{t['ed2_cell'] / t['lstm_bfloat16']:.2f}x edward2's cell |",
        f"| the {t['bags'][0]} recurrent matmuls alone, float32 / bfloat16 (interleaved) | {t['floor_float32']:.1f} / "
        f"{t['floor_bfloat16']:.1f} | [{t['ed2_rows']}, {units_of(t)}] x [{units_of(t)}, {4 * units_of(t)}] per "
        f"step; the faster ({faster_floor}) is the floor for any exact LSTM here, "
        f"{t['ed2_cell'] / t['floor']:.2f}x edward2's cell |",
        f"| model pass, 8 patients, S={args.num_samples} | {t['pass_8']:.1f} | {per_patient_8:.2f} patients/s "
        f"(the batched model's own limit) |",
        f"| 8 single-patient passes | {t['loop_8x1']:.1f} | batching speed-up {t['loop_8x1'] / t['pass_8']:.2f}x |",
        f"| S=25 in one pass | {t['one_pass_25']:.1f} | vs 25 passes with S=1: {t['loop_25x1']:.1f} ms "
        f"({t['loop_25x1'] / t['one_pass_25']:.1f}x) |",
        f"| edward2 LSTMCellRank1 in a plain tf.function ({t['ed2_rows']} rows x {t['bags'][0]} steps, "
        f"same size) | {t['ed2_cell']:.1f} | LSTM only, no embedding/head |",
        "",
        f"FLOPs per request (LSTM + head matmuls, 1 patient): {t['flops'] / 1e9:.2f} GFLOP; measured matmul "
        f"{t['matmul_shape']}: {t['matmul_gflops']:.1f} GFLOP/s, so the 1-patient pass runs at "
        f"{t['flops'] / t['pass_1'] / 1e6:.1f} GFLOP/s ({100 * t['flops'] / t['pass_1'] / 1e6 / t['matmul_gflops']:.0f} % "
        f"of that) and the 8-patient pass at {8 * t['flops'] / t['pass_8'] / 1e6:.1f} GFLOP/s. "
        f"Patient 0 alone vs among 8 (same seed): max |diff| {t['batch_max_diff']:.1e}.",
    ]


def _http_table(levels: list[dict]) -> list[str]:
    """End-to-end latency and throughput per concurrency level."""
    lines = [
        "",
        "End to end over HTTP ('server mean' is the server's own time per request from /metrics; 'model busy' "
        "the share of wall time in forward passes):",
        "",
        "| concurrency | requests | errors | throughput (req/s) | p50 (ms) | p95 (ms) | p99 (ms) | server mean (ms) "
        "| examples per forward pass | model busy |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for lv in levels:
        lines.append(f"| {lv['concurrency']} | {lv['requests']} | {lv['errors']} | {lv['throughput']:.2f} | "
                     f"{lv['p50']:.1f} | {lv['p95']:.1f} | {lv['p99']:.1f} | {lv['server_mean']:.1f} | "
                     f"{lv['mean_batch']:.1f} | {100 * lv['forward_share']:.0f} % |")
    return lines
