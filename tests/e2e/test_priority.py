"""Priority end to end (issue 16, item 3) on SQLite and PostgreSQL: a hotfix overtakes a
conflicting normal request that is already building, lands first, and the normal one
then lands on top of it on a path whose build contained the hotfix (on fakes, and on
real git with command builds, where main ends exactly at the commit a passed build
tested); who may ask for a hotfix (403), what a bad priority is (422), and where the
priority shows (summary, views, metrics)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from app.cli.root import cli
from app.db import tables
from app.db.repos import batches as batch_repo
from app.db.repos import speculation as spec_repo
from app.domain.states import Assumption, PathStatus, Priority
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, change, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(60),
]

TOKEN = "ops:s3cret"
ADMIN = {"Authorization": f"Bearer {TOKEN}"}
QUEUES = """\
queues:
  - name: demo
    change_provider: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    scorer: {type: constant, probability: 0.9}
    build_budget: 4
    hotfix_allowed: [alice]
"""


async def land(server: Server, uri: str, priority: str | None = None, *, status: int = 202,
               headers: dict[str, str] | None = None, key: str | None = None) -> Any:
    body: dict[str, Any] = {"change_uris": [uri]}
    if priority is not None:
        body["priority"] = priority
    hs = dict(headers or {})
    if key:
        hs["Idempotency-Key"] = key
    r = await server.client.post("/api/v1/queues/demo/requests", json=body, headers=hs)
    assert r.status_code == status, r.text
    return r.json()


async def landed_at(server: Server, sqid: str) -> tuple[int, dict[str, Any]]:
    [entry] = [e for e in await server.history(sqid) if e.get("status") == "landed"]
    [spec] = [e for e in await server.history(sqid) if e.get("status") == "speculated"]
    return entry["timestamp_ms"], spec["metadata"]


@pytest.mark.parametrize("mode", [
    pytest.param({}, id="plain"),
    pytest.param({"queue_chaos_duplicate": True, "queue_chaos_fail_rate": 0.2}, id="chaos")])
async def test_a_hotfix_overtakes_a_building_normal_request_and_lands_first(
    database_url: str, mode: dict[str, Any], tmp_path: Path
) -> None:
    """Also with chaos delivery (every message handled twice, a fifth of the runs failing
    after their writes): the overtake is applied once and the order holds."""
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, admin_token=TOKEN, **mode) as server:
        # long enough that a loaded machine still analyses the hotfix while it builds
        slow = (await land(server, change("slow", files="lib/a.py", build_ms=5000)))["sqid"]
        await server.wait_status(slow, {"speculating"})
        fix = (await land(server, change("fix", files="lib/b.py"), "hotfix",
                          headers=ADMIN))["sqid"]
        assert await server.wait_terminal(fix, timeout=20) == "landed"
        assert (await server.summary(slow))["status"] != "landed"  # it went first
        assert await server.wait_terminal(slow, timeout=20) == "landed"
        fix_at, _ = await landed_at(server, fix)
        slow_at, merged = await landed_at(server, slow)
        assert fix_at < slow_at

        async with server.runtime.db.read() as s:
            [fix_batch] = await batch_repo.for_request(s, queue="demo", request_id=fix)
            [slow_batch] = await batch_repo.for_request(s, queue="demo", request_id=slow)
            sets = await spec_repo.path_sets(s, queue="demo", heads=[slow_batch.id])
        assert fix_batch.priority is Priority.HOTFIX and slow_batch.priority is Priority.NORMAL
        assert fix_batch.dependencies == () and fix_batch.overtakes == (slow_batch.id,)
        assert slow_batch.dependencies == (fix_batch.id,)  # gained by the speculate run
        [batched] = [e for e in await server.history(fix) if e.get("status") == "batched"]
        assert batched["metadata"]["overtakes"] == [slow_batch.id]
        assert batched["metadata"]["dependencies"] == []
        entries = {e.id: e for e in sets[slow_batch.id].entries}
        # it landed on a passed build of exactly trunk + hotfix + itself
        on = entries[merged["path_id"]]
        assert on.status is PathStatus.PASSED
        assert on.path.dependencies == ((fix_batch.id, Assumption.SUCCEEDS),)
        # its first path (trunk alone, no hotfix) never landed anything
        [first] = [e for e in entries.values() if e.path.dependencies == ()]
        assert first.id != merged["path_id"]

        assert (await server.summary(fix))["priority"] == "hotfix"
        assert (await server.summary(slow))["priority"] == "normal"
        for sqid in (fix, slow):
            statuses = await server.statuses(sqid)
            assert len(statuses) == len(set(statuses)) and statuses[-1] == "landed", statuses
        text = (await server.client.get("/metrics")).text
        assert 'submitqueue_land_requests_total{priority="hotfix",queue="demo"} 1.0' in text
        assert 'submitqueue_land_requests_total{priority="normal",queue="demo"} 1.0' in text


async def test_who_may_land_a_hotfix_and_what_a_priority_is(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        refused = await land(server, change("h1", files="a/x.py"), "hotfix", status=403)
        assert refused["error"]["code"] == "hotfix_not_allowed"
        assert "hotfix_allowed" in refused["error"]["message"]
        assert "alice" in refused["error"]["message"]
        bad = await land(server, change("h2", files="a/x.py"), "urgent", status=422)
        assert bad["error"]["code"] == "invalid_request"
        for allowed in ("normal", "high", "hotfix"):
            assert allowed in bad["error"]["message"]

        async def token(label: str) -> dict[str, str]:
            r = await server.client.post("/api/v1/admin/tokens", headers=ADMIN,
                                         json={"label": label, "scopes": ["land"]})
            assert r.status_code == 201, r.text
            return {"Authorization": f"Bearer {r.json()['token']}"}

        bob = await token("bob")
        assert (await land(server, change("h3", files="a/x.py"), "hotfix", status=403,
                           headers=bob))["error"]["code"] == "hotfix_not_allowed"
        high = await land(server, change("h4", files="a/y.py"), "high", headers=bob)
        alice = await token("alice")  # on the queue's hotfix_allowed
        mine = await land(server, change("h5", files="a/z.py"), "hotfix", headers=alice,
                          key="k-1")
        assert (await server.summary(mine["sqid"]))["priority"] == "hotfix"
        assert (await server.summary(high["sqid"]))["priority"] == "high"
        # the same key with another priority is another body
        again = await land(server, change("h5", files="a/z.py"), "high", headers=alice,
                           key="k-1", status=422)
        assert again["error"]["code"] == "idempotency_key_reused"
        same = await land(server, change("h5", files="a/z.py"), "hotfix", headers=alice,
                          key="k-1")
        assert same["sqid"] == mine["sqid"]
        await server.wait_all_terminal([high["sqid"], mine["sqid"]], timeout=20)
        view = (await server.client.get(
            f"/api/v1/queues/demo/requests/{mine['sqid'].rsplit('/', 1)[1]}/view")).json()
        assert view["request"]["priority"] == "hotfix"
        text = (await server.client.get("/metrics")).text
        assert 'submitqueue_auth_refusals_total{code="hotfix_not_allowed",scope="hotfix"} ' \
               '2.0' in text


# --- real git and command builds: the normal request lands exactly a tested tree ----------

BUILD_PY = """\
import os, sys, time
if os.path.exists("lib/hold"):  # the normal change's builds wait for the test's signal
    hold = open("lib/hold").read().strip()
    deadline = time.time() + 60
    while os.path.exists(hold) and time.time() < deadline:
        time.sleep(0.05)
print("ok")
"""


async def test_on_git_the_normal_request_lands_on_the_hotfix_as_a_passed_build_tested(
    database_url: str, tmp_path: Path
) -> None:
    hold = tmp_path / "hold"
    hold.write_text("held")
    write_queues(tmp_path, queues_file(git_queue(
        repository="./sandbox.git",
        build_runner='{type: command, command: ["{python}", "build.py"], timeout_s: 60, '
                     'max_parallel: 4, sandbox: none}')))
    repo = GitSandbox(tmp_path, SANDBOX_KEY, bare="sandbox.git")
    repo.git("init", "--bare", "--quiet", "--initial-branch=main", str(repo.bare), cwd=tmp_path)
    repo.clone()
    repo.git("checkout", "--quiet", "-b", "main")
    repo.commit({"build.py": BUILD_PY, "lib/base.txt": "base\n"}, "initial")
    repo.git("push", "--quiet", "origin", "main")
    trunk = repo.tip()
    normal = repo.branch("normal", {"lib/a.txt": "a\n", "lib/hold": str(hold)}, "Add a")
    fix = repo.branch("fix", {"lib/b.txt": "b\n"}, "Fix b")
    t = tables.builds

    async def builds(server: Server) -> list[Any]:
        async with server.runtime.db.read() as s:
            return list(await s.execute(sa.select(t).where(t.c.queue == "gitq")
                                        .order_by(t.c.created_at_ms)))

    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        slow = await server.land(normal, queue="gitq")
        await server.wait_status(slow, {"speculating"})
        r = await server.client.post("/api/v1/queues/gitq/requests", headers=ADMIN,
                                     json={"change_uris": [fix], "priority": "hotfix"})
        assert r.status_code == 202, r.text
        hot = r.json()["sqid"]
        assert await server.wait_terminal(hot, timeout=30) == "landed"
        fix_tip = repo.tip()
        assert (await server.summary(slow))["status"] not in ("landed", "error")
        hold.unlink()  # the normal change's builds may finish now
        assert await server.wait_terminal(slow, timeout=30) == "landed"
        rows = await builds(server)
    tip = repo.tip()
    tree = repo.main("rev-parse", f"{tip}^{{tree}}")
    files = repo.main("ls-tree", "-r", "--name-only", tip).split()
    assert {"lib/a.txt", "lib/b.txt"} <= set(files)
    passed = [b for b in rows if b.status == "succeeded" and b.tree_sha == tree]
    # main is exactly the commit a passed build tested: the hotfix, then the normal
    # change, on the trunk both started from (its speculative path assumed the hotfix)
    assert [(b.base_sha, json.loads(b.changes_json), b.commit_sha) for b in passed] == [
        (trunk, [fix, normal], tip)]
    assert repo.main("rev-parse", f"{tip}^") == fix_tip  # the hotfix landed first
    # the normal change's first build (trunk alone) never landed
    assert any(json.loads(b.changes_json) == [normal] for b in rows)


async def test_the_cli_lands_with_a_priority_and_status_shows_it(
    database_url: str, tmp_path: Path
) -> None:
    async def run(*args: str, token: str | None = None) -> Any:
        env = {"SQ_TOKEN": token} if token else None
        return await asyncio.to_thread(CliRunner().invoke, cli, list(args), env=env)

    (tmp_path / "queues.yaml").write_text(QUEUES)
    async with serve(database_url, tmp_path, admin_token=TOKEN) as server:
        url = ("--url", server.base_url)
        r = await run("land", "-q", "demo", "--priority", "hotfix",
                      change("cli-fix", files="a/x.py"), *url)
        assert r.exit_code == 1 and "hotfix_allowed" in r.output, r.output  # anonymous
        r = await run("land", "-q", "demo", "--priority", "urgent",
                      change("cli-fix", files="a/x.py"), *url)
        assert r.exit_code == 2 and "urgent" in r.output, r.output  # typer's choice check
        r = await run("land", "-q", "demo", "--priority", "hotfix",
                      change("cli-fix", files="a/x.py"), *url, token=TOKEN)
        assert r.exit_code == 0, r.output
        sqid = r.stdout.strip()
        assert await server.wait_terminal(sqid) == "landed"
        r = await run("status", sqid, *url)
        assert r.stdout.startswith(f"{sqid}  landed  [hotfix]"), r.stdout
