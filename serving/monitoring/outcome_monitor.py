"""Realized performance beside the performance the model expected, over the outcomes that arrived.

Each outcome is matched to the prediction it belongs to (``outcome_store``), so the realized
numbers are those of the predictions whose outcomes are known, and the estimate beside them is
``model.evaluation.statistics.metrics_report.expected_performance`` on the same predictions' sampled
probabilities: the comparison is paired, whatever the monitor's window holds now.

The reading is made again only when outcomes arrived since the last one and at most every
``refresh_s`` seconds (the shift monitor's rule): a scrape with no new outcome costs one count
query, so /metrics stays as fast as without a store. Gauges: ``ehr_outcomes`` (predictions kept,
outcomes received) and ``ehr_outcome_performance{metric, kind}`` (kind "realized", "expected",
"expected_lower", "expected_upper"), ``ehr_outcome_alarm`` (1 when the O/E test fires).

The alarm (``model.adapt.outcome_alarm``): observed/expected deaths with its exact
interval, tested at looks of 100, 200, 400, ... outcomes at levels that keep an endless stream's
false-alarm rate at 5 %, said in words; beside it the update the closed test chooses on the same
outcomes among the recalibrations (``model.adapt.closed_test.recalibration_closed_test``), named
as ehr-adapt's --method.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from prometheus_client import Gauge

from model.adapt import recalibration
from model.adapt.closed_test import recalibration_closed_test
from model.adapt import outcome_alarm
from model.evaluation.statistics import metrics_report
from serving.monitoring.outcome_store import OutcomeStore
from serving.monitoring.telemetry import ServiceMetrics

# Fewer draws than the offline report's 1,000: the service recomputes as outcomes arrive, and the
# 90 % interval's ends move by about 0.01 of its width between 500 and 1,000 draws.
SERVICE_DRAWS = 500


class OutcomeMonitor:
    """The outcome store's realized and expected performance, cached until outcomes arrive, as JSON and gauges."""

    def __init__(self, store: OutcomeStore, metrics: ServiceMetrics, *, model_version: str, model_checksum: str,
                 thresholds: Sequence[float], refresh_s: float):
        self.store = store
        self.model_version = model_version
        self.model_checksum = model_checksum
        self.thresholds = tuple(thresholds)
        self.refresh_s = refresh_s
        self._lock = threading.Lock()
        self._made_at = float("-inf")
        self._outcomes_seen = -1
        self._reading: dict[str, Any] = {}
        self._counts = Gauge("ehr_outcomes", "Predictions kept in the outcome store, and outcomes received",
                             ("kind",), registry=metrics.registry)
        self._alarm = Gauge("ehr_outcome_alarm", "1 when observed/expected deaths over the outcomes received "
                            "differ from 1 beyond chance (GET /v1/monitor says how)", registry=metrics.registry)
        self._performance = Gauge("ehr_outcome_performance", "Realized performance over the outcomes received, and "
                                  "the performance expected on the same predictions with its 90% interval",
                                  ("metric", "kind"), registry=metrics.registry)

    def reading(self) -> dict[str, Any]:
        """Counts, realized and expected metrics over the matched outcomes (made again when outcomes arrived)."""
        with self._lock:
            counts = self.store.counts()
            self._counts.labels(kind="predictions").set(counts["predictions"])
            self._counts.labels(kind="outcomes").set(counts["outcomes"])
            stale = counts["outcomes"] != self._outcomes_seen
            if self._outcomes_seen < 0 or (stale and time.monotonic() - self._made_at >= self.refresh_s):
                self._reading = self._make()
                self._outcomes_seen = counts["outcomes"]
                self._made_at = time.monotonic()
            return {**counts, **self._reading}

    def _make(self) -> dict[str, Any]:
        p, samples, y = self.store.matched(self.model_checksum)
        if y.size == 0:
            return {"matched": 0}
        estimate = metrics_report.expected_performance(p, samples, thresholds=self.thresholds,
                                                             n_draws=SERVICE_DRAWS, seed=0)
        realized = metrics_report.realized_beside(estimate, p, y)
        for name, row in estimate["metrics"].items():
            value = realized["metrics"][name]["value"]
            for kind, number in (("realized", value), ("expected", row["estimate"]),
                                 ("expected_lower", row["lower"]), ("expected_upper", row["upper"])):
                self._performance.labels(metric=name, kind=kind).set(float("nan") if number is None else number)
        alarm = outcome_alarm.oe_alarm(p, y)
        self._alarm.set(1.0 if alarm["fires"] else 0.0)
        return {"matched": int(y.size), "deaths": int(y.sum()), "model_version": self.model_version,
                "model_checksum": self.model_checksum,
                "expected": estimate, "realized": realized, "alarm": alarm, "update": _update_choice(samples, y)}


def _update_choice(samples, y) -> dict[str, Any]:
    """The recalibration the closed test picks on these outcomes, as ehr-adapt's --method, with its tests."""
    if y.min() == y.max():
        return {"method": None, "words": "the closed test needs deaths and survivors among the outcomes"}
    fits = recalibration.fit_ladder(recalibration.logits_of(samples), y)
    result = recalibration_closed_test({name: fit.log_likelihood for name, fit in fits.items()})
    words = (f"the closed test on these {y.size} outcomes chooses `ehr-adapt --method {result.step}`"
             + (" (the model as it is)" if result.step == "none" else "")
             + "; revision was not tested (it needs the admissions: --outcome-keep-admissions)")
    return {"method": result.step, "words": words, **result.to_json()}
