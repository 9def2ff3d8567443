"""A removal as a person would say it (pure): the planner's facts — paths, their
assumptions about batches — told in terms of requests, and what to do next.

``trail.removal`` decides the kind and gathers the evidence; this module rewords a
``build_failed`` removal (``trail.py`` words it in paths and batches:
"path 2e495d118d (on top of demo/batch/3)") and adds, for every kind, the next steps.

A failed build is told by what it was tested with:

| Its path assumed | Said as |
|---|---|
| nothing (no dependency) | "on the target branch alone" |
| batches succeed | "together with demo/3 and demo/4, which were ahead of it" (their requests) |
| batches fail | "without demo/5" |

One failed build: "Its build failed when tested on main together with demo/3, which
was ahead of it, so it was taken out of the queue." Several: "All 3 builds of it
failed (on main alone; together with demo/3; ...), so no way of landing it was left
and it was taken out of the queue."
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from app.domain.entities import Batch, RequestLog
from app.domain.states import Assumption, LogType
from app.views.trail import BuildFact, Evidence, Removal, safe_url


@dataclass(frozen=True, slots=True)
class FailedBuild:
    build_id: str
    path_id: str
    url: str | None


def failed_builds(history: Sequence[RequestLog], builds: Sequence[BuildFact]
                  ) -> list[FailedBuild]:
    """The failed builds of its batch's paths (the builds table first, then the failed
    ``building`` events of its history for builds the table no longer links)."""
    out: dict[str, FailedBuild] = {
        b.build_id: FailedBuild(b.build_id, b.path_id, safe_url(b.log_url))
        for b in builds if b.status == "failed"}
    for e in history:
        md = e.metadata
        if e.type is LogType.EVENT and e.event == "building" and \
                md.get("build_status") == "failed" and md.get("build_id"):
            out.setdefault(str(md["build_id"]), FailedBuild(
                str(md["build_id"]), str(md.get("path_id", "")), safe_url(md.get("build_url"))))
    return list(out.values())


def _names(batch_ids: Sequence[str], batches: Mapping[str, Batch], own: str) -> list[str]:
    """The requests of the batches (their sqids), else the batch ids."""
    out: list[str] = []
    for bid in batch_ids:
        b = batches.get(bid)
        members = [m for m in (b.contains if b else ()) if m != own]
        out.extend(members or [bid])
    return list(dict.fromkeys(out))


def _and(items: Sequence[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def tested_with(deps: Sequence[tuple[str, Assumption]] | None, batches: Mapping[str, Batch],
                own: str, target: str) -> str:
    """What a path's build was tested with, in words (module docstring's table)."""
    if deps is None:
        return f"on {target}"
    on = _names([d for d, a in deps if a is Assumption.SUCCEEDS], batches, own)
    off = _names([d for d, a in deps if a is Assumption.FAILS], batches, own)
    if not on and not off:
        return f"on {target} alone"
    clauses = []
    if on:
        were = "was" if len(on) == 1 else "were"
        clauses.append(f"together with {_and(on)}, which {were} ahead of it")
    if off:
        clauses.append(f"without {_and(off)}")
    return f"on {target} " + ", and ".join(clauses)


def build_failed(removal: Removal, failed: Sequence[FailedBuild],
                 assumptions: Mapping[str, Sequence[tuple[str, Assumption]]],
                 batches: Mapping[str, Batch], own: str, target: str) -> Removal:
    """``removal`` (kind ``build_failed``) reworded; unchanged when no build is known."""
    if not failed:
        return replace(removal, text="Its builds failed, so it was taken out of the queue. "
                       + removal.text)
    where = [tested_with(assumptions.get(f.path_id), batches, own, target) for f in failed]
    if len(failed) == 1:
        text = f"Its build failed when tested {where[0]}, so it was taken out of the queue."
    else:
        text = (f"All {len(failed)} builds of it failed ({'; '.join(where)}), so no way of "
                "landing it was left and it was taken out of the queue.")
    evidence = tuple(
        Evidence(f"log of build {f.build_id} (tested {w})" if f.url
                 else f"build {f.build_id} (tested {w}; its runner published no log)", f.url)
        for f, w in zip(failed, where, strict=True))
    return replace(removal, text=text, evidence=evidence)


def next_steps(removal: Removal, *, alone_failed: bool | None = None,
               has_log: bool = False) -> list[str]:
    """What the person who submitted it can do now, by kind. For a build failure:
    ``alone_failed``, whether a build of the change on the target alone failed (None: not
    known); ``has_log``, whether its failing lines are shown with it."""
    k = removal.kind
    if k == "build_failed":
        read = ("Read the failing lines of the log above" if has_log else
                "Read the log of the failed build (linked above; a build without one is "
                "in your CI)")
        steps = [f"{read}, fix the change, push a new commit and submit it again."]
        if alone_failed is False:
            steps.append("Its builds failed only together with the requests ahead of it: "
                         "the clash may be with one of them — check their changes, or "
                         "submit it again once they have landed.")
        return steps
    return list(_STEPS.get(k, _STEPS["error"]))


_STEPS: dict[str, tuple[str, ...]] = {
    "no_ci_started": ("Nothing is wrong with the change itself: the queue's CI never "
                      "started on its branches. Make CI run on pushes to the queue's "
                      "branches (sq/**) and report the required checks by those names, "
                      "then submit it again.",),
    "merge_conflict": ("Rebase the change onto the latest target branch, resolve the "
                       "conflicts, push and submit it again.",),
    "cancelled": ("Nothing to do, unless you still want it landed: then submit it again.",),
    "dead_lettered": ("The queue could not finish its work on it; an operator can see why "
                      "on the admin page. Once the cause is fixed, submit it again.",),
    "dependency_unavailable": ("Submit it again once the dependency is back.",),
    "duplicate": ("Nothing to do here: follow the other request, which carries the same "
                  "change.",),
    "rejected": ("Fix what the reason says (a branch that moved needs its new commit "
                 "submitted) and submit it again.",),
    "error": ("Read the error as recorded below; if it looks like the queue's fault rather "
              "than the change's, ask an operator.",),
}
