"""GET /docs: Swagger UI with its script, stylesheet and icon served by the service itself.

FastAPI's default page loads Swagger UI from a CDN (and its icon from fastapi.tiangolo.com): on a
hospital network without internet it is a blank page. The assets here are the pinned
``swagger-ui-py`` package's copy of swagger-ui-dist 5 (FastAPI writes OpenAPI 3.1, which Swagger
UI 4 cannot render), served under ``/docs/assets/``, and the online validator badge, which would
call validator.swagger.io, is off. ReDoc is not served: it loads its script and Google Fonts from
the internet too, and Swagger UI covers what it shows.
"""
from __future__ import annotations

import importlib.util
import logging
import pathlib

from fastapi import FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

logger = logging.getLogger(__name__)

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
SCRIPT, STYLESHEET, ICON = "swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png"
ASSETS = (SCRIPT, STYLESHEET, ICON)  # all the page loads; nothing else of the package is served


def swagger_ui_dir() -> pathlib.Path | None:
    """swagger-ui-py's folder of swagger-ui-dist files; None when the package (or an asset) is missing.

    Found without importing the package: its __init__ imports Jinja2 and a handler per web framework.
    """
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = pathlib.Path(list(spec.submodule_search_locations)[0]) / "static"
    return folder if all((folder / name).is_file() for name in ASSETS) else None


def install_docs(app: FastAPI) -> None:
    """Adds /docs and its assets to an app made with docs_url=None; without swagger-ui-py, says so and adds none."""
    folder = swagger_ui_dir()
    if folder is None:
        logger.warning("swagger-ui-py is not installed: %s is off (the schema is at %s)", DOCS_PATH, app.openapi_url)
        return

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "").rstrip("/")  # behind a proxy's path prefix, as FastAPI's own page
        return get_swagger_ui_html(
            openapi_url=f"{root}{app.openapi_url}", title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/{SCRIPT}", swagger_css_url=f"{root}{ASSETS_PATH}/{STYLESHEET}",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/{ICON}", swagger_ui_parameters={"validatorUrl": None})

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def asset(name: str) -> FileResponse:
        if name not in ASSETS:
            raise HTTPException(404, "not a docs asset")
        # The files change only with the pinned package: a day's caching spares a reload of 1.5 MB.
        return FileResponse(folder / name, headers={"Cache-Control": "public, max-age=86400"})
