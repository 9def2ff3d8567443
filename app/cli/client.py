"""A small client for the gateway's REST API (``/api/v1``), used by the CLI and the demo.

```python
async with GatewayClient("http://127.0.0.1:8000", token=os.environ.get("SQ_TOKEN")) as gw:
    sqid = await gw.land("sandbox", [uri])
    summary = await gw.summary(sqid)          # RequestSummary
    events = await gw.history(sqid)           # [HistoryEntry], oldest first

with SyncGatewayClient("http://127.0.0.1:8000") as gw:   # the same calls, blocking
    summary = gw.summary(sqid)
```

Each call is written once, sans I/O: a generator (``Plan``) that yields the HTTP calls
it needs and reads their JSON answers; ``GatewayClient`` (httpx's async client, for
``watch`` and ``demo``, which poll many requests at once) and ``SyncGatewayClient``
(one request after another, for ``land``/``status``/``cancel``/``list``: no event loop
to import, ~35 ms less start-up) only drive them.

Every failure is a ``ClientError`` whose ``exit_code`` the CLI returns:

| Failure | Class | exit_code |
|---|---|---|
| the server answered 4xx (its JSON message is kept) | ``ApiError`` | 1 |
| the server answered 5xx | ``ApiError`` | 2 |
| no connection, timeout, TLS failure | ``Unreachable`` | 2 |
| the answer is not the API's JSON (another service on that port?) | ``BadResponse`` | 2 |
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, TypeVar, cast

import httpx

from app.domain.states import PublicStatus

DEFAULT_URL = "http://127.0.0.1:8000"
TERMINAL = frozenset(s.value for s in PublicStatus if s.terminal)
# Visible statuses a request can still leave (``accepting`` is never shown).
IN_FLIGHT = tuple(
    s.value for s in PublicStatus if not s.terminal and s is not PublicStatus.ACCEPTING
)


class ClientError(Exception):
    """A call to the gateway failed; ``str()`` is a message for a person."""

    exit_code = 2


class ApiError(ClientError):
    """The gateway answered with an error status and (usually) a JSON error body."""

    def __init__(self, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.exit_code = 1 if status < 500 else 2
        super().__init__(f"error {status} ({code}): {message}")


class Unreachable(ClientError):
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the SubmitQueue server at {url}: {reason}; is it "
                         "running (`make run` or `submitqueue serve`) and is --url / SQ_URL "
                         "right?")


class BadResponse(ClientError):
    pass


def _pct(p: Any) -> str:
    return f"{round(float(p) * 100)} %" if isinstance(p, int | float) else "unknown"


def _eta(ms: Any) -> str:
    return f"in ~{round(ms / 1000)} s" if isinstance(ms, int | float) else "unknown"


def split_sqid(sqid: str) -> tuple[str, int]:
    """``"sandbox/12"`` -> ``("sandbox", 12)``; ``ValueError`` says what a sqid looks like."""
    queue, sep, tail = sqid.rpartition("/")
    if not sep or not queue or not tail.isdigit() or int(tail) < 1:
        raise ValueError(f"{sqid!r} is not a request id; it looks like <queue>/<n>, "
                         "e.g. sandbox/12")
    return queue, int(tail)


@dataclass(frozen=True, slots=True)
class RequestSummary:
    sqid: str
    queue: str
    change_uris: tuple[str, ...]
    received_at_ms: int
    status: str
    last_error: str
    metadata: dict[str, Any] = field(default_factory=dict)
    submitted_by: str = ""
    priority: str = "normal"

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def of(cls, body: Any) -> RequestSummary:
        try:
            return cls(sqid=str(body["sqid"]), queue=str(body["queue"]),
                       change_uris=tuple(str(u) for u in body["change_uris"]),
                       received_at_ms=int(body["received_at_ms"]), status=str(body["status"]),
                       last_error=str(body.get("last_error") or ""),
                       metadata=dict(body.get("metadata") or {}),
                       submitted_by=str(body.get("submitted_by") or ""),
                       priority=str(body.get("priority") or "normal"))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadResponse(f"unexpected request summary from the server: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class HistoryEntry:
    timestamp_ms: int
    type: str  # "status" or "event"
    name: str  # the status or the event
    last_error: str
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, body: Any) -> HistoryEntry:
        try:
            kind = str(body["type"])
            name = body["status"] if kind == "status" else body["event"]
            return cls(timestamp_ms=int(body["timestamp_ms"]), type=kind, name=str(name or ""),
                       last_error=str(body.get("last_error") or ""),
                       metadata=dict(body.get("metadata") or {}))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadResponse(f"unexpected history entry from the server: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class QueueInfo:
    name: str
    description: str
    counts: dict[str, int]


T = TypeVar("T")
Call = tuple[str, str, dict[str, Any]]  # method, path, httpx keyword arguments
Plan = Generator[Call, Any, T]  # yields the calls it needs, is sent their JSON answers


def _answer(base_url: str, method: str, path: str, r: httpx.Response) -> Any:
    """The JSON body of ``r``, or the ``ClientError`` it means."""
    try:
        body = r.json()
    except ValueError:
        body = None
    if r.status_code >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and "message" in error:
            raise ApiError(r.status_code, str(error.get("code", "")), str(error["message"]))
        raise ApiError(r.status_code, "http_error",
                       (r.text.strip()[:300] or r.reason_phrase) + " (not a SubmitQueue "
                       "error body: is --url the SubmitQueue server?)")
    if body is None:
        raise BadResponse(f"{method} {base_url}{path} answered {r.status_code} without "
                          "JSON; is --url the SubmitQueue server?")
    return body


def _unreachable(base_url: str, exc: httpx.TransportError) -> Unreachable:
    return Unreachable(base_url, str(exc) or type(exc).__name__)


def plan_queues() -> Plan[list[QueueInfo]]:
    body = yield "GET", "/api/v1/queues", {}
    try:
        return [QueueInfo(name=str(q["name"]), description=str(q.get("description", "")),
                          counts=dict(q.get("counts") or {})) for q in body["items"]]
    except (KeyError, TypeError) as exc:
        raise BadResponse(f"unexpected queue list from the server: {exc!r}") from None


def plan_land(queue: str, change_uris: Sequence[str], strategy: str | None = None,
              idempotency_key: str | None = None, priority: str | None = None) -> Plan[str]:
    payload: dict[str, Any] = {"change_uris": list(change_uris)}
    if strategy:
        payload["strategy"] = strategy
    if priority:
        payload["priority"] = priority
    headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
    body = yield "POST", f"/api/v1/queues/{queue}/requests", {"json": payload,
                                                              "headers": headers}
    try:
        return str(body["sqid"])
    except (KeyError, TypeError):
        raise BadResponse(f"land answered without a sqid: {body!r}") from None


def plan_summary(sqid: str) -> Plan[RequestSummary]:
    queue, n = split_sqid(sqid)
    return RequestSummary.of((yield "GET", f"/api/v1/queues/{queue}/requests/{n}", {}))


def waiting_lines(body: Any, base_url: str) -> list[str]:
    """The lines of ``waiting`` from a request's view (``.../requests/<n>/view``)."""
    if not isinstance(body, dict):
        return []
    outages = body.get("outages")
    lines = [str(o["text"]) for o in outages or [] if isinstance(o, dict) and "text" in o]
    request: dict[str, Any] = body["request"] if isinstance(body.get("request"), dict) \
        else {}
    freeze = body.get("freeze")
    if isinstance(freeze, dict) and freeze.get("frozen") and \
            request.get("status") not in ("landed", "error", "cancelled"):
        # "frozen: <reason> (manual by ops, until ...)": the queue lands nothing now
        lines.insert(0, str(freeze.get("text") or f"frozen: {freeze.get('reason', '')}"))
    health = request.get("health")
    if isinstance(health, dict) and health.get("state") not in (None, "ok"):
        lines.append(str(health.get("text") or health.get("state")))
        if health.get("needs_operator") and health.get("admin_url"):
            lines.append(f"needs an operator: {base_url}{health['admin_url']}")
        forecast = request.get("forecast")
        if isinstance(forecast, dict):
            lines.append(f"chance to land {_pct(forecast.get('p_land'))}, ETA "
                         f"{_eta(forecast.get('eta_ms'))}: {forecast.get('basis', '')}")
    return lines


def plan_waiting(sqid: str, base_url: str) -> Plan[list[str]]:
    queue, n = split_sqid(sqid)
    body = yield "GET", f"/api/v1/queues/{queue}/requests/{n}/view", {}
    return waiting_lines(body, base_url)


def plan_history(sqid: str) -> Plan[list[HistoryEntry]]:
    queue, n = split_sqid(sqid)
    body = yield "GET", f"/api/v1/queues/{queue}/requests/{n}/history", {}
    try:
        return [HistoryEntry.of(e) for e in body["events"]]
    except (KeyError, TypeError):
        raise BadResponse(f"unexpected history from the server: {body!r}") from None


def plan_cancel(sqid: str, reason: str = "") -> Plan[str]:
    queue, n = split_sqid(sqid)
    body = yield "POST", f"/api/v1/queues/{queue}/requests/{n}/cancel", {
        "json": {"reason": reason}}
    return str(body.get("status", "")) if isinstance(body, dict) else ""


def plan_list_page(
    queue: str, *, since_ms: int | None = None, until_ms: int | None = None,
    status: str | None = None, limit: int = 50, cursor: str | None = None,
) -> Plan[tuple[list[RequestSummary], str | None]]:
    params: dict[str, Any] = {"limit": limit}
    for key, value in (("since_ms", since_ms), ("until_ms", until_ms),
                       ("status", status), ("cursor", cursor)):
        if value is not None:
            params[key] = value
    body = yield "GET", f"/api/v1/queues/{queue}/requests", {"params": params}
    try:
        items = [RequestSummary.of(i) for i in body["items"]]
        return items, body.get("next_cursor") or None
    except (KeyError, TypeError):
        raise BadResponse(f"unexpected request list from the server: {body!r}") from None


def plan_requests(
    queue: str, *, since_ms: int | None = None, until_ms: int | None = None,
    status: str | None = None, max_items: int | None = None, page_size: int = 200,
) -> Plan[list[RequestSummary]]:
    found: list[RequestSummary] = []
    cursor: str | None = None
    while True:
        want = page_size if max_items is None else min(page_size, max_items - len(found))
        if want <= 0:
            return found
        items, cursor = yield from plan_list_page(
            queue, since_ms=since_ms, until_ms=until_ms, status=status, limit=want,
            cursor=cursor)
        found.extend(items)
        if cursor is None:
            return found


class GatewayClient:
    """The REST API of one gateway, async; ``token`` is sent as ``Authorization: Bearer``."""

    def __init__(self, base_url: str = DEFAULT_URL, *, token: str | None = None,
                 timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.AsyncClient(base_url=self.base_url, headers=headers,
                                       timeout=timeout)

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def run(self, plan: Plan[T]) -> T:
        """Make the calls ``plan`` asks for, one after another; what it returns."""
        body: Any = None
        try:
            while True:
                method, path, kw = plan.send(body)
                try:
                    r = await self._http.request(method, path, **kw)
                except httpx.TransportError as exc:
                    raise _unreachable(self.base_url, exc) from None
                body = _answer(self.base_url, method, path, r)
        except StopIteration as stop:
            return cast(T, stop.value)

    async def queues(self) -> list[QueueInfo]:
        return await self.run(plan_queues())

    async def land(self, queue: str, change_uris: Sequence[str],
                   strategy: str | None = None, idempotency_key: str | None = None) -> str:
        """Submit a stack of changes; the new request's sqid. With ``idempotency_key``
        a resend (after a lost answer) returns the first sqid instead of a 409."""
        return await self.run(plan_land(queue, change_uris, strategy, idempotency_key))

    async def summary(self, sqid: str) -> RequestSummary:
        return await self.run(plan_summary(sqid))

    async def waiting(self, sqid: str) -> list[str]:
        """What holds the live request up, one line each: a dependency that is down
        ("waiting: <dep> unreachable since <time>, retrying (next in 40 s)"), a stage
        retrying or dead-lettered or a stall (the view's ``health``, with the admin page's
        address when it needs an operator) and then its chance to land and ETA; empty when
        nothing holds it up."""
        return await self.run(plan_waiting(sqid, self.base_url))

    async def history(self, sqid: str) -> list[HistoryEntry]:
        """The request's history, oldest first."""
        return await self.run(plan_history(sqid))

    async def cancel(self, sqid: str, reason: str = "") -> str:
        """Ask to cancel; the status the server answers (``cancelling`` or terminal)."""
        return await self.run(plan_cancel(sqid, reason))

    async def requests(self, queue: str, *, since_ms: int | None = None,
                       status: str | None = None, max_items: int | None = None,
                       ) -> list[RequestSummary]:
        """A queue's requests newest first, following ``next_cursor`` up to ``max_items``."""
        return await self.run(plan_requests(queue, since_ms=since_ms, status=status,
                                            max_items=max_items))


class SyncGatewayClient:
    """``GatewayClient``'s calls, blocking: for a command that makes a few in a row."""

    def __init__(self, base_url: str = DEFAULT_URL, *, token: str | None = None,
                 timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout)

    def __enter__(self) -> SyncGatewayClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None,
                 exc: BaseException | None, tb: TracebackType | None) -> None:
        self._http.close()

    def run(self, plan: Plan[T]) -> T:
        """Make the calls ``plan`` asks for, one after another; what it returns."""
        body: Any = None
        try:
            while True:
                method, path, kw = plan.send(body)
                try:
                    r = self._http.request(method, path, **kw)
                except httpx.TransportError as exc:
                    raise _unreachable(self.base_url, exc) from None
                body = _answer(self.base_url, method, path, r)
        except StopIteration as stop:
            return cast(T, stop.value)
