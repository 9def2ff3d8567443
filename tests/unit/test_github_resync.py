"""Every row of the resync's cancel rule (``app/domain/github_resync.py``)."""

from __future__ import annotations

import pytest

from app.domain.github_resync import CANCELLABLE, RESYNC_NOTE, PullNow, Queued, lost_cancel
from app.domain.removals import RemovalReason, classify

HEAD, OTHER = "a" * 40, "b" * 40
LABEL = frozenset({"merge-queue"})


def now(**kw: object) -> PullNow:
    fields: dict[str, object] = {"number": 5, "head": HEAD, "base": "main", "state": "open",
                                 "labels": LABEL}
    fields.update(kw)
    return PullNow(**fields)  # type: ignore[arg-type]


def queued(status: str = "speculating", origin: str = "label", head: str = HEAD) -> Queued:
    return Queued("q/1", 5, head, status, origin)


@pytest.mark.parametrize(("request_", "pull", "reason"), [
    (queued(), None, None),
    (queued(), now(state="merged"), None),
    (queued(), now(state="closed", labels=frozenset({"merged-by-queue"})), None),
    (queued(), now(state="closed"), f"pull request #5 was closed{RESYNC_NOTE}"),
    (queued(), now(base="release"),
     f"pull request #5 now targets 'release'; this queue lands on 'main'{RESYNC_NOTE}"),
    (queued(head=OTHER), now(), "superseded by a new push"),
    (queued(), now(labels=frozenset()), f"the merge-queue label was removed{RESYNC_NOTE}"),
    (queued(origin="comment"), now(labels=frozenset()), None),
    (queued(origin=""), now(labels=frozenset()), None),
    (queued(), now(), None),
    (queued(status="landing"), now(state="closed"), None),
    (queued(status="cancelling"), now(state="closed"), None),
])
def test_the_cancel_rule(request_: Queued, pull: PullNow | None, reason: str | None) -> None:
    assert lost_cancel(request_, pull, target="main", land_label="merge-queue") == reason


def test_only_statuses_before_landing_are_cancellable_and_a_push_reads_superseded() -> None:
    assert "landing" not in CANCELLABLE and "accepted" in CANCELLABLE
    assert not {"landed", "error", "cancelled", "cancelling"} & CANCELLABLE
    why = lost_cancel(queued(head=OTHER), now(), target="main", land_label="merge-queue")
    assert classify("cancelled", f"cancelled: {why}") is RemovalReason.SUPERSEDED
