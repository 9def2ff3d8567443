"""The ``submitqueue`` command line."""

from __future__ import annotations

import typer
import uvicorn

from app.db import migrate
from app.logs import configure_logging
from app.settings import get_settings

cli = typer.Typer(help="SubmitQueue: a speculative merge queue.", no_args_is_help=True)
db_cli = typer.Typer(help="Database commands.", no_args_is_help=True)
cli.add_typer(db_cli, name="db")


@cli.command()
def serve(
    host: str | None = typer.Option(None, help="Interface to bind (default: SQ_HOST)."),
    port: int | None = typer.Option(None, help="Port to bind (default: SQ_PORT)."),
) -> None:
    """Serve the REST gateway and run the orchestrator's queue consumers."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.queue_log_level)
    uvicorn.run(
        "app.main:app_factory",
        factory=True,
        host=host or settings.host,
        port=port or settings.port,
        log_config=None,
        timeout_graceful_shutdown=max(1, settings.queue_shutdown_grace_ms // 1000 + 5),
    )


@db_cli.command("upgrade")
def db_upgrade(revision: str = typer.Argument("head", help="Target revision.")) -> None:
    """Migrate the database (and the queue database, if separate) to a revision."""
    settings = get_settings()
    configure_logging(settings.log_level, settings.queue_log_level)
    migrate.upgrade_sync(settings.database_url, revision)
    if settings.queue_database_url:
        migrate.upgrade_sync(settings.queue_database_url, revision)
    typer.echo(f"database at {revision}: {settings.database_url}")


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
