"""FastAPI dependencies: each hands a route one piece of the app's state.

create_app puts the settings, the loaded model, the batcher and the metrics on
``app.state``; routes ask for them here instead of importing globals, so an app is fully
described by what its factory was given.
"""
from __future__ import annotations

from collections.abc import AsyncIterator

from fastapi import HTTPException, Request, status

from serving.batching import Arrival, MicroBatcher
from serving.metrics import ServiceMetrics
from serving.monitor import Monitor
from serving.predictor import ServedModel
from serving.settings import Settings


def get_settings(request: Request) -> Settings:
    """The app's Settings."""
    return request.app.state.settings


def get_metrics(request: Request) -> ServiceMetrics:
    """The app's metrics registry."""
    return request.app.state.metrics


def get_predictor(request: Request) -> ServedModel:
    """The loaded model; 503 while start-up has not loaded it yet."""
    predictor = getattr(request.app.state, "predictor", None)
    if predictor is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the model is not loaded yet",
                            headers={"Retry-After": "1"})
    return predictor


def get_monitor(request: Request) -> Monitor | None:
    """The population monitor; None before the model is loaded."""
    return getattr(request.app.state, "monitor", None)


def get_batcher(request: Request) -> MicroBatcher:
    """The app's micro-batcher."""
    return request.app.state.batcher


async def get_arrival(request: Request) -> AsyncIterator[Arrival]:
    """Announces a predict request to the batcher as soon as it is routed (before body validation).

    The worker then knows a request is about to join and may wait up to --max-wait-ms for it.
    Async on purpose: FastAPI would run a plain generator in a worker thread, and the count
    must only change on the event loop.
    """
    with get_batcher(request).arrival() as arrival:
        yield arrival
