"""Freezes end to end over HTTP (SQLite and PostgreSQL; docs/freeze.md): a frozen queue
accepts and builds requests but lands nothing (the target ref stays where it was) and
lands them once unfrozen, when ``until`` passes, or not at all while a ``queues.yaml``
window holds; ``allow_builds: false`` funds no build; auth, bad input and the audit."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from app.cli.root import cli
from app.db.repos import audit as audit_repo
from app.db.repos import speculation as spec_repo
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

TOKEN = "ops:s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
FAST = {"admin_token": TOKEN, "freeze_recheck_ms": 100, "metrics_refresh_ms": 0}
DEMO = """  - name: demo
    change_provider: {type: fake}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
"""


async def freeze(server: Server, queue: str = "demo", status: int = 200,
                 headers: dict[str, str] = AUTH, **body: Any) -> Any:
    body.setdefault("reason", "release cut")
    r = await server.client.post(f"/api/v1/queues/{queue}/freeze", json=body,
                                 headers=headers)
    assert r.status_code == status, r.text
    return r.json()


async def unfreeze(server: Server, queue: str = "demo", status: int = 200,
                   headers: dict[str, str] = AUTH) -> Any:
    r = await server.client.post(f"/api/v1/queues/{queue}/unfreeze",
                                 json={"reason": "done"}, headers=headers)
    assert r.status_code == status, r.text
    return r.json()


async def overview(server: Server, queue: str = "demo") -> Any:
    r = await server.client.get(f"/api/v1/queues/{queue}/overview")
    assert r.status_code == 200, r.text
    return r.json()


async def held_merges(server: Server) -> int:
    stats = {t.topic: t for t in await server.runtime.broker.stats()}
    assert stats["merge"].dlq_size == 0  # held, never dead-lettered
    assert all(g.retrying == 0 for g in stats["merge"].groups)  # no attempt spent
    return sum(g.held for g in stats["merge"].groups)


async def wait_held(server: Server, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while await held_merges(server) == 0:
        assert time.monotonic() < deadline, "no merge was held"
        await asyncio.sleep(0.05)


@pytest.fixture
def repo(tmp_path: Path) -> GitSandbox:
    write_queues(tmp_path, queues_file(git_queue()))
    return GitSandbox.seeded(tmp_path, SANDBOX_KEY)


async def test_a_frozen_queue_builds_but_moves_no_ref_until_unfrozen(
    database_url: str, tmp_path: Path, repo: GitSandbox
) -> None:
    feature = repo.branch("feature", {"src/hello.txt": "hello\n"}, "Add hello")
    before = repo.tip()
    async with serve(database_url, tmp_path, **FAST) as server:
        out = await freeze(server, "gitq", reason="release 4.2 cut")
        assert out["changed"] and out["freeze"]["frozen"] and out["freeze"]["by"] == "ops"
        sqid = await server.land(feature, queue="gitq")
        assert await server.wait_status(sqid, {"speculated"}) == "speculated"
        await wait_held(server)
        await asyncio.sleep(0.5)  # several rechecks: still held, still not landed
        events = [e["event"] for e in await server.history(sqid) if e["type"] == "event"]
        assert "built" in events  # built while frozen
        assert (await server.summary(sqid))["status"] == "speculated"
        assert repo.tip() == before  # the target ref did not move
        view = (await server.client.get(f"/api/v1/queues/gitq/requests/"
                                        f"{sqid.rsplit('/', 1)[1]}/view")).json()
        assert view["freeze"]["frozen"] and view["freeze"]["reason"] == "release 4.2 cut"
        assert view["freeze"]["text"].startswith("frozen: release 4.2 cut (manual by ops")
        assert view["request"]["activity"] == "frozen"  # not "landing: merging onto..."
        assert view["request"]["activity_text"].endswith("; lands when the freeze ends")
        rows = [r for g in (await overview(server, "gitq"))["stages"] for r in g["requests"]]
        assert [(r["sqid"], r["activity"]) for r in rows] == [(sqid, "frozen")]
        assert (await unfreeze(server, "gitq"))["freeze"] == {
            **(await overview(server, "gitq"))["freeze"], "frozen": False}
        assert await server.wait_terminal(sqid, timeout=10) == "landed"
    assert repo.tip() != before
    assert repo.main("log", "--format=%s", "main").splitlines()[0] == f"Add hello ({sqid})"


async def test_until_ends_a_freeze_by_itself(database_url: str, tmp_path: Path) -> None:
    write_queues(tmp_path, queues_file(DEMO))
    async with serve(database_url, tmp_path, **FAST) as server:
        until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=2)
        out = await freeze(server, until=until.isoformat().replace("+00:00", "Z"))
        until_ms = int(until.timestamp() * 1000)
        assert out["freeze"]["until_ms"] == until_ms
        sqid = await server.land(change("until", files="u/a.py"))
        await server.wait_status(sqid, {"speculated", "landed"})
        if time.time() * 1000 < until_ms - 300:  # (a loaded machine may be past it)
            assert (await overview(server))["freeze"]["frozen"]
            assert (await server.summary(sqid))["status"] == "speculated"
        assert await server.wait_terminal(sqid, timeout=10) == "landed"
        landed = [e for e in await server.history(sqid) if e.get("status") == "landed"]
        assert landed[0]["timestamp_ms"] >= until_ms  # not a moment before the end
        assert (await overview(server))["freeze"] == {
            "frozen": False, "reason": "", "since_ms": None, "until_ms": None, "by": "",
            "allow_builds": True, "allow_hotfix": False, "source": None, "text": ""}


async def test_allow_builds_false_funds_no_build_until_unfrozen(
    database_url: str, tmp_path: Path
) -> None:
    write_queues(tmp_path, queues_file(DEMO))
    async with serve(database_url, tmp_path, **FAST) as server:
        await freeze(server, reason="incident: CI is down", allow_builds=False)
        sqid = await server.land(change("nobuild", files="n/a.py"))
        await server.wait_status(sqid, {"speculating"})
        await asyncio.sleep(1.0)
        async with server.runtime.db.read() as s:
            sets = await spec_repo.path_sets(s, queue="demo", heads=["demo/batch/1"])
        assert [e for ps in sets.values() for e in ps.entries] == []  # nothing funded
        events = [e["event"] for e in await server.history(sqid) if e["type"] == "event"]
        assert "building" not in events
        assert (await server.summary(sqid))["status"] == "speculating"
        assert not (await overview(server))["freeze"]["allow_builds"]
        await unfreeze(server)  # wakes the queue: the build starts at once, then it lands
        assert await server.wait_terminal(sqid, timeout=10) == "landed"


async def test_a_window_in_queues_yaml_freezes_the_queue(
    database_url: str, tmp_path: Path
) -> None:
    window = '    freeze_windows: [{cron: "* * * * *", duration: 1h, reason: "code freeze"}]\n'
    write_queues(tmp_path, queues_file(DEMO + window))
    async with serve(database_url, tmp_path, **FAST) as server:
        sqid = await server.land(change("window", files="w/a.py"))
        await server.wait_status(sqid, {"speculated"})
        await wait_held(server)
        await asyncio.sleep(0.3)
        assert (await server.summary(sqid))["status"] == "speculated"
        got = (await server.client.get("/api/v1/queues/demo/freeze")).json()["freeze"]
        assert (got["frozen"], got["source"], got["reason"], got["by"]) == (
            True, "window", "code freeze", "queues.yaml")
        assert got["until_ms"] > got["since_ms"] + 3_600_000  # every minute: one long span
        # an unfreeze ends manual freezes only: the window holds on
        out = await unfreeze(server)
        assert (out["changed"], out["freeze"]["source"]) == (False, "window")
        metrics = (await server.client.get("/metrics")).text
        assert 'submitqueue_queue_frozen{queue="demo"} 1.0' in metrics
        assert (await server.summary(sqid))["status"] == "speculated"
        r = await asyncio.to_thread(CliRunner().invoke, cli,
                                    ["status", sqid, "--url", server.base_url])
        assert r.exit_code == 0, r.output
        lines = r.stdout.splitlines()
        assert lines[0] == f"{sqid}  speculated"
        assert lines[1].startswith("  frozen: code freeze (window, until "), r.stdout


async def test_freeze_needs_admin_and_good_input_and_is_audited(
    database_url: str, tmp_path: Path
) -> None:
    write_queues(tmp_path, queues_file(DEMO))
    async with serve(database_url, tmp_path, **FAST) as server:
        body = await freeze(server, status=401, headers={})
        assert body["error"]["code"] == "unauthorized"
        await unfreeze(server, status=401, headers={"Authorization": "Bearer ops:wrong"})
        r = await server.client.post("/api/v1/admin/tokens", headers=AUTH,
                                     json={"label": "ci-bot", "scopes": ["land"]})
        lander = {"Authorization": f"Bearer {r.json()['token']}"}
        assert (await freeze(server, status=403, headers=lander))["error"]["code"] == \
            "missing_scope"
        await unfreeze(server, status=403, headers=lander)
        past = await freeze(server, status=422, until="2020-01-01T00:00:00Z")
        assert "is not in the future" in past["error"]["message"]
        naive = await freeze(server, status=422, until="2030-01-01T00:00:00")
        assert "has no time zone" in naive["error"]["message"]
        await freeze(server, status=422, until="next friday")
        await freeze(server, status=422, until=2**63)  # out of range: no 500 from the DB
        await freeze(server, status=422, until=True)
        await freeze(server, status=422, reason="  ")
        await freeze(server, status=422, allow_builds="maybe")
        await freeze(server, "nosuch", status=404)
        assert not (await overview(server))["freeze"]["frozen"]  # nothing refused wrote
        async with server.runtime.db.read() as s:
            assert [e.action for e in await audit_repo.list_entries(s)] == ["token.create"]
        await freeze(server, reason="release", allow_hotfix=True)
        await freeze(server, reason="release, take two")  # replaces the reason
        assert (await unfreeze(server))["changed"] is True
        assert (await unfreeze(server))["changed"] is False
        async with server.runtime.db.read() as s:
            entries = [e for e in await audit_repo.list_entries(s)
                       if e.topic == "queue:demo"]
        assert [(e.action, e.actor, e.reason, e.result["changed"]) for e in entries] == [
            ("unfreeze", "ops", "done", False), ("unfreeze", "ops", "done", True),
            ("freeze", "ops", "release, take two", True), ("freeze", "ops", "release", True)]
        assert entries[2].result["freeze"]["allow_hotfix"] is False
        assert entries[3].result["freeze"]["allow_hotfix"] is True


async def test_allow_hotfix_lets_a_hotfix_land_through_the_freeze(
    database_url: str, tmp_path: Path
) -> None:
    write_queues(tmp_path, queues_file(DEMO))
    async with serve(database_url, tmp_path, **FAST) as server:
        await freeze(server, reason="release", allow_hotfix=True)
        r = await server.client.post("/api/v1/queues/demo/requests", headers=AUTH, json={
            "change_uris": [change("hotfix", files="h/a.py")], "priority": "hotfix"})
        assert r.status_code == 202, r.text
        hotfix = r.json()["sqid"]
        assert await server.wait_terminal(hotfix, timeout=10) == "landed"
        normal = await server.land(change("normal", files="n/a.py"))
        await server.wait_status(normal, {"speculated"})
        await wait_held(server)
        assert (await server.summary(normal))["status"] == "speculated"
        await unfreeze(server)
        assert await server.wait_terminal(normal, timeout=10) == "landed"


async def test_builds_held_back_start_when_until_passes_with_no_resync(
    database_url: str, tmp_path: Path
) -> None:
    """The freeze-thaw job wakes the queue when a freeze without builds ends by itself;
    the resync job is off, so nothing else would."""
    write_queues(tmp_path, queues_file(DEMO))
    async with serve(database_url, tmp_path, **FAST, speculate_resync_ms=0) as server:
        # long enough for the request to reach speculating (held) before it ends, even
        # on a loaded machine: at 1.5 s it sometimes got there after the end (CI,
        # PostgreSQL), and no wake-up was needed
        until = int(time.time() * 1000) + 4000
        await freeze(server, reason="CI maintenance", allow_builds=False, until=until)
        sqid = await server.land(change("thaw", files="t/a.py"))
        await server.wait_status(sqid, {"speculating"})
        assert int(time.time() * 1000) < until, "reached speculating after the freeze ended"
        assert await server.wait_terminal(sqid, timeout=10) == "landed"
        built = [e for e in await server.history(sqid) if e.get("event") == "building"]
        assert built and built[0]["timestamp_ms"] >= until  # no build before the end
        assert server.runtime.thaw is not None and server.runtime.thaw.woken == 1
