"""The status pages: static HTML, ES modules and CSS from ``frontend-static/``, with
no build step and nothing from a CDN.

| Path | Page |
|---|---|
| ``/`` | the configured queues with their counts |
| ``/queues/{queue}`` | a queue: in-flight requests by stage, batches and paths, recent results, live (404 with the same page when the queue is not configured) |
| ``/queues/{queue}/requests/{n}`` | a request: stage trail, forecast or removal reason, cancel |
| ``/admin`` | topics, dead letters (reconcile / requeue / discard) and the audit log |
| ``/static/...`` | the pages' scripts and styles |

The HTML is the same for every queue and request: its script reads the location and
renders from the JSON API with DOM text nodes only (never ``innerHTML``), so no
user-controlled text can become markup. Every page and static file is served with
a Content-Security-Policy that allows only this origin's scripts, styles and
connections (no inline script or style), ``X-Content-Type-Options: nosniff``,
``Referrer-Policy: no-referrer`` and ``X-Frame-Options: DENY``.
"""  # noqa: E501 - route tables read best unwrapped

from __future__ import annotations

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from app.api.deps import RuntimeDep
from app.domain.errors import NotFound
from app.resources import resource

STATIC_DIR = resource("frontend-static")  # the wheel's bundled copy or the checkout's

CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
       "form-action 'self'; frame-ancestors 'none'")
PAGE_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def with_page_headers(response: Response) -> Response:
    for name, value in PAGE_HEADERS.items():
        if name.lower() not in response.headers:
            response.headers[name] = value
    return response


class PageStaticFiles(StaticFiles):
    """``StaticFiles`` that adds the page headers to every file it serves."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        return with_page_headers(await super().get_response(path, scope))


def _page(name: str, status_code: int = 200) -> Response:
    path = STATIC_DIR / name
    if not path.is_file():
        raise NotFound(f"the status pages are not installed: {path} is missing (they are "
                       "served from frontend-static/ in the source checkout)")
    return with_page_headers(FileResponse(path, status_code=status_code,
                                          media_type="text/html"))


def _queue_page(name: str, queue: str, rt: RuntimeDep) -> Response:
    """A page of a queue that is not configured is the same page (its script says which
    queues exist) answered 404, so a link checker or a person's tools see it is wrong."""
    return _page(name, 200 if queue in rt.queues else 404)


router = APIRouter(include_in_schema=False)


@router.get("/")
async def index_page() -> Response:
    return _page("index.html")


@router.get("/queues/{queue}")
async def queue_page(queue: str, rt: RuntimeDep) -> Response:
    return _queue_page("queue.html", queue, rt)


@router.get("/queues/{queue}/requests/{n}")
async def request_page(queue: str, n: str, rt: RuntimeDep) -> Response:
    return _queue_page("request.html", queue, rt)


@router.get("/admin")
async def admin_page() -> Response:
    return _page("admin.html")


def install_pages(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", PageStaticFiles(directory=STATIC_DIR, check_dir=False), name="static")
