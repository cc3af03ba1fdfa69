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

from ehr_pipeline.shift import SEVERITIES

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
        self.auth_failures = Counter(f"{ns}_auth_failures_total", "Requests refused by the API-key check, by reason "
                                     "(missing, invalid, limited: the client address is out of its failure budget).",
                                     ("reason",), registry=reg)
        self.queue_depth = Gauge(f"{ns}_batch_queue_depth", "Requests waiting for the model.", registry=reg)
        self.ready = Gauge(f"{ns}_ready", "1 when the model is loaded and warmed up.", registry=reg)
        # A labelled gauge, not prometheus_client's Info, which shows an unlabelled series before a model loads.
        self.model_info = Gauge(f"{ns}_model_info", "The loaded model (value always 1).",
                                ("name", "version", "checksum"), registry=reg)
        # Several versions side by side (serving.inference.model_versions): who answered, and the split.
        self.version_requests = Counter(f"{ns}_model_version_requests_total", "Prediction requests routed to each "
                                        "model version, by how the version was chosen (default, split, request).",
                                        ("name", "version", "selected_by"), registry=reg)
        self.version_share = Gauge(f"{ns}_model_version_share_percent", "Percent of admissions the traffic split "
                                   "sends to each loaded version (100 for the default without a split).",
                                   ("name", "version"), registry=reg)
        self.version_ready = Gauge(f"{ns}_model_version_ready", "1 when a version of the model repository is loaded "
                                   "and warmed up; 0 while warming up or when it did not load (the start-up log "
                                   "says why).", ("name", "version"), registry=reg)
        # The population monitor (serving.monitoring.monitor): the shift report of the recent admissions.
        self.shift_level = Gauge(f"{ns}_shift_level", "Shift of the recent admissions against the training "
                                 "population: 0 none, 1 moderate, 2 severe, -1 no reference to compare with, "
                                 "-2 the last report failed (ehr_monitor_errors_total).", registry=reg)
        self.monitor_errors = Counter(f"{ns}_monitor_errors_total", "Population monitor failures (logged with "
                                      "their traceback), by stage: record (an admission left out of the window), "
                                      "report (no report for that window) or estimate (no expected performance "
                                      "for it).", ("stage",), registry=reg)
        self.shift_findings = Gauge(f"{ns}_shift_findings", "Shift findings in the monitor window, by kind and "
                                    "severity.", ("kind", "severity"), registry=reg)
        self.shift_worst_psi = Gauge(f"{ns}_shift_worst_psi", "Largest population stability index of a compared "
                                     "distribution (codes' values, events per source, case mix).", registry=reg)
        self.shift_oov_share = Gauge(f"{ns}_shift_oov_share", "Share of the window's events whose code is out of "
                                     "the model's vocabulary, by source.", ("source",), registry=reg)
        self.shift_mi_above_p95 = Gauge(f"{ns}_shift_mi_above_p95_share", "Share of the window's admissions whose "
                                        "mutual information is above the validation 95th percentile (0.05 "
                                        "expected).", registry=reg)
        self.shift_values = Gauge(f"{ns}_shift_values_share", "Share of the window's values with a unit that were "
                                  "converted to the model's unit, or could not be and were not used.", ("outcome",),
                                  registry=reg)
        self.shift_window = Gauge(f"{ns}_shift_window_admissions", "Admissions in the monitor window.", registry=reg)
        self.shift_report_age = Gauge(f"{ns}_shift_report_age_seconds", "Age of the shift report the ehr_shift_* "
                                      "gauges and /v1/monitor show, seconds (made again at most every "
                                      "--monitor-refresh-s; NaN before the first).", registry=reg)
        self.window_expected = Gauge(f"{ns}_window_expected_performance", "Performance the model expects over "
                                     "the monitor window's admissions before their outcomes arrive (outcomes drawn "
                                     "from its sampled probabilities): the estimate and its 90% interval's lower and "
                                     "upper bound, by metric (auc_roc, auc_pr, brier, observed_expected).",
                                     ("metric", "bound"), registry=reg)

    def update_expected(self, estimate: dict) -> None:
        """Sets the window's expected-performance gauges from metrics_report.expected_performance's answer."""
        for metric, row in estimate["metrics"].items():
            for bound in ("estimate", "lower", "upper"):
                value = row[bound]
                self.window_expected.labels(metric=metric, bound=bound).set(float("nan") if value is None else value)

    def update_shift(self, report, admissions: int) -> None:
        """Sets the shift gauges from a report (ehr_pipeline.shift.ShiftReport) of `admissions` admissions."""
        self.shift_level.set(SEVERITIES.index(report.level))
        for kind, by_severity in report.counts().items():
            for severity, n in by_severity.items():
                self.shift_findings.labels(kind=kind, severity=severity).set(n)
        summary = report.summary
        self.shift_worst_psi.set(summary["worst_psi"])
        for source, shares in summary["oov_share"].items():
            self.shift_oov_share.labels(source=source).set(shares["current"])
        mi = summary.get("mi_share_above_p95")
        self.shift_mi_above_p95.set(float("nan") if mi is None else mi)
        self.shift_values.labels(outcome="converted").set(summary["converted_share"])
        self.shift_values.labels(outcome="not_convertible").set(summary["not_convertible_share"])
        self.shift_window.set(admissions)

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """(body, content type) of every metric, in the format the Accept header asks for.

        Prometheus' text format by default; OpenMetrics when the scraper asks for it.
        """
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type
