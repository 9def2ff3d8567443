"""What one compact row of the queue page says about a request (pure): who and what it
is (title, branch, author), and what it is doing right now — in particular whether it
*builds* or *waits for a build slot*, which the stage alone does not tell.

**Title, branch, author** come from the change details the change provider reported
at validation (the first change of a stack; ``title`` is its commit subject or pull
request title). Before validation — or for details stored before titles existed —
the title is "" and the page shows the branch, which is read from the change URI
itself (:func:`branch_of`).

**Activity** (``code``: text), by stage:

| Stage | Code | When | Text |
|---|---|---|---|
| incoming | ``validating`` | always | validating its changes |
| batching | ``batching`` | always | batching: working out what it conflicts with |
| speculating | ``building`` | its batch holds a live path (pending or building) no settled batch contradicts | building (N paths) |
| speculating | ``built`` | a path of its batch passed (none live) | built; waiting for the batches ahead (A, B) / landing next |
| speculating | ``waiting_for_slot`` | nothing live or passed and the queue's live paths fill its budget | waiting for a build slot (4/4 in use) |
| speculating | ``queued`` | nothing live or passed and a slot is free | queued for a build (1/4 slots in use) |
| landing | ``landing`` | always | landing: merging onto the target |
| speculating / landing, ``built`` or ``landing`` above, its queue frozen (``frozen``) | ``frozen`` | the queue lands nothing now (docs/freeze.md) | frozen: <reason> (...); lands when the freeze ends |
| cancelling | ``cancelling`` | always | cancelling |
| terminal | the status | always | landed / error / cancelled |

**Slots in use** are counted as the planner counts them
(:func:`app.speculation.allocator.live_slots`): every live entry of every active batch's
path set, so a cancelling build still holds its slot until it ends.
"""  # noqa: E501 - tables read best unwrapped

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import unquote

from app.domain.entities import Batch, ChangeDetails, PathEntry
from app.domain.states import BatchState, PathStatus
from app.speculation import core
from app.speculation.allocator import live_slots
from app.speculation.core import Resolution


@dataclass(frozen=True, slots=True)
class Who:
    title: str
    branch: str
    author: str
    author_email: str


def branch_of(uri: str) -> str:
    """``my-branch`` (git, ``refs/heads/`` dropped), ``org/repo#12`` (GitHub), ``D7``
    (Phabricator); the URI without its query when it is none of them."""
    bare = uri.partition("?")[0]
    scheme, _, rest = bare.partition("://")
    parts = rest.split("/")
    if scheme == "git" and len(parts) >= 4:
        return unquote(parts[-2]).removeprefix("refs/heads/")
    if scheme == "github" and len(parts) >= 5 and parts[-3] == "pull":
        return f"{'/'.join(parts[1:-3])}#{parts[-2]}"
    if scheme == "phab" and len(parts) >= 2:
        return parts[1]
    return bare


def who(change_uris: Sequence[str], details: Sequence[ChangeDetails]) -> Who:
    """Title, branch and author of a request (its first change)."""
    first = change_uris[0] if change_uris else ""
    d = next((x for x in details if x.uri == first), details[0] if details else None)
    return Who(title=d.title if d else "", branch=branch_of(first) if first else "",
               author=(d.author_name or d.author_email) if d else "",
               author_email=d.author_email if d else "")


@dataclass(frozen=True, slots=True)
class Slots:
    budget: int
    in_use: int

    @property
    def full(self) -> bool:
        return self.in_use >= self.budget

    @property
    def text(self) -> str:
        return f"{self.in_use}/{self.budget} in use"


def slots(budget: int, entries: Mapping[str, Sequence[PathEntry]],
          active: Sequence[Batch]) -> Slots:
    heads = {b.id for b in active}
    return Slots(budget=budget,
                 in_use=live_slots({h: es for h, es in entries.items() if h in heads}))


@dataclass(frozen=True, slots=True)
class Activity:
    code: str
    text: str


_FIXED = {
    "incoming": Activity("validating", "validating its changes"),
    "batching": Activity("batching", "batching: working out what it conflicts with"),
    "landing": Activity("landing", "landing: merging onto the target"),
    "cancelling": Activity("cancelling", "cancelling"),
}


def frozen(act: Activity, freeze_text: str) -> Activity:
    """``act`` of a request in a frozen queue (``freeze_text``: the freeze's one line):
    one that would land next or is landing waits for the freeze to end instead."""
    if not freeze_text or act.code not in ("built", "landing"):
        return act
    return Activity("frozen", f"{freeze_text}; lands when the freeze ends")


def resolutions(batches: Mapping[str, Batch]) -> dict[str, Resolution]:
    return {bid: core.resolution(b.state) for bid, b in batches.items()}


def activity(stage: str, batch: Batch | None, entries: Sequence[PathEntry],
             res: Mapping[str, Resolution], slots_: Slots) -> Activity:
    """What the request is doing (module docstring's table); ``res``: every known
    batch's resolution (:func:`resolutions`)."""
    if stage in _FIXED:
        return _FIXED[stage]
    if stage != "speculating":
        return Activity(stage, stage)
    if batch is not None and batch.state is BatchState.MERGING:
        return _FIXED["landing"]
    unbroken = [e for e in entries if not core.broken(e.path, res)]
    live = [e for e in unbroken if e.status in (PathStatus.PENDING, PathStatus.BUILDING)]
    if live:
        n = len(live)
        return Activity("building", "building" if n == 1 else f"building ({n} paths)")
    if any(e.status is PathStatus.PASSED for e in unbroken):
        ahead = [d for d in (batch.dependencies if batch else ())
                 if res.get(d, Resolution.UNRESOLVED) is Resolution.UNRESOLVED]
        if ahead:
            return Activity("built", f"built; waiting for the batches ahead ({', '.join(ahead)})")
        return Activity("built", "built; landing next")
    if slots_.full:
        return Activity("waiting_for_slot", f"waiting for a build slot ({slots_.text})")
    return Activity("queued", f"queued for a build ({slots_.in_use}/{slots_.budget} slots "
                              "in use)")
