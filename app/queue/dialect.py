"""What differs between SQLite and PostgreSQL in the queue's SQL, in one place.

Statements are written with ``:name`` parameters; the PostgreSQL backend turns
them into ``$n`` placeholders (see ``to_positional``). On PostgreSQL the hot
operations (publish one message, claim, ack) are single statements built from
data-modifying CTEs, run without an explicit transaction (see ``Stmt.last``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@dataclass(frozen=True, slots=True)
class Stmt:
    """One statement of an operation.

    ``last``: the operation yields nothing after this statement. When the *first*
    statement is also the last, the operation is a single statement, which is atomic
    on its own: the PostgreSQL backend then runs it in autocommit, saving the
    ``BEGIN`` and ``COMMIT`` round trips.
    """

    sql: str
    params: dict[str, Any]
    last: bool = False


def _positional(sql: str) -> tuple[str, list[str]]:
    cached = _POSITIONAL.get(sql)
    if cached is None:
        cached = _POSITIONAL[sql] = to_positional(sql)
    return cached


_POSITIONAL: dict[str, tuple[str, list[str]]] = {}


def to_positional(sql: str) -> tuple[str, list[str]]:
    """``:name`` placeholders -> ``$n``; returns the new SQL and the parameter order."""
    order: list[str] = []

    def repl(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in order:
            order.append(name)
        return f"${order.index(name) + 1}"

    return _PARAM.sub(repl, sql), order


_NOT_PAUSED = """
  NOT EXISTS (SELECT 1 FROM queue_pauses p
              WHERE p.consumer_group = :g AND p.topic = :t
                AND (p.partition_key = '' OR p.partition_key = d.partition_key))"""

# Serial topics: only the oldest delivery of a partition may be claimed, and only
# when it is available. Any in-flight, held or retrying delivery of a partition is
# its oldest one, so this one rule gives "at most one in flight" and strict order.
# Partitions are walked with a loose index scan so the cost grows with the number
# of partitions, not with the backlog.
_SERIAL_CANDIDATES = """
WITH RECURSIVE parts(pk) AS (
  SELECT MIN(partition_key) FROM queue_deliveries WHERE consumer_group = :g AND topic = :t
  UNION ALL
  SELECT (SELECT MIN(x.partition_key) FROM queue_deliveries x
          WHERE x.consumer_group = :g AND x.topic = :t AND x.partition_key > parts.pk)
  FROM parts WHERE parts.pk IS NOT NULL
)
SELECT d.id FROM parts
JOIN queue_deliveries d ON d.id = (
  SELECT h.id FROM queue_deliveries h
  WHERE h.consumer_group = :g AND h.topic = :t AND h.partition_key = parts.pk
  ORDER BY h.id LIMIT 1)
WHERE parts.pk IS NOT NULL AND d.available_at_ms <= :now AND {not_paused}
ORDER BY d.id LIMIT :n
"""

# The same rule on PostgreSQL. Each step of the loose index scan yields the next
# partition's oldest delivery directly, and the heads are then fetched by id (a
# join here may be planned as a scan of the whole backlog). Heads are locked in id
# order, skipping one another claimer is taking: claimers never wait for each other
# (so cannot deadlock), and the claim itself re-checks availability.
_SERIAL_CANDIDATES_PG = """
WITH RECURSIVE heads(pk, id) AS (
  (SELECT h.partition_key, h.id FROM queue_deliveries h
   WHERE h.consumer_group = :g AND h.topic = :t ORDER BY h.partition_key, h.id LIMIT 1)
  UNION ALL
  SELECT nxt.partition_key, nxt.id FROM heads, LATERAL (
    SELECT x.partition_key, x.id FROM queue_deliveries x
    WHERE x.consumer_group = :g AND x.topic = :t AND x.partition_key > heads.pk
    ORDER BY x.partition_key, x.id LIMIT 1) nxt
)
SELECT d.id FROM queue_deliveries d
WHERE d.id = ANY(ARRAY(SELECT id FROM heads)) AND d.available_at_ms <= :now AND {not_paused}
ORDER BY d.id LIMIT :n FOR UPDATE OF d SKIP LOCKED
"""

# Other topics: any available delivery, oldest first, unless an older delivery of
# its partition is held (a hold is a barrier for its partition).
_PARALLEL_CANDIDATES = """
SELECT d.id FROM queue_deliveries d
WHERE d.consumer_group = :g AND d.topic = :t AND d.available_at_ms <= :now
  AND NOT EXISTS (SELECT 1 FROM queue_deliveries h
                  WHERE h.consumer_group = :g AND h.topic = :t
                    AND h.partition_key = d.partition_key AND h.held = 1 AND h.id < d.id)
  AND {not_paused}
ORDER BY d.id LIMIT :n {lock}
"""


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str

    @property
    def is_postgres(self) -> bool:
        return self.name == "postgresql"

    def lock_partition(self, topic: str, partition_key: str) -> Stmt | None:
        """Serialise publishers of one partition so ids commit in order (PostgreSQL).

        SQLite has a single writer, so commit order is id order already.
        """
        if not self.is_postgres:
            return None
        return Stmt(
            "SELECT pg_advisory_xact_lock(hashtextextended(:lk, 7)) AS locked",
            {"lk": f"{topic}\x1f{partition_key}"},
        )

    def driver_args(self, stmt: Stmt) -> tuple[str, Any]:
        """``stmt`` as a DB-API driver takes it: SQLite's ``:name`` with the dict;
        PostgreSQL's ``$n`` with the values in order (the translation is cached)."""
        if not self.is_postgres:
            return stmt.sql, stmt.params
        sql, order = _positional(stmt.sql)
        return sql, tuple(stmt.params[name] for name in order)

    def notify(self, topic: str) -> Stmt | None:
        if not self.is_postgres:
            return None
        return Stmt("SELECT pg_notify('submitqueue_queue', :topic) AS notified", {"topic": topic})

    def notify_alone(self, topics: list[str]) -> Stmt | None:
        """NOTIFY in a transaction of its own, after the data was committed.

        A transaction that notifies holds a server-wide lock from its commit until
        the commit is flushed, so notifying inside every publish serialises all
        publishers on the WAL flush. This transaction writes nothing, so it need
        not wait for a flush (``synchronous_commit`` off for it alone): the lock is
        held only briefly. A lost notification only delays a consumer until it polls.
        """
        if not self.is_postgres:
            return None
        return Stmt(
            """WITH async_commit AS (SELECT set_config('synchronous_commit', 'off', true))
               SELECT pg_notify('submitqueue_queue', t) AS notified
               FROM async_commit, unnest(CAST(:topics AS text[])) AS t""",
            {"topics": topics},
            last=True,
        )

    def claim_candidates(self, serial: bool) -> str:
        if serial:
            template = _SERIAL_CANDIDATES_PG if self.is_postgres else _SERIAL_CANDIDATES
            return template.format(not_paused=_NOT_PAUSED)
        lock = "FOR UPDATE OF d SKIP LOCKED" if self.is_postgres else ""
        return _PARALLEL_CANDIDATES.format(not_paused=_NOT_PAUSED, lock=lock)


SQLITE = Dialect("sqlite")
POSTGRES = Dialect("postgresql")
