"""Prometheus metrics rendered in the text exposition format (version 0.0.4), without prometheus_client.

The pinned stack has no prometheus_client, and the format is small: counters, gauges and
cumulative histograms with ``_bucket{le=...}``, ``_sum`` and ``_count`` series. Each app owns
one :class:`ServiceMetrics` (no process-global registry), so apps in one process, e.g. in
tests, never see each other's numbers. Labels carry route templates, status codes and
reasons only: never anything from a request body.
"""
from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Sequence

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# Seconds: a cached forward pass is ~ms on a CPU, a cold 100-sample batch can take seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Examples per forward pass: powers of two up to the largest --max-batch we allow.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value as Prometheus writes it: integers without '.0', infinities as +Inf/-Inf."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    if float(value).is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(float(value))


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape_label(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class _Metric:
    kind = ""

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()):
        self.name = name
        self.help = help_text
        self.labelnames = tuple(labelnames)
        self._lock = threading.Lock()  # observed from the event loop and the model's thread

    def _key(self, labels: dict[str, str]) -> tuple[str, ...]:
        if set(labels) != set(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, got {sorted(labels)}")
        return tuple(str(labels[n]) for n in self.labelnames)

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {_escape_help(self.help)}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Metric):
    """A monotonically increasing count per label set."""

    kind = "counter"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        """Adds `amount` (>= 0) to the series of `labels`."""
        if amount < 0:
            raise ValueError("a counter only goes up")
        key = self._key(labels)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def value(self, **labels: str) -> float:
        """Current value of one series (0 if never incremented)."""
        with self._lock:
            return self._values.get(self._key(labels), 0.0)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        lines = self.header()
        if not items and not self.labelnames:
            items = [((), 0.0)]  # an unlabelled counter exists from the start
        lines += [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]
        return lines


class Gauge(_Metric):
    """A value that goes up and down, per label set."""

    kind = "gauge"

    def __init__(self, name: str, help_text: str, labelnames: Sequence[str] = ()):
        super().__init__(name, help_text, labelnames)
        self._values: dict[tuple[str, ...], float] = {}

    def set(self, value: float, **labels: str) -> None:
        """Sets the series of `labels` to `value`."""
        key = self._key(labels)
        with self._lock:
            self._values[key] = float(value)

    def render(self) -> list[str]:
        with self._lock:
            items = sorted(self._values.items())
        return self.header() + [f"{self.name}{_labels(self.labelnames, k)} {_number(v)}" for k, v in items]


class Histogram(_Metric):
    """Cumulative histogram per label set: bucket counts for each upper bound, sum and count."""

    kind = "histogram"

    def __init__(self, name: str, help_text: str, buckets: Sequence[float], labelnames: Sequence[str] = ()):
        super().__init__(name, help_text, labelnames)
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError("histogram buckets must be distinct and increasing")
        self.buckets = tuple(float(b) for b in buckets)
        # Per series: [count per finite bucket (non-cumulative) + overflow, sum]
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, value: float, **labels: str) -> None:
        """Records one observation of `value` in the series of `labels`."""
        key = self._key(labels)
        index = bisect.bisect_left(self.buckets, value)  # first bound >= value: le is inclusive
        with self._lock:
            counts, total = self._series.setdefault(key, ([0] * (len(self.buckets) + 1), [0.0]))
            counts[index] += 1
            total[0] += value

    def snapshot(self, **labels: str) -> dict[str, float]:
        """{'count': n, 'sum': s, 'le=<bound>': cumulative count, ...} of one series."""
        with self._lock:
            counts, total = self._series.get(self._key(labels), ([0] * (len(self.buckets) + 1), [0.0]))
            counts = list(counts)
            total_value = total[0]
        out: dict[str, float] = {"count": sum(counts), "sum": total_value}
        running = 0
        for bound, c in zip(self.buckets, counts):
            running += c
            out[f"le={_number(bound)}"] = running
        return out

    def render(self) -> list[str]:
        with self._lock:
            items = sorted((k, (list(c), t[0])) for k, (c, t) in self._series.items())
        lines = self.header()
        for key, (counts, total) in items:
            running = 0
            for bound, c in zip(self.buckets + (math.inf,), counts):
                running += c
                le = f'le="{_number(bound)}"'
                lines.append(f"{self.name}_bucket{_labels(self.labelnames, key, le)} {running}")
            lines.append(f"{self.name}_sum{_labels(self.labelnames, key)} {_number(total)}")
            lines.append(f"{self.name}_count{_labels(self.labelnames, key)} {running}")
        return lines


class ServiceMetrics:
    """The metrics of one app: HTTP traffic, model forward passes, and what requests contained."""

    def __init__(self, namespace: str = "ehr"):
        ns = namespace
        self.requests = Counter(f"{ns}_http_requests_total", "HTTP requests by route template, method and status.",
                                ("route", "method", "status"))
        self.latency = Histogram(f"{ns}_http_request_duration_seconds", "HTTP request latency in seconds.",
                                 LATENCY_BUCKETS, ("route",))
        self.errors = Counter(f"{ns}_http_errors_total",
                              "Failed HTTP requests by route and class (client = 4xx, server = 5xx).",
                              ("route", "kind"))
        self.batch_size = Histogram(f"{ns}_model_batch_size", "Examples per model forward pass.",
                                    BATCH_SIZE_BUCKETS)
        self.forward_latency = Histogram(f"{ns}_model_forward_seconds", "Model forward pass time in seconds.",
                                         LATENCY_BUCKETS)
        self.model_errors = Counter(f"{ns}_model_errors_total", "Forward passes that raised.")
        self.predictions = Counter(f"{ns}_predictions_total", "Patients predicted.")
        self.referrals = Counter(f"{ns}_referrals_total", "Patients flagged for referral.")
        self.events_ignored = Counter(f"{ns}_events_ignored_total", "Request events not used, by reason.",
                                      ("reason",))
        self.oov_codes = Counter(f"{ns}_oov_codes_total", "Distinct out-of-vocabulary codes seen per patient, summed.")
        self.input_warnings = Counter(f"{ns}_input_warnings_total",
                                      "Predictions answered with a warning about their input, by kind.", ("kind",))
        self.queue_depth = Gauge(f"{ns}_batch_queue_depth", "Requests waiting for the model.")
        self.ready = Gauge(f"{ns}_ready", "1 when the model is loaded and warmed up.")
        self.model_info = Gauge(f"{ns}_model_info", "The loaded model (value always 1).",
                                ("name", "version", "checksum"))
        self.ready.set(0)
        self._all: list[_Metric] = [
            self.requests, self.latency, self.errors, self.batch_size, self.forward_latency,
            self.model_errors, self.predictions, self.referrals, self.events_ignored, self.oov_codes,
            self.input_warnings,
            self.queue_depth, self.ready, self.model_info,
        ]

    def render(self) -> str:
        """Every metric in the Prometheus text format, ending with a newline."""
        lines: list[str] = []
        for metric in self._all:
            lines += metric.render()
        return "\n".join(lines) + "\n"
