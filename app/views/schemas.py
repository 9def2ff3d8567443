"""Response bodies of the status pages' read endpoints (``app/api/views.py``).

Probabilities are in [0, 1]; times are epoch milliseconds (``*_at_ms``) or durations
(``*_ms``). ``app/views/forecast.py`` says exactly what ``p_land``,
``p_speculation_holds`` and ``eta_*`` mean; ``app/views/trail.py`` defines the trail and
the removal reasons.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class ForecastOut(BaseModel):
    p_land: float | None = Field(description="P(it lands) under the planner's model.")
    p_speculation_holds: float | None = Field(
        description="P(the build work funded now is the one that counts).")
    eta_ms: int | None = Field(description="Expected time left until it lands (if it lands).")
    eta_at_ms: int | None = Field(description="When it is expected to land.")
    basis: str = Field(description="How the numbers were derived, in words.")


class TimingOut(BaseModel):
    build_ms: int | None = Field(description="Median duration of the queue's recent builds.")
    merge_ms: int | None = Field(description="Median time from 'speculated' to 'landed'.")
    build_samples: int
    merge_samples: int


class BuildOut(BaseModel):
    id: str
    status: str
    log_url: str | None = Field(description="Only http(s) or site-relative URLs are kept.")
    started_at_ms: int
    finished_at_ms: int | None


class AssumptionOut(BaseModel):
    batch_id: str
    assumption: str = Field(description="'succeeds' (built on top of it) or 'fails'.")
    batch_state: str | None


class PathOut(BaseModel):
    id: str
    status: str
    attempt: int
    assumptions: list[AssumptionOut]
    described: str = Field(description="The assumptions in words.")
    p_assumptions_hold: float | None
    build: BuildOut | None


class DependencyOut(BaseModel):
    id: str
    state: str | None = Field(description="None when the batch is not known.")
    requests: list[str]


class BatchOut(BaseModel):
    id: str
    state: str
    requests: list[str]
    dependencies: list[DependencyOut]
    paths: list[PathOut]
    failure_reason: str
    forecast: ForecastOut


class RequestRowOut(BaseModel):
    sqid: str
    n: int
    queue: str
    status: str
    stage: str = Field(description="incoming | batching | speculating | landing | cancelling "
                                   "| landed | error | cancelled")
    change_uris: list[str]
    received_at_ms: int
    status_at_ms: int
    duration_ms: int | None = Field(description="Receipt to terminal status (terminal only).")
    last_error: str
    batch_id: str | None
    forecast: ForecastOut | None
    landed_commits: list[str] = Field(
        default_factory=list,
        description="Landed only: the target commit each change landed as, in order.")
    submitted_by: str = Field(default="", description=(
        "Who submitted it (the token's label; 'anonymous' under SQ_AUTH=open without a "
        "token; empty before tokens existed)."))


class OutageOut(BaseModel):
    dependency: str = Field(description="e.g. repository:<queue>, builds:<queue>.")
    status: str = Field(description="open (only open circuits are listed).")
    since_ms: int
    open_for_ms: int
    next_probe_ms: int = Field(description="When the next probe runs (epoch ms).")
    failures: int
    text: str = Field(description="'waiting: <dependency> unreachable since <time>, "
                                  "retrying (next in 40 s)'.")


class StageGroupOut(BaseModel):
    stage: str
    requests: list[RequestRowOut]


class TrunkMoveOut(BaseModel):
    """The newest move of the target branch outside the queue the merger found."""

    target_branch: str
    tip_sha: str = Field(description="Where the target was found (the new trunk).")
    epoch: int = Field(description="The trunk epoch it started (1 for the first move).")
    rebuilt: int = Field(description="Speculation paths refuted and rebuilt because of it.")
    detected_at_ms: int
    notice: str = Field(description="'<branch> moved outside the queue at <sha>; N paths "
                                    "rebuilt'")


class OverviewOut(BaseModel):
    queue: str
    description: str
    build_budget: int
    now_ms: int
    counts: dict[str, int]
    stages: list[StageGroupOut] = Field(description="In-flight requests by stage, oldest first.")
    batches: list[BatchOut] = Field(description="Active batches, oldest first.")
    recent: list[RequestRowOut] = Field(description="Terminal requests, newest first.")
    timing: TimingOut
    truncated: bool = Field(description="True when a list hit its limit.")
    outages: list[OutageOut] = Field(default=[], description=(
        "Open circuits of the queue's dependencies (requests that need them wait)."))
    trunk_move: TrunkMoveOut | None = Field(
        default=None, description="The newest move of the target outside the queue, if any.")


class TrailEntryOut(BaseModel):
    at_ms: int
    event: str
    build_id: str
    build_status: str
    build_url: str | None
    path_id: str


class TrailEventOut(BaseModel):
    event: str
    count: int


class StageOut(BaseModel):
    status: str
    label: str = Field(description="e.g. 'speculating [building \u00d73, built \u00d72, waiting]'.")
    at_ms: int
    duration_ms: int | None
    events: list[TrailEventOut]
    entries: list[TrailEntryOut]
    last_error: str
    metadata: dict[str, Any]


class EvidenceOut(BaseModel):
    label: str
    url: str | None


class RemovalOut(BaseModel):
    kind: str = Field(description="build_failed | merge_conflict | cancelled | dead_lettered "
                                  "| dependency_unavailable "
                                  "| duplicate | rejected | error")
    text: str
    stage: str
    evidence: list[EvidenceOut]


class RequestViewOut(BaseModel):
    request: RequestRowOut
    trail: list[StageOut]
    batch: BatchOut | None
    waits_on: list[DependencyOut] = Field(
        description="Unsettled dependencies of its batch (what it waits on).")
    removal: RemovalOut | None
    cancellable: bool
    timing: TimingOut
    now_ms: int
    outages: list[OutageOut] = Field(default=[], description=(
        "Open circuits this live request waits on (empty once it is terminal)."))


class SearchHitOut(BaseModel):
    sqid: str
    queue: str
    status: str
    received_at_ms: int
    change_uris: list[str]
    page: str = Field(description="Path of the request's page.")


class SearchOut(BaseModel):
    query: str
    kind: str = Field(description="'sqid' or 'change_uri'.")
    items: list[SearchHitOut]
