"""The chaos benchmark's checks, run once every request is terminal and the queue is
quiet: outcomes against the workload's rules, ``main`` against the outcomes, exact
trees (each landing's tip has the tree of a passed build of its batch), every history,
and the queue's message accounting. Each problem becomes one line in
``result.violations``; ``lost`` and ``duplicated`` are counted as well.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections import Counter, defaultdict
from typing import Any

import httpx

from bench._chaos_plan import QUEUE, Change, Sandbox, shared_original
from bench._chaos_types import ChaosRunView
from bench._servers import TERMINAL, queue_rows, request_any

# Statuses every history must hold, in this order, for each terminal status.
MILESTONES = {
    "landed": ["accepted", "started", "validating", "validated", "batching", "batched",
               "speculating", "landing", "landed"],
    "error": ["accepted", "started", "error"],
    "cancelled": ["accepted", "cancelling", "cancelled"],
}
# The loser of a conflicting pair fails at merge (fake builds) or in its builds (the
# command runner builds the real tree, where the pair conflicts).
LOSER_REASONS = ("merge conflict", "build failed")
ALLOWED = {"ok": {"landed"}, "fail": {"error"}, "conflict": {"landed", "error"}}
SUBJECT = re.compile(r"^(?P<subject>.*) \((?P<sqid>[^()]+)\)$")
SOURCE = re.compile(r"^Source-Commit: ([0-9a-f]{40})$", re.M)

_ORIGINAL = "m.original_topic IS NULL"
_HAS_DLQ = """EXISTS (SELECT 1 FROM queue_messages d WHERE d.original_topic = m.topic
               AND d.partition_key = m.partition_key AND d.message_id = m.message_id)"""
QUEUE_ACCOUNTS = f"""SELECT
  (SELECT COUNT(*) FROM queue_messages m WHERE {_ORIGINAL}) AS published,
  (SELECT COUNT(*) FROM queue_messages m WHERE {_ORIGINAL} AND {_HAS_DLQ}) AS dead_lettered,
  (SELECT COUNT(*) FROM queue_messages m WHERE {_ORIGINAL} AND NOT {_HAS_DLQ}
     AND m.settled_at_ms IS NOT NULL) AS acked,
  (SELECT COUNT(*) FROM queue_messages m WHERE {_ORIGINAL} AND NOT {_HAS_DLQ}
     AND m.settled_at_ms IS NULL) AS pending,
  (SELECT COUNT(*) FROM queue_messages m WHERE m.original_topic IS NOT NULL
     AND m.settled_at_ms IS NULL) AS dlq_unreconciled,
  (SELECT COUNT(*) FROM queue_deliveries) AS deliveries_left"""
LANDED_BATCHES = f"""SELECT id, contains_json, landed_json FROM batches
                     WHERE queue = '{QUEUE}' AND state = 'succeeded'"""
PASSED_TREES = f"""SELECT batch_id, tree_sha FROM builds
                   WHERE queue = '{QUEUE}' AND status = 'succeeded' AND tree_sha <> ''"""
DEAD_LETTERS = """SELECT original_topic, message_id, failure_count, last_error
                  FROM queue_messages WHERE original_topic IS NOT NULL ORDER BY seq"""


def history_problems(sqid: str, status: str, events: list[dict[str, Any]]) -> list[str]:
    """What is wrong with one request's history (empty: complete and ordered)."""
    statuses = [e["status"] for e in events if e["type"] == "status"]
    problems = []
    if not statuses or statuses[0] != "accepted":
        problems.append(f"{sqid}: history starts {statuses[:1]}, not accepted")
    stamps = [int(e["timestamp_ms"]) for e in events]
    if any(b < a for a, b in itertools.pairwise(stamps)):
        problems.append(f"{sqid}: history timestamps go back")
    terminal = [s for s in statuses if s in TERMINAL]
    if terminal != [status] or statuses[-1] != status:
        problems.append(f"{sqid}: summary {status!r} but history statuses {statuses}")
    # a merge refused untested_tree sends the batch back: speculating .. landing again
    again = {"speculating", "speculated", "landing"} if any(
        e.get("event") == "untested_tree" for e in events) else set()
    repeated = sorted(s for s, k in Counter(statuses).items() if k > 1 and s not in again)
    if repeated:
        problems.append(f"{sqid}: statuses repeated in history: {repeated}")
    wanted = iter(statuses)
    missing = [m for m in MILESTONES.get(status, []) if m not in wanted]  # ordered subsequence
    if missing:
        problems.append(f"{sqid}: {status} history lacks (in order) {missing}: {statuses}")
    return problems


def outcome_problems(changes: list[Change], items: dict[str, dict[str, Any]]) -> list[str]:
    """Each change's outcome against its kind; the conflict pairs' rule."""
    problems = []
    for c in changes:
        item = items.get(c.sqid or "")
        if item is None:
            problems.append(f"change {c.i} ({c.kind}): request {c.sqid} not found")
            continue
        allowed = ALLOWED[c.kind] | ({"cancelled"} if c.cancel_after_s is not None else set())
        error = item["last_error"] if item["status"] == "error" else ""
        if item["status"] not in allowed or "dead-lettered" in error or (
                c.kind == "fail" and error and "build failed" not in error):
            problems.append(f"{c.sqid} ({c.kind}, cancel sent: {c.cancel_after_s is not None}) "
                            f"ended {item['status']!r}: {item['last_error'][:300]}")
    pairs: dict[int, list[Change]] = defaultdict(list)
    for c in changes:
        if c.pair is not None:
            pairs[c.pair].append(c)
    for p, members in sorted(pairs.items()):
        got = [(items.get(c.sqid or "") or {}).get("status") for c in members]
        errors = [items[c.sqid] for c, s in zip(members, got, strict=True)
                  if s == "error" and c.sqid]
        if got.count("landed") > 1:
            problems.append(f"pair {p}: both landed {[c.sqid for c in members]}")
        elif "cancelled" not in got and got.count("landed") != 1:
            problems.append(f"pair {p}: expected one landed and one conflict, got {got}")
        elif "cancelled" in got and errors:
            problems.append(f"pair {p}: one was cancelled, yet the other ended error: "
                            f"{errors[0]['last_error'][:200]}")
        elif errors and not any(w in errors[0]["last_error"] for w in LOSER_REASONS):
            problems.append(f"pair {p}: the loser's error is not a conflict: "
                            f"{errors[0]['last_error'][:200]}")
    return problems


def target_problems(changes: list[Change], items: dict[str, dict[str, Any]],
                    sandbox: Sandbox) -> tuple[list[str], int]:
    """``main`` against the outcomes; returns the problems and the duplicated landings."""
    log = sandbox.main_log()
    by_sqid: Counter[str] = Counter()
    by_source: Counter[str] = Counter()
    problems = []
    for sha, subject, body in log:
        m = SUBJECT.match(subject)
        sources = SOURCE.findall(body)
        if m is None or len(sources) != 1:
            problems.append(f"main has a commit no request explains: {sha[:12]} {subject!r}")
            continue
        by_sqid[m["sqid"]] += 1
        by_source[sources[0]] += 1
    duplicated = 0
    known = {c.sha for c in changes}
    problems += [f"main holds unknown source commit {s[:12]}" for s in by_source if s not in known]
    for c in changes:
        status = (items.get(c.sqid or "") or {}).get("status")
        on_main = max(by_source[c.sha], by_sqid[c.sqid or ""])
        duplicated += max(0, on_main - 1)
        if status == "landed" and on_main != 1:
            problems.append(f"{c.sqid} landed but is on main {on_main} times")
        if status != "landed" and on_main:
            problems.append(f"{c.sqid} ended {status!r} but is on main {on_main} times")
        if status == "landed" and by_sqid[c.sqid or ""] != by_source[c.sha]:
            problems.append(f"{c.sqid}: its commit subject and Source-Commit disagree")
    files = sandbox.main_files(sorted({f for c in changes for f in c.files()}))
    for c in changes:
        landed = (items.get(c.sqid or "") or {}).get("status") == "landed"
        if files[c.own_file] != (c.own_text if landed else None):
            problems.append(f"{c.sqid} ({'landed' if landed else 'not landed'}): "
                            f"{c.own_file} on main is {files[c.own_file]!r}")
    pairs: dict[int, list[Change]] = defaultdict(list)
    for c in changes:
        if c.pair is not None:
            pairs[c.pair].append(c)
    for p, members in pairs.items():
        winners = [c for c in members
                   if (items.get(c.sqid or "") or {}).get("status") == "landed"]
        want = winners[0].shared_text if len(winners) == 1 else shared_original(p)
        path = members[0].shared_file or ""
        if len(winners) <= 1 and files[path] != want:
            problems.append(f"pair {p}: {path} on main is {files[path]!r}, expected {want!r}")
    return problems, duplicated


def tree_problems(batches: list[dict[str, Any]], built: list[dict[str, Any]],
                  sandbox: Sandbox) -> tuple[list[str], int]:
    """Exact trees: the tip each landing made (its batch's last landed commit) has the
    tree of a passed build of that batch. Returns the problems and the landings checked."""
    trees: dict[str, set[str]] = defaultdict(set)
    for b in built:
        trees[b["batch_id"]].add(b["tree_sha"])
    problems, checked = [], 0
    for b in batches:
        landed = json.loads(b["landed_json"] or "{}")
        commits = [c for m in json.loads(b["contains_json"]) for c in landed.get(m, []) if c]
        if not commits:
            problems.append(f"batch {b['id']} succeeded without a landed commit")
            continue
        tip = commits[-1]
        tree = sandbox.git("rev-parse", f"{tip}^{{tree}}", cwd=sandbox.bare).strip()
        checked += 1
        if tree not in trees[b["id"]]:
            problems.append(f"batch {b['id']} landed {tip[:12]} with tree {tree[:12]}, which "
                            f"no passed build of it tested ({sorted(trees[b['id']])})")
    return problems, checked


async def check_run(run: ChaosRunView, client: httpx.AsyncClient, sandbox: Sandbox) -> None:
    r = run.result
    listed = await run.list_requests(client)
    items = {i["sqid"]: i for i in listed}
    r.requests = len(items)
    count = Counter(i["status"] for i in listed)
    r.landed, r.error, r.cancelled = count["landed"], count["error"], count["cancelled"]
    terminal = sum(count[s] for s in TERMINAL)
    r.terminal_pct = 100.0 * terminal / r.requests if r.requests else 0.0
    by_uri: dict[str, list[str]] = defaultdict(list)
    for i in listed:
        for uri in i["change_uris"]:
            by_uri[uri].append(i["sqid"])
    uris = {c.uri for c in run.changes}
    r.violations += [f"request {s} is none of the bench's ({items[s]['change_uris']})"
                     for s in items if not set(items[s]["change_uris"]) <= uris]
    r.violations += [f"change {c.i} was submitted more than once: {by_uri[c.uri]}"
                     for c in run.changes if len(by_uri[c.uri]) > 1]
    r.violations += [f"{s} is not terminal: {i['status']}" for s, i in items.items()
                     if i["status"] not in TERMINAL]
    r.violations += outcome_problems(run.changes, items)
    sem = asyncio.Semaphore(8)

    async def history(sqid: str) -> list[str]:
        async with sem:
            n = sqid.rsplit("/", 1)[1]
            resp = await request_any(run.cluster, run.rng, "GET",
                                     f"/api/v1/queues/{QUEUE}/requests/{n}/history", client)
            resp.raise_for_status()
            return history_problems(sqid, items[sqid]["status"], resp.json()["events"])

    for problems in await asyncio.gather(*(history(s) for s in items)):
        r.violations += problems
    target, r.duplicated = await asyncio.to_thread(target_problems, run.changes, items, sandbox)
    r.violations += target
    if run.cfg.runner == "command":  # fake builds record no trees
        batches = await queue_rows(run.database_url, LANDED_BATCHES)
        built = await queue_rows(run.database_url, PASSED_TREES)
        trees, r.trees_checked = await asyncio.to_thread(tree_problems, batches, built,
                                                         sandbox)
        r.violations += trees
    acct = (await queue_rows(run.database_url, QUEUE_ACCOUNTS))[0]
    r.queue = {k: int(v) for k, v in acct.items()}
    q = r.queue
    gap = q["published"] - q["acked"] - q["dead_lettered"] - q["pending"]
    r.lost = (r.requests - terminal) + q["pending"] + q["dlq_unreconciled"] + abs(gap)
    if q["pending"] or q["dlq_unreconciled"] or q["deliveries_left"]:
        r.violations.append(f"queue not quiet at the end: {q}")
    r.dead_letters = [f"{d['original_topic']} {d['message_id']} after {d['failure_count']} "
                      f"attempts: {str(d['last_error'])[:200]}"
                      for d in await queue_rows(run.database_url, DEAD_LETTERS)]
