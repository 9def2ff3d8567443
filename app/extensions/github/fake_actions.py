"""The fake GitHub's branch rules and workflow runs (a part of ``fake.FakeGitHub``).

| Route | What it does |
|---|---|
| ``GET /repos/{o}/{r}/rules/branches/{branch}`` | the rules of the rulesets on ``branch`` (``rulesets``; paged): a ``required_status_checks`` rule per ruleset, and a ``deletion`` rule, as GitHub lists rules of every type |
| ``GET /repos/{o}/{r}/branches/{branch}/protection/required_status_checks`` | the classic protection's required checks (``protection``): 404 ``Branch not protected`` without; 403 when ``protection_readable`` is false (a token without admin rights) |
| ``GET /repos/{o}/{r}/actions/runs?branch=&head_sha=&status=`` | the workflow runs (``{total_count, workflow_runs}``) |
| ``POST /repos/{o}/{r}/actions/runs/{id}/cancel`` | 202: the run and its check-runs end ``cancelled``; 409 for a completed run, as GitHub answers |

The simulated CI (``FakeGitHub.simulate_ci``) records one workflow run per commit it
checks, ``completed`` with the worst conclusion of its checks, or, while ``hold`` is
set, ``in_progress`` with its check-runs ``in_progress`` until ``release()``.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.extensions.github import fake_json as J

if TYPE_CHECKING:
    from app.extensions.github.fake import FakeGitHub


class FakeActions:
    def __init__(self, gh: FakeGitHub) -> None:
        self.gh = gh
        # branch -> the check contexts each of its rulesets requires
        self.rulesets: dict[str, list[list[str]]] = {}
        # branch -> the check contexts its classic branch protection requires
        self.protection: dict[str, list[str]] = {}
        self.protection_readable = True
        self.runs: list[dict[str, Any]] = []
        self.hold = False  # True: CI runs start and stay in_progress until release()
        self.cancels: list[int] = []  # the run ids a cancel was asked for

    def routes(self, rp: str) -> list[Route]:
        return [
            Route(f"{rp}/rules/branches/{{branch:path}}", self._rules, methods=["GET"]),
            Route(f"{rp}/branches/{{branch:path}}/protection/required_status_checks",
                  self._protection, methods=["GET"]),
            Route(f"{rp}/actions/runs", self._list_runs, methods=["GET"]),
            Route(f"{rp}/actions/runs/{{rid:int}}/cancel", self._cancel, methods=["POST"]),
        ]

    # -- the simulated CI's side ---------------------------------------------------
    def record(self, sha: str, branch: str | None, checks: list[dict[str, Any]]) -> None:
        """One workflow run for ``checks`` (the check-runs just made) on ``sha``."""
        if self.hold:
            for check in checks:
                check["status"], check["conclusion"] = "in_progress", None
        worst = next((c["conclusion"] for c in checks if c["conclusion"] != "success"),
                     "success")
        self.runs.append({"id": self.gh.next_id(), "head_sha": sha, "head_branch": branch,
                          "status": "in_progress" if self.hold else "completed",
                          "conclusion": None if self.hold else worst,
                          "checks": [c["id"] for c in checks],
                          "verdicts": {c["id"]: c.get("verdict") for c in checks}})

    def release(self) -> None:
        """Every held run completes with its checks' verdicts."""
        with self.gh._lock:
            self.hold = False
            for run in self.runs:
                if run["status"] != "in_progress":
                    continue
                for check in self.gh.check_runs:
                    if check["id"] in run["checks"]:
                        check["status"] = "completed"
                        check["conclusion"] = run["verdicts"][check["id"]]
                run["status"] = "completed"
                run["conclusion"] = next(
                    (v for v in run["verdicts"].values() if v != "success"), "success")

    def _end(self, run: dict[str, Any], conclusion: str) -> None:
        run["status"], run["conclusion"] = "completed", conclusion
        for check in self.gh.check_runs:
            if check["id"] in run["checks"]:
                check["status"], check["conclusion"] = "completed", conclusion

    # -- the API side --------------------------------------------------------------
    async def _rules(self, request: Request) -> Response:
        refused = self.gh._refused(request)
        if refused is not None:
            return refused
        branch = request.path_params["branch"]
        rules: list[dict[str, Any]] = []
        for i, contexts in enumerate(self.rulesets.get(branch, []), start=1):
            source = {"ruleset_source_type": "Repository", "ruleset_source": self.gh.full_name,
                      "ruleset_id": i}
            rules.append({"type": "deletion", **source})
            rules.append({"type": "required_status_checks", **source, "parameters": {
                "strict_required_status_checks_policy": False,
                "required_status_checks": [{"context": c} for c in contexts]}})
        return self.gh._paged(request, rules)

    async def _protection(self, request: Request) -> Response:
        refused = self.gh._refused(request)
        if refused is not None:
            return refused
        if not self.protection_readable:
            return self.gh._error(403, "Resource not accessible by integration")
        branch = request.path_params["branch"]
        if branch not in self.protection:
            return self.gh._error(404, "Branch not protected")
        u = f"{self.gh.base_url}/repos/{self.gh.full_name}/branches/{branch}/protection/" \
            "required_status_checks"
        contexts = self.protection[branch]
        return JSONResponse({"url": u, "strict": False, "contexts": contexts,
                             "contexts_url": f"{u}/contexts",
                             "checks": [{"context": c, "app_id": None} for c in contexts]})

    async def _list_runs(self, request: Request) -> Response:
        refused = self.gh._refused(request)
        if refused is not None:
            return refused
        q = request.query_params
        with self.gh._lock:
            runs = [r for r in reversed(self.runs)  # newest first, as GitHub lists them
                    if (not q.get("branch") or r["head_branch"] == q["branch"])
                    and (not q.get("head_sha") or r["head_sha"] == q["head_sha"])
                    and (not q.get("status") or q["status"] in (r["status"], r["conclusion"]))]
            body = [self._run_json(r) for r in runs[:100]]
        return JSONResponse({"total_count": len(runs), "workflow_runs": body})

    async def _cancel(self, request: Request) -> Response:
        refused = self.gh._refused(request)
        if refused is not None:
            return refused
        rid = request.path_params["rid"]
        with self.gh._lock:
            self.cancels.append(rid)
            run = next((r for r in self.runs if r["id"] == rid), None)
            if run is None:
                return self.gh._error(404, "Not Found")
            if run["status"] == "completed":
                return self.gh._error(409, "Cannot cancel a workflow run that is completed.")
            self._end(run, "cancelled")
        return JSONResponse({}, 202)

    def _run_json(self, run: dict[str, Any]) -> dict[str, Any]:
        gh, rid = self.gh, run["id"]
        u = f"{gh.base_url}/repos/{gh.full_name}/actions/runs/{rid}"
        repo = gh.repository()
        return {
            "id": rid, "name": "CI", "node_id": f"WFR_{rid:08d}",
            "head_branch": run["head_branch"], "head_sha": run["head_sha"],
            "path": ".github/workflows/ci.yml", "run_number": rid, "event": "push",
            "status": run["status"], "conclusion": run["conclusion"], "workflow_id": 1,
            "url": u, "html_url": u, "pull_requests": [], "created_at": J.EPOCH,
            "updated_at": J.now_iso(), "jobs_url": f"{u}/jobs", "logs_url": f"{u}/logs",
            "check_suite_url": f"{u}/check-suite", "artifacts_url": f"{u}/artifacts",
            "cancel_url": f"{u}/cancel", "rerun_url": f"{u}/rerun",
            "workflow_url": f"{gh.base_url}/repos/{gh.full_name}/actions/workflows/1",
            "head_commit": {"id": run["head_sha"], "tree_id": run["head_sha"],
                            "message": "sq", "timestamp": J.EPOCH, "author": None,
                            "committer": None},
            "repository": repo, "head_repository": repo, "display_title": "CI",
        }
