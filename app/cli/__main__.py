"""``python -m app.cli``: the ``submitqueue`` command line."""

from app.cli import main

main()
