"""The app's lifespan: load the model's versions, start a micro-batcher for each, warm up, and drain at shutdown.

Until the warm-up's first forward pass has run, /readyz answers 503 'starting'; at shutdown it
turns 503 again before the batcher drains, so load balancers stop sending first.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable
from typing import AsyncContextManager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from model.evaluation.statistics import metrics_report
from serving.inference import precision as precision_choice
from serving.inference.batching import MicroBatcher
from serving.inference.encoding import encode
from serving.inference.model_versions import ModelVersions, load_versions
from serving.monitoring.telemetry import ServiceMetrics
from serving.monitoring.monitor import Monitor
from serving.monitoring.outcome_monitor import OutcomeMonitor
from serving.monitoring.outcome_store import OutcomeStore
from serving.inference.served_model import ServedModel
from serving.schemas import AdmissionRequest, Patient, PredictRequest
from serving.settings import Settings

logger = logging.getLogger("serving.app")  # log filters and alerts select the service by this name


def warmup_request(events: bool = True, meds_codes=None) -> PredictRequest:
    """A minimal admission (one event, or none) for the warm-up passes; its prediction is thrown away.

    A model trained on MEDS data reads MEDS codes: its event is a code its map reads as an event.
    """
    admit = dt.datetime(2150, 1, 1, 8, 0)
    event = {"source": "lab", "code": "warmup"}
    if meds_codes is not None:
        rule = next((r for r in meds_codes.events if r.item_range is None), meds_codes.events[0])
        event = {"code": f"{rule.prefix}//{rule.item_range[0] if rule.item_range else 'warmup'}"}
    return PredictRequest(
        patient=Patient(gender="U", age_years=60.0),
        admission=AdmissionRequest(admit_time=admit.isoformat(), admission_type="EMERGENCY"),
        events=[{"time": (admit + dt.timedelta(hours=1)).isoformat(), **event}] if events else [],
    )


async def warm_up(predictor: ServedModel, batcher: MicroBatcher, settings: Settings) -> bool:
    """Forward passes on the model thread; False when the first fails (the version is then not ready).

    bfloat16 compiles its fused LSTM step (XLA) once per batch shape (0.1-0.2 s each at Table-7
    size) and per loop (all sequences full, or some padded), so every batch the micro-batcher
    can form at the default num_samples, 1 .. max_batch admissions of equal and of unequal bag
    counts, runs once here instead of making the first patient in a batch of that shape wait.
    Before /readyz turns ok: compiling alongside the first requests slowed them instead. The
    warm-up admissions have at most one bag, so each pass costs little beyond its compilation.
    """
    try:
        # The unit registry too: the first request with a value to convert must not wait for it.
        await run_in_threadpool(predictor.export.harmoniser.converter.load)
        one, empty = [(await run_in_threadpool(encode, warmup_request(events, predictor.export.meds_codes),
                                               predictor.export)).example
                      for events in (True, False)]
        await batcher.run_in_model_thread(predictor.forward, [one], settings.default_num_samples, 0)
    except asyncio.CancelledError:
        raise
    except Exception as err:
        logger.error("warm-up forward pass of %s %s failed (%s: %s); /readyz stays 503", predictor.name,
                     predictor.version, type(err).__name__, err)
        return False
    if predictor.choice.requested == precision_choice.AUTO:
        try:
            timing = [(await run_in_threadpool(encode, r, predictor.export)).example
                      for r in precision_choice.timing_requests(predictor.export)]
            await batcher.run_in_model_thread(predictor.choose_precision, timing, settings.default_num_samples)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the float32 pass above worked: serve it
            logger.warning("precision auto: timing failed (%s: %s); serving float32", type(err).__name__, err)
    choice = predictor.choice
    logger.info("precision: serving %s (--precision %s): %s", choice.served, choice.requested, choice.reason)
    if predictor.precision == "bfloat16":  # float32 compiles nothing per shape
        try:
            for n in range(1, settings.max_batch + 1):
                for batch in ([one] * n, [one] * (n - 1) + [empty]):  # no bag padded, some padded
                    await batcher.run_in_model_thread(predictor.forward, batch, settings.default_num_samples, 0)
            logger.info("bfloat16 step compiled for batches of 1-%d admissions at num_samples=%d",
                        settings.max_batch, settings.default_num_samples)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # the model did answer one pass: serve, and compile the rest on demand
            logger.warning("bfloat16 warm-up stopped (%s); other batch shapes compile on first use",
                           type(err).__name__)
    logger.info("model %s %s warmed up", predictor.name, predictor.version)
    return True


async def warm_all(app: FastAPI, versions: ModelVersions, settings: Settings, metrics: ServiceMetrics) -> None:
    """Warms every loaded version in turn (one model thread each, sharing the cores); /readyz turns 'ok' once all
    are ready, and stays 503 when one failed."""
    for served in versions.loaded.values():
        assert served.batcher is not None
        served.ready = await warm_up(served.predictor, served.batcher, settings)
        metrics.version_ready.labels(name=versions.name, version=served.version).set(int(served.ready))
    if all(served.ready for served in versions.loaded.values()):
        app.state.ready = True
        metrics.ready.set(1)
        served_versions = list(versions.loaded)
        logger.info("model warmed up; ready (%s version%s %s)", versions.name, "s" if len(served_versions) > 1 else "",
                    ", ".join(served_versions))


async def start_versions(versions: ModelVersions, settings: Settings, metrics: ServiceMetrics) -> None:
    """Each loaded version's micro-batcher (started), the default version's population monitor (serving.inference.
    model_versions says why only its), the versions' gauges."""
    for served in versions.loaded.values():
        export = served.predictor.export
        metrics.model_info.labels(name=versions.name, version=served.version, checksum=export.checksum).set(1)
        served.batcher = MicroBatcher(served.predictor, max_batch=settings.max_batch,
                                      max_wait_s=settings.max_wait_ms / 1000.0, max_queue=settings.max_queue,
                                      metrics=metrics)
        await served.batcher.start()
        if served.version == versions.default:
            served.monitor = Monitor(export, settings.monitor_window, metrics, refresh_s=settings.monitor_refresh_s)
            if export.reference is None:
                logger.info("the export carries no reference population: /v1/monitor answers 'unavailable'")
        metrics.version_ready.labels(name=versions.name, version=served.version).set(0)
    for version in versions.failed:
        metrics.version_ready.labels(name=versions.name, version=version).set(0)
    for version, share in versions.shares().items():
        metrics.version_share.labels(name=versions.name, version=version).set(share)


# How often rows past the outcome store's retention period are deleted, seconds.
PURGE_EVERY_S = 3600.0


def open_outcomes(app: FastAPI, settings: Settings, model: ServedModel, metrics: ServiceMetrics) -> OutcomeStore | None:
    """The outcome store of settings.outcome_dir (None: off) and its monitor on app.state, rows past retention
    deleted now."""
    if settings.outcome_dir is None:
        return None
    store = OutcomeStore(settings.outcome_dir, retention_s=settings.outcome_retention_days * 86400.0,
                         keep_admissions=settings.outcome_keep_admissions)
    deleted = store.purge()
    export = model.export
    app.state.outcomes = store
    app.state.outcome_monitor = OutcomeMonitor(
        store, metrics, model_version=export.card.version, model_checksum=export.checksum, refresh_s=settings.monitor_refresh_s,
        thresholds=metrics_report.decision_thresholds(export.metrics.decision_threshold))
    logger.info("outcome store %s: %s, %d rows past %g days deleted%s", store.path, store.counts(), deleted,
                settings.outcome_retention_days, "; keeping encoded admissions" if store.keep_admissions else "")
    return store


async def purge_periodically(store: OutcomeStore, every_s: float = PURGE_EVERY_S) -> None:
    """Deletes the outcome store's rows past retention every `every_s` seconds, until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        try:
            deleted = await run_in_threadpool(store.purge)
        except Exception as err:  # a full disk must not stop the service; the next hour tries again
            logger.error("outcome store purge failed: %s: %s", type(err).__name__, err)
            continue
        if deleted:
            logger.info("outcome store: %d rows past retention deleted", deleted)


def model_lifespan(settings: Settings, metrics: ServiceMetrics,
                   versions: ModelVersions | None = None) -> Callable[[FastAPI], AsyncContextManager[None]]:
    """The lifespan of an app: loads settings' model (serving.inference.model_versions) unless `versions` are given."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        served = versions if versions is not None else await run_in_threadpool(load_versions, settings)
        await start_versions(served, settings, metrics)
        # /v1/model, /v1/monitor, the outcome store and /metrics' shift gauges describe the default version.
        default = served.loaded[served.default]
        model = default.predictor
        app.state.versions = served
        app.state.predictor, app.state.batcher, app.state.monitor = model, default.batcher, default.monitor
        store = await run_in_threadpool(open_outcomes, app, settings, model, metrics)
        purge = asyncio.create_task(purge_periodically(store)) if store is not None else None
        logger.info("referral: %s", model.export.metrics.referral.describe())
        if settings.warmup:
            warm = asyncio.create_task(warm_all(app, served, settings, metrics))
        else:
            warm = None
            for each in served.loaded.values():
                each.ready = True
                metrics.version_ready.labels(name=served.name, version=each.version).set(1)
            app.state.ready = True
            metrics.ready.set(1)
        try:
            yield
        finally:
            app.state.ready = False  # tell load balancers first, then drain
            metrics.ready.set(0)
            if warm is not None:
                warm.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await warm
            for each in served.loaded.values():
                if each.batcher is not None:
                    await each.batcher.stop()
            if purge is not None:
                purge.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await purge
                store.close()

    return lifespan
