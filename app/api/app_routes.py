"""``install(app)``: everything the gateway adds to a FastAPI app — the REST routers,
the error handlers and the middleware.

The app must set ``app.state.runtime`` (before serving requests) to an object with
``db`` (``Database``), ``broker`` (``Broker``; ``broker.clock()`` is "now") and
``queues`` (``{name: QueueConfig}``); see ``app/api/deps.py``. The admin API
(``app/api/admin.py``) also needs ``settings`` (``admin_token``) and ``deps``; the
status pages' views (``app/api/views.py``) need ``extensions`` (the queues' scorers).
"""

from __future__ import annotations

from fastapi import FastAPI

from app.api import builds, events, freeze, github, requests, tokens, views
from app.api.admin import install_admin
from app.api.auth import AUTH_RESPONSES
from app.api.errors import install_handlers
from app.api.examples import install_examples
from app.api.middleware import MAX_BODY_BYTES, BodyGuard, CatchAll
from app.api.pages import install_pages


def install(app: FastAPI, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    # every route may answer 401/403 (app/api/auth.py: a token that is not valid, a
    # scope it lacks), and a land 429 (quotas)
    auth = AUTH_RESPONSES
    app.include_router(requests.router, responses=auth)
    app.include_router(builds.router)  # build logs (auth answers declared there), CI callback
    app.include_router(github.router)  # GitHub's webhook (signed, app/api/github.py)
    install_admin(app)
    app.include_router(freeze.router)  # queue owners' freezes (admin; auth declared there)
    app.include_router(tokens.router)  # whoami, and the admin API's tokens
    app.include_router(views.router, responses=auth)  # status pages: JSON views, events
    app.include_router(events.router, responses=auth)
    install_pages(app)
    install_handlers(app)
    install_examples(app)  # the schema's examples, whole
    # Added last = outermost: CatchAll sees every error the body guard or routes raise.
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes)
    app.add_middleware(CatchAll)
