"""Writes a request's ``SubmitQueue`` check-run (or commit status) on each of its pull
requests' heads (docs/github.md; the content is ``app/domain/checkrun.py``).

- **GitHub App credentials**: one check-run per (request, head): found by name
  ``SubmitQueue`` and ``external_id`` = the sqid, updated in place; created when there
  is none. A redelivery finds the run the last attempt created and updates it again
  with the same content. A request submitted again later (a new sqid) gets a check-run
  of its own: GitHub shows the newest run of a name.
- **A token**: GitHub lets only Apps create check-runs, so the queue adds a commit
  status of context ``SubmitQueue`` instead (the newest of a context is the one shown).
- **Removal comment** (``github.removal_comment: true``): once a request is removed,
  each of its pull requests gets one comment (``removal_comment``) unless one carrying
  the request's hidden marker is there already, so a redelivery comments nothing twice.
"""

from __future__ import annotations

from typing import Any

from app.domain.checkrun import (
    CHECK_NAME,
    CheckFacts,
    comment_marker,
    commit_status,
    pull_heads,
    removal_comment,
    render,
)
from app.extensions.github.client import GitHubClient


class CheckRunPublisher:
    def __init__(self, client: GitHubClient, *, comment_removals: bool = False) -> None:
        self.client = client
        self.comment_removals = comment_removals

    @property
    def uses_check_runs(self) -> bool:
        """An App writes check-runs; a token writes commit statuses."""
        return not self.client.creds.token

    def heads(self, facts: CheckFacts) -> list[tuple[int, str]]:
        cfg = self.client.config
        return pull_heads(facts.change_uris, cfg.host, cfg.repository)

    async def publish(self, facts: CheckFacts) -> int:
        """Bring every pull request head of ``facts`` up to date; how many heads."""
        heads = self.heads(facts)
        for _number, sha in heads:
            if self.uses_check_runs:
                await self._check_run(sha, facts)
            else:
                await self._status(sha, facts)
        text = removal_comment(facts) if self.comment_removals else None
        if text is not None:
            for number in dict.fromkeys(n for n, _ in heads):
                await self._comment(number, facts.sqid, text)
        return len(heads)

    async def _comment(self, number: int, sqid: str, text: str) -> None:
        marker = comment_marker(sqid)
        if any(marker in body for body in await self.client.comments(number)):
            return  # written by an earlier delivery
        await self.client.add_comment(number, text)

    async def _check_run(self, sha: str, facts: CheckFacts) -> None:
        draft = render(facts)
        body: dict[str, Any] = {
            "name": CHECK_NAME, "head_sha": sha, "external_id": facts.sqid,
            "details_url": draft.details_url, "status": draft.status,
            "output": {"title": draft.title, "summary": draft.summary, "text": draft.text},
        }
        if draft.conclusion is not None:
            body["conclusion"] = draft.conclusion
        runs = await self.client.check_runs_named(sha, CHECK_NAME)
        mine = [r.id for r in runs if r.external_id == facts.sqid]
        if not mine:
            await self.client.create_check_run(body)
            return
        body.pop("head_sha")
        await self.client.update_check_run(max(mine), body)

    async def _status(self, sha: str, facts: CheckFacts) -> None:
        draft = commit_status(facts)
        await self.client.create_status(sha, {
            "state": draft.state, "description": draft.description,
            "target_url": draft.target_url, "context": draft.context})
