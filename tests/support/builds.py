"""Build requests for runner tests, named the way the speculation names real ones."""

from __future__ import annotations

import hashlib

from app.extensions.base import BuildRequest


def build_request(*head: str, base: tuple[str, ...] = (), attempt: int = 1,
                  queue: str = "q", batch_id: str = "q/batch/1") -> BuildRequest:
    """A build of ``head`` on ``base``. Its path id names the combination, as a real
    speculation path's does: runners derive the build id from (queue, path, attempt),
    so two different combinations must not share one."""
    path_id = hashlib.sha256(repr((base, head)).encode()).hexdigest()[:12]
    return BuildRequest(queue=queue, batch_id=batch_id, path_id=path_id, attempt=attempt,
                        base_changes=base, head_changes=head)
