"""The ``submitqueue`` command line (``root.py`` builds it).

| Module | What |
|---|---|
| ``root.py`` | the Typer app: ``serve`` and ``db`` (the server's own), ``dlq`` (admin API) |
| ``commands.py`` | client commands ``land``, ``status``, ``list``, ``watch``: HTTP only |
| ``client.py`` | ``GatewayClient``, the REST client those commands (and ``demo``) use |
| ``table.py`` | the live table of ``watch`` and ``demo`` |
| ``demo.py``, ``demo_git.py`` | ``submitqueue demo``: real changes pushed to a git queue |

The client modules import nothing of the server (an import-linter contract), and this
package's ``__init__`` imports nothing at all: ``main`` loads the app when it runs.
"""

from __future__ import annotations


def main() -> None:
    """Entry point of the ``submitqueue`` script and of ``python -m app.cli``."""
    from app.cli.root import cli

    cli()
