"""The ``github-resync`` job: converge each ``github`` queue on its pull requests.

GitHub does not retry a delivery that failed or was lost, so every
``SQ_GITHUB_RESYNC_MS`` each queue with a ``github`` block (and the ``github`` change
provider) lists its open pull requests into the target branch (one paged listing) and:

1. **Lands** each ready one that carries ``land_label`` at a head the queue never saw
   (no request ever carried that change URI), through ``landing.accept`` as a delivered
   ``labeled`` would (origin ``label``). A head submitted before is left alone whatever
   became of it (a failed build is not paid for again every interval; a new push or a
   new label is a new submission); a race with a delivery is settled by the change
   claim.
2. **Cancels** each live request (at most ``MAX_LIVE`` per queue, oldest first) that a
   lost ``unlabeled``, ``synchronize`` or ``closed`` would have cancelled, by the rules
   of ``app/domain/github_resync.py`` (a pull request missing from the listing is read
   on its own, to tell closed from merged), through ``requests.cancel`` with the actor
   ``github:submitqueue-resync``.

A resync that finds nothing lost changes nothing, and several processes may run it at
once (the claims and the cancel's stable message id settle races). One queue's GitHub
trouble is logged and does not stop the others.
"""

from __future__ import annotations

import logging

from app.db.repos import request_log
from app.domain.access import Principal, Scope
from app.domain.checkrun import pull_heads
from app.domain.github_config import GitHubConfig
from app.domain.github_events import Intent
from app.domain.github_resync import CANCELLABLE, PullNow, Queued, lost_cancel
from app.gateway import requests as gateway
from app.gateway.github import GitHubRuntime, Outcome, PullRequests, change_uri, land_intent

log = logging.getLogger("submitqueue.gateway")
RESYNC_ACTOR = "github:submitqueue-resync"
MAX_LIVE = 1000


class GitHubResync:
    """``run`` returns the outcomes per queue (for tests and logs)."""

    def __init__(self, runtime: GitHubRuntime) -> None:
        self.runtime = runtime

    def queues(self) -> list[str]:
        return [name for name, cfg in self.runtime.queues.items() if cfg.github is not None
                and cfg.change_provider.type == "github"]

    async def run(self) -> dict[str, list[Outcome]]:
        out: dict[str, list[Outcome]] = {}
        for name in self.queues():
            try:
                out[name] = await self._queue(name)
            except Exception as exc:  # one queue's GitHub trouble must not stop the others
                if getattr(exc, "dependency_kind", None) != "github":
                    raise
                log.warning("github resync: GitHub did not answer", exc_info=exc,
                            extra={"queue": name})
        return out

    async def _queue(self, name: str) -> list[Outcome]:
        gh = self.runtime.queues[name].github
        assert gh is not None
        provider = self.runtime.extensions.for_queue(name).provider
        if not isinstance(provider, PullRequests):
            return []
        pulls = await provider.open_pulls()
        outcomes = [await self._land(name, gh, provider, p) for p in pulls
                    if not p.draft and gh.land_label in p.labels]
        return outcomes + await self._cancel(name, gh, provider,
                                             {p.number: p for p in pulls})

    async def _land(self, name: str, gh: GitHubConfig, provider: PullRequests,
                    pull: PullNow) -> Outcome:
        uri = change_uri(gh, pull.number, pull.head)
        async with self.runtime.db.read() as s:
            seen = await request_log.summaries_by_change_uri(s, queue=name, change_uri=uri,
                                                             limit=1)
        if seen:  # this head was submitted before (whatever became of it): not lost
            return Outcome(name, "ignored", f"pull request #{pull.number} at "
                           f"{pull.head[:12]} was submitted before as "
                           f"{seen[0].request_id} ({seen[0].status})")
        wanted = Intent("land", gh.repository, pull.number, "submitqueue-resync",
                        head_sha=pull.head, base_ref=pull.base, via="label")
        outcome = await land_intent(self.runtime, name, self.runtime.queues[name], gh,
                                    wanted, provider)
        if outcome.action == "landed":
            log.info("github resync landed a pull request a lost delivery left out",
                     extra={"queue": name, "sqid": outcome.sqids[0]})
        return outcome

    async def _cancel(self, name: str, gh: GitHubConfig, provider: PullRequests,
                      open_now: dict[int, PullNow]) -> list[Outcome]:
        async with self.runtime.db.read() as s:
            live = await request_log.summaries_in(s, queue=name, statuses=CANCELLABLE,
                                                  limit=MAX_LIVE)
        caller = Principal(actor=RESYNC_ACTOR, scopes=frozenset({Scope.CANCEL_ANY}))
        read: dict[int, PullNow | None] = dict(open_now)
        outcomes = []
        for summary in live:
            queued = _queued(summary.request_id, summary.status, summary.change_uris,
                             str(summary.metadata.get("origin", "")), gh)
            if queued is None:
                continue  # not one pull request of this repository (e.g. a REST stack)
            if queued.number not in read:
                read[queued.number] = await provider.pull_now(queued.number)
            reason = lost_cancel(queued, read[queued.number], target=gh.target_branch,
                                 land_label=gh.land_label)
            if reason is None:
                continue
            await gateway.cancel(self.runtime, queue=name, sqid=queued.sqid, reason=reason,
                                 caller=caller)
            log.info("github resync cancelled a request a lost delivery left queued",
                     extra={"queue": name, "sqid": queued.sqid, "reason": reason})
            outcomes.append(Outcome(name, "cancelled", reason, [queued.sqid]))
        return outcomes


def _queued(sqid: str, status: str, uris: tuple[str, ...], origin: str,
            gh: GitHubConfig) -> Queued | None:
    """The request as one pull request at one head of ``gh``'s repository, or None."""
    heads = pull_heads(uris, gh.host, gh.repository)
    if len(uris) != 1 or len(heads) != 1:
        return None
    number, head = heads[0]
    return Queued(sqid, number, head, status, origin)
