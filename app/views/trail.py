"""A request's history as people read it (pure): the stage trail, and — when it was
removed from the queue — a typed reason in plain words with its evidence.

**Trail.** Each status entry opens a stage; events (``building``, ``built``,
``waiting``, ``invalidated``) belong to the stage they happened in, counted by name in
order of first appearance: ``speculating [building ×3, built ×2, waiting]``. A
stage lasts until the next status (a live request's last stage until now; a
terminal stage has no duration).

**Removal reasons**, by what the history and the error text say:

| Kind | When | Evidence |
|---|---|---|
| ``build_failed`` | ``error`` and no speculation path could pass | each failed build: path, its assumptions, log link |
| ``no_ci_started`` | ``error``: no required check ever appeared on its builds' branches (the ``github_checks`` runner) | the checks named, the fix, each errored build |
| ``merge_conflict`` | ``error`` from the pre-batch merge check, or a merge that failed | the conflicting paths |
| ``cancelled`` | ``cancelled``: by its own cancel (with the reason given) or with its batch | the batch |
| ``dead_lettered`` | ``error`` after a stage exhausted its retries (the stage is named) | the admin page |
| ``duplicate`` | ``error``: another live request already claims the change | that request |
| ``rejected`` | ``error`` before batching (e.g. the change is stale or unreadable) | - |
| ``error`` | any other ``error`` | - |

Each removal also carries ``reason``, its word in the one typed vocabulary
(``app/domain/removals.py``: ``stale`` for a rejected stale change, ``superseded`` for a
duplicate, ``dependency_failed`` for ``dependency_unavailable``; None for ``error``).

URLs from runners are kept only when they are ``http(s)://`` or site-relative, so a
link can never run script.
"""  # noqa: E501, RUF002 - tables read best unwrapped; the trail uses the multiplication sign

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from app.domain.entities import RequestLog
from app.domain.outages import UNAVAILABLE_PREFIX
from app.domain.removals import DEAD_LETTER as _DLQ
from app.domain.removals import DUPLICATE as _DUPLICATE
from app.domain.removals import NO_CI_STARTED_PREFIX, NO_PATH_PASSED, classify
from app.domain.states import Assumption, LogType

_PATHS = re.compile(r"\(conflicting paths: (?P<paths>[^)]*)\)")


def safe_url(url: object) -> str | None:
    """``url`` if it is an absolute http(s) URL or a site-relative path, else None."""
    if not isinstance(url, str) or not url or len(url) > 2048:
        return None
    lowered = url.strip().lower()
    if lowered.startswith(("http://", "https://")):
        return url.strip()
    if url.startswith("/") and not url.startswith("//") and "\\" not in url:
        return url
    return None


@dataclass(frozen=True, slots=True)
class TrailEntry:
    at_ms: int
    event: str
    build_id: str = ""
    build_status: str = ""
    build_url: str | None = None
    path_id: str = ""


@dataclass(frozen=True, slots=True)
class Stage:
    status: str
    at_ms: int
    duration_ms: int | None
    events: tuple[tuple[str, int], ...]
    entries: tuple[TrailEntry, ...]
    last_error: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if not self.events:
            return self.status
        parts = [name if n == 1 else f"{name} \u00d7{n}" for name, n in self.events]
        return f"{self.status} [{', '.join(parts)}]"


def _entry(e: RequestLog) -> TrailEntry:
    md = e.metadata
    return TrailEntry(
        at_ms=e.timestamp_ms, event=e.event, build_id=str(md.get("build_id", "")),
        build_status=str(md.get("build_status", "")), build_url=safe_url(md.get("build_url")),
        path_id=str(md.get("path_id", "")),
    )


def trail(history: Sequence[RequestLog], *, now_ms: int, terminal: frozenset[str]) -> list[Stage]:
    """The stages of a history (oldest first); events before any status open an
    ``accepted`` stage."""
    opened: list[tuple[RequestLog | None, list[RequestLog]]] = []
    for e in history:
        if e.type is LogType.STATUS:
            opened.append((e, []))
        else:
            if not opened:
                opened.append((None, []))
            opened[-1][1].append(e)
    stages: list[Stage] = []
    for i, (status, events) in enumerate(opened):
        name = status.status if status else "accepted"
        at = status.timestamp_ms if status else (events[0].timestamp_ms if events else 0)
        if i + 1 < len(opened):
            nxt = opened[i + 1][0]
            end: int | None = nxt.timestamp_ms if nxt else None
        else:
            end = None if name in terminal else now_ms
        counts: dict[str, int] = {}
        for ev in events:
            counts[ev.event] = counts.get(ev.event, 0) + 1
        stages.append(Stage(
            status=name, at_ms=at, duration_ms=None if end is None else max(0, end - at),
            events=tuple(counts.items()), entries=tuple(_entry(ev) for ev in events),
            last_error=status.last_error if status else "",
            metadata=dict(status.metadata) if status else {},
        ))
    return stages


# --- removal reasons -------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Evidence:
    label: str
    url: str | None = None


@dataclass(frozen=True, slots=True)
class Removal:
    kind: str
    text: str
    evidence: tuple[Evidence, ...] = ()
    stage: str = ""
    reason: str | None = None  # the typed reason (``app/domain/removals.py``)


def describe_assumptions(deps: Sequence[tuple[str, Assumption]]) -> str:
    """``on top of q/batch/1, without q/batch/2`` / ``on the target branch alone``."""
    if not deps:
        return "on the target branch alone (no dependencies)"
    on = [d for d, a in deps if a is Assumption.SUCCEEDS]
    off = [d for d, a in deps if a is Assumption.FAILS]
    parts = []
    if on:
        parts.append("on top of " + ", ".join(on))
    if off:
        parts.append("without " + ", ".join(off))
    return ", ".join(parts)


def removal(
    *, status: str, last_error: str, history: Sequence[RequestLog], batch_id: str | None,
    assumptions: Mapping[str, Sequence[tuple[str, Assumption]]], queue: str,
    builds: Sequence[BuildFact] = (),
) -> Removal | None:
    """Why a terminal ``error``/``cancelled`` request left the queue (None otherwise).
    ``assumptions`` maps path ids of its batch to their assumptions; ``builds`` are the
    builds of those paths (failed ones are the evidence of a build failure, with the
    failed ``building`` events of the history as a fallback). ``reason`` is the word of
    the one vocabulary (``app/domain/removals.py``) the notifications use too."""
    found = _removal(status=status, last_error=last_error, history=history,
                     batch_id=batch_id, assumptions=assumptions, queue=queue, builds=builds)
    if found is None:
        return None
    typed = classify(status, last_error)
    return replace(found, reason=typed.value if typed else None)


def _removal(
    *, status: str, last_error: str, history: Sequence[RequestLog], batch_id: str | None,
    assumptions: Mapping[str, Sequence[tuple[str, Assumption]]], queue: str,
    builds: Sequence[BuildFact],
) -> Removal | None:
    if status == "cancelled":
        return _cancelled(history, batch_id)
    if status != "error":
        return None
    err = last_error or "no reason was recorded"
    if err.startswith(UNAVAILABLE_PREFIX):
        return Removal("dependency_unavailable",
                       "A dependency stayed unreachable for longer than the queue's retry "
                       f"window: {err.removeprefix(UNAVAILABLE_PREFIX).strip()}. Submit it "
                       "again once the dependency is back.")
    m = _DLQ.match(err)
    if m:
        n = int(m["n"])
        return Removal(
            "dead_lettered",
            f"Dead-lettered at stage {m['topic']}: it failed {n} time{'s' if n != 1 else ''} "
            f"({m['error']}) and an operator or the reconciler ended it.",
            (Evidence("dead letters on the admin page", "/admin"),), stage=m["topic"])
    if err.startswith(("merge conflict:", "merge failed:")):
        paths = _PATHS.search(err)
        listed = [p.strip() for p in paths["paths"].split(",") if p.strip()] if paths else []
        where = "before batching" if err.startswith("merge conflict:") else "while landing"
        text = (f"Merge conflict {where}: the change does not apply onto the target branch"
                + (f"; conflicting paths: {', '.join(listed)}." if listed else f". {err}"))
        return Removal("merge_conflict", text, tuple(Evidence(p) for p in listed))
    if err.startswith(NO_CI_STARTED_PREFIX):
        return _no_ci_started(builds, err)
    if NO_PATH_PASSED in err:
        return _build_failed(history, builds, assumptions, err)
    m = _DUPLICATE.match(err)
    if m:
        other = m["sqid"]
        queue_of, _, number = other.rpartition("/")
        url = (f"/queues/{queue_of}/requests/{number}"
               if number.isdigit() and queue_of == queue else None)
        return Removal("duplicate", f"Another live request, {other}, already carries this "
                       "change; land it once.", (Evidence(other, url),))
    if batch_id is None:
        return Removal("rejected", f"Rejected before batching: {err}")
    return Removal("error", err)


def _no_ci_started(builds: Sequence[BuildFact], err: str) -> Removal:
    said = err.removeprefix(NO_CI_STARTED_PREFIX).split(f"; {NO_PATH_PASSED}")[0].strip()
    evidence = tuple(Evidence(f"build {b.build_id} (no check started)", safe_url(b.log_url))
                     for b in builds if b.status == "errored")
    return Removal("no_ci_started", "No CI run started for it, so nothing could test it: "
                   f"{said}.", evidence)


def _cancelled(history: Sequence[RequestLog], batch_id: str | None) -> Removal:
    own = [e for e in history if e.type is LogType.STATUS and e.status == "cancelling"]
    evidence = (Evidence(f"batch {batch_id}"),) if batch_id else ()
    if own:
        reason = str(own[-1].metadata.get("reason", "") or "").strip()
        said = f" (reason given: {reason})" if reason else " (no reason given)"
        actor = str(own[-1].metadata.get("actor", "") or "").strip()
        by = f" by {actor}" if actor else ""
        return Removal("cancelled", f"Cancelled{by} through the cancel API{said}.", evidence)
    with_batch = f" {batch_id}" if batch_id else ""
    return Removal("cancelled", f"Cancelled together with its batch{with_batch}: another "
                   "request in the batch was cancelled.", evidence)


@dataclass(frozen=True, slots=True)
class BuildFact:
    """A build of one of the batch's paths, as the builds table has it."""

    build_id: str
    path_id: str
    status: str
    log_url: str = ""


def _build_failed(history: Sequence[RequestLog], builds: Sequence[BuildFact],
                  assumptions: Mapping[str, Sequence[tuple[str, Assumption]]],
                  err: str) -> Removal:
    failed: dict[str, TrailEntry] = {
        b.build_id: TrailEntry(at_ms=0, event="building", build_id=b.build_id,
                               build_status=b.status, build_url=safe_url(b.log_url),
                               path_id=b.path_id)
        for b in builds if b.status == "failed"
    }
    for e in history:  # builds the table no longer links (e.g. a path re-planned)
        if e.type is LogType.EVENT and e.event == "building" and \
                e.metadata.get("build_status") == "failed":
            entry = _entry(e)
            failed.setdefault(entry.build_id, entry)
    if not failed:
        return Removal("build_failed", f"Its builds failed: {err}.")
    evidence = []
    sentences = []
    for entry in failed.values():
        deps = assumptions.get(entry.path_id)
        where = describe_assumptions(deps) if deps is not None else "with unknown assumptions"
        short = entry.path_id[:10] or "?"
        sentences.append(f"path {short} ({where})")
        label = (f"log of build {entry.build_id} (path {short})" if entry.build_url
                 else f"build {entry.build_id} (path {short}; its runner published no log)")
        evidence.append(Evidence(label, entry.build_url))
    n = len(failed)
    head = "Its build failed on " if n == 1 else f"All {n} of its builds failed: "
    return Removal("build_failed", head + "; ".join(sentences) +
                   ". No speculation path could pass.", tuple(evidence))
