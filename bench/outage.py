"""The full-size outage run (by hand; CI runs tests/e2e/test_outages.py, scaled down).

A sandbox git queue; 10 requests submitted, then the repository is moved away for
``--outage-s`` seconds (default 180) while 5 more are submitted; then it comes back.
With ``--kind builds`` the repository stays, and the queue's build command (the
command runner, unsandboxed) exits 75 (an infrastructure failure) for the outage.
Reports what the pages said during the outage, how many requests errored or were
dead-lettered (must be 0), whether all 15 landed exactly once in the queue's order,
and how long the queue took to drain once the repository was back.

    .venv/bin/python -m bench.outage                       # SQLite in a temp dir
    .venv/bin/python -m bench.outage --database-url postgresql+asyncpg://postgres@127.0.0.1:5432/test
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.e2e.harness import serve
from tests.gitfixtures import SANDBOX_KEY, GitSandbox, write_queues

QUEUES = """\
queues:
  - name: gitq
    change_provider: {type: git}
    merger: {type: git}
    git:
      repository: ./remote.git
      repo_key: sandbox.local/sandbox
      target_branch: main
    build_runner: %s
    conflict_analyzer: {type: all}
    default_strategy: squash_rebase
"""
FAKE = "{type: fake, delay_ms: 0}"
COMMAND = ('{type: command, sandbox: none, command: ["sh", "-c", '
           '"if [ -e %s ]; then echo cache down >&2; exit 75; fi; test -f a.txt"]}')


async def run(database_url: str, outage_s: float, root: Path, kind: str) -> dict[str, Any]:
    flag = root / "ci-down"
    write_queues(root, QUEUES % (COMMAND % flag if kind == "builds" else FAKE))
    repo = GitSandbox.seeded(root, SANDBOX_KEY)
    uris = [repo.branch(f"f{i}", {f"d{i}/f.txt": f"{i}\n"}, f"Add d{i}") for i in range(15)]
    away = root / "remote.away"
    report: dict[str, Any] = {"database": database_url.split(":", 1)[0], "kind": kind,
                              "outage_s": outage_s}

    def down() -> None:
        if kind == "builds":
            flag.touch()
        else:
            repo.bare.rename(away)

    def up() -> None:
        if kind == "builds":
            flag.unlink()
        else:
            away.rename(repo.bare)

    async with serve(database_url, root, admin_token="bench") as server:
        sqids = [await server.land(u, queue="gitq") for u in uris[:10]]
        down()
        began = time.monotonic()
        await asyncio.sleep(2)
        sqids += [await server.land(u, queue="gitq") for u in uris[10:]]
        errored_during = 0
        shown: str = ""
        while time.monotonic() - began < outage_s:
            overview = (await server.client.get("/api/v1/queues/gitq/overview")).json()
            if overview["outages"]:
                shown = overview["outages"][0]["text"]
            statuses = await server.statuses_of_queue("gitq")
            errored_during = max(errored_during, sum(
                1 for v in statuses.values() if v in ("error", "cancelled")))
            await asyncio.sleep(5)
        ready = (await server.client.get("/readyz")).json()["checks"]["dependencies"]
        metrics = [line for line in (await server.client.get("/metrics")).text.splitlines()
                   if line.startswith("submitqueue_circuit_open")]
        up()
        back = time.monotonic()
        final = await server.wait_all_terminal(sqids, timeout=600, queue="gitq")
        drained = time.monotonic() - back
        topics = (await server.client.get(
            "/api/v1/admin/topics", headers={"Authorization": "Bearer bench"})).json()
        batch_of = {}
        for s in sqids:
            n = s.rsplit("/", 1)[1]
            page = (await server.client.get(f"/api/v1/queues/gitq/requests/{n}/view")).json()
            batch_of[s] = int(page["batch"]["id"].rsplit("/", 1)[1])
    landed = [line.rsplit("(", 1)[1].rstrip(")")
              for line in repo.main("log", "--format=%s", "main").splitlines()[::-1][1:]]
    report.update({
        "page_said": shown, "readyz_during": ready, "metrics_during": metrics,
        "errored_during_outage": errored_during,
        "final": {v: list(final.values()).count(v) for v in set(final.values())},
        "dead_letters": sum(t["dlq_size"] for t in topics["topics"]),
        "landed_exactly_once": sorted(landed) == sorted(sqids),
        "landed_in_queue_order": landed == sorted(sqids, key=lambda s: batch_of[s]),
        "outage_submissions_last_in_order": landed[10:] == sqids[10:],
        "drain_after_return_s": round(drained, 1),
    })
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default="")
    parser.add_argument("--outage-s", type=float, default=180.0)
    parser.add_argument("--kind", choices=("repository", "builds"), default="repository")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sq-outage-") as tmp:
        root = Path(tmp)
        url = args.database_url or f"sqlite+aiosqlite:///{root / 'sq.db'}"
        print(json.dumps(asyncio.run(run(url, args.outage_s, root, args.kind)), indent=2))


if __name__ == "__main__":
    main()
