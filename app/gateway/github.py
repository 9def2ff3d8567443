"""GitHub's webhook into land and cancel requests, through the same gateway path as REST
(``landing.accept``, ``requests.cancel``). HTTP lives in ``app/api/github.py``.

1. **Signature.** ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>``,
   keyed with a queue's ``github.webhook_secret_env``; compared with
   ``hmac.compare_digest`` against every configured secret. Only the queues whose
   secret matched may be acted on. No match -> ``BadSignature`` (401).
2. **Deduplication.** The ``X-GitHub-Delivery`` id is claimed in ``github_deliveries``
   before anything is done (a redelivery is answered ``duplicate`` and changes
   nothing), settled with the outcome afterwards, and released again if acting
   failed (503), so that GitHub's "Redeliver" can try again.
3. **Intent** (``app/domain/github_events.py``, pure), per matched queue serving the
   payload's repository.
4. **Act.** A check event (``check_run``, ``check_suite``, ``status``) on a queue
   branch: the queue's ``github_checks`` runner reads that build's checks at its next
   poll (``checked``; nothing for another branch). A land: the change URI
   ``github://{host}/{repo}/pull/{n}/{head}`` (the current head, read through the API
   for a comment command) through
   ``landing.accept`` with the actor ``github:<login>``; a refusal the REST route would
   answer with a 4xx (already queued, already landed, quota) is reported in the
   outcome, not raised. A cancel: every live request of the queue whose changes
   include that URI, through ``requests.cancel`` with the reason. Comment commands
   first check the commenter's permission (write, maintain or admin) through the API.

**Resync**: ``app/gateway/github_resync.py`` (GitHub does not retry a lost delivery).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from app.db.repos import github_deliveries as deliveries
from app.db.repos import request_log
from app.domain.access import Principal, Scope
from app.domain.errors import (
    BadSignature,
    ChangeInFlight,
    ChangeLanded,
    ChangeRejected,
    QuotaExceeded,
    ServiceUnavailable,
    ValidationError,
)
from app.domain.github_config import GitHubConfig
from app.domain.github_events import Intent, checks_changed, intent
from app.domain.github_resync import PullNow
from app.domain.queue_config import QueueConfig
from app.domain.states import PublicStatus
from app.extensions.base import QueueExtensions
from app.gateway import landing
from app.gateway import requests as gateway
from app.gateway.landing import LandRuntime

log = logging.getLogger("submitqueue.gateway")

SIGNATURE_HEADER = "X-Hub-Signature-256"
_SIG = re.compile(r"^sha256=([0-9a-fA-F]{64})$")
_DELIVERY = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
_TERMINAL = frozenset(s.value for s in PublicStatus if s.terminal)
WRITE = frozenset({"admin", "maintain", "write"})


@runtime_checkable
class PullRequests(Protocol):
    """What the webhook asks of a queue's ``github`` change provider."""

    async def permission(self, login: str) -> str: ...

    async def head(self, number: int) -> tuple[str, str]:
        """The pull request's current ``(head sha, base branch)``."""
        ...

    async def open_pulls(self) -> list[PullNow]:
        """The open pull requests into the target branch."""
        ...

    async def pull_now(self, number: int) -> PullNow | None:
        """The pull request now (None: 404)."""
        ...


@runtime_checkable
class ChecksRunner(Protocol):
    """What a check webhook asks of a queue's ``github_checks`` build runner."""

    async def nudge(self, branches: Sequence[str]) -> int: ...


class _Extensions(Protocol):
    def for_queue(self, name: str) -> QueueExtensions: ...


class GitHubRuntime(LandRuntime, Protocol):
    """What the webhook needs (the composition root's ``Runtime`` offers it)."""

    @property
    def queues(self) -> Mapping[str, QueueConfig]: ...

    @property
    def extensions(self) -> _Extensions: ...


@dataclass
class Outcome:
    queue: str
    action: str  # landed | cancelled | refused | ignored | checked
    detail: str
    sqids: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"queue": self.queue, "action": self.action, "detail": self.detail,
                "sqids": self.sqids}


@dataclass
class WebhookResult:
    delivery: str
    event: str
    duplicate: bool = False
    outcomes: list[Outcome] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"delivery": self.delivery, "event": self.event, "duplicate": self.duplicate,
                "outcomes": [o.to_json() for o in self.outcomes]}


def signed_queues(configs: Mapping[str, QueueConfig], body: bytes,
                  header: str | None) -> list[str]:
    """The queues whose webhook secret signed ``body`` (``BadSignature`` if none did)."""
    keyed = [(name, os.environ.get(cfg.github.webhook_secret_env, ""))
             for name, cfg in configs.items()
             if cfg.github is not None and cfg.github.webhook_secret_env]
    keyed = [(name, secret) for name, secret in keyed if secret]
    if not keyed:
        raise BadSignature("no queue takes GitHub webhooks: set github.webhook_secret_env in "
                           "queues.yaml to the variable holding the webhook's secret, and "
                           "export it")
    m = _SIG.match((header or "").strip())
    if m is None:
        raise BadSignature(f"the {SIGNATURE_HEADER} header is missing or malformed; GitHub "
                           "sends sha256=<64 hex digits> when the webhook has a secret: set "
                           "the same secret on the webhook as in the queue's "
                           "github.webhook_secret_env")
    given = m.group(1).lower().encode()
    matched = []
    for name, secret in keyed:  # every secret is compared, in constant time each
        mac = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest().encode()
        if hmac.compare_digest(mac, given):
            matched.append(name)
    if not matched:
        raise BadSignature(f"the {SIGNATURE_HEADER} signature does not match any queue's "
                           "webhook secret: the webhook's secret must equal the value of the "
                           "queue's github.webhook_secret_env, and the body must arrive as "
                           "GitHub sent it")
    return matched


def parse_body(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValidationError("the webhook body is not JSON; set the webhook's content type "
                              "to application/json") from None


def check_delivery(delivery: str | None) -> str:
    if delivery is None or not _DELIVERY.match(delivery):
        raise ValidationError("the X-GitHub-Delivery header is missing or not an id (1-100 "
                              "of [A-Za-z0-9._:-]); GitHub sends one with every delivery")
    return delivery


def change_uri(config: GitHubConfig, number: int, head: str) -> str:
    return f"github://{config.host}/{config.repository}/pull/{number}/{head}"


async def handle(runtime: GitHubRuntime, *, event: str, delivery: str | None, body: bytes,
                 signature: str | None) -> WebhookResult:
    """Verify, deduplicate and act on one delivery (module docstring)."""
    matched = signed_queues(runtime.queues, body, signature)
    delivery = check_delivery(delivery)
    payload = parse_body(body)
    result = WebhookResult(delivery=delivery, event=event)
    async with runtime.db.write() as s:
        fresh = await deliveries.claim(s, delivery_id=delivery, event=event[:50],
                                       now_ms=runtime.broker.clock())
    if not fresh:
        result.duplicate = True
        return result
    try:
        for name in matched:
            outcome = await _for_queue(runtime, name, event, payload)
            if outcome is not None:
                result.outcomes.append(outcome)
    except BaseException:
        async with runtime.db.write() as s:
            await deliveries.release(s, delivery_id=delivery)
        raise
    summary = "; ".join(f"{o.queue}: {o.action} ({o.detail})" for o in result.outcomes)
    async with runtime.db.write() as s:
        await deliveries.settle(s, delivery_id=delivery, outcome=summary or "nothing to do")
    return result


async def _for_queue(runtime: GitHubRuntime, name: str, event: str,
                     payload: Any) -> Outcome | None:
    try:
        return await _act(runtime, name, event, payload)
    except ChangeRejected as exc:
        return Outcome(name, "refused", str(exc))
    except Exception as exc:
        if getattr(exc, "dependency_kind", None) != "github":
            raise
        raise ServiceUnavailable(f"GitHub did not answer ({exc}); nothing was done: "
                                 "redeliver the webhook once GitHub answers") from exc


async def _act(runtime: GitHubRuntime, name: str, event: str, payload: Any) -> Outcome | None:
    config = runtime.queues[name]
    gh = config.github
    assert gh is not None  # signed_queues only names queues with a github block
    changed = checks_changed(event, payload)  # InvalidPayload: 400
    if changed is not None:
        return await _checks(runtime, name, gh, changed.repository, changed.branches)
    wanted = intent(event, payload, land_label=gh.land_label)  # InvalidPayload: 400
    if wanted is None:
        return None
    if wanted.repository.lower() != gh.repository.lower():
        return Outcome(name, "ignored", f"this queue serves {gh.repository}, not "
                                        f"{wanted.repository}")
    provider = runtime.extensions.for_queue(name).provider
    if not isinstance(provider, PullRequests):
        return Outcome(name, "ignored", "the queue's change provider is not github")
    if wanted.needs_write:
        level = await provider.permission(wanted.sender)
        if level not in WRITE:
            return Outcome(name, "refused", f"@{wanted.sender} has {level} access to "
                           f"{gh.repository}; /submitqueue commands need write access")
    if wanted.action == "land":
        return await land_intent(runtime, name, config, gh, wanted, provider)
    return await _cancel(runtime, name, gh, wanted, provider)


async def _checks(runtime: GitHubRuntime, name: str, gh: GitHubConfig, repository: str,
                  branches: tuple[str, ...]) -> Outcome | None:
    """A check changed on ``branches``: the queue's builds on them ask GitHub now. No
    outcome when none is the queue's (CI reports on every branch)."""
    runner = runtime.extensions.for_queue(name).runner
    if repository.lower() != gh.repository.lower() or not isinstance(runner, ChecksRunner):
        return None
    woken = await runner.nudge(branches)
    if not woken:
        return None
    return Outcome(name, "checked", f"{woken} build{'s' if woken != 1 else ''} on "
                                    f"{', '.join(branches)} read GitHub's checks now")


async def land_intent(runtime: GitHubRuntime, name: str, config: QueueConfig, gh: GitHubConfig,
                wanted: Intent, provider: PullRequests) -> Outcome:
    head, base = wanted.head_sha, wanted.base_ref
    if not head:
        head, base = await provider.head(wanted.number)
    if base != gh.target_branch:
        return Outcome(name, "ignored", f"pull request #{wanted.number} targets {base!r}; "
                                        f"this queue lands on {gh.target_branch!r}")
    uri = change_uri(gh, wanted.number, head)
    try:
        landed = await landing.accept(runtime, queue=name, config=config, change_uris=[uri],
                                      strategy=None, key=None, origin=wanted.via,
                                      actor=f"github:{wanted.sender}"[:100])
    except (ChangeInFlight, ChangeLanded, QuotaExceeded, ValidationError) as exc:
        return Outcome(name, "refused", str(exc))
    return Outcome(name, "landed", f"pull request #{wanted.number} at {head[:12]} queued",
                   [landed.sqid])


async def _cancel(runtime: GitHubRuntime, name: str, gh: GitHubConfig, wanted: Intent,
                  provider: PullRequests) -> Outcome:
    head = wanted.head_sha or (await provider.head(wanted.number))[0]
    uri = change_uri(gh, wanted.number, head)
    async with runtime.db.read() as s:
        found = await request_log.summaries_by_change_uri(s, queue=name, change_uri=uri)
    live = [r.request_id for r in found if r.status not in _TERMINAL]
    if not live:
        return Outcome(name, "ignored", f"no live request carries pull request "
                                        f"#{wanted.number} at {head[:12]}")
    caller = Principal(actor=f"github:{wanted.sender}"[:100],
                       scopes=frozenset({Scope.CANCEL_ANY}))
    for sqid in live:
        await gateway.cancel(runtime, queue=name, sqid=sqid, reason=wanted.reason,
                             caller=caller)
    return Outcome(name, "cancelled", wanted.reason, live)
