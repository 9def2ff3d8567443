"""The fake GitHub's JSON: the objects GitHub's REST API (version 2022-11-28) returns,
with every field its OpenAPI description requires (``tests/unit/test_github_fake.py``
parses each with githubkit's generated models, the contract that keeps them honest).

Plain functions of plain data; URLs point at the fake's own base URL.
"""

from __future__ import annotations

import time
from typing import Any

EPOCH = "2026-01-01T00:00:00Z"


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _node(kind: str, n: int) -> str:
    return f"{kind}_{n:08d}"


def user(api: str, login: str, uid: int) -> dict[str, Any]:
    u = f"{api}/users/{login}"
    return {
        "login": login, "id": uid, "node_id": _node("U", uid), "avatar_url": "",
        "gravatar_id": "", "url": u, "html_url": u, "followers_url": f"{u}/followers",
        "following_url": f"{u}/following", "gists_url": f"{u}/gists",
        "starred_url": f"{u}/starred", "subscriptions_url": f"{u}/subscriptions",
        "organizations_url": f"{u}/orgs", "repos_url": f"{u}/repos",
        "events_url": f"{u}/events", "received_events_url": f"{u}/received_events",
        "type": "User", "site_admin": False,
    }


_REPO_URLS = (
    "archive", "assignees", "blobs", "branches", "collaborators", "comments", "commits",
    "compare", "contents", "contributors", "deployments", "downloads", "events", "forks",
    "git_commits", "git_refs", "git_tags", "issue_comment", "issue_events", "issues",
    "keys", "labels", "languages", "merges", "milestones", "notifications", "pulls",
    "releases", "stargazers", "statuses", "subscribers", "subscription", "tags", "teams",
    "trees", "hooks",
)


def repository(api: str, owner: dict[str, Any], name: str, rid: int,
               default_branch: str) -> dict[str, Any]:
    full = f"{owner['login']}/{name}"
    u = f"{api}/repos/{full}"
    out: dict[str, Any] = {f"{k}_url": f"{u}/{k}" for k in _REPO_URLS}
    out.update({
        "id": rid, "node_id": _node("R", rid), "name": name, "full_name": full,
        "license": None, "forks": 0, "owner": owner, "private": False, "html_url": u,
        "description": None, "fork": False, "url": u, "git_url": f"{u}.git",
        "ssh_url": f"{u}.git", "clone_url": f"{u}.git", "mirror_url": None, "svn_url": u,
        "homepage": None, "language": None, "forks_count": 0, "stargazers_count": 0,
        "watchers_count": 0, "size": 0, "default_branch": default_branch,
        "open_issues_count": 0, "has_pages": False, "disabled": False, "pushed_at": EPOCH,
        "created_at": EPOCH, "updated_at": EPOCH, "open_issues": 0, "watchers": 0,
    })
    return out


def label(api: str, full: str, name: str, lid: int) -> dict[str, Any]:
    return {"id": lid, "node_id": _node("L", lid), "url": f"{api}/repos/{full}/labels/{name}",
            "name": name, "description": None, "color": "ededed", "default": False,
            "archived_at": None, "archived_by": None}


def pull_request(api: str, repo: dict[str, Any], p: Any, author: dict[str, Any],
                 labels: list[dict[str, Any]]) -> dict[str, Any]:
    """``p``: a ``FakePull`` (number, title, state, draft, merged, head/base refs, ...)."""
    full = repo["full_name"]
    u = f"{api}/repos/{full}/pulls/{p.number}"
    issue = f"{api}/repos/{full}/issues/{p.number}"
    links = {k: {"href": v} for k, v in {
        "comments": f"{issue}/comments", "commits": f"{u}/commits",
        "statuses": f"{api}/repos/{full}/statuses/{p.head_sha}", "html": u, "issue": issue,
        "review_comments": f"{u}/comments", "review_comment": f"{u}/comments{{/number}}",
        "self": u}.items()}
    return {
        "url": u, "id": p.number, "node_id": _node("PR", p.number), "html_url": u,
        "diff_url": f"{u}.diff", "patch_url": f"{u}.patch", "issue_url": issue,
        "commits_url": f"{u}/commits", "review_comments_url": f"{u}/comments",
        "review_comment_url": f"{u}/comments{{/number}}", "comments_url": f"{issue}/comments",
        "statuses_url": links["statuses"]["href"], "number": p.number, "state": p.state,
        "locked": False, "title": p.title, "user": author, "body": p.body, "labels": labels,
        "milestone": None, "active_lock_reason": None, "created_at": EPOCH,
        "updated_at": now_iso(), "closed_at": None if p.state == "open" else now_iso(),
        "merged_at": now_iso() if p.merged else None, "merge_commit_sha": None,
        "assignee": None, "assignees": [], "requested_reviewers": [], "requested_teams": [],
        "head": {"label": f"{repo['owner']['login']}:{p.head_ref}", "ref": p.head_ref,
                 "repo": repo, "sha": p.head_sha, "user": repo["owner"]},
        "base": {"label": f"{repo['owner']['login']}:{p.base_ref}", "ref": p.base_ref,
                 "repo": repo, "sha": p.base_sha, "user": repo["owner"]},
        "_links": links, "author_association": "MEMBER", "auto_merge": None,
        "draft": p.draft, "merged": p.merged, "mergeable": p.mergeable,
        "rebaseable": p.mergeable, "mergeable_state": p.mergeable_state,
        "merged_by": None, "comments": len(p.comments), "review_comments": 0,
        "maintainer_can_modify": False, "commits": 1, "additions": p.additions,
        "deletions": p.deletions, "changed_files": len(p.files),
    }


def diff_entry(api: str, full: str, sha: str, path: str, added: int, deleted: int,
               status: str, previous: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "sha": None, "filename": path, "status": status, "additions": added,
        "deletions": deleted, "changes": added + deleted,
        "blob_url": f"{api}/{full}/blob/{sha}/{path}", "raw_url": f"{api}/{full}/raw/{sha}/{path}",
        "contents_url": f"{api}/repos/{full}/contents/{path}?ref={sha}",
    }
    if previous is not None:
        out["previous_filename"] = previous
    return out


def review(api: str, full: str, number: int, rid: int, reviewer: dict[str, Any], state: str,
           commit: str) -> dict[str, Any]:
    u = f"{api}/repos/{full}/pulls/{number}"
    return {"id": rid, "node_id": _node("PRR", rid), "user": reviewer, "body": "",
            "state": state, "html_url": f"{u}#review-{rid}", "pull_request_url": u,
            "_links": {"html": {"href": f"{u}#review-{rid}"}, "pull_request": {"href": u}},
            "submitted_at": EPOCH, "commit_id": commit, "author_association": "MEMBER"}


def comment(api: str, full: str, number: int, cid: int, author: dict[str, Any],
            body: str) -> dict[str, Any]:
    issue = f"{api}/repos/{full}/issues/{number}"
    return {"id": cid, "node_id": _node("IC", cid), "url": f"{api}/repos/{full}/issues/"
            f"comments/{cid}", "html_url": f"{issue}#issuecomment-{cid}", "body": body,
            "user": author, "created_at": now_iso(), "updated_at": now_iso(),
            "issue_url": issue, "author_association": "MEMBER"}


def permission(api: str, who: dict[str, Any], level: str) -> dict[str, Any]:
    base = {"read": "read", "triage": "read", "write": "write", "maintain": "write",
            "admin": "admin"}.get(level, "none")
    collab = {**who, "permissions": {"pull": base != "none", "triage": level != "read",
                                     "push": base in ("write", "admin"),
                                     "maintain": level in ("maintain", "admin"),
                                     "admin": level == "admin"},
              "role_name": level}
    return {"permission": base, "role_name": level, "user": collab}


def git_ref(api: str, full: str, ref: str, sha: str) -> dict[str, Any]:
    return {"ref": ref, "node_id": f"REF_{sha[:12]}", "url": f"{api}/repos/{full}/git/{ref}",
            "object": {"type": "commit", "sha": sha,
                       "url": f"{api}/repos/{full}/git/commits/{sha}"}}


def status(api: str, full: str, sid: int, creator: dict[str, Any], state: str,
           context: str, description: str | None, target_url: str | None) -> dict[str, Any]:
    return {"url": f"{api}/repos/{full}/statuses/{sid}", "avatar_url": None, "id": sid,
            "node_id": _node("ST", sid), "state": state, "description": description,
            "target_url": target_url, "context": context, "created_at": now_iso(),
            "updated_at": now_iso(), "creator": creator}


def app(api: str, owner: dict[str, Any], app_id: int) -> dict[str, Any]:
    return {"id": app_id, "slug": "submitqueue", "node_id": _node("A", app_id),
            "owner": owner, "name": "SubmitQueue", "description": None,
            "external_url": api, "html_url": f"{api}/apps/submitqueue",
            "created_at": EPOCH, "updated_at": EPOCH,
            "permissions": {"checks": "write", "contents": "write", "metadata": "read",
                            "pull_requests": "write", "statuses": "read"},
            "events": ["check_run", "issue_comment", "pull_request", "push", "status"]}


def check_run(api: str, full: str, run: dict[str, Any], the_app: dict[str, Any]) -> dict[str, Any]:
    """``run``: the fake's stored fields (id, name, head_sha, status, conclusion, ...)."""
    u = f"{api}/repos/{full}/check-runs/{run['id']}"
    return {
        "id": run["id"], "head_sha": run["head_sha"], "node_id": _node("CR", run["id"]),
        "external_id": run.get("external_id") or None, "url": u, "html_url": u,
        "details_url": run.get("details_url") or None, "status": run["status"],
        "conclusion": run.get("conclusion"), "started_at": run.get("started_at") or EPOCH,
        "completed_at": run.get("completed_at"), "name": run["name"],
        "output": {"title": run.get("title"), "summary": run.get("summary"),
                   "text": run.get("text"), "annotations_count": 0,
                   "annotations_url": f"{u}/annotations"},
        "check_suite": {"id": run["id"]}, "app": the_app, "pull_requests": [],
    }


def installation(api: str, account: dict[str, Any], iid: int, app_id: int) -> dict[str, Any]:
    return {"id": iid, "account": account, "repository_selection": "selected",
            "access_tokens_url": f"{api}/app/installations/{iid}/access_tokens",
            "repositories_url": f"{api}/installation/repositories",
            "html_url": f"{api}/settings/installations/{iid}", "app_id": app_id,
            "target_id": account["id"], "target_type": "Organization",
            "permissions": {"contents": "write", "pull_requests": "write"},
            "events": ["pull_request"], "created_at": EPOCH, "updated_at": EPOCH,
            "single_file_name": None, "app_slug": "submitqueue", "suspended_by": None,
            "suspended_at": None}
