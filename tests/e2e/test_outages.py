"""Outages end to end: the sandbox repository goes away while requests are in flight.

Scaled down for CI (an outage of a few seconds, probes every few hundred ms); the
3-minute version is ``bench/outage.py``.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BACKENDS
from tests.e2e.harness import Server, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(240),
    pytest.mark.slow,
]

QUEUES = queues_file(git_queue(conflicts="{type: all}", extra="outages: {window_s: %s}"))

FAST = {"outage_threshold": 2, "outage_probe_initial_ms": 200, "outage_probe_max_ms": 800,
        "outage_recheck_ms": 300, "speculate_resync_ms": 1000,
        "admin_token": "t"}


def changes(repo: GitSandbox, n: int, start: int = 0) -> list[str]:
    return [repo.branch(f"f{i}", {f"d{i}/f.txt": f"{i}\n"}, f"Add d{i}")
            for i in range(start, start + n)]


async def poll(what: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await what()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(0.1)


async def outage_lasts(server: Server, dependency: str, probes: int = 3) -> None:
    """Wait until the open circuit of ``dependency`` has failed ``probes`` more probes:
    the outage lasted through several retries (a condition, not a sleep)."""
    async def failures() -> int:
        ready = (await server.client.get("/readyz")).json()
        return int(_find(ready, dependency)["failures"])

    start = await failures()

    async def retried() -> bool:
        return await failures() >= start + probes

    await poll(retried, timeout=60)


async def overview(server: Server) -> dict[str, Any]:
    r = await server.client.get("/api/v1/queues/gitq/overview")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def view(server: Server, sqid: str) -> dict[str, Any]:
    r = await server.client.get(f"/api/v1/queues/gitq/requests/{sqid.rsplit('/', 1)[1]}/view")
    assert r.status_code == 200, r.text
    return r.json()  # type: ignore[no-any-return]


async def no_request_errored(server: Server) -> None:
    statuses = await server.statuses_of_queue("gitq")
    assert not [s for s, v in statuses.items() if v in ("error", "cancelled")], statuses


async def test_an_outage_shorter_than_the_window_loses_nothing(
        database_url: str, tmp_path: Path) -> None:
    write_queues(tmp_path, QUEUES % 120)
    repo = GitSandbox.seeded(tmp_path, SANDBOX_KEY)
    first, later = changes(repo, 10), changes(repo, 5, start=10)
    away = tmp_path / "remote.away"
    async with serve(database_url, tmp_path, **FAST) as server:
        sqids = [await server.land(c, queue="gitq") for c in first]
        repo.bare.rename(away)  # the repository goes away with 10 requests in flight
        outage = await poll(lambda: _open(server))
        assert outage["dependency"] == "repository:gitq"
        assert outage["text"].startswith("waiting: repository:gitq unreachable since ")
        assert "retrying (" in outage["text"]
        sqids += [await server.land(c, queue="gitq") for c in later]
        live = [s for s, v in (await server.statuses_of_queue("gitq")).items()
                if v not in ("landed", "error", "cancelled")]
        assert live, "every request landed before the outage began"
        page = await view(server, live[0])
        assert [o["dependency"] for o in page["outages"]] == ["repository:gitq"]
        ready = (await server.client.get("/readyz")).json()
        circuit = _find(ready, "repository:gitq")
        assert circuit["state"] == "open", ready["checks"]["dependencies"]
        metrics = (await server.client.get("/metrics")).text
        assert 'submitqueue_circuit_open{dependency="repository:gitq"} 1.0' in metrics
        await outage_lasts(server, "repository:gitq")  # nothing may fail meanwhile
        await no_request_errored(server)
        away.rename(repo.bare)
        final = await server.wait_all_terminal(sqids, timeout=120, queue="gitq")
        assert set(final.values()) == {"landed"}, final
        assert not await _open(server)
        dlq = sum(g["dlq_size"] for g in await _topic_stats(server))
        assert dlq == 0
        batch_of = {s: (await view(server, s))["batch"]["id"] for s in sqids}
    subjects = repo.main("log", "--format=%s", "main").splitlines()[::-1]
    assert subjects[0] == "initial"
    landed = [line.rsplit("(", 1)[1].rstrip(")") for line in subjects[1:]]
    assert sorted(landed) == sorted(sqids)  # each exactly once
    # in order: the queue's order (its batches), and those submitted during the outage
    # after the others, in submission order
    def number(batch: str) -> int:
        return int(batch.rsplit("/", 1)[1])
    assert landed == sorted(sqids, key=lambda s: number(batch_of[s])), " | ".join(landed)
    assert landed[10:] == sqids[10:], landed
    tree = repo.main("ls-tree", "-r", "--name-only", "main").splitlines()
    assert sorted(tree) == sorted(["a.txt", *[f"d{i}/f.txt" for i in range(15)]])


async def test_an_outage_longer_than_the_window_ends_requests_dependency_unavailable(
        database_url: str, tmp_path: Path) -> None:
    write_queues(tmp_path, QUEUES % 2)
    repo = GitSandbox.seeded(tmp_path, SANDBOX_KEY)
    uris = changes(repo, 3)
    async with serve(database_url, tmp_path, **FAST) as server:
        repo.bare.rename(tmp_path / "remote.away")
        sqids = [await server.land(c, queue="gitq") for c in uris]
        final = await server.wait_all_terminal(sqids, timeout=60, queue="gitq")
        assert set(final.values()) == {"error"}, final
        for sqid in sqids:
            last_error = (await server.summary(sqid))["last_error"]
            assert last_error.startswith("dependency unavailable: repository:gitq was "
                                         "unreachable for "), last_error
            assert "Traceback" not in last_error
            removal = (await view(server, sqid))["removal"]
            assert removal["kind"] == "dependency_unavailable", removal
            assert removal["reason"] == "dependency_failed", removal


BUILD_QUEUES = queues_file(git_queue(
    conflicts="{type: all}", extra="build_budget: 2",
    build_runner='{type: command, sandbox: none, command: ["sh", "-c", "if [ -e %s ]; '
                 'then echo \'cache down\' >&2; exit 75; fi; test -f a.txt"]}'))


async def test_a_build_system_outage_holds_the_builds_and_loses_nothing(
        database_url: str, tmp_path: Path) -> None:
    down = tmp_path / "ci-down"
    write_queues(tmp_path, BUILD_QUEUES % down)
    repo = GitSandbox.seeded(tmp_path, SANDBOX_KEY)
    uris = changes(repo, 6)
    down.touch()  # every build command exits 75 (EX_TEMPFAIL): infrastructure, not a test
    async with serve(database_url, tmp_path, **FAST) as server:
        sqids = [await server.land(c, queue="gitq") for c in uris[:4]]
        outage = await poll(lambda: _open(server), timeout=60)
        assert outage["dependency"] == "builds:gitq", outage
        sqids += [await server.land(c, queue="gitq") for c in uris[4:]]
        await outage_lasts(server, "builds:gitq")
        await no_request_errored(server)
        assert (await overview(server))["outages"], "the circuit closed while CI was down"
        down.unlink()
        final = await server.wait_all_terminal(sqids, timeout=120, queue="gitq")
        assert set(final.values()) == {"landed"}, final
        assert sum(t["dlq_size"] for t in await _topic_stats(server)) == 0
    landed = [line.rsplit("(", 1)[1].rstrip(")")
              for line in repo.main("log", "--format=%s", "main").splitlines()[::-1][1:]]
    assert sorted(landed) == sorted(sqids)


async def _open(server: Server) -> dict[str, Any] | None:
    outages = (await overview(server))["outages"]
    return outages[0] if outages else None


def _find(ready: dict[str, Any], dep: str) -> dict[str, Any]:
    checks = ready.get("checks", ready)
    return checks["dependencies"]["circuits"][dep]  # type: ignore[no-any-return]


async def _topic_stats(server: Server) -> list[dict[str, Any]]:
    r = await server.client.get("/api/v1/admin/topics",
                                headers={"Authorization": "Bearer t"})
    assert r.status_code == 200, r.text
    return r.json()["topics"]  # type: ignore[no-any-return]
