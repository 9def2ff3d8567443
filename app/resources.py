"""The files the server needs beside its code: the migrations, the status pages and the
example configuration.

| Name | What | Used by |
|---|---|---|
| ``alembic`` | the migration scripts (``env.py``, ``versions/``) | ``app/db/migrate.py`` |
| ``frontend-static`` | the status pages' HTML, ES modules and CSS | ``app/api/pages.py`` |
| ``queues.yaml`` | the example queues file (a fake queue and a git sandbox queue) | reference |
| ``.env.example`` | every setting with its default | ``submitqueue init`` |

In the source checkout they sit at the project root beside ``app/``. A built wheel
carries copies under ``app/_bundle/`` (``setup.py`` puts them there), so an installed
``submitqueue`` finds them wherever it runs. ``resource`` prefers the bundled copy and
falls back to the checkout's only when a ``pyproject.toml`` sits beside ``app/`` (an
installed package's parent folder is ``site-packages``, whose ``alembic/`` is the
Alembic library, not these migrations).

This module imports nothing of the application.
"""

from __future__ import annotations

from pathlib import Path

NAMES = ("alembic", "frontend-static", "queues.yaml", ".env.example")
PACKAGE_DIR = Path(__file__).resolve().parent
BUNDLE_DIR = PACKAGE_DIR / "_bundle"
CHECKOUT_DIR = PACKAGE_DIR.parent


class ResourceMissing(FileNotFoundError):
    """A file the package should carry is absent: a broken install (or a wheel built
    without ``setup.py``). Its message says which and where it was looked for."""


def resource(name: str, *, bundle_dir: Path = BUNDLE_DIR,
             checkout_dir: Path = CHECKOUT_DIR) -> Path:
    """The path of resource ``name`` (one of ``NAMES``): the bundled copy when the
    package has one, else the source checkout's, else ``ResourceMissing``."""
    if name not in NAMES:
        raise ValueError(f"unknown resource {name!r}; known: {', '.join(NAMES)}")
    bundled = bundle_dir / name
    if bundled.exists():
        return bundled
    if (checkout_dir / "pyproject.toml").is_file() and (checkout_dir / name).exists():
        return checkout_dir / name
    raise ResourceMissing(
        f"{name} is missing from this installation (looked in {bundle_dir} and in a "
        f"source checkout at {checkout_dir}); reinstall submitqueue from a wheel built "
        "with its setup.py, or run it from the source checkout")


def check_resources() -> None:
    """Raise ``ResourceMissing`` for the first resource that cannot be found."""
    for name in NAMES:
        resource(name)
