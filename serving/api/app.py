"""The app factory: create_app(settings) -> FastAPI, with everything it needs on app.state.

No module-level state besides the logger: the settings, the model, the micro-batcher and the
metrics registry all belong to one app, handed to routes by dependency injection. This module
only assembles the app; each concern lives in its own module:

* ``serving.api.lifespan``: model loading, the micro-batcher, warm-up and shutdown;
* ``serving.api.middleware``: request ids, the access log, HTTP metrics and body limits;
* ``serving.api.errors``: the exception handlers;
* ``serving.api.routes`` and ``serving.api.fhir_routes``: the endpoints;
* ``serving.api.auth``: the API-key check and its per-address failure budget;
* ``serving.oip``: the Open Inference Protocol v2 endpoints (/v2), built around the dependencies given here;
* ``serving.api.api_docs``: /docs, with Swagger UI's assets served from here.
"""
from __future__ import annotations

from fastapi import Depends, FastAPI

from serving import __version__
from serving.api.api_docs import install_docs
from serving.api.auth import AuthGuard, require_api_key
from serving.api.dependencies import OutcomesDep, ServingDep, VersionsDep
from serving.api.errors import install_error_handlers
from serving.api.fhir_routes import cds_router, fhir_open_router, fhir_router
from serving.api.lifespan import model_lifespan
from serving.monitoring.telemetry import ServiceMetrics
from serving.api.middleware import BodyLimitMiddleware, RequestContextMiddleware
from serving.inference.model_versions import ModelVersions, single
from serving.inference.served_model import ServedModel
from serving.api.routes import health_router, metrics_router, v1_router
from serving.oip import oip_routers
from serving.settings import Settings

DESCRIPTION = """\
In-hospital mortality predictions from a rank-1 Bayesian LSTM, with their uncertainty:
predictive mean and spread over S samples of each of K ensemble members, total / aleatoric /
epistemic uncertainty, and a referral flag calibrated on held-out data.

Events are bagged by the same code that built the training data. Authenticate with an
`X-API-Key` header (or `Authorization: Bearer <key>`). Not a medical device.
"""


def create_app(settings: Settings, predictor: ServedModel | None = None,
               versions: ModelVersions | None = None) -> FastAPI:
    """The service app; loads settings' model at start-up unless a loaded `predictor` (the one version) or
    `versions` are given."""
    metrics = ServiceMetrics()
    if predictor is not None:
        versions = single(predictor)
    app = FastAPI(
        title="ehr-uncertainty prediction service",
        version=__version__,
        description=DESCRIPTION,
        lifespan=model_lifespan(settings, metrics, versions),
        # serving.api.api_docs serves /docs with its assets (FastAPI's loads them from a CDN); no ReDoc (fonts and
        # script from the internet) and no OAuth redirect page (the service takes API keys).
        docs_url=None, redoc_url=None, swagger_ui_oauth2_redirect_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.predictor = None  # the default version's model, batcher and monitor, set at start-up
    app.state.versions = None  # every version (serving.inference.model_versions), set at start-up
    app.state.monitor = None
    app.state.outcomes = None  # the outcome store and its monitor, opened at start-up with settings.outcome_dir
    app.state.outcome_monitor = None
    app.state.ready = False
    app.state.auth = AuthGuard(settings, metrics)  # one failure table for the middleware and the routes
    # Last added runs first: the request id, log line and metrics cover 413s too.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s,
                       auth=app.state.auth, routes=app.router.routes)
    app.add_middleware(RequestContextMiddleware, metrics=metrics)
    install_error_handlers(app, fhir_router.prefix)
    app.include_router(health_router)
    app.include_router(metrics_router)
    app.include_router(v1_router)
    app.include_router(fhir_router)
    app.include_router(fhir_open_router)
    app.include_router(cds_router)
    # The Open Inference Protocol's routes take the app's dependencies as arguments: serving.oip is a room
    # below this one and must not import it. Its health routes are open, like /healthz.
    oip_health, oip_keyed = oip_routers(ServingDep, VersionsDep, OutcomesDep)
    app.include_router(oip_health)
    app.include_router(oip_keyed, dependencies=[Depends(require_api_key)])
    install_docs(app)
    return app
