"""Second chance: a request whose batch of one failed its builds goes to the back of the
queue once more before it is rejected (pure rules; ``conclude`` applies them).

A flaky build (a spurious failure) would otherwise evict a good change. A retry in place
(``speculation.retries``) holds every batch behind the failure until the retry ends; a
second chance does not: the failed batch is rejected at once, so what stands behind it
lands as planned, and its request goes on in a new batch at the back (``chance`` 1),
which the planner gives the success probability :data:`PROBABILITY` (it just failed),
so the batches behind *that* one assume it fails rather than wait on it.

Whether a queue's failures are worth a second chance is learned from the queue's own
second chances: while ``(passed + 1) / (ended + 2)`` of its last :data:`WINDOW` ended ones
(a uniform prior) exceeds :data:`GATE`, a failed batch of one gets one; in a queue
without flakes they all fail again, and after five the gate shuts. So that it can open
again when a queue turns flaky, every failed batch whose id hashes into one bucket of
:data:`EXPLORE` (:func:`explores`: stable across processes and replays) gets one anyway.

| The failed batch | Second chance |
|---|---|
| several members | no: it is bisected (``app/controllers/bisect.py``) |
| one member, ``chance`` 0, failed by its builds (``build_failed``), the gate open or it explores | yes: a new batch of that member, ``chance`` 1 |
| one member, ``chance`` 1 (this was its second chance) | no: the request ends ``error`` |
| one member, failed otherwise (merge conflict, stale, no CI started, ...) | no |
| ``speculation.second_chance: false`` | no |
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import zlib
from collections.abc import Sequence

PROBABILITY = 0.1  # P(lands) of a batch on its second chance, for the planner
GATE = 0.15  # give second chances while their smoothed pass rate exceeds this
WINDOW = 50  # how many of the queue's last ended second chances count
EXPLORE = 10  # one failed batch in this many gets a second chance whatever the gate


def gate_open(outcomes: Sequence[bool]) -> bool:
    """``outcomes``: whether each of the queue's recent second chances landed."""
    recent = outcomes[-WINDOW:]
    return (sum(recent) + 1) / (len(recent) + 2) > GATE


def explores(batch_id: str) -> bool:
    """The failed batch gets a second chance whatever the gate (one in :data:`EXPLORE`)."""
    return zlib.crc32(batch_id.encode()) % EXPLORE == 0


def deserved(*, members: int, chance: int, build_failed: bool, outcomes: Sequence[bool],
             batch_id: str) -> bool:
    """Whether a failed batch's one request gets its second chance (the module's table)."""
    return members == 1 and chance == 0 and build_failed and \
        (gate_open(outcomes) or explores(batch_id))
