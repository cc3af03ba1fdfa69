"""The service watches its population: the shift report over a rolling window of recent admissions.

A deployed model sees its new population one request at a time, and no single request shows
that creatinine now arrives in umol/L without a unit, or that a site's local codes fill a
third of the chart. The monitor keeps the last ``Settings.monitor_window`` admissions it
answered, each summarised by the very function that summarises the training data
(``ehr_pipeline.shift.population.admission_from_bags``, with the model's mutual information), plus
the units their values came in, and compares them with the export's reference
(``ehr_pipeline.shift.compare``): ``GET /v1/monitor`` answers the findings, and the gauges of
``serving.monitoring.telemetry`` carry the level and the main numbers for alerting.

Beside the report, the performance the model expects over the window before any outcome arrives
(``model.evaluation.statistics.metrics_report.expected_performance``: outcomes drawn from each admission's
sampled probabilities, so the interval carries the posterior's spread and the window's size; docs/shift.md
"Expected performance before outcomes"): /v1/monitor's ``performance_estimate`` and the
``ehr_window_expected_performance`` gauges. It holds under the estimate's assumptions (the model calibrated
for this population, no concept shift); the outcome monitor checks it when outcomes arrive.

The report is computed when asked for (a scrape or /v1/monitor), never on a request's path, and
at most once every ``refresh_s`` seconds (``Settings.monitor_refresh_s``): under load the window
changes with every prediction, and a report per scrape (~0.1 s for 500 admissions on a quiet
machine, seconds on a busy one) made scrapes queue behind each other (/metrics p50 2.2 s with 8
clients, docs/benchmarks.md "soak"). A reading older than that is replaced in the background
while callers get the last one at once; its age is the ``ehr_shift_report_age_seconds`` gauge
and /v1/monitor's ``age_s``. Only the first report, and every one with ``refresh_s`` 0, is made
while the caller waits.

The monitor summarises whatever requests send, so it must never take the service down: a report
that raises is logged with its traceback (once per window state), counted in
``ehr_monitor_errors_total{stage}``, shown as ``ehr_shift_level`` -2 and answered by /v1/monitor as
level "error" with one line saying why; /metrics renders every other metric as usual. An admission
that cannot be recorded is counted the same way and left out; its prediction is answered.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Mapping

import numpy as np

from ehr_base.cli_args import one_line
from ehr_pipeline import shift
from ehr_pipeline.contract import spec
from ehr_pipeline.encode import bagging
from ehr_pipeline.shift import Admission, Profile, admission_from_bags
from model.evaluation.statistics import metrics_report
from model.export.load import Export
from serving.monitoring import malloc
from serving.monitoring.telemetry import ServiceMetrics

logger = logging.getLogger(__name__)

# ehr_shift_level while the last report failed (-1: nothing to compare with; 0-2: the report's level).
LEVEL_ERROR = -2
# Sampled probabilities kept per admission for the window's expected performance: requests ask for
# different numbers of samples, and one matrix needs one width (a row with fewer repeats its own).
WINDOW_COLUMNS = 16
# One answered admission in the window: its summary, its unit rows ((code, unit as written) -> values) and its
# sampled probabilities (None: left out of the expected performance).
WindowItem = tuple[Admission, Mapping[tuple[str, str], int], np.ndarray | None]


@dataclasses.dataclass(frozen=True)
class MonitorReading:
    """What the monitor says now: the report of its window, or why there is none."""

    report: shift.ShiftReport | None  # None: no reference, or the report failed (error says why)
    admissions: int  # in the window
    error: str | None = None  # one line: the report could not be made (logged, counted)
    made_at: float | None = None  # time.monotonic() when it was made; None: never made (nothing to compare)
    # expected_performance over the window's sampled probabilities; None: no admission carried them, or it failed
    performance: dict | None = None

    def age_s(self) -> float | None:
        """Seconds since the reading was made; None when it never was."""
        return None if self.made_at is None else time.monotonic() - self.made_at


class Monitor:
    """A rolling window of admissions and their report against the export's reference (thread-safe)."""

    def __init__(self, export: Export, window: int, metrics: ServiceMetrics | None = None,
                 thresholds: shift.Thresholds | None = None, refresh_s: float = 0.0):
        self.export = export
        self.window = int(window)
        self.refresh_s = float(refresh_s)  # 0: a new report whenever the window changed
        self.metrics = metrics
        self.thresholds = thresholds or shift.Thresholds()
        self._items: collections.deque[WindowItem] = collections.deque(maxlen=max(self.window, 1))
        self._lock = threading.Lock()  # guards the window
        self._compute = threading.Lock()  # one report at a time; released by whoever made it
        self._version = 0
        self._reading: tuple[int, MonitorReading] = (-1, MonitorReading(None, 0))
        if metrics is not None:
            if not self.available:
                metrics.shift_level.set(-1)
            # Read at scrape time: the age of the report the gauges show (NaN before the first).
            metrics.shift_report_age.set_function(lambda: _or_nan(self._reading[1].age_s()))

    @property
    def available(self) -> bool:
        """Whether there is anything to compare with (the export carries a reference and the window is on)."""
        return self.export.reference is not None and self.window > 0

    def record(self, context: spec.AdmissionContext, bags: bagging.Bags, unit_rows: Mapping[tuple[str, str], int],
               mutual_information: float, probs=None) -> None:
        """Adds one answered admission to the window: summarised from the context and bags its record was written
        from, as the job's records are (``ehr_pipeline.shift.admission_from_bags``), with its unit rows ((code, unit as
        written) -> values), the model's mutual information and its sampled probabilities (for the window's expected
        performance; None leaves it out of that estimate)."""
        if not self.available:
            return
        try:
            admission = admission_from_bags(context.age_years, context.gender, context.admission_type, bags,
                                            float(mutual_information))
            columns = None if probs is None else np.resize(np.asarray(probs, dtype=np.float32).ravel(), WINDOW_COLUMNS)
            item = (admission, dict(unit_rows), columns)
        except Exception as err:  # noqa: BLE001  (never fail the prediction that is being answered)
            self._failed("record", err)
            return
        with self._lock:
            self._items.append(item)
            self._version += 1

    def report(self) -> MonitorReading:
        """The last report of the window, made again when the window changed and it is refresh_s old (module doc)."""
        if not self.available:
            return MonitorReading(None, 0)
        with self._lock:
            version = self._version
        version_made, reading = self._reading
        if version_made == version or (reading.made_at is not None and reading.age_s() < self.refresh_s):
            return reading
        first = version_made < 0 or self.refresh_s <= 0
        if not self._compute.acquire(blocking=first):
            return reading  # being made by another caller: the last one now, not a wait behind it
        if first:
            return self._make()
        threading.Thread(target=self._make, name="monitor-report", daemon=True).start()
        return reading

    def _make(self) -> MonitorReading:
        """Makes the report of the window now (the caller holds _compute; released here); updates the gauges."""
        try:
            with self._lock:
                version, items = self._version, list(self._items)
            if self._reading[0] == version:
                return self._reading[1]
            performance = self._expected(items)
            try:
                report = self._compare(items)
                if self.metrics is not None:
                    self.metrics.update_shift(report, len(items))
                reading = MonitorReading(report, len(items), made_at=time.monotonic(), performance=performance)
            except Exception as err:  # noqa: BLE001  (whatever the data does to the statistics: see the docstring)
                reading = MonitorReading(None, len(items), self._failed("report", err), made_at=time.monotonic(),
                                         performance=performance)
            self._reading = (version, reading)
            # A report allocates and frees tens of MiB on whichever thread makes it: hand the free
            # pages back (~ms, at most once per refresh_s) rather than keep them in that thread's arena.
            malloc.trim()
            return reading
        finally:
            self._compute.release()

    def _expected(self, items: list[WindowItem]) -> dict | None:
        """The performance expected over the window's admissions that carried their sampled probabilities (None
        when none did, or when it could not be made: logged and counted as stage "estimate"); sets its gauges."""
        columns = [c for _, _, c in items if c is not None]
        if not columns:
            return None
        try:
            probs = np.stack(columns).astype(np.float64)
            thresholds = metrics_report.decision_thresholds(self.export.metrics.decision_threshold)
            estimate = metrics_report.expected_performance(probs.mean(axis=1), probs, thresholds=thresholds)
        except Exception as err:  # noqa: BLE001  (never take the report or the service down with it)
            self._failed("estimate", err)
            return None
        if self.metrics is not None:
            self.metrics.update_expected(estimate)
        return estimate

    def _compare(self, items: list[WindowItem]) -> shift.ShiftReport:
        """The shift report of `items` against the export's reference."""
        units: dict[str, dict[str, int]] = {}
        for _, rows, _ in items:
            for (code, unit), n in rows.items():
                by_unit = units.setdefault(code, {})
                by_unit[unit] = by_unit.get(unit, 0) + n
        current = Profile.build([a for a, _, _ in items], vocabulary=self.export.vocabulary, bins_from=self.export.reference,
                                units=units, canonical=self.export.units,
                                description=f"the service's last {len(items)} admissions")
        harmoniser = self.export.harmoniser
        return shift.compare(self.export.reference, current, loinc=harmoniser.loinc, thresholds=self.thresholds,
                             converter=harmoniser.converter)

    def _failed(self, stage: str, err: BaseException) -> str:
        """Logs (with the traceback) and counts a monitor failure; returns it in one line."""
        line = one_line(f"the population monitor could not {stage} ({type(err).__name__}: {err}); "
                        "predictions are unaffected")
        logger.error("%s", line, exc_info=err)
        if self.metrics is not None:
            self.metrics.monitor_errors.labels(stage=stage).inc()
            if stage == "report":
                self.metrics.shift_level.set(LEVEL_ERROR)
        return line


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value
