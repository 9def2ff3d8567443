"""Issue 18's scenario, end to end (real git, command builds, HTTP): the target branch
moves outside the queue while a change's build runs.

The change adds ``a.txt``; the queue's test (``build.py`` on main) fails when both
``a.txt`` and ``b.txt`` exist. The first build is held (a file outside the tree) until
the test has pushed a commit straight to ``main``; then it passes, on the old tip. The
merger must refuse that tree (``untested_tree``), the queue must start a new trunk epoch
and rebuild on the new tip: with ``b.txt`` the rebuild fails and the request ends
``error`` naming it (``main`` stays green); with an unrelated ``c.txt`` the rebuild
passes and the landing fast-forwards ``main`` to exactly the rebuilt commit. Scaled
timings: the hold is released as soon as the push is done (the issue used a 6 s sleep).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from app.db import tables
from tests.conftest import BACKENDS
from tests.e2e.harness import Server, serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, git_queue, queues_file, write_queues
from tests.support.polls import wait_for

pytestmark = [
    pytest.mark.parametrize("database_url", BACKENDS, indirect=True),
    pytest.mark.timeout(120),
    pytest.mark.slow,
]

BUILD_PY = """\
import json, os, sys, time
if os.path.exists("hold.json"):
    spec = json.load(open("hold.json"))
    tmp = spec["pids"] + "." + os.environ["SQ_BUILD_ID"]  # written whole, then renamed
    with open(tmp, "w") as fh:
        fh.write(os.environ["SQ_BASE"])
    os.replace(tmp, os.path.join(spec["pids"], os.environ["SQ_BUILD_ID"]))
    deadline = time.time() + 60
    while os.path.exists(spec["hold"]) and time.time() < deadline:
        time.sleep(0.05)
both = os.path.exists("a.txt") and os.path.exists("b.txt")
print("a.txt and b.txt together: FAIL" if both else "ok")
sys.exit(1 if both else 0)
"""


class Repo(GitSandbox):
    def __init__(self, root: Path) -> None:
        super().__init__(root, SANDBOX_KEY, bare="sandbox.git")
        self.git("init", "--bare", "--quiet", "--initial-branch=main", str(self.bare),
                 cwd=root)
        self.clone()
        self.git("checkout", "--quiet", "-b", "main")
        self.commit({"build.py": BUILD_PY, "README.md": "exact trees\n"}, "initial")
        self.git("push", "--quiet", "origin", "main")

    def hotfix(self, name: str) -> str:
        """A commit adding ``name`` pushed straight to main (outside the queue)."""
        self.git("fetch", "--quiet", "origin")
        self.git("checkout", "--quiet", "-B", "hotfix", "origin/main")
        sha = self.commit({name: "hotfix\n"}, f"Add {name} outside the queue")
        self.git("push", "--quiet", "origin", "HEAD:refs/heads/main")
        return sha

    def files(self, rev: str = "main") -> list[str]:
        return self.main("ls-tree", "-r", "--name-only", rev).splitlines()


async def builds(server: Server) -> list[Any]:
    t = tables.builds
    async with server.runtime.db.read() as s:
        rows = await s.execute(sa.select(t).where(t.c.queue == "gitq")
                               .order_by(t.c.created_at_ms))
    return list(rows)


async def scenario(database_url: str, tmp_path: Path, pushed: str) -> dict[str, Any]:
    """Land a change adding a.txt while ``pushed`` is pushed straight to main."""
    hold, pids = tmp_path / "hold", tmp_path / "pids"
    hold.write_text("held")
    pids.mkdir()
    write_queues(tmp_path, queues_file(git_queue(
        repository="./sandbox.git",
        build_runner='{type: command, command: ["{python}", "build.py"], timeout_s: 90, '
                     'max_parallel: 2, sandbox: none}')))
    repo = Repo(tmp_path)
    old_tip = repo.tip()
    change = repo.branch("feature", {"a.txt": "a\n", "hold.json": json.dumps(
        {"hold": str(hold), "pids": str(pids)})}, "Add a.txt")
    async with serve(database_url, tmp_path) as server:
        sqid = await server.land(change, queue="gitq")
        await wait_for(lambda: any(pids.iterdir()), "the first build to start")
        moved_to = repo.hotfix(pushed)
        hold.unlink()
        end = await server.wait_terminal(sqid, timeout=90)
        summary = await server.summary(sqid)
        history = await server.history(sqid)
        rows = await builds(server)
        metrics = (await server.client.get("/metrics")).text
        page = (await server.client.get("/api/v1/queues/gitq/overview")).json()
    return {"end": end, "summary": summary, "history": history, "builds": rows,
            "metrics": metrics, "repo": repo, "old_tip": old_tip, "moved_to": moved_to,
            "page": page, "sqid": sqid}


def check_moved(out: dict[str, Any]) -> None:
    """The first build passed on the old tip; the merger refused it (untested_tree, the
    tip moved); a rebuild ran on the new tip; the move is counted and shown."""
    first, *rest = out["builds"]
    assert (first.status, first.base_sha) == ("succeeded", out["old_tip"])
    assert first.tree_sha and first.commit_sha and first.epoch == 0
    assert rest and rest[-1].base_sha == out["moved_to"] and rest[-1].epoch == 1
    refused = [e for e in out["history"] if e.get("event") == "untested_tree"]
    assert refused and refused[0]["metadata"]["tip"] == out["moved_to"]
    assert refused[0]["metadata"]["moved"] is True
    assert "submitqueue_target_moves_total{queue=\"gitq\"} 1.0" in out["metrics"]
    move = out["page"]["trunk_move"]
    assert (move["tip_sha"], move["epoch"], move["rebuilt"]) == (out["moved_to"], 1, 1)
    assert move["notice"] == f"main moved outside the queue at {out['moved_to'][:12]}; " \
        "1 path rebuilt"


async def test_a_push_to_main_mid_build_that_breaks_the_pair_never_lands(
    database_url: str, tmp_path: Path
) -> None:
    out = await scenario(database_url, tmp_path, "b.txt")
    check_moved(out)
    assert out["end"] == "error"
    failed = out["builds"][-1]
    assert failed.status == "failed" and failed.id in out["summary"]["last_error"]
    repo = out["repo"]
    assert repo.tip() == out["moved_to"]  # main is the hotfix alone: still green
    assert "a.txt" not in repo.files() and "b.txt" in repo.files()


async def test_a_harmless_push_to_main_mid_build_lands_the_rebuilt_commit_itself(
    database_url: str, tmp_path: Path
) -> None:
    out = await scenario(database_url, tmp_path, "c.txt")
    check_moved(out)
    assert out["end"] == "landed"
    repo = out["repo"]
    passed = [b for b in out["builds"] if b.status == "succeeded"]
    tip = repo.tip()
    # landing fast-forwarded main to exactly the commit the passing rebuild tested
    assert tip == passed[-1].commit_sha and passed[-1].base_sha == out["moved_to"]
    assert repo.main("rev-parse", "main^{tree}") == passed[-1].tree_sha
    assert {"a.txt", "c.txt"} <= set(repo.files())
