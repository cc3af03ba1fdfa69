"""FastAPI dependencies: each hands a route one piece of the app's state.

create_app puts the settings, the loaded model, the batcher and the metrics on
``app.state``; routes ask for them here instead of importing globals, so an app is fully
described by what its factory was given. Every prediction route (/v1, FHIR, CDS Hooks) takes
the one ``ServingDep`` bundle and the same query parameters, declared once below, so the
route modules share them without importing each other.
"""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Query, Request, status

from serving.inference.batching import Arrival, MicroBatcher
from serving.inference.model_versions import DEFAULT, REQUESTED, ModelVersions, ServedVersion
from serving.monitoring.telemetry import ServiceMetrics
from serving.monitoring.monitor import Monitor
from serving.monitoring.outcome_monitor import OutcomeMonitor
from serving.monitoring.outcome_store import OutcomeStore
from serving.inference.served_model import ServedModel
from serving.settings import Settings


def get_settings(request: Request) -> Settings:
    """The app's Settings."""
    return request.app.state.settings


def get_metrics(request: Request) -> ServiceMetrics:
    """The app's metrics registry."""
    return request.app.state.metrics


def _loaded(request: Request, name: str) -> Any:
    """app.state.NAME, set once start-up has loaded the model; 503 (retry in 1 s) before."""
    found = getattr(request.app.state, name, None)
    if found is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the model is not loaded yet",
                            headers={"Retry-After": "1"})
    return found


def get_predictor(request: Request) -> ServedModel:
    """The loaded model; 503 while start-up has not loaded it yet."""
    return _loaded(request, "predictor")


def get_monitor(request: Request) -> Monitor | None:
    """The population monitor; None before the model is loaded."""
    return getattr(request.app.state, "monitor", None)


def get_outcomes(request: Request) -> OutcomeStore | None:
    """The outcome store; None when the server keeps no outcomes (no --outcome-dir) or before start-up."""
    return getattr(request.app.state, "outcomes", None)


def get_outcome_monitor(request: Request) -> OutcomeMonitor | None:
    """Realized beside expected performance over the outcomes received; None without an outcome store."""
    return getattr(request.app.state, "outcome_monitor", None)


def get_versions(request: Request) -> ModelVersions:
    """Every version of the model (serving.inference.model_versions); 503 while start-up has not loaded them."""
    return _loaded(request, "versions")


def get_batcher(request: Request) -> MicroBatcher:
    """The default version's micro-batcher (the one a request is announced to before it is routed)."""
    return request.app.state.batcher


async def get_arrival(request: Request) -> AsyncIterator[Arrival]:
    """Announces a predict request to the batcher as soon as it is routed (before body validation).

    The worker then knows a request is about to join and may wait up to --max-wait-ms for it.
    Async on purpose: FastAPI would run a plain generator in a worker thread, and the count
    must only change on the event loop.
    """
    with get_batcher(request).arrival() as arrival:
        yield arrival


SettingsDep = Annotated[Settings, Depends(get_settings)]
ServedModelDep = Annotated[ServedModel, Depends(get_predictor)]
BatcherDep = Annotated[MicroBatcher, Depends(get_batcher)]
ArrivalDep = Annotated[Arrival, Depends(get_arrival)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]
MonitorDep = Annotated[Monitor | None, Depends(get_monitor)]
OutcomesDep = Annotated[OutcomeStore | None, Depends(get_outcomes)]
OutcomeMonitorDep = Annotated[OutcomeMonitor | None, Depends(get_outcome_monitor)]
VersionsDep = Annotated[ModelVersions, Depends(get_versions)]


@dataclasses.dataclass(frozen=True)
class Serving:
    """What a prediction route needs from the app, in one dependency (/v1/predict, FHIR, CDS Hooks)."""

    settings: Settings
    predictor: ServedModel
    batcher: MicroBatcher
    arrival: Arrival
    metrics: ServiceMetrics
    monitor: Monitor | None
    outcomes: OutcomeStore | None = None
    versions: ModelVersions | None = None
    selected_by: str = DEFAULT  # how predictor's version was chosen (model_identity names it)

    def routed(self, key: str) -> Serving:
        """This bundle with the version the admission of `key` gets (the split's, or the default), counted."""
        assert self.versions is not None
        served, how = self.versions.route(key)
        return self._with(served, how)

    def addressed(self, version: str) -> Serving | None:
        """This bundle with the loaded `version` a request named (OIP's .../versions/V), counted; None if not loaded."""
        assert self.versions is not None
        served = self.versions.loaded.get(version)
        return None if served is None else self._with(served, REQUESTED)

    def _with(self, served: ServedVersion, how: str) -> Serving:
        self.metrics.version_requests.labels(name=served.predictor.name, version=served.version,
                                             selected_by=how).inc()
        if served.batcher is self.batcher:
            return dataclasses.replace(self, selected_by=how)
        # The request was announced to the default version's batcher before its body was read: that batcher
        # must not wait for it. Its own version's batcher never heard of it, so it waits for nobody; it still
        # joins a pass forming there.
        self.arrival.close()
        return dataclasses.replace(self, predictor=served.predictor, batcher=served.batcher, monitor=served.monitor,
                                   selected_by=how)


def _serving(settings: SettingsDep, predictor: ServedModelDep, batcher: BatcherDep, arrival: ArrivalDep,
             metrics: MetricsDep, monitor: MonitorDep, outcomes: OutcomesDep, versions: VersionsDep) -> Serving:
    """The app's settings, default model, batcher, metrics, monitor, outcome store and versions, and this request's
    arrival; a route picks the admission's version with routed() or addressed()."""
    return Serving(settings, predictor, batcher, arrival, metrics, monitor, outcomes, versions)


ServingDep = Annotated[Serving, Depends(_serving)]
NumSamplesQuery = Annotated[int | None, Query(
    ge=1, description="Monte-Carlo samples S per ensemble member; default and upper limit are server "
                      "settings (25 and 100 unless changed). The response holds S*K samples.")]
SeedQuery = Annotated[int | None, Query(
    ge=0, le=2**63 - 1, description="Seed for reproducible samples: the same request with the same seed "
                                    "gives the same answer. Without it every call draws fresh samples.")]
IncludeSamplesQuery = Annotated[bool, Query(description="Return all S*K sampled probabilities.")]
