"""Multi-request batches end to end (real app over HTTP, fakes): a batch builds and
lands as one unit; a failing batch is bisected until the bad change is alone, the good
ones land, and the bad one's reason names the failed build and the bisection."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from app.controllers.batch import BatchController
from tests.conftest import BACKENDS
from tests.e2e.harness import change, serve
from tests.support.interleave import hook

QUEUE = """
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: constant, probability: 0.9}
    build_budget: 4
    batching: {max_size: %d, max_wait_ms: 15000}  # closes when full: all join under load
"""


# Validated or any status after it (a request batched beside a held one runs through).
PAST_VALIDATION = {"validated", "batching", "batched", "speculating", "speculated",
                   "landing", "landed", "error"}


def _batches(history: list[dict[str, Any]]) -> list[str]:
    """The batches a request was put in, in order."""
    seen: list[str] = []
    for e in history:
        bid = (e.get("metadata") or {}).get("batch_id")
        if e["type"] == "status" and e["status"] == "batching" and bid not in seen:
            seen.append(bid)
    return seen


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_batch_of_four_with_one_bad_member_lands_the_three_good_ones(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUE % 4)
    async with serve(database_url, tmp_path) as server:
        sqids = [await server.land(change(f"c{i}", files=f"d{i}/a.py",
                                          fake="build-fail" if i == 2 else ""))
                 for i in range(4)]
        outcomes = [await server.wait_terminal(s, timeout=60) for s in sqids]
        assert outcomes == ["landed", "landed", "error", "landed"]

        histories = [await server.history(s) for s in sqids]
        first = {_batches(h)[0] for h in histories}
        assert len(first) == 1, histories  # all four were batched together
        bad = await server.summary(sqids[2])
        reason = bad["last_error"]
        assert "isolated by bisecting batch" in reason, reason
        assert "build" in reason and "failed" in reason, reason
        # the bad change went through the whole bisection: 4 -> 2 -> 1
        assert len(_batches(histories[2])) == 3, histories[2]
        split = [e for e in histories[2] if e["type"] == "status"
                 and e["status"] == "batching" and "split_from" in e["metadata"]]
        assert split and "did not land" in split[0]["metadata"]["reason"]
        # every build of the bad change's batches failed, none of it landed
        landed = {s: [e for e in h if e["type"] == "status" and e["status"] == "landed"]
                  for s, h in zip(sqids, histories, strict=True)}
        assert not landed[sqids[2]]


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_a_good_batch_lands_as_one_unit_with_one_build(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUE % 3)
    async with serve(database_url, tmp_path) as server:
        sqids = [await server.land(change(f"g{i}", files=f"g{i}/a.py")) for i in range(3)]
        assert [await server.wait_terminal(s, timeout=30) for s in sqids] == ["landed"] * 3
        histories = [await server.history(s) for s in sqids]
        assert len({_batches(h)[0] for h in histories}) == 1
        builds = {e["metadata"]["path_id"] for h in histories for e in h
                  if e.get("event") == "building"}
        assert len(builds) == 1, builds


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_requests_of_one_queue_are_batched_one_at_a_time(
        database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the first request's batching is held, the second one's does not start
    (on PostgreSQL both used to find no open batch and mint one each); once let go,
    the two join one batch."""
    (tmp_path / "queues.yaml").write_text(QUEUE % 2)
    async with serve(database_url, tmp_path) as server:
        batching = hook(monkeypatch, BatchController, "_create", pause="entry")
        first = await server.land(change("j0", files="j0/a.py"))
        await batching.reached()
        second = await server.land(change("j1", files="j1/a.py"))
        await server.wait_status(second, PAST_VALIDATION)
        await asyncio.sleep(0.5)  # its batch message is due by now
        assert batching.entered == 1, "the second request was batched beside the first"
        batching.release()
        assert [await server.wait_terminal(s, timeout=30) for s in (first, second)] == [
            "landed", "landed"]
        histories = [await server.history(s) for s in (first, second)]
        assert len({_batches(h)[0] for h in histories}) == 1, histories
