"""The peers' merge-queue policies as simulator strategies, on the same workload as ours.

Each is written from the peer's published behaviour; its docstring says what the peer
does and what the simulation leaves out. Every peer gets the point's ``budget`` as its
CI capacity and, where it batches, the point's ``batch`` as its batch or group size.
None of them analyses conflicts: each queue is one line (``bench/_sim_linear.py``).
"""

from __future__ import annotations

from collections.abc import Callable

from bench._sim_baselines import batch_bisect
from bench._sim_linear import github_allgreen, github_headgreen, trunk, zuul
from bench._sim_mergify import mergify
from bench._sim_record import Recorder
from bench._sim_workload import Workload


def bors(w: Workload) -> Recorder:
    """bors-ng: one batch at a time, of every approved pull request waiting (at most the
    point's ``batch``: bors-ng's ``max_batch_size``), built on the target; a passing
    batch lands in one push; a failing batch of several is bisected: split in two
    halves, each retried in turn as its own batch on the then-current target; a failing
    single pull request is rejected. Simplified: no priorities, no ``bors retry`` (a
    person's command), no timeouts; only one build slot of the budget is ever used, as
    bors-ng builds one batch at a time."""
    return batch_bisect(w, max_batch=w.point.batch)


PEERS: dict[str, Callable[[Workload], Recorder]] = {
    "zuul": zuul,
    "bors": bors,
    "mergify": mergify,
    "github-allgreen": github_allgreen,
    "github-headgreen": github_headgreen,
    "trunk": trunk,
}
