"""Chaos benchmark: land requests on a real git queue while server processes are SIGKILLed.

Starts real ``submitqueue serve`` processes (SQLite: one process, since SQLite is
single-process by design; PostgreSQL: ``--processes`` sharing one fresh database),
pushes N branches to a sandbox repository of its own and submits them to its
``sandbox`` queue — some that fail their build, some pairs that conflict, some that
are cancelled at a random moment — while it SIGKILLs a server M times at random
moments and restarts it each time. Then it checks, and prints:

- every request reached a terminal status (within ``--settle-timeout``);
- every landed change is on ``main`` exactly once (``<subject> (<sqid>)``, one
  ``Source-Commit`` trailer), its file is there, and nothing that ended ``error`` or
  ``cancelled`` is;
- every outcome is the one its kind allows (see ``bench/_chaos_plan.py``);
- every history is complete and ordered (starts ``accepted``, has the milestones
  of its terminal status in order, one terminal status and nothing after it,
  timestamps never go back);
- no queue message is lost: published = acked + dead-lettered + pending, and nothing
  is pending once the queue goes quiet.

Usage (from the checkout)::

    .venv/bin/python -m bench.chaos [--db sqlite|postgres|both] [--n 60] [--kills 10]
        [--processes 3] [--seed 1] [--json]

``--runner`` picks the queue's build runner (``RUNNERS``): ``command`` (default) runs
the sandbox's ``sq_test.py`` in each speculative tree, which fails on a line
``BROKEN``; ``fake`` decides from the ``sq-fake=build-fail`` URI marker. The failing
changes carry both, so either runner fails the same ones. The CI-sized version is
``tests/e2e/test_chaos.py``; docs/operating.md explains the output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from bench._chaos_check import check_run
from bench._chaos_plan import QUEUE, Change, Sandbox, plan
from bench._chaos_types import ChaosConfig, ChaosResult, Kill
from bench._servers import (
    PG_ADMIN_DSN,
    TERMINAL,
    Cluster,
    ServerProcess,
    create_pg_database,
    drop_pg_database,
    queue_rows,
    request_any,
)

RUNNERS = {
    "fake": "{{type: fake, delay_ms: {build_ms}}}",
    "command": '{{type: command, command: ["{{python}}", "sq_test.py"], max_parallel: 2}}',
}

QUEUES = """\
queues:
  - name: sandbox
    description: chaos benchmark sandbox (real git)
    change_provider: {{type: git}}
    merger: {{type: git}}
    git:
      repository: ./sandbox.git
      repo_key: sandbox.local/sandbox
      target_branch: main
      work_dir: {work_dir}
      create_sandbox: true
    build_runner: {runner}
    conflict_analyzer: {{type: pathoverlap, by: directory}}
    scorer: {{type: constant, probability: 0.9}}
    build_budget: 4
    default_strategy: squash_rebase
"""


class ChaosRun:
    def __init__(self, cfg: ChaosConfig, database_url: str, workdir: Path, label: str) -> None:
        self.cfg = cfg
        self.database_url = database_url
        self.workdir = workdir
        self.rng = random.Random(cfg.seed)
        self.changes = plan(cfg.n, self.rng, cancel_window_s=cfg.cancel_window_s)
        self.result = ChaosResult(db=label, processes=cfg.processes)
        self.cluster = Cluster(workdir, cfg.processes, self._env(), self._server_env)
        self.statuses: dict[str, str] = {}
        self.submitted = asyncio.Event()
        self.t0 = 0.0

    def _env(self) -> dict[str, str]:
        runner = RUNNERS[self.cfg.runner].format(build_ms=self.cfg.build_ms)
        for i in range(self.cfg.processes):
            work = "./git" if self.cfg.shared_work_dir else f"./git/p{i}"
            (self.workdir / f"queues-{i}.yaml").write_text(
                QUEUES.format(work_dir=work, runner=runner))
        return {
            "SQ_DATABASE_URL": self.database_url, "SQ_HOST": "127.0.0.1",
            "SQ_LOG_LEVEL": "WARNING", "SQ_AUTO_MIGRATE": "true",
            "SQ_QUEUE_VISIBILITY_TIMEOUT_MS": str(self.cfg.visibility_timeout_ms),
            "SQ_QUEUE_SHUTDOWN_GRACE_MS": "3000",
        }

    def _server_env(self, i: int) -> dict[str, str]:
        return {"SQ_QUEUES_FILE": str(self.workdir / f"queues-{i}.yaml")}

    # --- the run ----------------------------------------------------------------------

    async def run(self) -> ChaosResult:
        await self.cluster.start()
        try:
            sandbox = Sandbox(self.workdir / "sandbox.git", self.workdir / "clone")
            await asyncio.to_thread(sandbox.prepare, self.changes)
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(timeout=60, limits=limits) as client:
                self.t0 = time.monotonic()
                poller = asyncio.create_task(self._poll(client))
                try:
                    await asyncio.gather(self._submit_all(client), self._kill_loop(client))
                    await self._settle(client)
                finally:
                    poller.cancel()
                self.result.wall_s = time.monotonic() - self.t0
                await self._quiet()
                await check_run(self, client, sandbox)
        finally:
            codes = self.cluster.stop()
            self.result.clean_exit = all(c == 0 for c in codes)
        return self.result

    async def _submit_all(self, client: httpx.AsyncClient) -> None:
        cancels = []
        for change in self.changes:
            await asyncio.sleep(self.rng.expovariate(self.cfg.rate))
            await self._submit(client, change)
            if change.cancel_after_s is not None:
                cancels.append(asyncio.create_task(self._cancel(client, change)))
        self.submitted.set()
        await asyncio.gather(*cancels)

    async def _submit(self, client: httpx.AsyncClient, change: Change) -> None:
        """POST the land request with an ``Idempotency-Key``; when the answer is lost (the
        server died under it), send it again with the same key: the gateway answers
        with the first sqid if the first attempt was stored, so it is never landed twice."""
        body = {"change_uris": [change.uri]}
        headers = {"Idempotency-Key": f"chaos-{self.cfg.seed}-{change.branch}"}
        lost = False
        while True:
            server = await self.cluster.pick(self.rng)
            try:
                r = await client.post(f"{server.url}/api/v1/queues/{QUEUE}/requests",
                                      json=body, headers=headers)
            except httpx.TransportError:
                self.result.answers_lost += 1
                quiet_until = time.monotonic() + 10
                while server.alive and time.monotonic() < quiet_until:
                    await asyncio.sleep(0.05)  # a dead server's silence means "stored or not"
                if not lost:
                    self.result.resubmitted += 1
                lost = True
                continue
            if r.status_code == 202:
                change.sqid = r.json()["sqid"]
                change.blind = lost and r.headers.get("idempotent-replayed") == "true"
                return
            if r.status_code != 503:
                raise RuntimeError(f"land {change.uri}: {r.status_code} {r.text}")
            await asyncio.sleep(0.1)

    async def _cancel(self, client: httpx.AsyncClient, change: Change) -> None:
        assert change.sqid is not None and change.cancel_after_s is not None
        await asyncio.sleep(change.cancel_after_s)
        n = change.sqid.rsplit("/", 1)[1]
        r = await request_any(self.cluster, self.rng, "POST",
                              f"/api/v1/queues/{QUEUE}/requests/{n}/cancel", client,
                              json={"reason": "chaos benchmark"})
        r.raise_for_status()
        change.cancel_answer = r.json()["status"]
        self.result.cancel_requested += 1

    async def _poll(self, client: httpx.AsyncClient) -> None:
        while True:
            with contextlib.suppress(Exception):  # a poll that failed is simply retried
                self.statuses = await self.list_statuses(client)
            await asyncio.sleep(0.3)

    async def list_requests(self, client: httpx.AsyncClient) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        cursor = None
        while True:
            params: dict[str, Any] = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            r = await request_any(self.cluster, self.rng, "GET",
                                  f"/api/v1/queues/{QUEUE}/requests", client, params=params)
            r.raise_for_status()
            body = r.json()
            items += body["items"]
            cursor = body.get("next_cursor")
            if not cursor:
                return items

    async def list_statuses(self, client: httpx.AsyncClient) -> dict[str, str]:
        return {i["sqid"]: i["status"] for i in await self.list_requests(client)}

    def _in_flight(self, statuses: dict[str, str]) -> int:
        return sum(1 for c in self.changes if c.sqid and statuses.get(c.sqid) not in TERMINAL)

    # --- kills --------------------------------------------------------------------------

    async def _kill_loop(self, client: httpx.AsyncClient) -> None:
        if not self.cfg.kill_while_submitting:
            await self.submitted.wait()
        for _ in range(self.cfg.kills):
            await asyncio.sleep(self.rng.uniform(*self.cfg.kill_gap_s))
            # aim at work in flight while there is (or will be) some
            for _ in range(200):
                statuses = await self.list_statuses(client)
                if self._in_flight(statuses) or self.submitted.is_set():
                    break
                await asyncio.sleep(0.05)
            victim = await self._victim()
            deadline = time.monotonic() + (5.0 if self.cfg.aim_at_leases else 0.0)
            while time.monotonic() < deadline and not await self._leases_of(victim):
                await asyncio.sleep(0.02)
                victim = await self._victim()
            pid = victim.proc.pid if victim.proc else -1
            at = time.monotonic()
            victim.kill()
            kill = Kill(at_s=round(at - self.t0, 2), server=victim.index, pid=pid,
                        in_flight_requests=self._in_flight(statuses),
                        orphaned_leases=await self._leases_of(victim))
            self.result.kill_log.append(kill)
            self.result.kills += 1
            await asyncio.sleep(self.rng.uniform(*self.cfg.down_s))
            victim.start()
            await victim.wait_ready()
            kill.restart_s = round(time.monotonic() - at, 2)

    async def _leases_of(self, server: ServerProcess) -> int:
        """Deliveries leased by the server (its member id: also those of a killed
        process, until its restart takes them back)."""
        rows = await queue_rows(
            self.database_url,
            "SELECT COUNT(*) AS n FROM queue_deliveries WHERE lease_token IS NOT NULL "
            f"AND leased_by = '{server.member_id}'")
        return int(rows[0]["n"])

    async def _victim(self) -> ServerProcess:
        live = [s for s in self.cluster.ready() if s.proc is not None]
        while not live:
            await asyncio.sleep(0.05)
            live = [s for s in self.cluster.ready() if s.proc is not None]
        if self.cfg.victim == "busiest" and len(live) > 1:
            rows = await queue_rows(
                self.database_url,
                "SELECT leased_by, COUNT(*) AS n FROM queue_deliveries "
                "WHERE lease_token IS NOT NULL GROUP BY leased_by")
            held = {str(r["leased_by"]): int(r["n"]) for r in rows}
            return max(live, key=lambda s: (held.get(s.member_id, 0), self.rng.random()))
        return self.rng.choice(live)

    # --- the end --------------------------------------------------------------------

    async def _settle(self, client: httpx.AsyncClient) -> None:
        """Until every request we submitted is terminal (bounded)."""
        deadline = time.monotonic() + self.cfg.settle_timeout_s
        while time.monotonic() < deadline:
            self.statuses = await self.list_statuses(client)
            if not self._in_flight(self.statuses):
                return
            await asyncio.sleep(0.3)

    async def _quiet(self) -> None:
        """Until nothing is left to deliver in the queue (bounded): terminal requests
        still have log and clean-up messages in flight for a moment."""
        deadline = time.monotonic() + self.cfg.quiet_timeout_s
        while time.monotonic() < deadline:
            rows = await queue_rows(self.database_url,
                                    "SELECT COUNT(*) AS n FROM queue_deliveries")
            if int(rows[0]["n"]) == 0:
                return
            await asyncio.sleep(0.3)


async def run_chaos(cfg: ChaosConfig, database_url: str, workdir: Path,
                    label: str) -> ChaosResult:
    """One chaos run against ``database_url`` (an empty or migrated database)."""
    return await ChaosRun(cfg, database_url, workdir, label).run()


# --- command line ---------------------------------------------------------------------


def table(results: list[ChaosResult]) -> str:
    head = ("| database | processes | requests | landed | error | cancelled | kills "
            "| lost | duplicated | terminal | violations | wall time |")
    rows = [head, "|" + "---|" * 12]
    for r in results:
        rows.append(f"| {r.db} | {r.processes} | {r.requests} | {r.landed} | {r.error} | "
                    f"{r.cancelled} | {r.kills} | {r.lost} | {r.duplicated} | "
                    f"{r.terminal_pct:.0f}% | {len(r.violations)} | {r.wall_s:.0f} s |")
    return "\n".join(rows)


def details(r: ChaosResult) -> str:
    q = r.queue
    lines = [
        f"{r.db}: queue messages published {q.get('published', 0)} = acked "
        f"{q.get('acked', 0)} + dead-lettered {q.get('dead_lettered', 0)} + pending "
        f"{q.get('pending', 0)}; leases orphaned by kills "
        f"{sum(k.orphaned_leases for k in r.kill_log)}; cancels sent {r.cancel_requested}; "
        f"land answers lost to a kill {r.answers_lost} (sent again: {r.resubmitted}); "
        f"clean shutdown {'yes' if r.clean_exit else 'no'}",
        f"  exact trees: {r.trees_checked} landings' trees compared with their batches' "
        "passed builds (violations below if any differed)",
        "  kills (s, server, requests in flight, leases orphaned, back after s): "
        + ", ".join(f"{k.at_s:.1f}/{k.server}/{k.in_flight_requests}/{k.orphaned_leases}/"
                    f"{k.restart_s:.1f}" for k in r.kill_log),
    ]
    lines += [f"  dead letter: {d}" for d in r.dead_letters[:10]]
    lines += [f"  VIOLATION: {v}" for v in r.violations[:50]]
    return "\n".join(lines)


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--n", type=int, default=60, help="land requests (default 60)")
    ap.add_argument("--kills", type=int, default=10, help="SIGKILLs per database (default 10)")
    ap.add_argument("--processes", type=int, default=3,
                    help="PostgreSQL server processes (default 3; SQLite always runs 1)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rate", type=float, default=3.0, help="submissions per second")
    ap.add_argument("--runner", choices=sorted(RUNNERS), default="command",
                    help="build runner of the queue (default: command, i.e. sq_test.py)")
    ap.add_argument("--build-ms", type=int, default=200, help="fake build duration")
    ap.add_argument("--victim", choices=["random", "busiest"], default="random")
    ap.add_argument("--shared-work-dir", action="store_true",
                    help="let every process share one git work_dir (one host, one queues file)")
    ap.add_argument("--pg-url", default=PG_ADMIN_DSN, help="admin DSN; a fresh database "
                    "is created next to it and dropped afterwards")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    args = ap.parse_args()
    results: list[ChaosResult] = []
    for db in (["sqlite", "postgres"] if args.db == "both" else [args.db]):
        cfg = ChaosConfig(n=args.n, kills=args.kills, seed=args.seed, rate=args.rate,
                          processes=1 if db == "sqlite" else args.processes,
                          runner=args.runner, build_ms=args.build_ms, victim=args.victim,
                          shared_work_dir=args.shared_work_dir)
        workdir = Path(tempfile.mkdtemp(prefix=f"sq-chaos-{db}-"))
        url = (f"sqlite+aiosqlite:///{workdir}/chaos.db" if db == "sqlite"
               else await create_pg_database(args.pg_url, prefix="sq_chaos"))
        try:
            label = "SQLite" if db == "sqlite" else "PostgreSQL"
            results.append(await run_chaos(cfg, url, workdir, label))
        finally:
            if db == "postgres":
                await drop_pg_database(url, args.pg_url)
            if args.keep:
                print(f"work directory kept: {workdir}")
            else:
                shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        print(json.dumps([asdict(r) | {"ok": r.ok} for r in results], indent=2))
    else:
        print(f"\nChaos: {args.n} land requests on a real git queue, {args.kills} SIGKILLs "
              f"per database (seed {args.seed})\n")
        print(table(results))
        print()
        for r in results:
            print(details(r))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
