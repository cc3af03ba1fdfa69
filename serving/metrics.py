"""The service's Prometheus metrics, on ``prometheus_client`` with one registry per app.

Each app owns one :class:`ServiceMetrics` and its own ``CollectorRegistry`` (never the
process-global default registry), so apps in one process, e.g. in tests, never see each
other's numbers. Labels carry route templates, status codes and reasons only: never
anything from a request body. The exposition writes labels in name order
(``{method=...,route=...,status=...}``), whatever order they are declared in.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import choose_encoder

# Seconds: a cached forward pass is ~ms on a CPU, a cold 100-sample batch can take seconds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Examples per forward pass: powers of two up to the largest --max-batch we allow.
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ServiceMetrics:
    """The metrics of one app: HTTP traffic, model forward passes, and what requests contained."""

    def __init__(self, namespace: str = "ehr"):
        self.registry = CollectorRegistry()
        ns, reg = namespace, self.registry
        self.requests = Counter(f"{ns}_http_requests_total", "HTTP requests by route template, method and status.",
                                ("route", "method", "status"), registry=reg)
        self.latency = Histogram(f"{ns}_http_request_duration_seconds", "HTTP request latency in seconds.",
                                 ("route",), buckets=LATENCY_BUCKETS, registry=reg)
        self.errors = Counter(f"{ns}_http_errors_total",
                              "Failed HTTP requests by route and class (client = 4xx, server = 5xx).",
                              ("route", "kind"), registry=reg)
        self.batch_size = Histogram(f"{ns}_model_batch_size", "Examples per model forward pass.",
                                    buckets=BATCH_SIZE_BUCKETS, registry=reg)
        self.forward_latency = Histogram(f"{ns}_model_forward_seconds", "Model forward pass time in seconds.",
                                         buckets=LATENCY_BUCKETS, registry=reg)
        self.model_errors = Counter(f"{ns}_model_errors_total", "Forward passes that raised.", registry=reg)
        self.predictions = Counter(f"{ns}_predictions_total", "Patients predicted.", registry=reg)
        self.referrals = Counter(f"{ns}_referrals_total", "Patients flagged for referral.", registry=reg)
        self.events_ignored = Counter(f"{ns}_events_ignored_total", "Request events not used, by reason.",
                                      ("reason",), registry=reg)
        self.oov_codes = Counter(f"{ns}_oov_codes_total", "Distinct out-of-vocabulary codes seen per patient, summed.",
                                 registry=reg)
        self.input_warnings = Counter(f"{ns}_input_warnings_total",
                                      "Predictions answered with a warning about their input, by kind.", ("kind",),
                                      registry=reg)
        self.queue_depth = Gauge(f"{ns}_batch_queue_depth", "Requests waiting for the model.", registry=reg)
        self.ready = Gauge(f"{ns}_ready", "1 when the model is loaded and warmed up.", registry=reg)
        # A labelled gauge, not prometheus_client's Info, which shows an unlabelled series before a model loads.
        self.model_info = Gauge(f"{ns}_model_info", "The loaded model (value always 1).",
                                ("name", "version", "checksum"), registry=reg)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) of every metric, in the format the Accept header asks for.

        Prometheus' text format by default; OpenMetrics when the scraper asks for it.
        """
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type
