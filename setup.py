"""Build hook only; the metadata is in pyproject.toml.

The server needs files that live beside ``app/`` in the checkout: the migrations
(``alembic/``), the status pages (``frontend-static/``), the example ``queues.yaml`` and
``.env.example``. ``build_py`` copies them into the built package as ``app/_bundle/``,
where ``app.resources.resource`` finds them in an installed wheel. An editable install
(``pip install -e .``, ``make run``) copies nothing: it reads the checkout's own files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
BUNDLE = ("alembic", "frontend-static", "queues.yaml", ".env.example")  # app.resources.NAMES
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo")


class BuildPyWithBundle(build_py):
    """``build_py`` that also copies the resources into ``<build_lib>/app/_bundle``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "app" / "_bundle"
        if target.exists():
            shutil.rmtree(target)  # a stale copy from an earlier build
        target.mkdir(parents=True)
        for name in BUNDLE:
            source = HERE / name
            if source.is_dir():
                shutil.copytree(source, target / name, ignore=SKIP)
            elif source.is_file():
                shutil.copy2(source, target / name)
            else:
                raise SystemExit(f"setup.py: {source} is missing; a wheel without it "
                                 "cannot migrate or serve its pages")


setup(cmdclass={"build_py": BuildPyWithBundle})
