"""A queue's ``notify:`` endpoints (``queues.yaml``; docs/notifications.md).

```yaml
notify:
  - name: team                         # 1-64 of [a-z0-9_-], unique in the queue
    url: https://hooks.example.com/sq  # or url_env: the variable holding the URL
    secret_env: SQ_NOTIFY_SECRET_TEAM  # the variable holding the HMAC secret
    events: [landed, removed, needs_operator]   # default: all three
    format: json                       # json (signed) | slack
    timeout_s: 10
```

Secrets (and URLs that carry one, such as Slack's) are named by environment variable,
never written here. ``json`` endpoints must be signed (``secret_env``); a ``slack``
endpoint may omit it (Slack does not check signatures; when set, the header is sent).
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.domain.text import ENV_NAME

_ENDPOINT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")

NotifyEvent = Literal["landed", "removed", "needs_operator"]


def check_url(url: str, where: str) -> str:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{where} must be an http:// or https:// address, not {url[:80]!r}")
    return url


class NotifyEndpointConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    url: str = ""
    url_env: str = ""
    secret_env: str = ""
    events: tuple[NotifyEvent, ...] = ("landed", "removed", "needs_operator")
    format: Literal["json", "slack"] = "json"
    timeout_s: float = Field(default=10.0, gt=0, le=120)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _ENDPOINT_NAME.match(v):
            raise ValueError(f"notify endpoint name {v!r} must be 1-64 of [a-z0-9_-], "
                             "starting with a letter or digit")
        return v

    @model_validator(mode="after")
    def _shape(self) -> NotifyEndpointConfig:
        where = f"notify endpoint {self.name!r}"
        if bool(self.url) == bool(self.url_env):
            raise ValueError(f"{where} needs exactly one of url (the address) or url_env "
                             "(the environment variable holding it)")
        if self.url:
            check_url(self.url, f"{where}: url")
        for key in ("url_env", "secret_env"):
            value = getattr(self, key)
            if value and not ENV_NAME.match(value):
                raise ValueError(f"{where}: {key} must name an environment variable (e.g. "
                                 f"SQ_NOTIFY_SECRET_TEAM), not hold the value itself")
        if self.format == "json" and not self.secret_env:
            raise ValueError(f"{where}: format json is signed; set secret_env to the name of "
                             "the environment variable holding the shared secret")
        if not self.events or len(set(self.events)) != len(self.events):
            raise ValueError(f"{where}: events must list each of landed, removed, "
                             "needs_operator at most once, and at least one")
        return self


def check_endpoints(endpoints: tuple[NotifyEndpointConfig, ...], queue: str) -> None:
    names = [e.name for e in endpoints]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"queue {queue!r}: notify endpoint {', '.join(twice)} is declared "
                         "twice; give each endpoint its own name")
