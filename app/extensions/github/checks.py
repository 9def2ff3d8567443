"""The verdict of GitHub's checks on one commit (pure; the ``github_checks`` runner).

``verdict(required, seen, waited_s=..., start_timeout_s=...)`` over what GitHub reports
for the commit — each check-run (``name``, ``status``, ``conclusion``) and each commit
status (``context`` as the name, ``state``) — for the queue's required check names:

| Seen | Verdict |
|---|---|
| a required check completed ``failure`` / ``action_required`` (status: ``failure``) | ``failed``, naming it and its link |
| a required check completed ``cancelled`` / ``timed_out`` / ``stale`` (status: ``error``) | ``errored``: CI did not finish, not the change's fault |
| every required check completed ``success`` / ``neutral`` / ``skipped`` | ``succeeded`` |
| no required check at all after ``start_timeout_s`` | ``errored``, ``no_ci_started``: names the checks that never appeared and the fix |
| otherwise | ``running`` (or ``accepted`` while none has appeared) |

Several runs of one name: the newest counts (GitHub re-runs a check under its name).
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.removals import NO_CI_STARTED_PREFIX
from app.domain.states import BuildStatus

_FAILED = frozenset({"failure", "action_required"})
_ERRORED = frozenset({"cancelled", "timed_out", "stale", "error", "startup_failure"})
_PASSED = frozenset({"success", "neutral", "skipped"})


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    completed: bool
    conclusion: str = ""  # of a completed check
    url: str = ""


def from_status(context: str, state: str, url: str = "") -> Check:
    """A commit status as a check: ``pending`` runs, the others completed."""
    conclusion = {"success": "success", "failure": "failure", "error": "error"}.get(state, "")
    return Check(context, state != "pending", conclusion, url)


def verdict(required: Sequence[str], seen: Sequence[Check], *, waited_s: float,
            start_timeout_s: float, branch: str) -> tuple[BuildStatus, str]:
    latest: dict[str, Check] = {}
    for check in seen:  # oldest first: the newest run of a name wins
        latest[check.name] = check
    mine = {name: latest[name] for name in required if name in latest}
    for name, check in mine.items():
        if check.completed and check.conclusion in _FAILED:
            return BuildStatus.FAILED, f"check {name!r} failed" + (
                f": {check.url}" if check.url else "")
    for name, check in mine.items():
        if check.completed and check.conclusion in _ERRORED:
            return BuildStatus.ERRORED, (f"check {name!r} ended {check.conclusion}: CI did "
                                         "not finish it; the path is built again")
    if len(mine) == len(required) and all(
            c.completed and c.conclusion in _PASSED for c in mine.values()):
        return BuildStatus.SUCCEEDED, "required checks passed: " + ", ".join(required)
    if not mine:
        if waited_s >= start_timeout_s:
            return BuildStatus.ERRORED, (
                f"{NO_CI_STARTED_PREFIX} none of the required checks ({', '.join(required)}) "
                f"appeared on {branch} within {start_timeout_s:g} s; CI must run on pushes "
                "to the queue's branches (GitHub Actions: on: push: branches: ['sq/**']) "
                "and report checks with exactly these names")
        return BuildStatus.ACCEPTED, "waiting for CI to start"
    missing = [n for n in required if n not in mine]
    return BuildStatus.RUNNING, ("running" if not missing else
                                 f"running; not started yet: {', '.join(missing)}")
