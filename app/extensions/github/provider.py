"""The ``github`` change provider: pull requests (``github://{host}/{owner}/{repo}/pull/{n}/{head_sha}``).

Per change of a stack: read the pull request, its reviews (when the queue requires
approval) and its changed files (paged) through the queue's ``GitHubClient``, then
decide with ``refusal`` (pure) whether the queue may take it:

| Pull request | Answer |
|---|---|
| another host or repository than the queue's ``github`` block | refused: names the one it serves |
| not found (or not visible to our credentials) | refused: check the number and the App's installation |
| closed or merged | refused: reopen it, or it already landed |
| head moved since submission | refused ``stale:`` with the new head: submit that one |
| draft | refused: mark it ready for review |
| base is not the queue's target branch | refused: retarget it |
| ``mergeable: false`` (conflicts with the base) | refused: rebase or merge the base in |
| changes requested, or not approved while ``require_approval`` | refused: get an approving review |
| otherwise | details: the author (login), the title, every changed file with its additions and deletions (a rename under its new name) |

GitHub's own failures (5xx, timeouts, rate limits, refused credentials) propagate as
``GitHubUnavailable`` (retryable). ``mergeable: null`` (GitHub still computing it) is
not a refusal: the dry-run merge decides.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from app.domain.change_uri import ChangeURI, parse_change_uri
from app.domain.entities import ChangeDetails, ChangedFile
from app.domain.errors import ValidationError
from app.domain.github_config import GitHubConfig
from app.domain.github_resync import PullNow
from app.extensions.base import ChangeRejected
from app.extensions.github.client import GitHubClient, GitHubNotFound


@dataclass(frozen=True, slots=True)
class PullFacts:
    """What the refusal rule needs of a pull request (plain data, for a pure rule)."""

    number: int
    state: str  # open | closed
    merged: bool
    draft: bool
    head_sha: str
    base_ref: str
    mergeable: bool | None
    review_decision: str  # approved | changes_requested | review_required


def review_decision(reviews: Iterable[tuple[str, str]]) -> str:
    """GitHub's review decision from ``(reviewer login, state)`` in submission order:
    each reviewer's latest approving or blocking review counts (``COMMENTED`` changes
    nothing, ``DISMISSED`` withdraws); any ``CHANGES_REQUESTED`` -> changes_requested,
    else any ``APPROVED`` -> approved, else review_required."""
    latest: dict[str, str] = {}
    for login, state in reviews:
        state = state.upper()
        if state in ("APPROVED", "CHANGES_REQUESTED"):
            latest[login] = state
        elif state == "DISMISSED":
            latest.pop(login, None)
    if "CHANGES_REQUESTED" in latest.values():
        return "changes_requested"
    return "approved" if "APPROVED" in latest.values() else "review_required"


def refusal(pr: PullFacts, pinned_sha: str, *, target_branch: str,
            require_approval: bool) -> str | None:
    """Why the queue must not take this pull request at ``pinned_sha`` (None: it may)."""
    n = pr.number
    if pr.merged:
        return f"pull request #{n} is already merged; there is nothing left to land"
    if pr.state != "open":
        return f"pull request #{n} is closed; reopen it and submit it again"
    if pr.head_sha != pinned_sha:
        return (f"stale: pull request #{n}'s head is now {pr.head_sha}, not {pinned_sha}; "
                "submit the new head (or label the pull request again)")
    if pr.draft:
        return f"pull request #{n} is a draft; mark it ready for review, then submit it again"
    if pr.base_ref != target_branch:
        return (f"pull request #{n} targets {pr.base_ref!r}, but this queue lands on "
                f"{target_branch!r}; change its base branch, or use the queue of that branch")
    if pr.mergeable is False:
        return (f"pull request #{n} conflicts with {target_branch!r}; rebase it (or merge "
                f"{target_branch!r} into it) and submit the new head")
    if pr.review_decision == "changes_requested":
        return (f"pull request #{n} has changes requested; address them and get the "
                "reviewer's approval, then submit it again")
    if require_approval and pr.review_decision != "approved":
        return (f"pull request #{n} is not approved and this queue requires an approving "
                "review; get one, then submit it again")
    return None


def changed_files(entries: Iterable[tuple[str, int, int]]) -> tuple[ChangedFile, ...]:
    return tuple(ChangedFile(path, lines_added=a, lines_deleted=d) for path, a, d in entries)


class GitHubChangeProvider:
    def __init__(self, config: GitHubConfig, client: GitHubClient) -> None:
        self.config = config
        self.client = client

    async def permission(self, login: str) -> str:
        """``login``'s permission on the queue's repository (``RepositoryAccess``)."""
        return await self.client.permission(login)

    async def head(self, number: int) -> tuple[str, str]:
        """The pull request's current ``(head sha, base branch)`` (``PullRequests``)."""
        try:
            pr = await self.client.pull(number)
        except GitHubNotFound:
            raise ChangeRejected(f"pull request #{number} of {self.config.repository} was "
                                 "not found (or the queue's credentials cannot see it)") from None
        return pr.head.sha, pr.base.ref

    async def open_pulls(self) -> list[PullNow]:
        """Each open pull request into the target branch (``PullRequests``; the resync)."""
        pulls = await self.client.open_pulls(self.config.target_branch)
        return [PullNow(p.number, p.head.sha, p.base.ref, "open",
                        frozenset(lb.name for lb in p.labels), bool(p.draft)) for p in pulls]

    async def pull_now(self, number: int) -> PullNow | None:
        """The pull request as GitHub has it now; None when GitHub answers 404."""
        try:
            pr = await self.client.pull(number)
        except GitHubNotFound:
            return None
        state: Literal["open", "closed", "merged"] = (
            "merged" if pr.merged else "open" if pr.state == "open" else "closed")
        return PullNow(pr.number, pr.head.sha, pr.base.ref, state,
                       frozenset(lb.name for lb in pr.labels), bool(pr.draft))

    def _parse(self, uri: str) -> tuple[ChangeURI, int]:
        try:
            change = parse_change_uri(uri)
        except ValidationError as exc:
            raise ChangeRejected(str(exc)) from None
        want = f"github://{self.config.host}/{self.config.repository}"
        if change.scheme != "github" or (change.host, change.repo) != (
                self.config.host, self.config.repository):
            raise ChangeRejected(
                f"change {uri!r} is not a pull request of {self.config.repository} on "
                f"{self.config.host}; this queue takes {want}/pull/<number>/<head sha>")
        return change, int(change.raw.partition("?")[0].split("/")[-2])

    async def get(self, queue: str, change_uris: Sequence[str]) -> list[ChangeDetails]:
        parsed = [self._parse(uri) for uri in change_uris]
        return [await self._one(change, number) for change, number in parsed]

    async def _one(self, change: ChangeURI, number: int) -> ChangeDetails:
        try:
            pr = await self.client.pull(number)
        except GitHubNotFound:
            raise ChangeRejected(
                f"pull request #{number} of {self.config.repository} was not found; check "
                "the number, and that the queue's token or GitHub App can see the "
                "repository") from None
        decision = "review_required"
        if pr.state == "open" and not pr.merged:
            reviews = await self.client.reviews(number)
            decision = review_decision(
                (r.user.login if r.user else "", r.state) for r in reviews)
        facts = PullFacts(number=number, state=pr.state, merged=bool(pr.merged),
                          draft=bool(pr.draft), head_sha=pr.head.sha, base_ref=pr.base.ref,
                          mergeable=pr.mergeable, review_decision=decision)
        why = refusal(facts, change.sha or "", target_branch=self.config.target_branch,
                      require_approval=self.config.require_approval)
        if why is not None:
            raise ChangeRejected(why)
        files = await self.client.files(number)
        user = pr.user
        return ChangeDetails(
            uri=change.raw,
            author_name=user.login if user is not None else "",
            author_email="",
            title=pr.title[:500],
            changed_files=changed_files((f.filename, f.additions, f.deletions) for f in files),
        )
