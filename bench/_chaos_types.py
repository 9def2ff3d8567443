"""The chaos benchmark's configuration and result types, and the view of a run its checks read.

Apart from :mod:`bench.chaos` so that :mod:`bench._chaos_check` needs no import of it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from bench._chaos_plan import Change
from bench._servers import Cluster


@dataclass
class ChaosConfig:
    n: int = 60
    kills: int = 10
    processes: int = 1
    seed: int = 1
    rate: float = 3.0             # land requests submitted per second (Poisson arrivals)
    kill_gap_s: tuple[float, float] = (1.0, 4.0)   # between a restart and the next kill
    down_s: tuple[float, float] = (0.0, 0.5)       # how long a killed process stays down
    cancel_window_s: float = 4.0  # a cancel comes this long (at most) after its accept
    build_ms: int = 200           # fake runner only: how long a build takes
    runner: str = "command"       # see RUNNERS
    victim: str = "random"        # random | busiest (the one holding the most leases)
    # False: kill only once every land request was answered (see docs/operating.md:
    # a kill between a request's publish and its ``accepted`` record loses that record)
    kill_while_submitting: bool = True
    # True: wait (up to 5 s) until the victim holds a lease, so the kill takes work down
    aim_at_leases: bool = False
    shared_work_dir: bool = False  # all processes share git mirrors/worktrees
    visibility_timeout_ms: int = 3000
    settle_timeout_s: float = 240.0
    quiet_timeout_s: float = 60.0


@dataclass
class Kill:
    at_s: float
    server: int
    pid: int
    in_flight_requests: int   # our requests not yet terminal, just before the kill
    orphaned_leases: int      # deliveries the killed process held (redelivered later)
    restart_s: float = 0.0    # from the kill until the new process was ready


@dataclass
class ChaosResult:
    db: str
    processes: int
    requests: int = 0
    landed: int = 0
    error: int = 0
    cancelled: int = 0
    kills: int = 0
    lost: int = 0
    duplicated: int = 0
    trees_checked: int = 0     # landings whose tree was compared with the passed builds'
    terminal_pct: float = 0.0
    wall_s: float = 0.0
    cancel_requested: int = 0
    answers_lost: int = 0      # land POSTs whose answer a kill swallowed
    resubmitted: int = 0       # ... sent again with the same Idempotency-Key
    queue: dict[str, int] = field(default_factory=dict)
    dead_letters: list[str] = field(default_factory=list)
    kill_log: list[Kill] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    clean_exit: bool = True

    @property
    def ok(self) -> bool:
        return (not self.violations and self.lost == 0 and self.duplicated == 0
                and self.terminal_pct == 100.0)


class ChaosRunView(Protocol):
    """What :func:`bench._chaos_check.check_run` reads of a run."""

    cfg: ChaosConfig
    database_url: str
    rng: random.Random
    changes: list[Change]
    result: ChaosResult
    cluster: Cluster

    async def list_requests(self, client: httpx.AsyncClient) -> list[dict[str, Any]]: ...
