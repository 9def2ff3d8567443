"""Several seeds of one grid point, summed up per strategy (``--seeds`` without ``--json``).

Per strategy, over the seeds: P95 and mean land time relative to the oracle's on the
same workload (mean over seeds, and the worst seed's P95 ratio), builds per landed
change (mean over seeds), good changes evicted (all seeds together, and as a share of
the truly good ones) and red landings (all seeds together).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def summarize(rows: Sequence[dict[str, Any]], good: int) -> list[dict[str, Any]]:
    """``rows``: every row of one grid point over its seeds; ``good``: truly good changes
    summed over the same seeds."""
    by: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by.setdefault(r["strategy"], []).append(r)
    out = []
    for name, rs in by.items():
        k = len(rs)
        evicted = sum(r["good_evicted"] for r in rs)
        out.append({
            "strategy": name, "seeds": k,
            "p95_vs_oracle": sum(r["p95_vs_oracle"] for r in rs) / k,
            "p95_vs_oracle_worst": max(r["p95_vs_oracle"] for r in rs),
            "mean_vs_oracle": sum(r["mean_vs_oracle"] for r in rs) / k,
            "p95": sum(r["p95"] for r in rs) / k,
            "builds_per_landed": sum(r["builds_per_landed"] for r in rs) / k,
            "good_evicted": evicted, "evicted_share": evicted / good if good else 0.0,
            "red_landings": sum(r["red_landings"] for r in rs),
        })
    return out


def summary_table(title: str, summary: Sequence[dict[str, Any]]) -> str:
    cols = ("strategy", "P95/or", "worst P95/or", "mean/or", "P95 (T)", "builds/land",
            "evicted", "evicted %", "red")
    lines = [title, "  ".join(f"{c:>12}" if i else f"{c:<26}" for i, c in enumerate(cols))]
    for s in summary:
        vals = [f"{s['p95_vs_oracle']:.2f}x", f"{s['p95_vs_oracle_worst']:.2f}x",
                f"{s['mean_vs_oracle']:.2f}x", f"{s['p95']:.2f}",
                f"{s['builds_per_landed']:.2f}", str(s["good_evicted"]),
                f"{100 * s['evicted_share']:.1f}", str(s["red_landings"])]
        lines.append(f"{s['strategy']:<26}  " + "  ".join(f"{v:>12}" for v in vals))
    return "\n".join(lines)
