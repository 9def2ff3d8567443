"""A fake GitHub for tests and the demo: an ASGI app over a real bare git repository.

Pull requests are refs (``refs/pull/<n>/head``, and the branch they came from), so
their head commits, changed files (``git diff --numstat -M`` from the merge base) and
mergeability (``git merge-tree``) are real. Held in memory: each pull request's title,
author, draft, state, labels, reviews, comments; collaborators' permissions;
check-runs and commit statuses. Served (REST version 2022-11-28; every answer is
built by ``fake_json`` to GitHub's OpenAPI description):

| Route | What it does |
|---|---|
| ``GET /repos/{o}/{r}/pulls/{n}`` | the pull request |
| ``GET /repos/{o}/{r}/pulls?state=&base=`` | pull requests, paged |
| ``PATCH /repos/{o}/{r}/pulls/{n}`` | ``state`` (close or reopen), ``title`` |
| ``POST /repos/{o}/{r}/issues/{n}/labels`` | ``{labels: [...]}``: adds labels |
| ``GET /repos/{o}/{r}/pulls/{n}/files``, ``.../reviews`` | paged (``per_page`` <= 100, ``page``; ``Link: rel="next"``) |
| ``GET /repos/{o}/{r}/collaborators/{login}/permission`` | 404 for a stranger, as GitHub |
| ``GET /repos/{o}/{r}/git/ref/heads/{branch}`` | the branch |
| ``DELETE /repos/{o}/{r}/git/refs/heads/{branch}`` | deletes the branch |
| ``PATCH /repos/{o}/{r}/git/refs/heads/{branch}`` | ``{sha, force}``: moves the real branch; without ``force`` only on a fast-forward (422 ``Update is not a fast forward`` otherwise) |
| ``GET``/``POST /repos/{o}/{r}/issues/{n}/comments`` | comments |
| ``POST /repos/{o}/{r}/check-runs``, ``PATCH .../check-runs/{id}``, ``GET .../commits/{ref}/check-runs?check_name=`` | check-runs; writing them takes an installation token (403 for the plain token, as GitHub refuses personal tokens) |
| ``POST /repos/{o}/{r}/statuses/{sha}``, ``GET .../commits/{ref}/statuses`` | commit statuses |
| ``GET /repos/{o}/{r}/installation``, ``POST /app/installations/{id}/access_tokens`` | GitHub App auth: the JWT must verify with the App's public key |
| ``.../rules/branches/{b}``, ``.../branches/{b}/protection/required_status_checks``, ``.../actions/runs`` | branch rules and workflow runs: ``fake_actions.py`` |

Every route needs ``Authorization: token <token>`` (or ``Bearer``) with the fake's
token or an installation token it issued: 401 otherwise. An ``X-GitHub-Api-Version``
other than 2022-11-28 is refused with 400, as GitHub refuses unknown versions.
``deliver`` sends a webhook delivery signed as GitHub signs them.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from app.domain.github_config import API_VERSION
from app.extensions.builds import sq_test
from app.extensions.github import fake_json as J
from app.extensions.github.fake_actions import FakeActions
from app.extensions.github.fake_git import BareRepo

SANDBOX_TEST = Path(sq_test.__file__)  # the sandbox repository's test, run by the fake CI


@dataclass
class FakePull:
    number: int
    title: str
    author: str
    head_ref: str
    base_ref: str
    head_sha: str
    body: str | None = None
    draft: bool = False
    state: str = "open"
    merged: bool = False
    labels: list[str] = field(default_factory=list)
    reviews: list[tuple[str, str, str]] = field(default_factory=list)  # login, state, sha
    comments: list[dict[str, Any]] = field(default_factory=list)
    mergeable_override: bool | None = None
    # filled per answer from the repository
    base_sha: str = ""
    mergeable: bool | None = None
    mergeable_state: str = "unknown"
    files: list[tuple[str, int, int, str, str | None]] = field(default_factory=list)

    @property
    def additions(self) -> int:
        return sum(f[1] for f in self.files)

    @property
    def deletions(self) -> int:
        return sum(f[2] for f in self.files)


def app_key_pair() -> tuple[str, str]:
    """A new RSA key pair in PEM (private PKCS#8, public SubjectPublicKeyInfo) for a
    fake GitHub App: the server signs its JWTs with the first, the fake verifies them
    with the second."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    return private, public


def signature(secret: bytes, body: bytes) -> str:
    """GitHub's ``X-Hub-Signature-256`` value for ``body``."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


class FakeGitHub:
    def __init__(self, repo_path: Path, *, owner: str = "acme", repo: str = "widgets",
                 token: str = "fake-token", default_branch: str = "main",
                 app_id: int = 4242, app_public_key: str = "",
                 installation_id: int = 77, prefix: str = "") -> None:
        self.repo = BareRepo(repo_path)
        self.owner, self.name = owner, repo
        self.full_name = f"{owner}/{repo}"
        self.default_branch = default_branch
        self.token = token
        self.app_id, self.app_public_key = app_id, app_public_key
        self.installation_id = installation_id
        self.base_url = "http://fake-github.invalid"  # set by whoever serves it
        self.pulls: dict[int, FakePull] = {}
        self.permissions: dict[str, str] = {}
        self.check_runs: list[dict[str, Any]] = []
        self.statuses: list[dict[str, Any]] = []
        self.api_versions: list[str] = []
        self.installation_tokens: dict[str, float] = {}
        # ref updates through the API: (ref, sha, force, answered status)
        self.ref_updates: list[tuple[str, str, bool, int]] = []
        # branch -> message: a ruleset refusing every API update of it (422)
        self.protected: dict[str, str] = {}
        # called with the branch just before an API ref update (a test moves it there)
        self.before_ref_update: Callable[[str], None] | None = None
        # simulated CI: check name -> conclusion for a commit pushed to a sq/ branch
        # (None: that check never starts); see simulate_ci
        self.ci: dict[str, Callable[[str], str | None]] = {}
        self.ci_on_pulls = False
        self.ci_output: dict[str, str] = {}  # sha -> the sandbox test's output
        self.ci_paused = False  # True: the simulated CI reports nothing (not started yet)
        self.check_listings: list[str] = []  # the shas whose check-runs were listed
        self._ids = 1000
        self._users: dict[str, int] = {}
        self._lock = threading.RLock()
        self.repo.init(default_branch)
        self.actions = FakeActions(self)  # branch rules and workflow runs
        # GitHub Enterprise Server serves the API under /api/v3: ``prefix="/api/v3"``
        routes: list[BaseRoute] = list(self._routes())
        self.app = Starlette(routes=[Mount(prefix, routes=routes)] if prefix else routes)

    # -- the test/demo side -------------------------------------------------------
    def next_id(self) -> int:
        with self._lock:
            self._ids += 1
            return self._ids

    def tip(self, branch: str | None = None) -> str:
        return self.repo.resolve(f"refs/heads/{branch or self.default_branch}") or ""

    def open_pull(self, files: dict[str, str | None], *, title: str = "A change",
                  author: str = "octocat", base: str | None = None, draft: bool = False,
                  branch: str | None = None, body: str | None = None) -> FakePull:
        """A new branch with one commit (``files``) on ``base``'s tip, and its pull request."""
        base = base or self.default_branch
        with self._lock:
            number = max(self.pulls, default=0) + 1
            branch = branch or f"change-{number}"
            sha = self.repo.commit(self.tip(base), files, title,
                                   author=f"{author} <{author}@example.com>")
            self.repo.set_ref(f"refs/heads/{branch}", sha)
            self.repo.set_ref(f"refs/pull/{number}/head", sha)
            pull = FakePull(number=number, title=title, author=author, head_ref=branch,
                            base_ref=base, head_sha=sha, draft=draft, body=body)
            self.pulls[number] = pull
            return pull

    def push(self, number: int, files: dict[str, str | None], message: str = "More") -> str:
        """A new commit on the pull request's head (a ``synchronize``); its sha."""
        with self._lock:
            pull = self.pulls[number]
            sha = self.repo.commit(pull.head_sha, files, message)
            self.repo.set_ref(f"refs/heads/{pull.head_ref}", sha)
            self.repo.set_ref(f"refs/pull/{number}/head", sha)
            pull.head_sha = sha
            return sha

    def simulate_ci(self, *names: str, verdict: Callable[[str], str | None] | None = None,
                    pulls: bool = False) -> None:
        """Report a completed check-run per name on every commit pushed to a ``sq/``
        branch (with ``pulls``, on every pull request's head too, as CI ``on:
        pull_request`` does), the first time its checks are asked for; ``verdict(sha)``
        is the conclusion (default: the sandbox's test, ``sq_test.py``, run in the
        commit's tree: ``failure`` when a file has a line ``BROKEN``; its output is the
        check's summary; None: the check never starts)."""
        self.ci = dict.fromkeys(names, verdict or self.sandbox_test)
        self.ci_on_pulls = pulls

    def sandbox_test(self, sha: str) -> str:
        """Run the sandbox's test in ``sha``'s tree: ``success`` or ``failure``."""
        with tempfile.TemporaryDirectory(prefix="fake-ci-") as tree:
            self.repo.export(sha, Path(tree))
            res = subprocess.run([sys.executable, str(SANDBOX_TEST)], cwd=tree,
                                 capture_output=True, text=True, timeout=120, check=False,
                                 env={"PATH": os.environ.get("PATH", ""),
                                      "PYTHONDONTWRITEBYTECODE": "1"})
        self.ci_output[sha] = (res.stdout + res.stderr)[-4000:]
        return "success" if res.returncode == 0 else "failure"

    def _run_ci(self, sha: str) -> None:
        if not self.ci or self.ci_paused:
            return
        where = ["refs/heads/sq/", *(["refs/pull/"] if self.ci_on_pulls else [])]
        tips = dict(line.split(" ", 1) for line in self.repo.out(
            "for-each-ref", "--format=%(objectname) %(refname)", *where).splitlines())
        if sha not in tips:
            return
        ref = tips[sha]
        branch = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
        with self._lock:
            made = []
            for name, decide in self.ci.items():
                if any(r["name"] == name and r["head_sha"] == sha for r in self.check_runs):
                    continue
                conclusion = decide(sha)
                if conclusion is not None:
                    made.append({
                        "id": self.next_id(), "name": name, "head_sha": sha,
                        "status": "completed", "conclusion": conclusion, "verdict": conclusion,
                        "details_url": f"{self.base_url}/ci/{name}/{sha}",
                        "title": f"{name}: {conclusion}",
                        "summary": self.ci_output.get(sha) or None})
            if made:
                self.actions.record(sha, branch, made)
                self.check_runs.extend(made)

    def review(self, number: int, login: str, state: str = "APPROVED") -> None:
        with self._lock:
            pull = self.pulls[number]
            pull.reviews.append((login, state, pull.head_sha))

    def user(self, login: str) -> dict[str, Any]:
        with self._lock:
            uid = self._users.setdefault(login, 100 + len(self._users))
        return J.user(self.base_url, login, uid)

    def repository(self) -> dict[str, Any]:
        return J.repository(self.base_url, self.user(self.owner), self.name, 1,
                            self.default_branch)

    def pull_json(self, number: int) -> dict[str, Any]:
        with self._lock:
            p = self.pulls[number]
            tip = self.tip(p.base_ref)
            if p.state == "open" and tip and self.repo.is_ancestor(p.head_sha, tip):
                p.state, p.merged = "closed", True  # pushed into its base, as GitHub sees it
            p.base_sha = self.repo.merge_base(tip, p.head_sha) or tip
            p.files = self.repo.numstat(p.base_sha, p.head_sha)
            clean = self.repo.merges_cleanly(tip, p.head_sha)
            p.mergeable = p.mergeable_override if p.mergeable_override is not None else clean
            p.mergeable_state = ("dirty" if p.mergeable is False else
                                 "draft" if p.draft else "clean")
            labels = [J.label(self.base_url, self.full_name, n, i + 1)
                      for i, n in enumerate(p.labels)]
            return J.pull_request(self.base_url, self.repository(), p, self.user(p.author),
                                  labels)

    # -- webhook deliveries -------------------------------------------------------
    def pull_request_event(self, number: int, action: str, *, sender: str = "octocat",
                           label: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"action": action, "number": number,
                               "pull_request": self.pull_json(number),
                               "repository": self.repository(), "sender": self.user(sender)}
        if label is not None:
            out["label"] = J.label(self.base_url, self.full_name, label, 1)
        return out

    def comment_event(self, number: int, body: str, *, sender: str) -> dict[str, Any]:
        pr = self.pull_json(number)
        issue = {k: pr[k] for k in ("url", "id", "node_id", "number", "title", "user",
                                    "labels", "state", "locked", "body", "created_at",
                                    "updated_at", "closed_at", "author_association")}
        issue["pull_request"] = {"url": pr["url"], "html_url": pr["html_url"],
                                 "diff_url": pr["diff_url"], "patch_url": pr["patch_url"]}
        cid = self.next_id()
        return {"action": "created", "issue": issue,
                "comment": J.comment(self.base_url, self.full_name, number, cid,
                                     self.user(sender), body),
                "repository": self.repository(), "sender": self.user(sender)}

    @staticmethod
    def signed(event: str, payload: dict[str, Any], secret: bytes,
               delivery: str | None = None) -> tuple[bytes, dict[str, str]]:
        body = json.dumps(payload).encode()
        return body, {"X-GitHub-Event": event, "X-GitHub-Delivery": delivery or str(uuid.uuid4()),
                      "X-Hub-Signature-256": signature(secret, body),
                      "Content-Type": "application/json", "User-Agent": "GitHub-Hookshot/fake"}

    async def deliver(self, url: str, event: str, payload: dict[str, Any], *, secret: bytes,
                      delivery: str | None = None,
                      transport: httpx.AsyncBaseTransport | None = None) -> httpx.Response:
        """POST one webhook delivery to ``url`` signed with ``secret``."""
        body, headers = self.signed(event, payload, secret, delivery)
        async with httpx.AsyncClient(transport=transport, timeout=10) as client:
            return await client.post(url, content=body, headers=headers)

    # -- the API side -------------------------------------------------------------
    def _routes(self) -> list[Route]:
        rp = "/repos/{owner}/{repo}"
        return [
            Route(f"{rp}/pulls", self._list_pulls, methods=["GET"]),
            Route(f"{rp}/pulls/{{n:int}}", self._get_pull, methods=["GET"]),
            Route(f"{rp}/pulls/{{n:int}}", self._update_pull, methods=["PATCH"]),
            Route(f"{rp}/issues/{{n:int}}/labels", self._add_labels, methods=["POST"]),
            Route(f"{rp}/pulls/{{n:int}}/files", self._files, methods=["GET"]),
            Route(f"{rp}/pulls/{{n:int}}/reviews", self._reviews, methods=["GET"]),
            Route(f"{rp}/collaborators/{{login}}/permission", self._permission),
            Route(f"{rp}/git/ref/heads/{{branch:path}}", self._get_ref, methods=["GET"]),
            Route(f"{rp}/git/refs/heads/{{branch:path}}", self._patch_ref, methods=["PATCH"]),
            Route(f"{rp}/git/refs/heads/{{branch:path}}", self._delete_ref, methods=["DELETE"]),
            Route(f"{rp}/issues/{{n:int}}/comments", self._comments, methods=["GET", "POST"]),
            Route(f"{rp}/check-runs", self._create_check_run, methods=["POST"]),
            Route(f"{rp}/check-runs/{{cid:int}}", self._update_check_run, methods=["PATCH"]),
            Route(f"{rp}/commits/{{ref}}/check-runs", self._list_check_runs, methods=["GET"]),
            Route(f"{rp}/statuses/{{sha}}", self._create_status, methods=["POST"]),
            Route(f"{rp}/commits/{{ref}}/statuses", self._list_statuses, methods=["GET"]),
            Route(f"{rp}/installation", self._installation, methods=["GET"]),
            Route("/app/installations/{iid:int}/access_tokens", self._access_token,
                  methods=["POST"]),
            *self.actions.routes(rp),
        ]

    @staticmethod
    def _error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"message": message,
                             "documentation_url": "https://docs.github.com/rest"}, status)

    def _refused(self, request: Request, *, app_jwt: bool = False) -> JSONResponse | None:
        version = request.headers.get("x-github-api-version")
        if version is not None:
            self.api_versions.append(version)
            if version != API_VERSION:
                return self._error(400, f"API version {version!r} is not supported.")
        scheme, _, cred = request.headers.get("authorization", "").partition(" ")
        if app_jwt:
            return None if scheme.lower() == "bearer" and self._jwt_ok(cred) else \
                self._error(401, "A JSON web token could not be decoded")
        ok = cred == self.token or self.installation_tokens.get(cred, 0) > time.time()
        if scheme.lower() not in ("token", "bearer") or not cred or not ok:
            return self._error(401, "Bad credentials")
        owner, repo = request.path_params.get("owner"), request.path_params.get("repo")
        if owner is not None and f"{owner}/{repo}" != self.full_name:
            return self._error(404, "Not Found")
        return None

    def _jwt_ok(self, token: str) -> bool:
        if not self.app_public_key:
            return False
        import jwt  # PyJWT, a dependency of githubkit's App auth

        try:
            claims = jwt.decode(token, self.app_public_key, algorithms=["RS256"])
        except jwt.PyJWTError:
            return False
        return str(claims.get("iss")) == str(self.app_id)

    def _pull(self, request: Request) -> FakePull | JSONResponse:
        refused = self._refused(request)
        if refused is not None:
            return refused
        pull = self.pulls.get(int(request.path_params["n"]))
        return pull if pull is not None else self._error(404, "Not Found")

    async def _get_pull(self, request: Request) -> Response:
        pull = self._pull(request)
        return pull if isinstance(pull, Response) else JSONResponse(self.pull_json(pull.number))

    async def _list_pulls(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        state = request.query_params.get("state", "open")
        base = request.query_params.get("base")
        with self._lock:
            chosen = [n for n, p in sorted(self.pulls.items())
                      if state in ("all", p.state) and base in (None, p.base_ref)]
        return self._paged(request, [self.pull_json(n) for n in chosen])

    async def _update_pull(self, request: Request) -> Response:
        pull = self._pull(request)
        if isinstance(pull, Response):
            return pull
        try:
            body = await request.json()
            state = body.get("state", pull.state)
        except (ValueError, AttributeError):
            return self._error(422, "Invalid request")
        if state not in ("open", "closed"):
            return self._error(422, f"state {state!r} is not open or closed")
        pull.state = state
        if "title" in body:
            pull.title = str(body["title"])
        return JSONResponse(self.pull_json(pull.number))

    async def _add_labels(self, request: Request) -> Response:
        pull = self._pull(request)
        if isinstance(pull, Response):
            return pull
        try:
            names = [str(n) for n in (await request.json())["labels"]]
        except (ValueError, KeyError, TypeError):
            return self._error(422, "Invalid request: labels is required")
        pull.labels += [n for n in names if n not in pull.labels]
        return JSONResponse([J.label(self.base_url, self.full_name, n, i + 1)
                             for i, n in enumerate(pull.labels)])

    def _paged(self, request: Request, items: list[Any]) -> Response:
        try:
            per_page = min(max(int(request.query_params.get("per_page", 30)), 1), 100)
            page = max(int(request.query_params.get("page", 1)), 1)
        except ValueError:
            return self._error(422, "per_page and page must be numbers")
        chunk = items[(page - 1) * per_page: page * per_page]
        headers = {}
        if page * per_page < len(items):
            nxt = request.url.include_query_params(page=page + 1, per_page=per_page)
            headers["Link"] = f'<{nxt}>; rel="next"'
        return JSONResponse(chunk, headers=headers)

    async def _files(self, request: Request) -> Response:
        pull = self._pull(request)
        if isinstance(pull, Response):
            return pull
        self.pull_json(pull.number)  # refresh files from the repository
        items = [J.diff_entry(self.base_url, self.full_name, pull.head_sha, *f)
                 for f in pull.files]
        return self._paged(request, items)

    async def _reviews(self, request: Request) -> Response:
        pull = self._pull(request)
        if isinstance(pull, Response):
            return pull
        items = [J.review(self.base_url, self.full_name, pull.number, i + 1, self.user(login),
                          state, sha) for i, (login, state, sha) in enumerate(pull.reviews)]
        return self._paged(request, items)

    async def _permission(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        login = request.path_params["login"]
        level = self.permissions.get(login)
        if level is None:
            return self._error(404, f"{login} is not a user")
        return JSONResponse(J.permission(self.base_url, self.user(login), level))

    async def _get_ref(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ref = f"refs/heads/{request.path_params['branch']}"
        sha = self.repo.resolve(ref)
        if sha is None:
            return self._error(404, "Not Found")
        return JSONResponse(J.git_ref(self.base_url, self.full_name, ref, sha))

    async def _patch_ref(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ref = f"refs/heads/{request.path_params['branch']}"
        try:
            body = await request.json()
            sha, force = str(body["sha"]), bool(body.get("force", False))
        except (ValueError, KeyError, TypeError):
            return self._error(422, "Invalid request: sha is required")
        branch = request.path_params["branch"]
        if self.before_ref_update is not None:
            self.before_ref_update(branch)
        answer = self._update_ref(ref, sha, force, self.protected.get(branch))
        self.ref_updates.append((ref, sha, force, answer.status_code))
        return answer

    def _update_ref(self, ref: str, sha: str, force: bool, protected: str | None) -> Response:
        with self._lock:
            old = self.repo.resolve(ref)
            if old is None:
                return self._error(422, "Reference does not exist")
            if not self.repo.has_commit(sha):
                return self._error(422, "Object does not exist")
            if protected is not None:
                return self._error(422, protected)
            if not force and not self.repo.is_ancestor(old, sha):
                return self._error(422, "Update is not a fast forward")
            if not self.repo.set_ref(ref, sha, old):
                return self._error(409, "Reference update failed")
            self._mark_merged(ref, sha)
        return JSONResponse(J.git_ref(self.base_url, self.full_name, ref, sha))

    async def _delete_ref(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        ref = f"refs/heads/{request.path_params['branch']}"
        if self.repo.resolve(ref) is None:
            return self._error(422, "Reference does not exist")
        self.repo.delete_ref(ref)
        return Response(status_code=204)

    def _mark_merged(self, ref: str, tip: str) -> None:
        for pull in self.pulls.values():
            if pull.state == "open" and f"refs/heads/{pull.base_ref}" == ref and \
                    self.repo.is_ancestor(pull.head_sha, tip):
                pull.state, pull.merged = "closed", True

    async def _comments(self, request: Request) -> Response:
        pull = self._pull(request)
        if isinstance(pull, Response):
            return pull
        if request.method == "GET":
            return self._paged(request, pull.comments)
        try:
            text = str((await request.json())["body"])
        except (ValueError, KeyError, TypeError):
            return self._error(422, "Invalid request: body is required")
        made = J.comment(self.base_url, self.full_name, pull.number, self.next_id(),
                         self.user("submitqueue[bot]"), text)
        pull.comments.append(made)
        return JSONResponse(made, 201)

    def _the_app(self) -> dict[str, Any]:
        return J.app(self.base_url, self.user(self.owner), self.app_id)

    def _app_only(self, request: Request) -> JSONResponse | None:
        """Writing check-runs takes an installation token, as on GitHub (403 for a
        personal token)."""
        refused = self._refused(request)
        if refused is not None:
            return refused
        cred = request.headers.get("authorization", "").partition(" ")[2]
        if cred not in self.installation_tokens:
            return self._error(403, "You must authenticate via a GitHub App.")
        return None

    async def _create_check_run(self, request: Request) -> Response:
        refused = self._app_only(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            run = {"id": self.next_id(), "name": str(body["name"]),
                   "head_sha": str(body["head_sha"]), "status": body.get("status", "queued")}
        except (ValueError, KeyError, TypeError):
            return self._error(422, "Invalid request: name and head_sha are required")
        run.update(self._run_fields(body))
        self.check_runs.append(run)
        return JSONResponse(J.check_run(self.base_url, self.full_name, run, self._the_app()), 201)

    @staticmethod
    def _run_fields(body: dict[str, Any]) -> dict[str, Any]:
        keys = ("status", "conclusion", "details_url", "external_id", "started_at",
                "completed_at")
        out: dict[str, Any] = {k: body[k] for k in keys if k in body}
        output = body.get("output") or {}
        out.update({k: output[k] for k in ("title", "summary", "text") if k in output})
        if out.get("conclusion") and "status" not in body:
            out["status"] = "completed"
        return out

    async def _update_check_run(self, request: Request) -> Response:
        refused = self._app_only(request)
        if refused is not None:
            return refused
        cid = int(request.path_params["cid"])
        run = next((r for r in self.check_runs if r["id"] == cid), None)
        if run is None:
            return self._error(404, "Not Found")
        try:
            run.update(self._run_fields(await request.json()))
        except (ValueError, TypeError):
            return self._error(422, "Invalid request")
        return JSONResponse(J.check_run(self.base_url, self.full_name, run, self._the_app()))

    def _sha_of(self, ref: str) -> str:
        return self.repo.resolve(ref) or ref

    async def _list_check_runs(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        sha = self._sha_of(request.path_params["ref"])
        self.check_listings.append(sha)
        self._run_ci(sha)
        name = request.query_params.get("check_name")
        runs = [J.check_run(self.base_url, self.full_name, r, self._the_app())
                for r in self.check_runs
                if r["head_sha"] == sha and (name is None or r["name"] == name)]
        return JSONResponse({"total_count": len(runs), "check_runs": runs})

    async def _create_status(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        try:
            body = await request.json()
            state = str(body["state"])
        except (ValueError, KeyError, TypeError):
            return self._error(422, "Invalid request: state is required")
        if state not in ("error", "failure", "pending", "success"):
            return self._error(422, f"state {state!r} is not one of error, failure, "
                               "pending, success")
        made = J.status(self.base_url, self.full_name, self.next_id(), self.user(self.owner),
                        state, str(body.get("context") or "default"), body.get("description"),
                        body.get("target_url"))
        self.statuses.append({**made, "sha": request.path_params["sha"]})
        return JSONResponse(made, 201)

    async def _list_statuses(self, request: Request) -> Response:
        refused = self._refused(request)
        if refused is not None:
            return refused
        sha = self._sha_of(request.path_params["ref"])
        items = [{k: v for k, v in s.items() if k != "sha"} for s in reversed(self.statuses)
                 if s["sha"] == sha]
        return self._paged(request, items)

    async def _installation(self, request: Request) -> Response:
        refused = self._refused(request, app_jwt=True)
        if refused is not None:
            return refused
        if f"{request.path_params['owner']}/{request.path_params['repo']}" != self.full_name:
            return self._error(404, "Not Found")
        return JSONResponse(J.installation(self.base_url, self.user(self.owner),
                                           self.installation_id, self.app_id))

    async def _access_token(self, request: Request) -> Response:
        refused = self._refused(request, app_jwt=True)
        if refused is not None:
            return refused
        if int(request.path_params["iid"]) != self.installation_id:
            return self._error(404, "Not Found")
        token = f"ghs_{secrets.token_hex(16)}"
        expires = time.time() + 3600
        self.installation_tokens[token] = expires
        return JSONResponse({"token": token, "expires_at": time.strftime(
            "%Y-%m-%dT%H:%M:%SZ", time.gmtime(expires))}, 201)
