"""A build runner that builds nothing: the outcome is decided at trigger time.

Stateless across restarts: the build id carries all there is to know,
``fake-<12 hex>-<finish_at_ms>-<outcome>`` with outcome ``succeeded``, ``failed``,
``error`` or ``lost``. Any process (a restarted worker too) reads the status from the id and the
wall clock. Only cancellations live in memory (a set per runner): after a restart a
cancelled, unfinished build reports RUNNING and then its outcome, which a fake may.

Tokens (``sq-fake=<token>``), read from every change of the request, base and head:

| Token | Effect |
|---|---|
| ``trigger-error`` | ``trigger`` raises ``FakeConnectionError`` (retried, then dead-lettered) |
| ``build-error`` | ``status`` raises ``FakeConnectionError`` (retried, then dead-lettered) |
| ``build-fail`` | the build finishes FAILED |
| ``build-lost`` | a path's first attempt ends ERRORED (as if its runner died); later ones go on |
| ``build-flaky`` | a path's first attempt ends FAILED (a flaky test); later ones go on |
| ``build-flaky-head`` | like ``build-flaky``, but only in a path whose head carries it |
| ``build-flaky-batch`` | every build whose head batch is the first batch of a change carrying it ends FAILED; a later batch's go on (in memory: a restart forgets) |

Precedence: ``trigger-error`` > ``build-error`` > ``build-fail``. The build takes the
runner's ``delay_ms``, or the largest ``sq-build-ms=<n>`` among the head changes.
Before it finishes the status is RUNNING. A build cancelled before it finished reports
CANCELLED from then on; a cancel after it finished changes nothing.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from app.domain.change_uri import parse_change_uri
from app.domain.states import BuildStatus
from app.extensions.base import BuildReport, BuildRequest, FakeConnectionError

TRIGGER_ERROR = "trigger-error"
BUILD_ERROR = "build-error"
BUILD_FAIL = "build-fail"
BUILD_LOST = "build-lost"
BUILD_FLAKY = "build-flaky"
BUILD_FLAKY_HEAD = "build-flaky-head"
BUILD_FLAKY_BATCH = "build-flaky-batch"

_ID = re.compile(r"^fake-(?P<nonce>[0-9a-f]{12})-(?P<finish>[0-9]{1,16})-"
                 r"(?P<outcome>succeeded|failed|error|lost)$")


class UnknownBuild(ValueError):
    """The id was not issued by a fake build runner."""

    retryable = False


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class FakeBuildId:
    nonce: str
    finish_at_ms: int
    outcome: str  # succeeded | failed | error | lost

    def __str__(self) -> str:
        return f"fake-{self.nonce}-{self.finish_at_ms}-{self.outcome}"

    @classmethod
    def parse(cls, build_id: str) -> FakeBuildId:
        m = _ID.match(build_id) if isinstance(build_id, str) else None
        if m is None:
            raise UnknownBuild(
                f"unknown build id {build_id!r}: a fake build id looks like "
                "fake-<12 hex>-<finish_at_ms>-<succeeded|failed|error|lost>"
            )
        return cls(m["nonce"], int(m["finish"]), m["outcome"])


class FakeBuildRunner:
    def __init__(self, delay_ms: int = 0, clock: Callable[[], int] = wall_clock_ms) -> None:
        """``clock`` returns milliseconds since the epoch (wall clock: ids outlive processes)."""
        if delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {delay_ms}")
        self.delay_ms = delay_ms
        self.clock = clock
        self._cancelled: set[str] = set()
        self._first_batch: dict[str, str] = {}  # build-flaky-batch: change -> first batch

    async def trigger(self, request: BuildRequest) -> str:
        all_changes = [parse_change_uri(u) for u in (*request.base_changes, *request.head_changes)]
        tokens: set[str] = set().union(*(c.fake_tokens for c in all_changes))
        if TRIGGER_ERROR in tokens:
            raise FakeConnectionError("fake build service refused the trigger")
        heads = all_changes[len(request.base_changes):]
        head_tokens: set[str] = set().union(*(c.fake_tokens for c in heads))
        first = request.attempt == 1
        if BUILD_FLAKY_BATCH in head_tokens and self._flaky_batch(request):
            tokens = tokens | {BUILD_FAIL}
        if BUILD_ERROR in tokens:
            outcome = "error"
        elif BUILD_LOST in tokens and first:
            outcome = "lost"
        elif BUILD_FAIL in tokens or (first and (
                BUILD_FLAKY in tokens or BUILD_FLAKY_HEAD in head_tokens)):
            outcome = "failed"
        else:
            outcome = "succeeded"
        delays = [int(c.markers["sq-build-ms"]) for c in heads if "sq-build-ms" in c.markers]
        delay = max(delays) if delays else self.delay_ms
        return str(FakeBuildId(uuid.uuid4().hex[:12], self.clock() + delay, outcome))

    def _flaky_batch(self, request: BuildRequest) -> bool:
        """The head batch is the first batch of a ``build-flaky-batch`` change seen."""
        for uri in request.head_changes:
            if BUILD_FLAKY_BATCH in parse_change_uri(uri).fake_tokens:
                first = self._first_batch.setdefault(uri, request.batch_id)
                if first == request.batch_id:
                    return True
        return False

    async def status(self, build_id: str) -> BuildReport:
        bid = FakeBuildId.parse(build_id)
        if build_id in self._cancelled:  # recorded only if cancelled before it finished
            return BuildReport(BuildStatus.CANCELLED, detail="cancelled")
        if bid.outcome == "error":
            raise FakeConnectionError(f"fake build service lost build {build_id} ({BUILD_ERROR})")
        if self.clock() < bid.finish_at_ms:
            return BuildReport(BuildStatus.RUNNING)
        if bid.outcome == "lost":
            return BuildReport(BuildStatus.ERRORED, detail=f"fake build lost ({BUILD_LOST})")
        if bid.outcome == "failed":
            return BuildReport(
                BuildStatus.FAILED, detail=f"fake build failed: a change carries {BUILD_FAIL}"
            )
        return BuildReport(BuildStatus.SUCCEEDED)

    async def cancel(self, build_id: str) -> None:
        bid = FakeBuildId.parse(build_id)
        if self.clock() < bid.finish_at_ms:
            self._cancelled.add(build_id)
