"""The API's documentation pages, served without a CDN.

FastAPI's own ``/docs`` (Swagger UI) and ``/redoc`` load their bundles from
jsdelivr, so on a machine without internet access (an air-gapped CI runner, a
laptop on a train) they render blank. The same pages are served here with the
assets of the ``fastapi-offline`` package (Swagger UI and ReDoc, pinned in
``pyproject.toml``) under ``/static-docs/``; nothing leaves this origin.

| Path | Page |
|---|---|
| ``/docs`` | Swagger UI over ``/openapi.json`` |
| ``/docs/oauth2-redirect`` | Swagger UI's OAuth2 redirect helper |
| ``/redoc`` | ReDoc over ``/openapi.json`` |
| ``/static-docs/...`` | the two bundles, Swagger UI's stylesheet and a favicon |

The app must be created with ``docs_url=None, redoc_url=None`` so FastAPI does not
add its CDN versions first.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles

DOCS_URL = "/docs"
OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
REDOC_URL = "/redoc"
ASSETS_URL = "/static-docs"


def assets_dir() -> Path:
    """The folder of the Swagger UI and ReDoc bundles, found without importing the
    package (its module builds a FastAPI app factory this project does not use)."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the fastapi-offline package is missing: pip install -e .")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


def install_docs(app: FastAPI) -> None:
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="static-docs")

    def asset(request: Request, name: str) -> str:
        return f"{request.scope.get('root_path', '')}{ASSETS_URL}/{name}"

    def openapi_url(request: Request) -> str:
        return f"{request.scope.get('root_path', '')}{app.openapi_url}"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url(request), title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=OAUTH2_REDIRECT_URL,
            swagger_js_url=asset(request, "swagger-ui-bundle.js"),
            swagger_css_url=asset(request, "swagger-ui.css"),
            swagger_favicon_url=asset(request, "favicon.png"),
            swagger_ui_parameters=app.swagger_ui_parameters)

    @app.get(OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url(request), title=f"{app.title} - ReDoc",
            redoc_js_url=asset(request, "redoc.standalone.js"),
            redoc_favicon_url=asset(request, "favicon.png"), with_google_fonts=False)
