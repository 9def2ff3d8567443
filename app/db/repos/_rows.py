"""Row <-> entity conversions shared by the orchestrator's repositories."""

from __future__ import annotations

import json
from typing import Any

from app.domain.entities import (
    Batch,
    Build,
    LandRequest,
    PathEntry,
    SpeculationPath,
)
from app.domain.states import (
    Assumption,
    BatchState,
    BuildStatus,
    LandStrategy,
    PathStatus,
    Priority,
    RequestState,
)


def dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def request_from_row(r: Any) -> LandRequest:
    return LandRequest(
        queue=r.queue, id=r.id, change_uris=tuple(json.loads(r.change_uris_json)),
        strategy=LandStrategy(r.strategy), state=RequestState(r.state), version=r.version,
        last_error=r.last_error or "", created_at_ms=r.created_at_ms,
        priority=Priority(r.priority or Priority.NORMAL),
    )


def batch_from_row(r: Any) -> Batch:
    return Batch(
        queue=r.queue, id=r.id, contains=tuple(json.loads(r.contains_json)),
        dependencies=tuple(json.loads(r.dependencies_json)), state=BatchState(r.state),
        version=r.version, failure_reason=r.failure_reason or "",
        created_at_ms=r.created_at_ms, updated_at_ms=r.updated_at_ms,
        landed={k: tuple(v) for k, v in json.loads(r.landed_json or "{}").items()},
        priority=Priority(r.priority or Priority.NORMAL),
        overtakes=tuple(json.loads(r.overtakes_json or "[]")),
        chance=r.chance or 0,
    )


def build_from_row(r: Any) -> Build:
    return Build(
        queue=r.queue, id=r.id, batch_id=r.batch_id, path_id=r.path_id, attempt=r.attempt,
        status=BuildStatus(r.status), version=r.version, log_url=r.log_url or "",
        created_at_ms=r.created_at_ms, updated_at_ms=r.updated_at_ms,
        base_sha=r.base_sha or "", commit_sha=r.commit_sha or "", tree_sha=r.tree_sha or "",
        changes=tuple(json.loads(r.changes_json or "[]")), epoch=int(r.epoch or 0),
        detail=r.detail or "",
    )


def entries_to_json(entries: tuple[PathEntry, ...]) -> str:
    return dumps([
        {
            "head": e.path.head,
            "deps": [[dep, a.value] for dep, a in e.path.dependencies],
            "status": e.status.value,
            "attempt": e.attempt,
            "rebuilds": e.rebuilds,
            **({"retried": e.retried} if e.retried else {}),
            **({"vindicated": e.vindicated} if e.vindicated else {}),
            "created_at_ms": e.created_at_ms,
            "updated_at_ms": e.updated_at_ms,
        }
        for e in entries
    ])


def entries_from_json(text: str) -> tuple[PathEntry, ...]:
    return tuple(
        PathEntry(
            path=SpeculationPath(
                head=e["head"], dependencies=tuple((d, Assumption(a)) for d, a in e["deps"])
            ),
            status=PathStatus(e["status"]),
            attempt=int(e["attempt"]),
            rebuilds=int(e.get("rebuilds", 0)),
            retried=int(e.get("retried", 0)),
            vindicated=int(e.get("vindicated", 0)),
            created_at_ms=int(e.get("created_at_ms", 0)),
            updated_at_ms=int(e.get("updated_at_ms", 0)),
        )
        for e in json.loads(text)
    )
