"""Reading a server's ``/metrics`` for the benchmarks: a snapshot of every sample, the
difference of two, and quantiles of a histogram between two snapshots (linear
interpolation inside the bucket, as Prometheus' ``histogram_quantile`` does)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

Labels = frozenset[tuple[str, str]]
Snapshot = dict[tuple[str, Labels], float]

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> Snapshot:
    out: Snapshot = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        labels = frozenset(_LABEL.findall(m.group(2) or ""))
        try:
            out[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            continue
    return out


def _matches(labels: Labels, want: Mapping[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in want.items())


def total(snap: Snapshot, name: str, **want: str) -> float | None:
    """The sum of a family's samples whose labels match ``want``; None if it has none
    (an older server without the family)."""
    values = [v for (n, labels), v in snap.items() if n == name and _matches(labels, want)]
    return sum(values) if values else None


def delta(before: Snapshot, after: Snapshot, name: str, **want: str) -> float | None:
    a = total(after, name, **want)
    if a is None:
        return None
    return a - (total(before, name, **want) or 0.0)


def quantile(before: Snapshot, after: Snapshot, name: str, q: float,
             **want: str) -> float | None:
    """The q-quantile of histogram ``name`` (its ``_bucket`` samples) observed between
    the two snapshots, summed over the label sets matching ``want``; None without
    observations."""
    buckets: dict[float, float] = {}
    for (n, labels), v in after.items():
        if n != f"{name}_bucket" or not _matches(labels, want):
            continue
        le = dict(labels).get("le", "")
        bound = math.inf if le == "+Inf" else float(le)
        buckets[bound] = buckets.get(bound, 0.0) + v - before.get((n, labels), 0.0)
    if not buckets:
        return None
    bounds = sorted(buckets)
    count = buckets[bounds[-1]]
    if count <= 0:
        return None
    rank = q * count
    lower, below = 0.0, 0.0
    for bound in bounds:
        cumulative = buckets[bound]
        if cumulative >= rank:
            if math.isinf(bound):
                return lower  # beyond the last finite bucket: its bound is all we know
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
        lower, below = bound, cumulative
    return lower
