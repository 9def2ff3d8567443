"""The ``submitqueue`` command line: ``serve``, ``db`` and ``dlq`` here; the client
commands (``commands.py``), ``demo`` (``demo.py``) and ``init`` (``init.py``) are added
to it."""

from __future__ import annotations

import json
import os
import signal
import time
from enum import StrEnum
from typing import Annotated, Any

import httpx
import typer
import uvicorn
from pydantic import ValidationError

from app.cli import commands, demo, init
from app.cli.output import print_table
from app.db import migrate
from app.domain.errors import ValidationError as InvalidInput
from app.logs import configure_logging, redact_text
from app.resources import ResourceMissing, check_resources
from app.settings import Settings, get_settings, setting_errors

ROLE_HELP = ("all = gateway + consumers; gateway = HTTP and the request log only; "
             "worker = orchestrator consumers only (default: SQ_ROLE).")


class Role(StrEnum):
    ALL = "all"
    GATEWAY = "gateway"
    WORKER = "worker"


cli = typer.Typer(help="SubmitQueue: a speculative merge queue.", no_args_is_help=True)
db_cli = typer.Typer(help="Database commands.", no_args_is_help=True)
cli.add_typer(db_cli, name="db")
dlq_cli = typer.Typer(help="Dead letters, over the admin API (SQ_ADMIN_TOKEN).",
                      no_args_is_help=True)
cli.add_typer(dlq_cli, name="dlq")
token_cli = typer.Typer(help="API tokens, over the admin API (SQ_ADMIN_TOKEN).",
                        no_args_is_help=True)
cli.add_typer(token_cli, name="token")


@cli.command()
def serve(
    host: str | None = typer.Option(None, help="Interface to bind (default: SQ_HOST)."),
    port: int | None = typer.Option(None, help="Port to bind (default: SQ_PORT)."),
    role: Annotated[Role | None, typer.Option(help=ROLE_HELP)] = None,
) -> None:
    """Serve the REST gateway and run the orchestrator's queue consumers."""
    if role is not None:
        os.environ["SQ_ROLE"] = role.value  # read again by the app factory
    if port is not None:
        os.environ["SQ_PORT"] = str(port)  # part of the default member id (SQ_MEMBER_ID)
    if role is not None or port is not None:
        get_settings.cache_clear()
    settings = _settings()
    from app.extensions.factory import load_queues_file  # the server's imports, not a client's

    try:  # a wrong queues file, install or schema is one line, before anything starts
        load_queues_file(settings.queues_file)
        check_resources()
        if not settings.auto_migrate:
            _check_migrated(settings)
    except (InvalidInput, ResourceMissing) as exc:
        typer.echo(f"submitqueue: {exc}", err=True)
        raise typer.Exit(2) from None
    configure_logging(settings.log_level, settings.queue_log_level)
    # uvicorn shuts down gracefully on SIGTERM, then re-raises it to the handler it found
    # here: exit 0 (a requested stop) instead of dying by the signal.
    signal.signal(signal.SIGTERM, _exit_zero)
    uvicorn.run(
        "app.main:app_factory",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        log_config=None,
        access_log=False,  # app/api/access_log.py writes a structured line instead
        timeout_graceful_shutdown=max(1, settings.queue_shutdown_grace_ms // 1000 + 5),
    )


def _settings() -> Settings:
    """The settings, or exit 2 with one line per invalid one (no traceback)."""
    try:
        return get_settings()
    except ValidationError as exc:
        for line in setting_errors(exc):
            typer.echo(f"submitqueue: invalid setting {redact_text(line)}", err=True)
        raise typer.Exit(2) from None


def _check_migrated(settings: Settings) -> None:
    """With ``SQ_AUTO_MIGRATE`` off, a database behind this version's migrations is an
    ``InvalidInput`` naming the command that fixes it (the lifespan would fail later,
    with a traceback)."""
    for url in (settings.database_url, settings.queue_database_url):
        if url and (state := migrate.behind(url)):
            current, head = state
            raise InvalidInput(
                f"the database {redact_text(url)} is at migration {current or 'none'}; this "
                f"version needs {head}: run `submitqueue db upgrade` (SQ_AUTO_MIGRATE is off)")


def _exit_zero(_signum: int, _frame: object) -> None:
    raise SystemExit(0)


@db_cli.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Migrate the database (and the queue database, if separate) to a revision."""
    settings = _settings()
    configure_logging(settings.log_level, settings.queue_log_level)
    migrate.upgrade_sync(settings.database_url, revision)
    if settings.queue_database_url:
        migrate.upgrade_sync(settings.queue_database_url, revision)
    typer.echo(f"database at {revision}: {redact_text(settings.database_url)}")


def _admin(method: str, path: str, url: str | None, **kw: Any) -> Any:
    """Call the admin API of the server at ``url`` (default: SQ_HOST/SQ_PORT)."""
    settings = _settings()
    if not settings.admin_token:
        raise typer.BadParameter("SQ_ADMIN_TOKEN is not set; export the server's admin token")
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::", "") else settings.host
    base = url or f"http://{host}:{settings.port}"
    try:
        r = httpx.request(method, f"{base.rstrip('/')}/api/v1/admin{path}", timeout=120,
                          headers={"Authorization": f"Bearer {settings.admin_token}"}, **kw)
    except httpx.TransportError as exc:
        typer.echo(f"cannot reach {base}: {exc}", err=True)
        raise typer.Exit(2) from None
    if r.status_code >= 400:
        try:
            message = r.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = r.text
        typer.echo(f"error {r.status_code}: {message}", err=True)
        raise typer.Exit(1)
    return r.json()


URL = typer.Option(None, "--url", envvar="SQ_URL",
                   help="Server base URL (env SQ_URL; default: http://SQ_HOST:SQ_PORT).")
AS_JSON = typer.Option(False, "--json", help="Print the raw JSON response.")
IDS = typer.Option(None, "--id", help="Message ids (repeat); default: all.")


@dlq_cli.command("list")
def dlq_list(url: str | None = URL, as_json: bool = AS_JSON) -> None:
    """Dead-letter topics with their sizes."""
    body = _admin("GET", "/dlq", url)
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    print_table(("TOPIC", "SIZE", "PARKED", "PAUSED"), [
        (t["topic"], t["size"], t["parked"],
         "yes" if any(c["paused"] for c in t["consumers"]) else "")
        for t in body["topics"]], right=("SIZE", "PARKED"))


@dlq_cli.command("show")
def dlq_show(
    topic: str = typer.Argument(..., help="A DLQ topic, e.g. build_dlq."),
    message_id: str | None = typer.Argument(None, help="One message's id (else: list)."),
    limit: int = typer.Option(50, min=1, max=1000),
    url: str | None = URL, as_json: bool = AS_JSON,
) -> None:
    """List a DLQ topic's messages, or show one in full."""
    if message_id is not None:
        typer.echo(json.dumps(_admin("GET", f"/dlq/{topic}/messages/{message_id}", url),
                              indent=2))
        return
    body = _admin("GET", f"/dlq/{topic}/messages", url, params={"limit": limit})
    if as_json:
        typer.echo(json.dumps(body, indent=2))
        return
    if not body["items"]:
        typer.echo(f"(no dead letters on {topic})")
        return
    rows = []
    for i in body["items"]:
        first, *rest = (i["last_error"] or "-").splitlines()
        more = (f"  (+{len(rest)} lines: submitqueue dlq show {topic} {i['id']})"
                if rest else "")
        rows.append((i["id"], i["entity_id"] or "-", i["attempts"], first + more))
    print_table(("ID", "ENTITY", "ATTEMPTS", "LAST ERROR"), rows, right=("ID", "ATTEMPTS"))
    if body["next_cursor"]:
        typer.echo(f"(only the first {limit} shown; --limit shows more)")


@dlq_cli.command("drain")
def dlq_drain(
    topic: str = typer.Argument(..., help="A DLQ topic, e.g. build_dlq."),
    mode: str = typer.Option(..., help="reconcile | requeue | discard"),
    ids: list[str] | None = IDS,
    reason: str = typer.Option("", help="Why (required for requeue and discard)."),
    url: str | None = URL, as_json: bool = AS_JSON,
) -> None:
    """Reconcile, requeue or discard dead letters (all of them, a page at a time)."""
    body: dict[str, Any] = {"mode": mode, "reason": reason,
                            "message_ids": list(ids) if ids else None}
    counts: dict[str, int] = {}
    while True:
        out = _admin("POST", f"/dlq/{topic}/drain", url, json=body)
        for r in out["results"]:
            counts[r["result"]] = counts.get(r["result"], 0) + 1
            if as_json:
                typer.echo(json.dumps(r))
            else:
                typer.echo(f"{r['id']:>8}  {r['result']}  {r.get('error') or r.get('to') or ''}")
        if not out["next_cursor"]:
            break
        body["cursor"] = out["next_cursor"]
    typer.echo(", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "nothing to drain")


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_lifetime(text: str) -> int:
    """``90d`` / ``12h`` / ``30m`` / ``45s`` -> seconds."""
    raw = text.strip().lower()
    if len(raw) < 2 or raw[-1] not in _UNITS or not raw[:-1].isdigit() or int(raw[:-1]) < 1:
        raise typer.BadParameter(f"{text!r} is not a lifetime; write e.g. 90d, 12h or 30m")
    return int(raw[:-1]) * _UNITS[raw[-1]]


def _ms(ms: int | None) -> str:
    if not ms:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ms / 1000))


SCOPES = typer.Option(..., "--scope", help="read | land | cancel | cancel:any | admin "
                                          "(repeat).")
QUEUES = typer.Option(None, "--queue", help="Limit it to this queue (repeat).")


@token_cli.command("create")
def token_create(
    label: str = typer.Option(..., help="Who uses it (e.g. ci-bot, alice): the actor "
                                        "the history records."),
    scopes: list[str] = SCOPES,
    queues: list[str] | None = QUEUES,
    expires_in: str | None = typer.Option(None, help="Lifetime, e.g. 90d or 12h; "
                                                     "default: never expires."),
    url: str | None = URL, as_json: bool = AS_JSON,
) -> None:
    """Create an API token and print its secret (shown this once)."""
    body = {"label": label, "scopes": scopes, "queues": list(queues) if queues else None,
            "expires_in_s": parse_lifetime(expires_in) if expires_in else None}
    out = _admin("POST", "/tokens", url, json=body)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    where = f"; queues {', '.join(out['queues'])}" if out["queues"] else ""
    until = f"; expires {_ms(out['expires_at_ms'])} UTC" if out["expires_at_ms"] else ""
    typer.echo(f"token {out['id']} for {out['label']} ({', '.join(out['scopes'])}{where}{until})")
    typer.echo(out["token"])
    typer.echo("shown this once: store it now (e.g. export SQ_TOKEN=...); only its hash is kept",
               err=True)


@token_cli.command("list")
def token_list(
    include_revoked: bool = typer.Option(False, "--all", help="Also revoked tokens."),
    url: str | None = URL, as_json: bool = AS_JSON,
) -> None:
    """API tokens, newest first (never their secrets)."""
    out = _admin("GET", f"/tokens?include_revoked={str(include_revoked).lower()}", url)
    if as_json:
        typer.echo(json.dumps(out, indent=2))
        return
    if not out["items"]:
        typer.echo("no tokens; create one with `submitqueue token create`")
        return
    typer.echo(f"{'ID':12}  {'LABEL':16} {'SCOPES':24} {'QUEUES':12} {'LAST USED':16} "
               f"{'EXPIRES':16} REVOKED")
    for t in out["items"]:
        typer.echo(f"{t['id']:12}  {t['label']:16} {','.join(t['scopes']):24} "
                   f"{','.join(t['queues'] or ['all']):12} {_ms(t['last_used_at_ms']):16} "
                   f"{_ms(t['expires_at_ms']):16} {_ms(t['revoked_at_ms'])}")


@token_cli.command("revoke")
def token_revoke(
    token_id: str = typer.Argument(..., help="The token's id, as listed."),
    reason: str = typer.Option("", help="Why, for the audit log."),
    url: str | None = URL,
) -> None:
    """Revoke a token: every server process refuses it from its next call on."""
    out = _admin("POST", f"/tokens/{token_id}/revoke", url, json={"reason": reason})
    typer.echo(f"revoked {out['id']} ({out['label']})" if out["revoked"] else
               f"{out['id']} ({out['label']}) was revoked already")


commands.register(cli)  # land, status, list, watch
cli.command("demo")(demo.demo_command)
cli.command("init")(init.init_command)
