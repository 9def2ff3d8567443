"""The client-side commands of ``submitqueue``: ``land``, ``status``, ``cancel``,
``list`` and ``watch``. They talk to any gateway over its REST API
(``app/cli/client.py``) and import nothing of the server (an import-linter contract);
``demo`` lives in ``demo.py``.

Common options: ``--url`` (env ``SQ_URL``, default http://127.0.0.1:8000); the token in
``SQ_TOKEN``, if set, is sent as ``Authorization: Bearer``. Exit status: 0 success;
1 the server refused (4xx, its message is printed) or, for ``watch``/``demo``, not
every request ended as wanted; 2 usage errors, an unreachable server or a 5xx.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import asdict
from datetime import datetime
from typing import Annotated, Any

import typer

from app.cli.client import (
    DEFAULT_URL,
    IN_FLIGHT,
    TERMINAL,
    ClientError,
    GatewayClient,
    HistoryEntry,
    RequestSummary,
    SyncGatewayClient,
    plan_cancel,
    plan_history,
    plan_land,
    plan_queues,
    plan_requests,
    plan_summary,
    plan_waiting,
    split_sqid,
)
from app.cli.output import print_table
from app.domain.change_uri import parse_change_uri
from app.domain.errors import ValidationError
from app.domain.states import LandStrategy, Priority, PublicStatus

Url = Annotated[str, typer.Option("--url", envvar="SQ_URL",
                                  help="The SubmitQueue server (env SQ_URL).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
QueueOpt = Annotated[str | None, typer.Option(
    "--queue", "-q", envvar="SQ_QUEUE",
    help="Merge queue (env SQ_QUEUE; default: the server's only queue, if it has one).")]
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _client(url: str) -> SyncGatewayClient:
    return SyncGatewayClient(url, token=os.environ.get("SQ_TOKEN") or None)


def run_exit(work: Callable[[], int]) -> None:
    """Run ``work`` and exit with its status (or the error's)."""
    try:
        code = work()
    except ClientError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        typer.echo("interrupted (requests already submitted stay in the queue)", err=True)
        raise typer.Exit(130) from None
    raise typer.Exit(code)


def run_exit_async(work: Callable[[], Coroutine[Any, Any, int]]) -> None:
    """``run_exit`` for a command that needs an event loop (``watch``)."""
    import asyncio  # only here: ~25 ms that land, status, cancel and list never pay

    run_exit(lambda: asyncio.run(work()))


def _queue(client: SyncGatewayClient, queue: str | None) -> str:
    return queue or _only_queue([q.name for q in client.run(plan_queues())])


def _only_queue(names: Sequence[str]) -> str:
    if len(names) == 1:
        return names[0]
    raise typer.BadParameter(f"the server has several queues ({', '.join(names)}); "
                             "pass --queue (or set SQ_QUEUE)", param_hint="--queue")


def short_change(uri: str) -> str:
    """A change as a person names it: the branch of a git change, else the URI."""
    try:
        change = parse_change_uri(uri)
    except ValidationError:
        return uri
    if change.scheme == "git" and change.ref:
        return change.ref.removeprefix("refs/heads/")
    return uri.partition("?")[0]


def parse_since(text: str, now_ms: int) -> int:
    """``30m``, ``2h``, ``1d``, ``1w`` ago, or an ISO date/time (local time unless it
    says otherwise), as epoch milliseconds."""
    m = _DURATION.match(text.strip())
    if m:
        return now_ms - int(m.group(1)) * _UNITS[m.group(2)] * 1000
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise typer.BadParameter(
            f"{text!r} is neither a duration (30s, 10m, 2h, 1d, 1w) nor an ISO date or time "
            "(2025-01-31, 2025-01-31T09:30, 2025-01-31T09:30+00:00)", param_hint="--since",
        ) from None
    return int(when.timestamp() * 1000)


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _meta(metadata: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in metadata.items() if v not in ("", None))


def land(
    uris: Annotated[list[str], typer.Argument(help="Change URIs, bottom of the stack first.")],
    queue: QueueOpt = None,
    strategy: Annotated[LandStrategy | None, typer.Option(
        help="How to land (default: the queue's).")] = None,
    priority: Annotated[Priority | None, typer.Option(
        help="normal (default), high or hotfix: goes ahead of conflicting requests of a "
             "lower priority; hotfix needs the admin token or the queue's "
             "hotfix_allowed list.")] = None,
    url: Url = DEFAULT_URL, as_json: Json = False,
) -> None:
    """Submit changes to land as one request; prints its id (<queue>/<n>)."""
    def work() -> int:
        with _client(url) as client:
            name = _queue(client, queue)
            sqid = client.run(plan_land(name, uris, strategy.value if strategy else None,
                                        priority=priority.value if priority else None))
        typer.echo(json.dumps({"sqid": sqid, "queue": name}) if as_json else sqid)
        return 0
    run_exit(work)


def _sqid(sqid: str) -> str:
    try:
        split_sqid(sqid)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="SQID") from None
    return sqid


def _print_status(summary: RequestSummary, history: list[HistoryEntry],
                  waiting: Sequence[str] = ()) -> None:
    badge = f"  [{summary.priority}]" if summary.priority != "normal" else ""
    typer.echo(f"{summary.sqid}  {summary.status}{badge}")
    for line in waiting:
        typer.echo(f"  {line}")
    by = f" by {summary.submitted_by}" if summary.submitted_by else ""
    typer.echo(f"  received  {_when(summary.received_at_ms)}{by}")
    for uri in summary.change_uris:
        typer.echo(f"  change    {uri}")
    if summary.last_error:
        typer.echo(f"  error     {summary.last_error}")
    if summary.metadata:
        typer.echo(f"  metadata  {_meta(summary.metadata)}")
    typer.echo("history:")
    for e in history:
        offset = (e.timestamp_ms - summary.received_at_ms) / 1000
        error = f"  error: {e.last_error}" if e.last_error else ""
        typer.echo(f"  {offset:+9.3f}s  {e.type:6} {e.name:12} {_meta(e.metadata)}{error}"
                   .rstrip())


def status(
    sqid: Annotated[str, typer.Argument(help="A request id, <queue>/<n>.", callback=_sqid)],
    url: Url = DEFAULT_URL, as_json: Json = False,
) -> None:
    """Show one request: its status, changes, last error and full history."""
    def work() -> int:
        with _client(url) as client:
            summary = client.run(plan_summary(sqid))
            history = client.run(plan_history(sqid))
            waiting = client.run(plan_waiting(sqid, client.base_url))
        if as_json:
            typer.echo(json.dumps({"summary": asdict(summary), "waiting": waiting,
                                   "history": [asdict(e) for e in history]}, indent=2))
        else:
            _print_status(summary, history, waiting)
        return 0
    run_exit(work)


def cancel(
    sqid: Annotated[str, typer.Argument(help="A request id, <queue>/<n>.", callback=_sqid)],
    reason: Annotated[str, typer.Option(help="Why; kept in the request's history.")] = "",
    url: Url = DEFAULT_URL, as_json: Json = False,
) -> None:
    """Ask to cancel a request; prints the status the server answers (``cancelling``, or
    the request's terminal status when it had already ended: nothing is changed then)."""
    def work() -> int:
        with _client(url) as client:
            answer = client.run(plan_cancel(sqid, reason))
        typer.echo(json.dumps({"sqid": sqid, "status": answer}) if as_json
                   else f"{sqid}  {answer}")
        return 0
    run_exit(work)


def list_requests(
    queue: QueueOpt = None,
    since: Annotated[str | None, typer.Option(
        help="Received at or after: a duration ago (30m, 2h, 1d) or an ISO date/time.")] = None,
    status_: Annotated[PublicStatus | None, typer.Option(
        "--status", help="Only requests in this status.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000,
                                       help="At most this many, newest first.")] = 50,
    url: Url = DEFAULT_URL, as_json: Json = False,
) -> None:
    """List a queue's requests, newest first."""
    since_ms = parse_since(since, int(time.time() * 1000)) if since else None

    def work() -> int:
        with _client(url) as client:
            name = _queue(client, queue)
            items = client.run(plan_requests(
                name, since_ms=max(since_ms, 0) if since_ms is not None else None,
                status=status_.value if status_ else None, max_items=limit + 1))
        more, items = len(items) > limit, items[:limit]
        if as_json:
            typer.echo(json.dumps([asdict(r) for r in items], indent=2))
            return 0
        if not items:
            typer.echo(f"(no requests on {name} match)")
        else:
            print_table(("REQUEST", "STATUS", "RECEIVED", "CHANGES", "ERROR"),
                        [_list_row(r) for r in items])
        if more:
            typer.echo(f"(only the newest {limit} shown; raise --limit for more)")
        return 0
    run_exit(work)


def _list_row(r: RequestSummary) -> tuple[str, ...]:
    first = short_change(r.change_uris[0]) if r.change_uris else "-"
    extra = f" (+{len(r.change_uris) - 1})" if len(r.change_uris) > 1 else ""
    error = " ".join((r.last_error or "").split())  # one line, never cut
    return (r.sqid, r.status, _when(r.received_at_ms), first + extra, error)


async def _in_flight(client: GatewayClient, queue: str) -> list[RequestSummary]:
    found: dict[str, RequestSummary] = {}
    for st in IN_FLIGHT:
        for r in await client.requests(queue, status=st):
            found[r.sqid] = r
    return sorted(found.values(), key=lambda r: (r.received_at_ms, r.sqid))


def watch(
    sqids: Annotated[list[str] | None, typer.Argument(
        help="Request ids to follow (default: every request of --queue in flight).")] = None,
    queue: QueueOpt = None,
    timeout: Annotated[float, typer.Option(
        min=0, help="Give up after this many seconds (0 = never).")] = 0,
    poll: Annotated[float, typer.Option(min=0.1, help="Seconds between polls.")] = 0.5,
    url: Url = DEFAULT_URL,
) -> None:
    """Follow requests live until they settle; exit 0 if all landed, else 1."""
    for s in sqids or []:
        _sqid(s)

    async def work() -> int:
        from app.cli.table import LiveTable, Row, Watcher

        async with GatewayClient(url, token=os.environ.get("SQ_TOKEN") or None) as client:
            if sqids:
                summaries = [await client.summary(s) for s in dict.fromkeys(sqids)]
            else:
                name = queue or _only_queue([q.name for q in await client.queues()])
                summaries = await _in_flight(client, name)
                if not summaries:
                    typer.echo(f"nothing in flight on {name}")
                    return 0
            watcher = Watcher(client, LiveTable(sys.stdout), poll_s=poll)
            for s in summaries:
                label = short_change(s.change_uris[0]) if s.change_uris else "-"
                if len(s.change_uris) > 1:
                    label += f" (+{len(s.change_uris) - 1})"
                watcher.add(Row(sqid=s.sqid, changes=label))
            deadline = time.monotonic() + timeout if timeout else None
            settled = await watcher.run(deadline=deadline)
            rows = list(watcher.rows.values())
            watcher.table.final(rows)
            if not settled:
                typer.echo(f"timed out after {timeout:g} s; not settled: "
                           + ", ".join(f"{r.sqid} ({r.status})" for r in watcher.unsettled))
                return 1
            landed = sum(r.status == "landed" for r in rows)
            typer.echo(f"{landed} of {len(rows)} landed" + "".join(
                f"\n  {r.sqid} {r.status}: {r.last_error}" for r in rows
                if r.status in TERMINAL and r.status != "landed"))
            return 0 if landed == len(rows) else 1
    run_exit_async(work)


def register(cli: typer.Typer) -> None:
    """Add the client commands to the ``submitqueue`` app."""
    cli.command()(land)
    cli.command()(status)
    cli.command()(cancel)
    cli.command("list")(list_requests)
    cli.command()(watch)
