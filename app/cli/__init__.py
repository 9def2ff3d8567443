"""The ``submitqueue`` command line (``root.py`` builds it).

| Module | What |
|---|---|
| ``root.py`` | the Typer app: ``serve`` and ``db`` (the server's own), ``dlq`` (admin API) |
| ``commands.py`` | client commands ``land``, ``status``, ``cancel``, ``list``, ``watch`` |
| ``client.py`` | the REST client: ``SyncGatewayClient``, async ``GatewayClient`` (``watch``) |
| ``table.py`` | the live table of ``watch`` and ``demo`` |
| ``demo.py``, ``demo_git.py`` | ``submitqueue demo``: real changes pushed to a git queue |

The client modules import nothing of the server (an import-linter contract), and this
package's ``__init__`` imports nothing at all: ``main`` loads the app when it runs.
A client command (``submitqueue status ...``) loads only the client modules: the
server's imports (uvicorn, SQLAlchemy, alembic, the app) would triple its start-up,
nor httpx's own command line.
"""

from __future__ import annotations

import sys

CLIENT_COMMANDS = frozenset({"land", "status", "cancel", "list", "watch"})


def main() -> None:
    """Entry point of the ``submitqueue`` script and of ``python -m app.cli``."""
    if len(sys.argv) > 1 and sys.argv[1] in CLIENT_COMMANDS:
        # httpx imports its own command line (click, rich's syntax colouring, pygments)
        # when imported, unless that import fails; the client never runs it. A None
        # entry makes the import fail, and httpx falls back to a stub: ~60-100 ms less.
        sys.modules.setdefault("httpx._main", None)  # type: ignore[arg-type]
        import typer

        from app.cli import commands

        client = typer.Typer(help="SubmitQueue: a speculative merge queue.",
                             no_args_is_help=True)
        commands.register(client)
        client(prog_name="submitqueue")
        return
    from app.cli.root import cli

    cli()
