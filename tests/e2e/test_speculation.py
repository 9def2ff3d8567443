"""Speculation end to end (real app over HTTP, fakes): merge on full coverage.

A small change queued behind a slow change in the same folder depends on it. With
coverage merging on, the small change builds both of its paths (the slow one lands /
fails), both pass long before the slow build ends, and it lands first; the slow
change then rebuilds with the small one underneath and lands after it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import BACKENDS
from tests.e2e.harness import change, serve

QUEUES = """
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: constant, probability: 0.9}
    build_budget: 6
    speculation: {allocator: sticky, coverage: %s, coverage_min_remaining: 0,
                  min_probability: 0}
"""


async def _landed_at(server: object, sqid: str) -> int:
    history = await server.history(sqid)  # type: ignore[attr-defined]
    return next(e["timestamp_ms"] for e in history
                if e["type"] == "status" and e["status"] == "landed")


@pytest.mark.slow
@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_small_change_behind_a_slow_conflicting_one_lands_first(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES % "true")
    async with serve(database_url, tmp_path) as server:
        slow = await server.land(change("slow", files="src/a.py", build_ms=8000))
        await server.wait_status(slow, {"speculating"}, timeout=20)
        small = await server.land(change("small", files="src/b.py", build_ms=200))
        assert await server.wait_terminal(small, timeout=30) == "landed"
        assert (await server.summary(slow))["status"] not in ("landed", "error")
        assert await server.wait_terminal(slow, timeout=60) == "landed"
        assert await _landed_at(server, small) < await _landed_at(server, slow)
        # the slow change was rebuilt with the small one underneath: one of its builds
        # assumed the overtaking batch lands
        events = [e for e in await server.history(slow) if e.get("event") == "building"]
        assert len({e["metadata"]["path_id"] for e in events}) >= 2


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_without_coverage_the_small_change_waits_for_the_slow_one(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES % "false")
    async with serve(database_url, tmp_path) as server:
        slow = await server.land(change("slow", files="src/a.py", build_ms=3000))
        await server.wait_status(slow, {"speculating"}, timeout=20)
        small = await server.land(change("small", files="src/b.py", build_ms=200))
        assert await server.wait_terminal(small, timeout=30) == "landed"
        assert await server.wait_terminal(slow, timeout=30) == "landed"
        assert await _landed_at(server, slow) < await _landed_at(server, small)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_lost_build_is_retried_as_a_new_attempt_and_the_change_lands(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES % "false")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change("lost", files="x/a.py", fake="build-lost"))
        assert await server.wait_terminal(sqid, timeout=30) == "landed"
        builds = [e["metadata"] for e in await server.history(sqid)
                  if e.get("event") == "building"]
        by_attempt = {md["attempt"]: md["build_status"] for md in builds}
        assert by_attempt.get(1) == "errored" and by_attempt.get(2) == "succeeded", builds
        assert len({md["path_id"] for md in builds}) == 1  # the same path, built again


def fake_queue(speculation: str, *, budget: int, by_directory: bool = False) -> str:
    """A ``demo`` queue on fakes with a constant scorer and the given speculation block."""
    analyzer = "\n    conflict_analyzer: {type: pathoverlap, by: directory}" if by_directory \
        else ""
    return f"""
queues:
  - name: demo
    change_provider: {{type: fake}}{analyzer}
    build_runner: {{type: fake, delay_ms: 0}}
    merger: {{type: fake}}
    scorer: {{type: constant, probability: 0.9}}
    build_budget: {budget}
    speculation: {speculation}
"""


RETRY_QUEUE = fake_queue("{retries: %d}", budget=2)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_flaky_build_is_retried_and_lands_marked_flake_suspected(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(RETRY_QUEUE % 1)
    async with serve(database_url, tmp_path) as server:
        flaky = await server.land(change("flaky", files="x/a.py", fake="build-flaky"))
        bad = await server.land(change("bad", files="y/b.py", fake="build-fail"))
        assert await server.wait_terminal(flaky, timeout=30) == "landed"
        assert await server.wait_terminal(bad, timeout=30) == "error"  # retried, still bad
        history = await server.history(flaky)
        builds = {e["metadata"]["attempt"]: e["metadata"]["build_status"] for e in history
                  if e.get("event") == "building" and e["metadata"]["build_status"] in
                  ("failed", "succeeded")}
        assert builds == {1: "failed", 2: "succeeded"}, history
        [flake] = [e for e in history if e.get("event") == "flake_suspected"]
        assert flake["metadata"]["detail"].endswith(
            "1 earlier attempt failed and attempt 2 passed: the failure is suspected flaky")
        bad_builds = [e["metadata"]["attempt"] for e in await server.history(bad)
                      if e.get("event") == "building"
                      and e["metadata"]["build_status"] == "failed"]
        assert sorted(bad_builds) == [1, 2]  # one retry, then the failure counts
        assert not [e for e in await server.history(bad) if e.get("event") == "flake_suspected"]


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_without_retries_a_flaky_build_fails_its_change(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(RETRY_QUEUE % 0)
    async with serve(database_url, tmp_path) as server:
        flaky = await server.land(change("flaky", files="x/a.py", fake="build-flaky"))
        assert await server.wait_terminal(flaky, timeout=30) == "error"



SECOND_CHANCE_QUEUE = fake_queue("{second_chance: %s}", budget=4, by_directory=True)


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_flaky_batch_lands_on_its_second_chance_and_a_bad_change_fails_twice(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(SECOND_CHANCE_QUEUE % "true")
    async with serve(database_url, tmp_path) as server:
        flaky = await server.land(change("flaky", files="x/a.py", fake="build-flaky-batch"))
        bad = await server.land(change("bad", files="y/b.py", fake="build-fail"))
        assert await server.wait_terminal(flaky, timeout=30) == "landed"
        assert await server.wait_terminal(bad, timeout=30) == "error"
        history = await server.history(flaky)
        [second] = [e for e in history if (e.get("metadata") or {}).get("second_chance")]
        assert second["status"] == "batching" and "second chance" in \
            second["metadata"]["reason"], second
        ends = [e["metadata"]["build_status"] for e in history if e.get("event") ==
                "building" and e["metadata"]["build_status"] in ("failed", "succeeded")]
        assert ends == ["failed", "succeeded"], history
        summary = await server.summary(bad)
        assert "its second chance: it failed in batch" in summary["last_error"], summary
        bad_builds = [e for e in await server.history(bad) if e.get("event") == "building"
                      and e["metadata"]["build_status"] == "failed"]
        assert len(bad_builds) == 2  # its first batch's and its second chance's


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_without_second_chances_a_flaky_batch_fails_its_change(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(SECOND_CHANCE_QUEUE % "false")
    async with serve(database_url, tmp_path) as server:
        flaky = await server.land(change("flaky", files="x/a.py", fake="build-flaky-batch"))
        assert await server.wait_terminal(flaky, timeout=30) == "error"


VINDICATION_QUEUE = fake_queue("{vindication_depth: %d}", budget=4, by_directory=True)


def _builds(history: list[dict[str, object]]) -> dict[tuple[str, int], str]:
    """(path id, attempt) -> the build's end status, from a request's history."""
    out = {}
    for e in history:
        md = e.get("metadata")
        if e.get("event") == "building" and isinstance(md, dict) and \
                md["build_status"] in ("failed", "succeeded"):
            out[(str(md["path_id"]), int(md["attempt"]))] = str(md["build_status"])
    return out


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_a_failure_a_dependents_passed_build_contains_is_rebuilt_and_lands(
        database_url: str, tmp_path: Path) -> None:
    """``first`` fails its own first build (a flake: ``build-flaky-head``) while the build
    of ``second`` on top of it still runs: with vindication it is not removed, the
    dependent's build passes, ``first`` is built once more, passes and lands, and so does
    ``second``. A truly bad change (``build-fail``) breaks its dependent's containing
    build too: it is not rebuilt and is removed; its dependent lands without it."""
    (tmp_path / "queues.yaml").write_text(VINDICATION_QUEUE % 2)
    async with serve(database_url, tmp_path) as server:
        first = await server.land(change("first", files="x/a.py", fake="build-flaky-head",
                                         build_ms=1000))
        second = await server.land(change("second", files="x/b.py", build_ms=2500))
        bad = await server.land(change("bad", files="y/a.py", fake="build-fail",
                                       build_ms=300))
        after_bad = await server.land(change("after-bad", files="y/b.py", build_ms=1000))
        assert await server.wait_terminal(first, timeout=30) == "landed"
        assert await server.wait_terminal(second, timeout=30) == "landed"
        assert await server.wait_terminal(bad, timeout=30) == "error"
        assert await server.wait_terminal(after_bad, timeout=30) == "landed"

        history = await server.history(first)
        assert sorted(_builds(history).values()) == ["failed", "succeeded"], history
        [(path, attempt)] = [k for k, v in _builds(history).items() if v == "succeeded"]
        assert attempt == 2 and _builds(history)[(path, 1)] == "failed"  # the same path
        [flake] = [e for e in history if e.get("event") == "flake_suspected"]
        assert flake["metadata"]["vindicated"] == 1
        assert "failed (a build of a dependent that contained it had passed) and attempt " \
            "2 passed" in flake["metadata"]["detail"]
        landed = {e["status"]: e["timestamp_ms"] for e in history if e["type"] == "status"}
        second_landed = [e["timestamp_ms"] for e in await server.history(second)
                         if e["type"] == "status" and e["status"] == "landed"]
        assert landed["landed"] <= second_landed[0]

        bad_history = await server.history(bad)
        assert list(_builds(bad_history).values()) == ["failed"], bad_history  # no rebuild
        assert not [e for e in bad_history if e.get("event") == "flake_suspected"]


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_without_vindication_the_same_flake_removes_the_change(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(VINDICATION_QUEUE % 0)
    async with serve(database_url, tmp_path) as server:
        first = await server.land(change("first", files="x/a.py", fake="build-flaky-head",
                                         build_ms=1000))
        second = await server.land(change("second", files="x/b.py", build_ms=2500))
        assert await server.wait_terminal(first, timeout=30) == "error"
        assert await server.wait_terminal(second, timeout=30) == "landed"


HISTORY_QUEUE = """
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: history, prior: 0.9, prior_weight: 1}
    build_budget: 4
"""


async def _p_land(server: object, sqid: str) -> float:
    queue, n = sqid.split("/")
    r = await server.client.get(f"/api/v1/queues/{queue}/requests/{n}/view")  # type: ignore[attr-defined]
    assert r.status_code == 200, r.text
    p = r.json()["request"]["forecast"]["p_land"]
    assert isinstance(p, float)
    return p


@pytest.mark.parametrize("database_url", BACKENDS[:1], indirect=True)
async def test_the_history_scorer_learns_from_the_queues_own_builds(
        database_url: str, tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(HISTORY_QUEUE)
    async with serve(database_url, tmp_path) as server:
        bad = await server.land(change("bad", files="risky/a.py", fake="build-fail"))
        assert await server.wait_terminal(bad) == "error"
        risky = await server.land(change("r2", files="risky/b.py", build_ms=4000))
        safe = await server.land(change("s1", files="safe/c.py", build_ms=4000))
        await server.wait_status(risky, {"speculating"})
        await server.wait_status(safe, {"speculating"})
        p_risky, p_safe = await _p_land(server, risky), await _p_land(server, safe)
        assert p_risky < p_safe, (p_risky, p_safe)
        assert p_risky < 0.9
