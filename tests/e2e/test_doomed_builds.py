"""Doomed builds end to end on SQLite and PostgreSQL (``app/speculation/doom.py``): in a
lane of three conflicting requests, the middle one's build fails while the first is
still building; the last one's build that assumed the middle one lands can never land
anything, so it is cancelled at once (not left to fail a build time later), and the last
request lands on the path built without the failed one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.db.repos import batches as batch_repo
from app.db.repos import speculation as spec_repo
from app.domain.states import Assumption, PathStatus
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

QUEUES = """\
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: constant, probability: 0.9}
    build_budget: 4
"""
S, F = Assumption.SUCCEEDS, Assumption.FAILS


async def landed_at(server: Server, sqid: str) -> tuple[int, dict[str, Any]]:
    history = await server.history(sqid)
    [entry] = [e for e in history if e.get("status") == "landed"]
    [spec] = [e for e in history if e.get("status") == "speculated"]
    return entry["timestamp_ms"], spec["metadata"]


async def test_a_build_behind_a_failed_one_is_cancelled_at_once_and_the_lane_goes_on(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path) as server:
        first = await server.land(change("first", files="lib/a.py", build_ms=6000))
        bad = await server.land(change("bad", files="lib/b.py", fake="build-fail",
                                       build_ms=2500))
        last = await server.land(change("last", files="lib/c.py", build_ms=6000))
        assert await server.wait_terminal(first, timeout=40) == "landed"
        assert await server.wait_terminal(bad, timeout=40) == "error"
        assert await server.wait_terminal(last, timeout=40) == "landed"

        async with server.runtime.db.read() as s:
            [a] = await batch_repo.for_request(s, queue="demo", request_id=first)
            [b] = await batch_repo.for_request(s, queue="demo", request_id=bad)
            [c] = await batch_repo.for_request(s, queue="demo", request_id=last)
            sets = await spec_repo.path_sets(s, queue="demo", heads=[b.id, c.id])
        assert c.dependencies == (a.id, b.id)
        b_entries = {e.path.dependencies: e for e in sets[b.id].entries}
        assert b_entries[((a.id, S),)].status is PathStatus.FAILED
        c_entries = {e.path.dependencies: e for e in sets[c.id].entries}
        doomed = c_entries[((a.id, S), (b.id, S))]
        first_at, _ = await landed_at(server, first)
        # stopped when the bad one's build failed, before the first one even landed
        # (without the rule it ran on and failed, a build time after it started)
        assert doomed.status is PathStatus.CANCELLED, doomed
        assert doomed.updated_at_ms < first_at
        _, merged = await landed_at(server, last)
        on = c_entries[((a.id, S), (b.id, F))]
        assert merged["path_id"] == on.id and on.status is PathStatus.PASSED
