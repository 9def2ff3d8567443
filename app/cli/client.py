"""A small async client for the gateway's REST API (``/api/v1``), used by the CLI and
the demo.

```python
async with GatewayClient("http://127.0.0.1:8000", token=os.environ.get("SQ_TOKEN")) as gw:
    sqid = await gw.land("sandbox", [uri])
    summary = await gw.summary(sqid)          # RequestSummary
    events = await gw.history(sqid)           # [HistoryEntry], oldest first
```

Every failure is a ``ClientError`` whose ``exit_code`` the CLI returns:

| Failure | Class | exit_code |
|---|---|---|
| the server answered 4xx (its JSON message is kept) | ``ApiError`` | 1 |
| the server answered 5xx | ``ApiError`` | 2 |
| no connection, timeout, TLS failure | ``Unreachable`` | 2 |
| the answer is not the API's JSON (another service on that port?) | ``BadResponse`` | 2 |
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

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
                       submitted_by=str(body.get("submitted_by") or ""))
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


class GatewayClient:
    """The REST API of one gateway; ``token`` is sent as ``Authorization: Bearer``."""

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

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = await self._http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise Unreachable(self.base_url, str(exc) or type(exc).__name__) from None
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
            raise BadResponse(f"{method} {self.base_url}{path} answered {r.status_code} without "
                              "JSON; is --url the SubmitQueue server?")
        return body

    async def queues(self) -> list[QueueInfo]:
        body = await self._call("GET", "/api/v1/queues")
        try:
            return [QueueInfo(name=str(q["name"]), description=str(q.get("description", "")),
                              counts=dict(q.get("counts") or {})) for q in body["items"]]
        except (KeyError, TypeError) as exc:
            raise BadResponse(f"unexpected queue list from the server: {exc!r}") from None

    async def land(self, queue: str, change_uris: Sequence[str],
                   strategy: str | None = None, idempotency_key: str | None = None) -> str:
        """Submit a stack of changes; the new request's sqid. With ``idempotency_key``
        a resend (after a lost answer) returns the first sqid instead of a 409."""
        payload: dict[str, Any] = {"change_uris": list(change_uris)}
        if strategy:
            payload["strategy"] = strategy
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = await self._call("POST", f"/api/v1/queues/{queue}/requests", json=payload,
                                headers=headers)
        try:
            return str(body["sqid"])
        except (KeyError, TypeError):
            raise BadResponse(f"land answered without a sqid: {body!r}") from None

    async def summary(self, sqid: str) -> RequestSummary:
        queue, n = split_sqid(sqid)
        return RequestSummary.of(await self._call("GET", f"/api/v1/queues/{queue}/requests/{n}"))

    async def waiting(self, sqid: str) -> list[str]:
        """What the live request waits for while a dependency is down ("waiting: <dep>
        unreachable since <time>, retrying (next in 40 s)"); empty when nothing is."""
        queue, n = split_sqid(sqid)
        body = await self._call("GET", f"/api/v1/queues/{queue}/requests/{n}/view")
        outages = body.get("outages") if isinstance(body, dict) else None
        return [str(o["text"]) for o in outages or [] if isinstance(o, dict) and "text" in o]

    async def history(self, sqid: str) -> list[HistoryEntry]:
        queue, n = split_sqid(sqid)
        body = await self._call("GET", f"/api/v1/queues/{queue}/requests/{n}/history")
        try:
            return [HistoryEntry.of(e) for e in body["events"]]
        except (KeyError, TypeError):
            raise BadResponse(f"unexpected history from the server: {body!r}") from None

    async def cancel(self, sqid: str, reason: str = "") -> str:
        """Ask to cancel; the status the server answers (``cancelling`` or terminal)."""
        queue, n = split_sqid(sqid)
        body = await self._call("POST", f"/api/v1/queues/{queue}/requests/{n}/cancel",
                                json={"reason": reason})
        return str(body.get("status", "")) if isinstance(body, dict) else ""

    async def list_page(
        self, queue: str, *, since_ms: int | None = None, until_ms: int | None = None,
        status: str | None = None, limit: int = 50, cursor: str | None = None,
    ) -> tuple[list[RequestSummary], str | None]:
        """One page of a queue's requests, newest first, and the cursor of the next."""
        params: dict[str, Any] = {"limit": limit}
        for key, value in (("since_ms", since_ms), ("until_ms", until_ms),
                           ("status", status), ("cursor", cursor)):
            if value is not None:
                params[key] = value
        body = await self._call("GET", f"/api/v1/queues/{queue}/requests", params=params)
        try:
            items = [RequestSummary.of(i) for i in body["items"]]
            return items, body.get("next_cursor") or None
        except (KeyError, TypeError):
            raise BadResponse(f"unexpected request list from the server: {body!r}") from None

    async def iter_requests(
        self, queue: str, *, since_ms: int | None = None, until_ms: int | None = None,
        status: str | None = None, max_items: int | None = None, page_size: int = 200,
    ) -> AsyncIterator[RequestSummary]:
        """A queue's requests newest first, following ``next_cursor`` up to ``max_items``."""
        cursor: str | None = None
        seen = 0
        while True:
            want = page_size if max_items is None else min(page_size, max_items - seen)
            if want <= 0:
                return
            items, cursor = await self.list_page(queue, since_ms=since_ms, until_ms=until_ms,
                                                 status=status, limit=want, cursor=cursor)
            for item in items:
                yield item
            seen += len(items)
            if cursor is None:
                return
