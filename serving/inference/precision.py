"""`ehr-serve --precision auto`: time the export's two signatures on this machine and serve the faster.

Every export answers through float32 (exact: ehr-eval's numbers) and through bfloat16 matmul
operands (model.export.load). Which is faster depends on the machine, and CPU flags do not settle it:
bench/service/service_latency.py found bfloat16's model pass faster on a 2-core Xeon with AMX (34.0 against
66.9 ms) and on one CPU with AVX-512 bfloat16 and no AMX (62.7 against 89.2 ms), slower on
another of that kind (76 against 62 ms) and not faster on an AVX2-only one (docs/serving.md).
So the service measures at warm-up instead of guessing: it times both signatures on admissions of
the export's full history length, interleaved, and serves bfloat16 only when

  * its median pass takes at most ``SPEED_MARGIN`` of float32's (within that, timing noise on a
    shared machine decides, and float32 is exact), and
  * its answers for the same admissions and seed are within the export's tolerance
    (``model.export.load.BFLOAT16_MEAN_TOLERANCE`` on predictive means, ``..._SAMPLE_TOLERANCE`` on
    single samples).

Otherwise it serves float32. ``PrecisionChoice`` records what was measured and why; /v1/model and
the start-up log show it.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import statistics
import time
from collections.abc import Callable, Sequence

import numpy as np

from ehr_pipeline.contract import spec
from model.export.load import Export
from model.export_layout import BFLOAT16_MEAN_TOLERANCE, BFLOAT16_SAMPLE_TOLERANCE
from serving.schemas import AdmissionRequest, Patient, PredictRequest

AUTO = "auto"
SPEED_MARGIN = 0.9  # bfloat16 must take <= 90 % of float32's pass time to be served
TIMED_PASSES = 5  # per precision, after one untimed pass (bfloat16 compiles its step on it)
TIMING_ADMISSIONS = 4  # compared for the tolerance; the first one is timed alone

Forward = Callable[[Sequence[bytes], int, int], np.ndarray]


@dataclasses.dataclass(frozen=True)
class PrecisionChoice:
    """Which signature answers and why; the timings (ms) and differences when they were measured."""

    requested: str  # --precision: "auto", "float32" or "bfloat16"
    served: str  # "float32" or "bfloat16"
    reason: str
    float32_ms: float | None = None
    bfloat16_ms: float | None = None
    max_mean_diff: float | None = None  # largest |predictive mean difference| over the compared admissions
    max_sample_diff: float | None = None  # largest |difference| of one sampled probability

    def as_dict(self) -> dict:
        """JSON-ready fields (None where nothing was measured)."""
        return dataclasses.asdict(self)


def fixed(precision: str, reason: str | None = None) -> PrecisionChoice:
    """The choice when --precision names one signature (or auto could not measure: `reason`)."""
    if reason is None:
        return PrecisionChoice(requested=precision, served=precision, reason=f"--precision {precision}")
    return PrecisionChoice(requested=AUTO, served=precision, reason=reason)


def decide(float32_ms: float, bfloat16_ms: float, max_mean_diff: float, max_sample_diff: float,
           margin: float = SPEED_MARGIN) -> tuple[str, str]:
    """(served precision, reason) from measured pass times (ms) and bfloat16's largest differences."""
    speed = f"bfloat16 pass {bfloat16_ms:.1f} ms, float32 {float32_ms:.1f} ms"
    if max_mean_diff > BFLOAT16_MEAN_TOLERANCE or max_sample_diff > BFLOAT16_SAMPLE_TOLERANCE:
        return "float32", (f"bfloat16 moved the answers beyond the tolerance (predictive mean by "
                           f"{max_mean_diff:.1e} > {BFLOAT16_MEAN_TOLERANCE:g} or a sample by {max_sample_diff:.1e} > "
                           f"{BFLOAT16_SAMPLE_TOLERANCE:g}); {speed}")
    if bfloat16_ms <= margin * float32_ms:
        return "bfloat16", (f"{speed} on this machine ({float32_ms / bfloat16_ms:.2f}x faster); predictive means "
                            f"within {max_mean_diff:.1e} of float32's")
    return "float32", (f"{speed} on this machine: bfloat16 is not at least {1 / margin:.2f}x faster, and float32 "
                       "is exact")


def measure(float32: Forward, bfloat16: Forward, examples: Sequence[bytes], num_samples: int,
            passes: int = TIMED_PASSES) -> PrecisionChoice:
    """Times both forward functions on examples[0] (interleaved, median ms) and compares them on all examples."""
    seed = 0
    exact, low = float32(examples, num_samples, seed), bfloat16(examples, num_samples, seed)  # compiles too
    one = list(examples[:1])
    times: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for _ in range(passes):  # interleaved: a load change on a shared machine hits both alike
        for name, forward in (("float32", float32), ("bfloat16", bfloat16)):
            started = time.perf_counter()
            forward(one, num_samples, seed)
            times[name].append((time.perf_counter() - started) * 1000.0)
    f32, b16 = statistics.median(times["float32"]), statistics.median(times["bfloat16"])
    mean_diff = float(np.abs(low.mean(axis=1) - exact.mean(axis=1)).max())
    sample_diff = float(np.abs(low - exact).max())
    served, reason = decide(f32, b16, mean_diff, sample_diff)
    return PrecisionChoice(requested=AUTO, served=served, reason=reason, float32_ms=f32, bfloat16_ms=b16,
                           max_mean_diff=mean_diff, max_sample_diff=sample_diff)


def timing_requests(export: Export, count: int = TIMING_ADMISSIONS) -> list[PredictRequest]:
    """Admissions filling every bag of the export's history with known codes, values near their training means.

    Full histories because the two signatures' speeds differ per LSTM step; codes the model knows
    and values in range because the tolerance check is about this model's answers.
    """
    bagging = export.pipeline.bagging
    admit = dt.datetime(2150, 1, 1, 8, 0)
    trigger = admit + dt.timedelta(seconds=export.pipeline.trigger_offset_seconds)
    codes = sorted(export.vocabulary, key=lambda c: (export.vocabulary_rank.get(c, 0), c))[:16] or ["lab:timing"]
    requests = []
    for variant in range(count):
        events = []
        for bag in range(bagging.max_bags):
            at = trigger - dt.timedelta(seconds=(bag + 0.5) * bagging.bagging_time_precision)
            for i in range(4):
                source, _, code = codes[(bag * 4 + i + variant) % len(codes)].partition(":")
                event = {"time": at.isoformat(), "source": source, "code": code}
                mean_std = export.value_stats.get(spec.format_code(source, code))
                if mean_std is not None:
                    event["value"] = round(mean_std[0] + (variant - 1.5) * 0.5 * mean_std[1], 4)
                events.append(event)
        requests.append(PredictRequest(
            patient=Patient(gender="F" if variant % 2 else "M", age_years=45.0 + 10 * variant),
            admission=AdmissionRequest(admit_time=admit.isoformat(), admission_type="EMERGENCY"), events=events))
    return requests
