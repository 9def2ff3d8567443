"""The webhook sink of a queue's ``notify:`` endpoint: POSTs a notification's bytes.

```text
POST <url>
Content-Type: application/json
X-SubmitQueue-Event: landed | removed | needs_operator
X-SubmitQueue-Delivery: <log id>/<endpoint>          (the same on every attempt)
X-SubmitQueue-Signature: t=<unix s>,v1=<hex HMAC-SHA256 of "<t>.<delivery id>.<body>">
```

The signature is the build callbacks' scheme (``app/extensions/builds/signature.py``)
with the delivery id in the build id's place; it is sent when the endpoint has a
secret (always for ``format: json``). Redirects are not followed.

| Answer | Raises | The queue then |
|---|---|---|
| 2xx | nothing | acks |
| 408, 429, 5xx (not 501/505); timeout; connection refused/reset; DNS | ``NotificationFailed(retryable=True)`` | retries with the topic's backoff, then ``notify_dlq`` |
| any other status (3xx, 4xx, 501, 505) | ``NotificationFailed(retryable=False)`` | ``notify_dlq`` at once |

Errors name the endpoint and its host only: a URL's path may hold a token (Slack's does).
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import time
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from app.domain.errors import NotificationFailed
from app.extensions.builds.signature import SIGNATURE_HEADER, sign

DELIVERY_HEADER = "X-SubmitQueue-Delivery"
EVENT_HEADER = "X-SubmitQueue-Event"


def host_of(url: str) -> str:
    """``https://hooks.example.com/…``: how an endpoint appears in logs and errors."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}/…"


def _retryable(code: int) -> bool:
    return code in (408, 429) or (code >= 500 and code not in (501, 505))


class WebhookSink:
    """One endpoint of one queue."""

    def __init__(self, *, queue: str, name: str, url: str, secret: str,
                 events: frozenset[str], fmt: str, timeout_s: float,
                 public_url: str = "http://127.0.0.1:8000",
                 clock: Callable[[], float] = time.time,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.queue = queue
        self.name = name
        self.url = url
        self._secret = secret.encode()
        self.events = events
        self.format = fmt
        self.timeout_s = timeout_s
        self.public_url = public_url  # the request pages' links start with it
        self.clock = clock
        self._transport = transport

    @property
    def signed(self) -> bool:
        return bool(self._secret)

    def headers(self, delivery_id: str, event: str, body: bytes) -> dict[str, str]:
        out = {"content-type": "application/json", "user-agent": "SubmitQueue",
               DELIVERY_HEADER: delivery_id, EVENT_HEADER: event}
        if self._secret:
            out[SIGNATURE_HEADER] = sign(self._secret, delivery_id, body, t=int(self.clock()))
        return out

    async def send(self, *, delivery_id: str, event: str, body: bytes) -> int:
        """POST ``body``; the status code on success, else ``NotificationFailed``."""
        where = f"notify endpoint {self.name!r} of queue {self.queue!r} ({host_of(self.url)})"
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s, transport=self._transport,
                                         follow_redirects=False) as client:
                response = await client.post(self.url, content=body,
                                             headers=self.headers(delivery_id, event, body))
        except httpx.HTTPError as exc:
            raise NotificationFailed(f"{where} could not be reached: {type(exc).__name__}: "
                                     f"{exc}"[:500], retryable=True) from exc
        code = response.status_code
        if response.is_success:
            return code
        answer = " ".join(response.text.split())[:200]
        retry = _retryable(code)
        then = "it will be sent again" if retry else \
            "not retried (a permanent answer): fix the endpoint, then requeue it from /admin"
        raise NotificationFailed(f"{where} answered HTTP {code}: {answer or '(no body)'}; "
                                 f"{then}", retryable=retry)
