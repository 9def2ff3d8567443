"""The GitHub REST client of a queue: githubkit, one pinned API version, no hidden retries.

- **Version**: every call goes through ``rest(API_VERSION)`` (``2022-11-28``), so it
  sends ``X-GitHub-Api-Version: 2022-11-28`` and its answer is parsed into that
  version's models (generated from GitHub's OpenAPI description): an answer that does
  not fit is an error, not a silently wrong value.
- **Auth**: a token (``token_env``) or a GitHub App (``app_id`` + ``private_key_env``):
  githubkit signs a JWT with the key (cached 8 min) and trades it for an installation
  token, cached (per client, i.e. per queue) until a minute before it expires, then
  fetched again. The installation
  is ``installation_id``, or looked up once per process for the repository.
- **Base URL**: ``api_url`` (GitHub Enterprise Server: ``https://<host>/api/v3``).
- **No client-side retries or HTTP cache** (``auto_retry=False``, ``http_cache=False``):
  the durable queue retries (with backoff, counting attempts) and a cached answer could
  hide a head that moved.

Errors: ``GitHubUnavailable`` (retryable; the ``github`` dependency in
``app/domain/outages.py``) for timeouts, transport errors, 5xx, 429, rate limits and
bad credentials (an operator fixes them; the work waits); ``GitHubNotFound`` for a
404/410 the caller turns into a refusal that names what is missing.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar, cast

import httpx
from githubkit import AppAuthStrategy, AppInstallationAuthStrategy, GitHub, TokenAuthStrategy
from githubkit.cache import MemCacheStrategy
from githubkit.exception import (
    GitHubException,
    RateLimitExceeded,
    RequestError,
    RequestFailed,
)
from githubkit_schemas.v2022_11_28.models import (
    CheckRun,
    DiffEntry,
    IssueComment,
    PullRequest,
    PullRequestReview,
    PullRequestSimple,
)

from app.domain.errors import ValidationError
from app.domain.github_config import API_VERSION, GitHubConfig
from app.extensions.github.checks import Check, from_status

PER_PAGE = 100
MAX_FILES = 3000  # GitHub lists at most 3000 files of a pull request
MAX_REVIEWS = 1000
MAX_OPEN_PULLS = 1000  # a resync reads at most this many open pull requests
MAX_RULES = 500  # rules of a branch read at most
MAX_COMMENTS = 3000  # comments of a pull request read at most
USER_AGENT = "SubmitQueue"

T = TypeVar("T")


class GitHubUnavailable(Exception):
    """GitHub did not answer usefully for want of itself or of our credentials: retry."""

    retryable = True
    dependency_kind = "github"


class GitHubNotFound(Exception):
    """GitHub answered 404 or 410 (missing, or not visible to our credentials)."""

    retryable = False


@dataclass(frozen=True, slots=True)
class Credentials:
    token: str = ""
    app_id: int | None = None
    private_key: str = ""
    installation_id: int | None = None


def credentials(config: GitHubConfig, queue: str) -> Credentials:
    """Read the secrets the ``github`` block names; ``ValidationError`` (start-up fails)
    naming the variable that is missing."""
    def env(key: str, name: str) -> str:
        value = os.environ.get(name, "")
        if not value.strip():
            raise ValidationError(
                f"queue {queue!r}: github.{key} names the environment variable {name}, "
                "which is not set or empty; export it before starting the server")
        return value

    if config.token_env:
        return Credentials(token=env("token_env", config.token_env).strip())
    return Credentials(app_id=config.app_id,
                       private_key=env("private_key_env", config.private_key_env),
                       installation_id=config.installation_id)


def _status_error(exc: RequestFailed) -> Exception:
    status = exc.response.status_code
    what = f"GitHub answered {status} to {exc.request.method} {exc.request.url.path}"
    if status in (404, 410):
        return GitHubNotFound(what)
    if isinstance(exc, RateLimitExceeded) or status in (408, 429) or status >= 500:
        return GitHubUnavailable(f"{what}; trying again later")
    if status in (401, 403):
        return GitHubUnavailable(
            f"{what}: the queue's credentials were refused or lack a permission (token: "
            "repo/pull requests read; App: contents, pull requests, checks, metadata); fix "
            "them, the work waits and is tried again")
    return exc


async def call(fn: Callable[[], Awaitable[T]]) -> T:
    """Run one githubkit call, translating its errors (module docstring)."""
    try:
        return await fn()
    except RequestFailed as exc:
        raise _status_error(exc) from exc
    except (RequestError, httpx.TransportError) as exc:
        raise GitHubUnavailable(f"GitHub could not be reached: {exc!r}") from exc
    except GitHubException as exc:  # e.g. an App key that cannot sign
        raise GitHubUnavailable(f"GitHub call failed: {exc!r}") from exc


class GitHubClient:
    """The calls the queue makes, for one repository (``config.repository``)."""

    def __init__(self, config: GitHubConfig, creds: Credentials, *,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.config = config
        self.creds = creds
        self._transport = transport
        self._installation_id = creds.installation_id
        self._gh: GitHub[Any] | None = None
        # this client's own token cache (githubkit's default is one per process, keyed by
        # app id and installation only, so two queues could share a token)
        self._cache = MemCacheStrategy()

    def _make(self, auth: Any) -> GitHub[Any]:
        return GitHub(auth, base_url=self.config.api_url + "/", user_agent=USER_AGENT,
                      timeout=self.config.timeout_s, http_cache=False, auto_retry=False,
                      async_transport=self._transport, cache_strategy=self._cache)

    async def _client(self) -> GitHub[Any]:
        if self._gh is not None:
            return self._gh
        if self.creds.token:
            self._gh = self._make(TokenAuthStrategy(self.creds.token))
            return self._gh
        app = AppAuthStrategy(self.creds.app_id, self.creds.private_key)
        if self._installation_id is None:
            as_app = self._make(app)
            inst = await call(lambda: as_app.rest(API_VERSION).apps.async_get_repo_installation(
                self.config.owner, self.config.repo))
            self._installation_id = inst.parsed_data.id
        self._gh = self._make(AppInstallationAuthStrategy(
            self.creds.app_id, self.creds.private_key, self._installation_id))
        return self._gh

    async def pull(self, number: int) -> PullRequest:
        gh = await self._client()
        res = await call(lambda: gh.rest(API_VERSION).pulls.async_get(
            self.config.owner, self.config.repo, number))
        return res.parsed_data

    async def _pages(self, fetch: Callable[[int], Awaitable[list[T]]], limit: int) -> list[T]:
        out: list[T] = []
        page = 1
        while len(out) < limit:
            items = await fetch(page)
            out.extend(items)
            if len(items) < PER_PAGE:
                break
            page += 1
        return out[:limit]

    async def files(self, number: int) -> list[DiffEntry]:
        """Every changed file of the pull request (paged, at most ``MAX_FILES``)."""
        gh = await self._client()

        async def page(n: int) -> list[DiffEntry]:
            res = await call(lambda: gh.rest(API_VERSION).pulls.async_list_files(
                self.config.owner, self.config.repo, number, per_page=PER_PAGE, page=n))
            return res.parsed_data

        return await self._pages(page, MAX_FILES)

    async def reviews(self, number: int) -> list[PullRequestReview]:
        gh = await self._client()

        async def page(n: int) -> list[PullRequestReview]:
            res = await call(lambda: gh.rest(API_VERSION).pulls.async_list_reviews(
                self.config.owner, self.config.repo, number, per_page=PER_PAGE, page=n))
            return res.parsed_data

        return await self._pages(page, MAX_REVIEWS)

    async def open_pulls(self, base: str) -> list[PullRequestSimple]:
        """The open pull requests into ``base`` (paged, at most ``MAX_OPEN_PULLS``)."""
        gh = await self._client()

        async def page(n: int) -> list[PullRequestSimple]:
            res = await call(lambda: gh.rest(API_VERSION).pulls.async_list(
                self.config.owner, self.config.repo, state="open", base=base,
                per_page=PER_PAGE, page=n))
            return res.parsed_data

        return await self._pages(page, MAX_OPEN_PULLS)

    async def branch_tip(self, branch: str) -> str | None:
        """The commit ``refs/heads/<branch>`` points at (None: no such branch)."""
        gh = await self._client()
        try:
            res = await call(lambda: gh.rest(API_VERSION).git.async_get_ref(
                self.config.owner, self.config.repo, f"heads/{branch}"))
        except GitHubNotFound:
            return None
        return res.parsed_data.object_.sha

    async def fast_forward(self, branch: str, sha: str) -> str | None:
        """Move ``branch`` to ``sha`` with ``force: false``: None when it moved, else
        GitHub's refusal (422: not a fast-forward, a ruleset or protection)."""
        gh = await self._client()
        try:
            await call(lambda: gh.rest(API_VERSION).git.async_update_ref(
                self.config.owner, self.config.repo, f"heads/{branch}", sha=sha, force=False))
        except RequestFailed as exc:
            if exc.response.status_code != 422:
                raise
            body = exc.response.raw_response.text[:300]
            return f"GitHub refused to move {branch} to {sha} (422): {body}"
        return None

    async def checks(self, sha: str) -> list[Check]:
        """Every check-run (first 100) and commit status (first 100) on ``sha``, oldest
        first."""
        gh = await self._client()
        runs = await call(lambda: gh.rest(API_VERSION).checks.async_list_for_ref(
            self.config.owner, self.config.repo, sha, filter_="all", per_page=PER_PAGE))
        statuses = await call(lambda: gh.rest(API_VERSION).repos
                              .async_list_commit_statuses_for_ref(
                                  self.config.owner, self.config.repo, sha, per_page=PER_PAGE))
        out = [Check(r.name, r.status == "completed", r.conclusion or "",
                     r.details_url or r.html_url or "")
               for r in sorted(runs.parsed_data.check_runs, key=lambda r: r.id)]
        out += [from_status(st.context, st.state, st.target_url or "")
                for st in reversed(statuses.parsed_data)]  # GitHub lists newest first
        return out

    async def required_checks(self, branch: str) -> tuple[tuple[str, ...], str]:
        """The check names GitHub requires on ``branch``: from the rulesets that apply to
        it (``GET .../rules/branches/{branch}``, every page; Metadata: read) and from its
        classic branch protection (``GET .../branches/{branch}/protection/
        required_status_checks``; Administration: read). Returns the names (rulesets'
        first, in GitHub's order) and a note: "" or why classic protection was not read
        (403: a missing permission). 404 from the protection: the branch has none."""
        gh = await self._client()
        rest = gh.rest(API_VERSION)
        o, r = self.config.owner, self.config.repo

        async def rules_page(n: int) -> list[Any]:
            res = await call(lambda: rest.repos.async_get_branch_rules(
                o, r, branch, per_page=PER_PAGE, page=n))
            return list(res.parsed_data)

        names: list[str] = []
        for rule in await self._pages(rules_page, MAX_RULES):
            if rule.type == "required_status_checks":
                names += [c.context for c in rule.parameters.required_status_checks]

        async def classic() -> Any:
            try:
                return await rest.repos.async_get_status_checks_protection(o, r, branch)
            except RequestFailed as exc:
                if exc.response.status_code == 403:
                    return None
                raise

        note = ""
        try:
            policy = await call(classic)
        except GitHubNotFound:
            policy = None
        else:
            if policy is None:
                note = (f"the classic branch protection of {branch} could not be read (403: "
                        "the App needs Administration: read, a token admin rights)")
        if policy is not None:
            names += list(policy.parsed_data.contexts)
            names += [c.context for c in policy.parsed_data.checks]
        return tuple(dict.fromkeys(names)), note

    async def check_runs_named(self, sha: str, name: str) -> list[CheckRun]:
        """The check-runs called ``name`` on ``sha`` (first 100, every attempt)."""
        gh = await self._client()
        res = await call(lambda: gh.rest(API_VERSION).checks.async_list_for_ref(
            self.config.owner, self.config.repo, sha, check_name=name, filter_="all",
            per_page=PER_PAGE))
        return list(res.parsed_data.check_runs)

    async def create_check_run(self, body: dict[str, Any]) -> int:
        """Create a check-run (``body`` as GitHub's REST API takes it); its id."""
        gh = await self._client()
        res = await call(lambda: gh.rest(API_VERSION).checks.async_create(
            self.config.owner, self.config.repo, data=cast(Any, body)))
        return res.parsed_data.id

    async def update_check_run(self, run_id: int, body: dict[str, Any]) -> None:
        gh = await self._client()
        await call(lambda: gh.rest(API_VERSION).checks.async_update(
            self.config.owner, self.config.repo, run_id, data=cast(Any, body)))

    async def create_status(self, sha: str, body: dict[str, Any]) -> None:
        """Add a commit status to ``sha`` (the newest of one context is the one shown)."""
        gh = await self._client()
        await call(lambda: gh.rest(API_VERSION).repos.async_create_commit_status(
            self.config.owner, self.config.repo, sha, data=cast(Any, body)))

    async def delete_branch(self, branch: str) -> None:
        """Delete ``refs/heads/<branch>`` (gone already: fine)."""
        gh = await self._client()
        try:
            await call(lambda: gh.rest(API_VERSION).git.async_delete_ref(
                self.config.owner, self.config.repo, f"heads/{branch}"))
        except GitHubNotFound:
            return
        except RequestFailed as exc:
            if exc.response.status_code != 422:  # 422: "Reference does not exist"
                raise

    async def cancel_workflow_runs(self, branch: str, sha: str) -> int:
        """Cancel the unfinished workflow runs of ``sha`` on ``branch`` (first 100; Actions:
        write); how many were cancelled. A run that completed meanwhile (409) is fine."""
        gh = await self._client()
        rest = gh.rest(API_VERSION)
        o, r = self.config.owner, self.config.repo
        res = await call(lambda: rest.actions.async_list_workflow_runs_for_repo(
            o, r, branch=branch, head_sha=sha, per_page=PER_PAGE))
        cancelled = 0
        for run in res.parsed_data.workflow_runs:
            if run.status == "completed":
                continue
            try:
                await call(partial(rest.actions.async_cancel_workflow_run, o, r, run.id))
            except RequestFailed as exc:
                if exc.response.status_code != 409:
                    raise
                continue
            cancelled += 1
        return cancelled

    async def comments(self, number: int) -> list[str]:
        """The bodies of the pull request's comments (paged, at most ``MAX_COMMENTS``)."""
        gh = await self._client()

        async def page(n: int) -> list[str]:
            res = await call(lambda: gh.rest(API_VERSION).issues.async_list_comments(
                self.config.owner, self.config.repo, number, per_page=PER_PAGE, page=n))
            items: list[IssueComment] = res.parsed_data
            return [c.body or "" for c in items]

        return await self._pages(page, MAX_COMMENTS)

    async def add_comment(self, number: int, body: str) -> None:
        gh = await self._client()
        await call(lambda: gh.rest(API_VERSION).issues.async_create_comment(
            self.config.owner, self.config.repo, number, body=body))

    async def close_landed(self, number: int, comment: str, label: str) -> None:
        """Comment on the pull request, label it and close it (it landed as other
        commits than its own: squashed or rebased)."""
        gh = await self._client()
        rest = gh.rest(API_VERSION)
        o, r = self.config.owner, self.config.repo
        await call(lambda: rest.issues.async_create_comment(o, r, number, body=comment))
        await call(lambda: rest.issues.async_add_labels(o, r, number, labels=[label]))
        await call(lambda: rest.pulls.async_update(o, r, number, state="closed"))

    async def permission(self, login: str) -> str:
        """``login``'s permission on the repository: admin, maintain, write, triage,
        read or none (404: not a collaborator -> none)."""
        gh = await self._client()
        try:
            res = await call(lambda: gh.rest(API_VERSION).repos
                             .async_get_collaborator_permission_level(
                                 self.config.owner, self.config.repo, login))
        except GitHubNotFound:
            return "none"
        role = getattr(res.parsed_data, "role_name", "") or ""
        return role if role in ("maintain", "triage") else res.parsed_data.permission
