"""The api's auth dependencies: the caller of a route, allowed the scope it needs
(``app/gateway/access.py`` decides; this module only reads the ``Authorization``
header and counts refusals in ``/metrics``).

A route declares what it needs with one parameter:

```python
async def land(queue: str, caller: Lander, ...)      # Scope.LAND in {queue}
async def summary(queue: str, _: Reader, ...)        # Scope.READ in {queue}
```
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.api.deps import RuntimeDep
from app.api.schemas import ErrorOut
from app.domain.access import Principal, Scope
from app.domain.errors import Forbidden, Unauthorized

AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "no valid token where one is needed"},
    403: {"model": ErrorOut, "description": "the token lacks the scope (or the queue)"},
}
bearer = HTTPBearer(
    auto_error=False, scheme_name="ApiToken",
    description="An API token (`submitqueue token create`; `sq_<id>_<secret>`) or "
                "`SQ_ADMIN_TOKEN`, as `Authorization: Bearer <token>`.")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def authorize(rt: RuntimeDep, credentials: HTTPAuthorizationCredentials | None,
                    scope: Scope, queue: str | None) -> Principal:
    token = credentials.credentials if credentials is not None else None
    try:
        return await rt.access.authorize(token, scope, queue)
    except (Unauthorized, Forbidden) as exc:
        rt.metrics.auth_refused(scope.value, exc.code)
        raise


def _queue_of(request: Request) -> str | None:
    """The queue the call is about: the ``{queue}`` of the path, else ``?queue=``."""
    queue = request.path_params.get("queue") or request.query_params.get("queue")
    return queue if isinstance(queue, str) and queue else None


def needs(scope: Scope) -> Any:
    """A dependency: the caller, allowed ``scope`` in the route's ``{queue}`` (if any)."""

    async def dependency(request: Request, rt: RuntimeDep,
                         credentials: Credentials = None) -> Principal:
        return await authorize(rt, credentials, scope, _queue_of(request))

    dependency.__name__ = f"needs_{scope.value.replace(':', '_')}"
    return Depends(dependency)


Reader = Annotated[Principal, needs(Scope.READ)]
Lander = Annotated[Principal, needs(Scope.LAND)]
Canceller = Annotated[Principal, needs(Scope.CANCEL)]
Admin = Annotated[Principal, needs(Scope.ADMIN)]
