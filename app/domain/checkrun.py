"""The ``SubmitQueue`` check-run on a queued pull request's head (pure; docs/github.md).

:func:`render` turns what the request page shows (:class:`CheckFacts`, read by
``app/views/checkfacts.py``) into the check-run GitHub shows (:class:`CheckDraft`), and
:func:`commit_status` into a commit status, for queues whose credentials are a token
(GitHub lets only Apps create check-runs).

| The request | Check-run ``status`` / ``conclusion`` | Commit status | Title |
|---|---|---|---|
| in flight: incoming, batching | ``queued`` / - | ``pending`` | ``Queued: #3 in line · 92 % chance to land · lands in ~4 min`` |
| in flight: speculating, landing, cancelling | ``in_progress`` / - | ``pending`` | its activity: ``Building · ...``, ``Landing · ...`` |
| in flight, its stage dead-lettered or parked | ``in_progress`` / - | ``pending`` | ``Needs an operator: ...`` |
| ``landed`` | ``completed`` / ``success`` | ``success`` | ``Landed as 1a2b3c4d5e6f`` |
| ``error`` | ``completed`` / ``failure`` (``action_required`` when dead-lettered or no CI started) | ``failure`` | ``Removed: <the typed reason in words>`` |
| ``cancelled`` | ``completed`` / ``cancelled`` (``neutral`` when superseded by a new push) | ``error`` | ``Cancelled: ...`` |

The summary carries the request's page, its position, chance and ETA while in flight,
the landed commits, or the removal's text, evidence (links: the failed check, the
build log, conflicting paths, who cancelled) and next steps; the text carries the
failing log lines and the trail of stages. Everything is a function of the facts
alone (no clock), so a replayed message writes the same check-run.

:func:`removal_comment` is the short comment a queue with ``removal_comment: true``
adds to a pull request it removed (``error`` or ``cancelled``): the summary above and
a hidden marker naming the request, by which a replay finds it written already.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

CHECK_NAME = "SubmitQueue"
_SUMMARY_CHARS = 60_000  # GitHub's output.summary and output.text take 65,535 characters
_TITLE_CHARS = 250
_DESCRIPTION_CHARS = 140  # a commit status description

CheckStatus = Literal["queued", "in_progress", "completed"]
StatusState = Literal["pending", "success", "failure", "error"]


@dataclass(frozen=True, slots=True)
class Link:
    label: str
    url: str | None = None


@dataclass(frozen=True, slots=True)
class TrailStep:
    label: str  # "Accepted", "Speculating (building)"
    at_ms: int
    duration_ms: int | None = None


@dataclass(frozen=True, slots=True)
class CheckFacts:
    """What the request page shows of one request, as the check-run needs it."""

    sqid: str
    queue: str
    status: str  # the public status
    stage: str  # incoming | batching | speculating | landing | cancelling | terminal ones
    page_url: str
    change_uris: tuple[str, ...]
    activity_text: str = ""
    position: int | None = None
    p_land: float | None = None
    eta_ms: int | None = None
    landed_commits: tuple[str, ...] = ()
    needs_operator: bool = False
    health_text: str = ""
    reason: str | None = None  # app/domain/removals.py
    removal_text: str = ""
    evidence: tuple[Link, ...] = ()
    next_steps: tuple[str, ...] = ()
    log_lines: tuple[str, ...] = ()
    log_url: str | None = None
    trail: tuple[TrailStep, ...] = ()
    last_error: str = ""


@dataclass(frozen=True, slots=True)
class CheckDraft:
    status: CheckStatus
    conclusion: str | None
    title: str
    summary: str
    text: str
    details_url: str


def _duration(ms: int) -> str:
    s = max(0, ms) // 1000
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{round(s / 60)} min"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _in_flight_parts(f: CheckFacts) -> list[str]:
    parts = []
    if f.position is not None:
        parts.append(f"#{f.position} in line")
    if f.p_land is not None:
        parts.append(f"{round(f.p_land * 100)} % chance to land")
    if f.eta_ms is not None:
        parts.append(f"lands in ~{_duration(f.eta_ms)}")
    return parts


def _title(f: CheckFacts) -> str:
    if f.status == "landed":
        shas = [c[:12] for c in f.landed_commits if c]
        return f"Landed as {', '.join(shas)}" if shas else "Landed"
    if f.status == "error":
        return f"Removed: {f.removal_text or f.last_error or 'error'}"
    if f.status == "cancelled":
        return f"Cancelled: {f.removal_text}" if f.removal_text else "Cancelled"
    if f.needs_operator:
        return f"Needs an operator: {f.health_text}"
    head = "Queued" if f.stage in ("incoming", "batching") else \
        (f.activity_text[:1].upper() + f.activity_text[1:] if f.activity_text else f.stage)
    return " · ".join([head, *_in_flight_parts(f)])


def _conclusion(f: CheckFacts) -> str | None:
    if f.status == "landed":
        return "success"
    if f.status == "error":
        return "action_required" if f.reason in ("dead_lettered", "no_ci_started") \
            else "failure"
    if f.status == "cancelled":
        return "neutral" if f.reason == "superseded" else "cancelled"
    return None


def _link(e: Link) -> str:
    return f"[{e.label}]({e.url})" if e.url else e.label


def _summary(f: CheckFacts) -> str:
    lines = [f"**{f.sqid}** in queue `{f.queue}`: {f.status} — [its page]({f.page_url})", ""]
    if f.status == "landed":
        lines += [f"- landed as `{c}`" for c in f.landed_commits]
    elif f.status in ("error", "cancelled"):
        if f.reason:
            lines.append(f"Reason: `{f.reason}`")
        if f.removal_text:
            lines += ["", f.removal_text]
        if f.evidence:
            lines += ["", "Evidence:", *[f"- {_link(e)}" for e in f.evidence]]
        if f.next_steps:
            lines += ["", "What to do:", *[f"- {s}" for s in f.next_steps]]
    else:
        if f.activity_text:
            lines.append(f"- now: {f.activity_text}")
        lines += [f"- {p}" for p in _in_flight_parts(f)]
        if f.health_text:
            lines.append(f"- {f.health_text}")
    return "\n".join(lines).strip()[:_SUMMARY_CHARS]


def _text(f: CheckFacts) -> str:
    out: list[str] = []
    if f.log_lines:
        where = f" ([whole log]({f.log_url}))" if f.log_url else ""
        out += [f"Failing lines of the build log{where}:", "", "```",
                *[line.replace("```", "'''") for line in f.log_lines], "```", ""]
    elif f.status == "error" and f.last_error:
        out += ["Error:", "", "```", f.last_error.replace("```", "'''")[:4000], "```", ""]
    if f.trail:
        start = f.trail[0].at_ms
        out += ["| Stage | At | Took |", "|---|---|---|"]
        out += [f"| {s.label} | +{_duration(s.at_ms - start)} | "
                f"{_duration(s.duration_ms) if s.duration_ms is not None else ''} |"
                for s in f.trail]
    return "\n".join(out).strip()[:_SUMMARY_CHARS]


def render(f: CheckFacts) -> CheckDraft:
    """The check-run for ``f`` (module docstring)."""
    conclusion = _conclusion(f)
    status: CheckStatus = "completed" if conclusion else \
        "queued" if f.stage in ("incoming", "batching") and not f.needs_operator \
        else "in_progress"
    return CheckDraft(status=status, conclusion=conclusion, title=_title(f)[:_TITLE_CHARS],
                      summary=_summary(f), text=_text(f), details_url=f.page_url)


@dataclass(frozen=True, slots=True)
class StatusDraft:
    state: StatusState
    description: str
    target_url: str
    context: str = field(default=CHECK_NAME)


def commit_status(f: CheckFacts) -> StatusDraft:
    """The commit status for ``f`` (module docstring): the title, cut to 140 characters."""
    conclusion = _conclusion(f)
    state: StatusState = "pending" if conclusion is None else \
        "success" if conclusion == "success" else \
        "error" if f.status == "cancelled" else "failure"
    title = _title(f)
    if len(title) > _DESCRIPTION_CHARS:
        title = title[:_DESCRIPTION_CHARS - 1] + "…"
    return StatusDraft(state=state, description=title, target_url=f.page_url)


def pull_heads(change_uris: tuple[str, ...], host: str, repository: str
               ) -> list[tuple[int, str]]:
    """``(pull number, head sha)`` of each ``github://`` change of ``repository`` on
    ``host`` (the others are not this queue's pull requests)."""
    out = []
    prefix = f"github://{host}/{repository}/pull/"
    for uri in change_uris:
        base = uri.partition("?")[0]
        if not base.startswith(prefix):
            continue
        number, _, sha = base[len(prefix):].partition("/")
        if number.isdigit() and len(sha) == 40:
            out.append((int(number), sha))
    return out


def comment_marker(sqid: str) -> str:
    """The hidden line that says a removal comment for ``sqid`` was written."""
    return f"<!-- submitqueue:removed:{sqid} -->"


def removal_comment(f: CheckFacts) -> str | None:
    """The comment on a removed request's pull requests (None unless removed)."""
    if f.status not in ("error", "cancelled"):
        return None
    verb = "removed this pull request from" if f.status == "error" else \
        "cancelled this pull request's request in"
    return "\n".join([f"SubmitQueue {verb} queue `{f.queue}`.", "", _summary(f), "",
                      comment_marker(f.sqid)])

