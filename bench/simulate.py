"""Speculation simulator: merge-queue strategies side by side on the same pre-drawn workload.

The speculating strategies run the real planner (``app.speculation.planner.plan``) with a
simulated clock and simulated CI; see ``bench/_sim_workload.py`` for the model and
``bench/_sim_record.py`` for the metrics and the trunk-state check. Usage::

    python -m bench.simulate                 # the default grid, a table per grid point
    python -m bench.simulate --json          # one JSON object per (grid point, strategy)
    python -m bench.simulate --grid default  # only the default point
    python -m bench.simulate --n 60 --strategies oracle,best-first --grid default
    python -m bench.simulate --grid peers    # ours against the peers' policies (issue 16)
    python -m bench.simulate --grid peers --seeds 1-10   # a summary table per grid point

Strategies (``bench/_sim_baselines.py``, ``bench/_sim_speculate.py``):

- ``oracle``: knows every outcome; each change is built once, at arrival, on exactly the
  trunk it will land on; unlimited builds (so with a small budget the ratios flatter
  nobody: the oracle ignores the budget);
- ``serial``: one build at a time, first come first served;
- ``optimistic``: each change built on every conflicting change ahead, all assumed to land,
  rebuilt when that breaks (Zuul-style, but conflict-aware), oldest first within budget;
- ``batch-bisect``: bors-style batches of everything waiting, bisected on failure;
- ``speculate-all``: every outcome combination of the oldest heads, within budget;
- ``best-first``: the planner as the simulator tunes it - sticky allocator, a scorer
  that sees a noisy risk flag (80% right, calibrated; never the outcome), build
  evidence, hedges above 10% probability only, timed hedges;
- ``best-first+preempt``: the same with the preempting allocator;
- ``best-first+coverage``: ``best-first`` plus merge on full coverage when it pays;
- ``best-first+coverage-naive``: merge as soon as covered, complements from spare slots;
- ``default``: ours exactly as a queue with the shipped ``queues.yaml`` defaults runs
  it (constant scorer 0.9, sticky allocator, no coverage, build evidence, hedges above
  10 % only, timed hedges), its ``build_budget`` set to the point's CI capacity;
- ``default+retry``: ``default`` with ``speculation: {retries: 1}``;
- ``default+vindicate``: ``default`` with ``speculation: {vindication_depth: 1}``;
- ``default+second-chance``: ``default`` where a change whose batch of one failed goes
  to the back of the queue once more (its P(lands) 0.1), as long as the queue's second
  chances so far pass often enough (a policy the app does not have yet: measured to
  decide whether to build it);
- ``default+batch`` / ``default+batch-aimd``: ``default`` with ``batching: {max_size:
  <the point's batch>, max_wait_ms: T/4}`` (and ``adaptive: true``): multi-request
  batches, a failed one bisected (``bench/_sim_speculate.py``);
- ``default+batch-lanes``: ``default+batch`` where a change joins the forming batch
  only when it conflicts with one of its changes (a policy the app does not have:
  measured to see whether batching within a lane pays);
- ``default+batch-skip-last``: ``default+batch-aimd`` with Mergify's rule: the last part
  of a bisected batch whose other parts all landed fails without a build of its own
  (not in the app: measured to decide whether to build it);
- the peers (``bench/_sim_peers.py``): ``zuul``, ``bors``, ``mergify``,
  ``github-allgreen``, ``github-headgreen``, ``trunk``.

Grids: ``default`` (the default point), ``small`` (it and four neighbours), ``peers``:
the default point, a CI-constrained point (8 -> 16 changes per T, budget 4), a flaky
point (the default with ``p_flake`` 0.05) and a one-lane point (every change conflicts).

Exits 1 when a strategy landed a red combination or did not land exactly the truly good
changes (under flaky builds too: every good change landed, no bad one did; a good
change a flake got evicted is a problem, named with the count).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from app.speculation.coverage import CoveragePolicy
from bench._sim_baselines import batch_bisect, oracle, serial
from bench._sim_peers import PEERS
from bench._sim_record import Recorder
from bench._sim_speculate import SpecConfig, speculate
from bench._sim_summary import summarize, summary_table
from bench._sim_workload import Point, Workload, draw

Strategy = Callable[[Workload], Recorder]


def _spec(cfg: SpecConfig) -> Strategy:
    def run(w: Workload) -> Recorder:
        return speculate(w, cfg)
    return run


STRATEGIES: dict[str, Strategy] = {
    "oracle": oracle,
    "serial": serial,
    "optimistic": _spec(SpecConfig(funding="likely", evidence=False)),
    "batch-bisect": batch_bisect,
    "speculate-all": _spec(SpecConfig(funding="all", evidence=False)),
    # ours: the planner's defaults (evidence, hedges over 10% only, timed hedges)
    "best-first": _spec(SpecConfig()),
    "best-first+preempt": _spec(SpecConfig(allocator="preempting")),
    # merge on full coverage only when it pays (the overtaken batch needs >= 1 build)
    "best-first+coverage": _spec(SpecConfig(coverage=CoveragePolicy())),
    # for comparison: merge as soon as covered, and fund complements from spare slots
    "best-first+coverage-naive": _spec(SpecConfig(
        coverage=CoveragePolicy(min_remaining=0.0, complements=True))),
    # the shipped defaults (app/domain/queue_config.py, queues.yaml): scorer constant 0.9,
    # speculation {allocator: sticky, coverage: false, min_probability: 0.1,
    # hedge_by_time: true}, PlanInput's evidence, the controller's running mean build
    # time; build_budget = the point's budget (the CI's capacity)
    "default": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma")),
    # the same with speculation: {retries: 1} (a failed build is built once more)
    "default+retry": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                                      retries=1)),
    # the same with speculation: {vindication_depth: 1} (a failure a dependent's passed
    # build contains is built once more; a failed head waits for such running builds)
    "default+vindicate": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                                          vindication=1)),
    # speculation: {second_chance: true}: a change whose batch of one failed goes to the
    # back once more, while the queue's second chances pass often enough
    "default+second-chance": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                                              second_chance=True)),
    # the same with batching: {max_size: <the point's batch>, max_wait_ms: T/4} (a
    # failed batch of several is bisected), and with adaptive: true (AIMD size)
    "default+batch": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                                      batching=True)),
    "default+batch-aimd": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                                           batching=True, adaptive=True)),
    # not in the app: a change joins only a forming batch it conflicts with
    "default+batch-lanes": _spec(SpecConfig(scorer="fixed", fixed_p=0.9, mean_build="ewma",
                                            batching=True, lanes=True)),
    "default+batch-skip-last": _spec(SpecConfig(scorer="fixed", fixed_p=0.9,
                                                mean_build="ewma", batching=True,
                                                adaptive=True, skip_last=True)),
    **PEERS,
}

DEFAULT = Point()
GRID = {
    "default": [DEFAULT],
    "small": [DEFAULT, replace(DEFAULT, load=2.0), replace(DEFAULT, budget=4),
              replace(DEFAULT, budget=32), replace(DEFAULT, p_conflict=0.1)],
    "peers": [DEFAULT, replace(DEFAULT, load=16.0, budget=4),
              replace(DEFAULT, p_flake=0.05), replace(DEFAULT, p_conflict=1.0)],
}


def is_default(point: Point) -> bool:
    """The default grid point, whatever the number of changes or the seed."""
    return replace(point, n=DEFAULT.n, seed=DEFAULT.seed) == DEFAULT


def run_one(job: tuple[Point, str]) -> tuple[Point, str, dict[str, Any], float]:
    point, name = job
    start = time.perf_counter()
    rec = STRATEGIES[name](draw(point))
    if not rec.done():
        raise RuntimeError(f"{name} did not finish every change at {point}")
    return point, name, rec.metrics(), time.perf_counter() - start


def rows_for(point: Point, results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    base = results.get("oracle")
    rows = []
    for name, m in results.items():
        row: dict[str, Any] = {"point": point.to_json(), "default": is_default(point),
                               "strategy": name}
        row.update({k: m[k] for k in ("p50", "p95", "p99")})
        for q in ("p50", "p95"):
            row[f"{q}_vs_oracle"] = m[q] / base[q] if base and base[q] > 0 else math.nan
        row.update({k: m[k] for k in ("throughput", "builds_per_landed", "aborted_builds",
                                      "red_landings", "landed")})
        # added with the peers (after the older keys, so those lines keep their prefix)
        row["mean"] = m["mean"]
        row["mean_vs_oracle"] = m["mean"] / base["mean"] if base and base["mean"] > 0 \
            else math.nan
        row["good_evicted"] = m["good_evicted"]
        row["bad_landed"] = m["bad_landed"]
        rows.append(row)
    return rows


def check_point(point: Point, results: dict[str, dict[str, Any]]) -> list[str]:
    """Problems at one grid point: red landings, or a landed set other than exactly the
    truly good changes (with flaky builds as without: every good change landed and no
    bad one did, whatever each strategy's builds said)."""
    good = sorted(draw(point).good)
    problems = []
    for name, m in results.items():
        if m["red_landings"]:
            problems.append(f"{name}: {m['red_landings']} red landings at {point.to_json()}")
        if m["landed_set"] != good:
            landed = set(m["landed_set"])
            evicted = sum(1 for g in good if g not in landed)
            bad = len(landed - set(good))
            problems.append(f"{name}: landed {m['landed']} changes, not the {len(good)} good "
                            f"ones ({evicted} good evicted, {bad} bad landed), at "
                            f"{point.to_json()}")
    return problems


def table(rows: Sequence[dict[str, Any]]) -> str:
    p = rows[0]["point"]
    head = (f"load {p['load']:g} changes/T, budget {p['budget']}, p_fail {p['p_fail']:g}, "
            f"p_conflict {p['p_conflict']:g}, p_flake {p['p_flake']:g}, batch {p['batch']}, "
            f"seed {p['seed']}" + ("  [default]" if rows[0]["default"] else ""))
    cols = ("strategy", "P50", "P95", "P99", "mean", "P50/or", "P95/or", "mean/or", "thru/T",
            "builds/land", "aborted", "red", "landed", "evicted")
    lines = [head, "  ".join(f"{c:>11}" if i else f"{c:<26}" for i, c in enumerate(cols))]
    for r in rows:
        vals = [f"{r['p50']:.2f}", f"{r['p95']:.2f}", f"{r['p99']:.2f}", f"{r['mean']:.2f}",
                f"{r['p50_vs_oracle']:.2f}x", f"{r['p95_vs_oracle']:.2f}x",
                f"{r['mean_vs_oracle']:.2f}x", f"{r['throughput']:.2f}",
                f"{r['builds_per_landed']:.2f}", str(r["aborted_builds"]),
                str(r["red_landings"]), str(r["landed"]), str(r["good_evicted"])]
        lines.append(f"{r['strategy']:<26}  " + "  ".join(f"{v:>11}" for v in vals))
    return "\n".join(lines)


def simulate(points: Sequence[Point], names: Sequence[str], jobs: int,
             ) -> tuple[list[list[dict[str, Any]]], list[str], float]:
    """Run every (point, strategy); returns rows per point, problems, and CPU seconds."""
    work = [(pt, n) for pt in points for n in names]
    if jobs > 1:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = pool.map(run_one, work, chunksize=1)
    else:
        done = [run_one(j) for j in work]
    by_point: dict[Point, dict[str, dict[str, Any]]] = {pt: {} for pt in points}
    cpu = 0.0
    for pt, name, m, secs in done:
        by_point[pt][name] = m
        cpu += secs
    problems: list[str] = []
    rows = []
    for pt in points:
        problems += check_point(pt, by_point[pt])
        rows.append(rows_for(pt, by_point[pt]))
    return rows, problems, cpu


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.simulate", description=__doc__.split(
        "\n\n")[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per line")
    ap.add_argument("--grid", choices=sorted(GRID), default="small")
    ap.add_argument("--strategies", default=",".join(STRATEGIES),
                    help="comma-separated subset (oracle is always run for the ratios)")
    ap.add_argument("--n", type=int, help="changes per grid point (default 300)")
    ap.add_argument("--seed", type=int, help="workload seed (default 1)")
    ap.add_argument("--seeds", help="several seeds, e.g. 1-10 or 1,3,5: every grid point "
                    "with each; without --json, one summary table per grid point")
    ap.add_argument("--p-flake", type=float, help="P(a build of good changes fails "
                    "spuriously) at every grid point")
    ap.add_argument("--batch", type=int, help="batch size of the batching peers")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    args = ap.parse_args(argv)
    names = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        ap.error(f"unknown strategies {unknown}; choose from {', '.join(STRATEGIES)}")
    if "oracle" not in names:
        names.insert(0, "oracle")
    points = GRID[args.grid]
    if args.n is not None:
        points = [replace(p, n=args.n) for p in points]
    if args.p_flake is not None:
        points = [replace(p, p_flake=args.p_flake) for p in points]
    if args.batch is not None:
        points = [replace(p, batch=args.batch) for p in points]
    seeds = _seeds(args.seeds) if args.seeds else None
    if args.seed is not None or seeds:
        points = [replace(p, seed=s) for p in points for s in (seeds or [args.seed])]
    started = time.perf_counter()
    rows, problems, cpu = simulate(points, names, args.jobs)
    wall = time.perf_counter() - started
    if seeds and not args.json:
        print(_summaries(points, rows, len(seeds)))
    for point_rows in rows:
        if args.json:
            for r in point_rows:
                print(json.dumps(r))
        elif not seeds:
            print(table(point_rows), end="\n\n")
    if not args.json:
        print(f"{len(points)} grid points x {len(names)} strategies in {wall:.1f} s "
              f"({cpu:.1f} s of simulation, {args.jobs} jobs)")
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    return 1 if problems else 0


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += range(int(lo), int(hi or lo) + 1)
    return out


def _summaries(points: Sequence[Point], rows: Sequence[list[dict[str, Any]]],
               per: int) -> str:
    """One table per grid point over its seeds (``points`` are grouped by seed)."""
    out = []
    for k in range(0, len(points), per):
        group = points[k:k + per]
        good = sum(len(draw(p).good) for p in group)
        p = group[0].to_json()
        title = (f"load {p['load']:g} changes/T, budget {p['budget']}, p_fail "
                 f"{p['p_fail']:g}, p_conflict {p['p_conflict']:g}, p_flake {p['p_flake']:g}, "
                 f"batch {p['batch']}, seeds {group[0].seed}-{group[-1].seed} "
                 f"({good} good changes in all)")
        flat = [r for point_rows in rows[k:k + per] for r in point_rows]
        out.append(summary_table(title, summarize(flat, good)) + "\n")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
