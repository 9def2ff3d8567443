"""``install(app)``: everything the gateway adds to a FastAPI app — the REST routers,
the error handlers and the middleware.

The app must set ``app.state.runtime`` (before serving requests) to an object with
``db`` (``Database``), ``broker`` (``Broker``; ``broker.clock()`` is "now") and
``queues`` (``{name: QueueConfig}``); see ``app/api/deps.py``. The admin API
(``app/api/admin.py``) also needs ``settings`` (``admin_token``) and ``deps``.
"""

from __future__ import annotations

from fastapi import FastAPI

from app.api import requests
from app.api.admin import install_admin
from app.api.errors import install_handlers
from app.api.middleware import MAX_BODY_BYTES, BodyGuard, CatchAll


def install(app: FastAPI, *, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    app.include_router(requests.router)
    install_admin(app)
    install_handlers(app)
    # Added last = outermost: CatchAll sees every error the body guard or routes raise.
    app.add_middleware(BodyGuard, max_bytes=max_body_bytes)
    app.add_middleware(CatchAll)
