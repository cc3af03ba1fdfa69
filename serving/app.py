"""The app factory: create_app(settings) -> FastAPI, with everything it needs on app.state.

No module-level state besides the logger: the settings, the model, the micro-batcher and the
metrics registry all belong to one app, handed to routes by dependency injection. This module
only assembles the app; each concern lives in its own module:

* ``serving.lifespan``: model loading, the micro-batcher, warm-up and shutdown;
* ``serving.middleware``: request ids, the access log, HTTP metrics and body limits;
* ``serving.errors``: the exception handlers;
* ``serving.routes`` and ``serving.fhir_routes``: the endpoints.
"""
from __future__ import annotations

from fastapi import FastAPI

from serving import __version__
from serving.errors import install_error_handlers
from serving.fhir_routes import cds_router, fhir_router
from serving.lifespan import model_lifespan
from serving.telemetry import ServiceMetrics
from serving.middleware import BodyLimitMiddleware, RequestContextMiddleware
from serving.predictor import ServedModel
from serving.routes import health_router, metrics_router, v1_router
from serving.settings import Settings

DESCRIPTION = """\
In-hospital mortality predictions from a rank-1 Bayesian LSTM, with their uncertainty:
predictive mean and spread over S samples of each of K ensemble members, total / aleatoric /
epistemic uncertainty, and a referral flag calibrated on held-out data.

Events are bagged by the same code that built the training data. Authenticate with an
`X-API-Key` header (or `Authorization: Bearer <key>`). Not a medical device.
"""


def create_app(settings: Settings, predictor: ServedModel | None = None) -> FastAPI:
    """The service app; loads settings.model_dir at start-up unless a loaded `predictor` is given."""
    metrics = ServiceMetrics()
    app = FastAPI(
        title="ehr-uncertainty prediction service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=model_lifespan(settings, metrics, predictor),
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.predictor = None
    app.state.monitor = None
    app.state.ready = False
    # Last added runs first: the request id, log line and metrics cover 413s too.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                       settings=settings, routes=app.router.routes)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    install_error_handlers(app, fhir_router.prefix)
    app.include_router(health_router)
    app.include_router(metrics_router)
    app.include_router(v1_router)
    app.include_router(fhir_router)
    app.include_router(cds_router)
    return app
