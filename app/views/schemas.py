"""Response bodies of the status pages' read endpoints (``app/api/views.py``).

Probabilities are in [0, 1]; times are epoch milliseconds (``*_at_ms``) or durations
(``*_ms``). ``app/views/forecast.py`` says exactly what ``p_land``,
``p_speculation_holds`` and ``eta_*`` mean; ``app/views/trail.py`` defines the trail and
the removal reasons.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from app.views.freeze import FreezeView


class ForecastOut(BaseModel):
    p_land: float | None = Field(description="P(it lands) under the planner's model.")
    p_speculation_holds: float | None = Field(
        description="P(the build work funded now is the one that counts).")
    eta_ms: int | None = Field(description="Expected time left until it lands (if it lands).")
    eta_at_ms: int | None = Field(description="When it is expected to land.")
    basis: str = Field(description="How the numbers were derived, in words.")
    p_land_from: str = Field(default="prior", description=(
        "What p_land rests on: 'prior' (the scorer's number for the change; nothing of "
        "its batch has finished building yet), 'builds' (a finished build moved it), "
        "'state' (its state decides it: landed, failed, cancelling, merging) or 'health' "
        "(a dead letter makes it 0)."))


class HealthOut(BaseModel):
    """Whether the pipeline work of a request (or batch) is healthy (``app/views/health.py``)."""

    state: str = Field(default="ok", description=(
        "ok | retrying (a stage's message failed and waits for, or runs, another attempt) | "
        "dead_lettered (it moved to the stage's dead-letter queue) | stalled (the oldest "
        "request in flight and nothing about it changed for SQ_STALL_THRESHOLD_MS)"))
    topic: str = Field(default="", description="The stage (queue topic) that failed, e.g. "
                       "'merge'; empty when ok or stalled.")
    subject: str = Field(default="", description="What the failing message names: the "
                         "sqid, the batch id, or the queue (speculate).")
    attempts: int = Field(default=0, description="Attempts of that stage that failed so far.")
    max_attempts: int | None = Field(default=None, description="The stage's attempt budget "
                                     "(SQ_QUEUE_MAX_ATTEMPTS).")
    last_error: str = Field(default="", description="The last attempt's error.")
    next_attempt_at_ms: int | None = Field(default=None, description=(
        "Retrying: when the next attempt may start (None while one runs)."))
    attempt_running: bool = Field(default=False, description="Retrying: an attempt is under "
                                  "way right now.")
    since_ms: int | None = Field(default=None, description=(
        "Dead-lettered: when it moved to the DLQ; stalled: when it last changed."))
    needs_operator: bool = Field(default=False, description=(
        "True when nothing moves it without an operator: its dead letter is parked or its "
        "reconciler is paused."))
    operator_reason: str = Field(default="", description="Why it needs an operator.")
    admin_url: str | None = Field(default=None, description=(
        "Where to act on it (the admin page), for dead letters."))
    text: str = Field(default="", description=(
        "In words, e.g. 'dead-lettered at merge after 10 attempts — needs an operator "
        "(its reconciler is paused): see /admin; last error: ...'."))


class StallOut(BaseModel):
    """The stall detector's verdict on a queue (``app/views/stalls.py``)."""

    stalled: bool = Field(description="True when the oldest in-flight request has not "
                          "changed for longer than threshold_ms.")
    request: str | None = Field(description="The oldest in-flight request (None: none).")
    last_moved_at_ms: int | None = Field(description="Its newest history entry.")
    unmoved_ms: int = Field(description="How long it has not moved (0: nothing in flight).")
    threshold_ms: int = Field(description="SQ_STALL_THRESHOLD_MS.")
    checked_at_ms: int = Field(description="When the detector last looked.")
    text: str = Field(description="In words.")


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
    health: HealthOut = Field(default_factory=HealthOut, description=(
        "Whether its stage is retrying or dead-lettered."))


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
    priority: str = Field(default="normal", description=(
        "normal, high or hotfix (a batch goes ahead of conflicting batches of a lower "
        "priority that are not yet merging; docs/pipeline.md)."))
    health: HealthOut = Field(default_factory=HealthOut, description=(
        "Whether its stage is retrying, dead-lettered or stalled (ok for terminal ones)."))
    title: str = Field(default="", description=(
        "The first change's title (commit subject or pull request title) as the change "
        "provider reported it; '' before validation or when unknown."))
    branch: str = Field(default="", description=(
        "The first change's branch, read from its URI ('my-fix'; 'org/repo#12' for a pull "
        "request; 'D7' for a Phabricator revision)."))
    author: str = Field(default="", description="The first change's author (name, else "
                        "email); '' before validation.")
    author_email: str = Field(default="", description="The first change's author's email.")
    position: int | None = Field(default=None, description=(
        "In flight only: its place in line, 1 = the oldest request in flight (the queue "
        "lands in that order unless a build fails or an independent batch is faster)."))
    elapsed_ms: int = Field(default=0, description=(
        "Time since it was received (in flight) or receipt to terminal status."))
    activity: str = Field(default="", description=(
        "What it is doing now: validating | batching | building | built | "
        "waiting_for_slot | queued | landing | frozen | cancelling, or its terminal "
        "status (app/views/rows.py; frozen: ready to land in a frozen queue)."))
    activity_text: str = Field(default="", description=(
        "The activity in words, e.g. 'waiting for a build slot (4/4 in use)'."))


class SlotsOut(BaseModel):
    """The queue's build budget and the slots its live speculation paths hold."""

    budget: int = Field(description="The queue's build_budget.")
    in_use: int = Field(description="Live paths (pending, building, cancelling) of its "
                        "active batches, counted as the planner counts them.")
    building: int = Field(description="In-flight requests whose batch is building.")
    waiting_for_slot: int = Field(description="In-flight requests waiting for a build slot.")
    text: str = Field(description="'4/4 in use'.")


class ThroughputBucketOut(BaseModel):
    start_ms: int = Field(description="Start of the hour (epoch ms).")
    landed: int = Field(description="Requests that landed in it.")
    failed: int = Field(description="Requests that ended as error in it.")
    cancelled: int = Field(description="Requests cancelled in it.")
    mean_wait_ms: int | None = Field(description=(
        "Mean time from receipt to landing of those that landed in it (None: none did)."))
    max_wait_ms: int | None = Field(description="The longest of those waits.")


class ThroughputOut(BaseModel):
    """The queue's last 24 hours, by hour of the terminal status (``throughput.py``)."""

    window_ms: int
    bucket_ms: int
    until_ms: int = Field(description="End of the window (the hour after now started).")
    buckets: list[ThroughputBucketOut] = Field(description="Oldest first, one per hour.")
    landed: int
    failed: int
    cancelled: int
    mean_wait_ms: int | None = Field(description="Over every request landed in the window.")


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
    stall: StallOut | None = Field(default=None, description=(
        "The stall detector's last verdict (None before its first check or when off)."))
    queue_health: HealthOut = Field(default_factory=HealthOut, description=(
        "Failures of queue-wide work (a speculate run retrying or dead-lettered)."))
    slots: SlotsOut | None = Field(default=None, description=(
        "Build slots: the budget, how many are in use, how many requests build or wait."))
    throughput: ThroughputOut | None = Field(default=None, description=(
        "Landed, failed and cancelled per hour over the last 24 h, and the wait to land."))
    freeze: FreezeView = Field(default_factory=FreezeView, description=(
        "The queue's freeze in effect (docs/freeze.md): it lands nothing while frozen."))


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


class LogLineOut(BaseModel):
    n: int = Field(description="Line number in the log (from 1).")
    text: str
    failing: bool = Field(description="It reads like a failure (from the first one on).")


class LogExcerptOut(BaseModel):
    """The lines of a failed build's log around its first failure (``logtail.py``)."""

    build_id: str
    url: str | None = Field(description="The whole log.")
    first_failure: int | None = Field(description=(
        "Line number of the first line that reads like a failure (None: none did; the "
        "excerpt is then the log's tail)."))
    total_lines: int
    lines: list[LogLineOut]


class RemovalOut(BaseModel):
    kind: str = Field(description="build_failed | merge_conflict | cancelled | dead_lettered "
                                  "| dependency_unavailable "
                                  "| duplicate | rejected | error")
    reason: str | None = Field(default=None, description=(
        "The typed reason, one word of the vocabulary the notifications use "
        "(app/domain/removals.py): build_failed | merge_conflict | stale | cancelled "
        "| dependency_failed | dead_lettered | no_ci_started | flake_suspected | superseded; "
        "None when no word fits (an unexpected error)."))
    text: str = Field(description="Why, in words (app/views/explain.py for a build failure).")
    stage: str
    evidence: list[EvidenceOut]
    next_steps: list[str] = Field(default=[], description="What to do now, in words.")
    log: LogExcerptOut | None = Field(default=None, description=(
        "A build failure: the failing lines of the first failed build's log that a runner "
        "of ours kept (None for builds without a stored log, e.g. external CI)."))


class FlakeOut(BaseModel):
    at_ms: int
    build_id: str = Field(description="The build that passed after the failure.")
    path_id: str
    detail: str = Field(description=(
        "In words: how many earlier attempts failed and why the path was built again "
        "(speculation.retries, or a dependent's passed build that contained it)."))


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
    freeze: FreezeView = Field(default_factory=FreezeView, description=(
        "Its queue's freeze in effect (docs/freeze.md): it lands nothing while frozen."))
    flakes: list[FlakeOut] = Field(default=[], description=(
        "Build failures suspected flaky (``flake_suspected`` in its history): a later "
        "attempt of the same path passed."))


class SearchHitOut(BaseModel):
    sqid: str
    queue: str
    status: str
    received_at_ms: int
    change_uris: list[str]
    page: str = Field(description="Path of the request's page.")


class SearchOut(BaseModel):
    query: str
    kind: str = Field(description="'sqid', 'batch' (its member requests) or 'change_uri'.")
    items: list[SearchHitOut]
