"""``submitqueue init [DIR] [--force]``: write a commented ``queues.yaml`` (one demo
queue on fakes: nothing is fetched, built or pushed, no outside service is needed) and
a ``.env`` (``.env.example`` with a generated admin token) into ``DIR`` (default: the
current directory), so that ``submitqueue serve`` run there works at once.

| Found in DIR | Action |
|---|---|
| neither file | write both, print what was written and what to run next |
| either file, no ``--force`` | write nothing; one line naming it, exit 1 |
| either file, ``--force`` | overwrite both |
| DIR is not a folder (or cannot be written) | write nothing; one line, exit 1 |
"""

from __future__ import annotations

import re
import secrets
from pathlib import Path
from typing import Annotated

import typer

from app.resources import ResourceMissing, resource

QUEUES_YAML = """\
# Merge queues served by SubmitQueue, read at start-up from SQ_QUEUES_FILE (./queues.yaml).
# Written by `submitqueue init`. Every key is checked: an unknown or misspelt key is an
# error that names it. Change it and restart `submitqueue serve`.

# Merged under every queue below (shallowly: a queue that sets a block replaces it).
defaults:
  # Largest number of speculative builds in flight per queue (1..1000).
  build_budget: 4
  # How a request lands when it does not say: rebase | squash_rebase | merge | fast_forward.
  default_strategy: rebase

queues:
  # A queue on fakes only: nothing is fetched, built or pushed, so it works without git,
  # CI or a code host. Change URIs steer the fakes with markers, e.g.
  #   git://demo.example.com/demo/refs%2Fheads%2Fmy-change/<40 hex>?sq-files=src/a.py
  # lands; add &sq-fake=build-fail to fail its build, &sq-build-ms=2000 to slow it down.
  # Try it with `submitqueue serve` running (any branch name and 40 hex digits will do):
  #   submitqueue land --queue demo \\
  #     'git://demo.example.com/demo/refs%2Fheads%2Ftry/1111111111111111111111111111111111111111?sq-files=src/a.py'
  #   then open http://127.0.0.1:8000/queues/demo
  - name: demo                      # 1-100 of [A-Za-z0-9._-]; part of every request id
    description: Demo queue on fake extensions
    # Where change details (author, changed files) come from. git reads a repository.
    change_provider: {type: fake}
    # Which batches must wait for which: all (serial) | none | pathoverlap
    # (by: directory, or by: file).
    conflict_analyzer: {type: pathoverlap, by: directory}
    # Runs the builds. fake decides from markers; delay_ms is how long a build takes.
    # For real builds: {type: command, command: [...]} or {type: webhook, url: ...}.
    build_runner: {type: fake, delay_ms: 200}
    # Applies the merge. fake obeys merge-* markers; git pushes to a real repository.
    merger: {type: fake}
    # P(a batch lands), used to rank speculation paths: constant | size | history | combined.
    scorer: {type: constant, probability: 0.9}
    # How the build budget is spent: sticky | preempting; coverage lets a batch overtake.
    speculation: {allocator: sticky, coverage: false}

  # A queue on a real git repository, with real builds, looks like this (the full
  # example, with every key explained, is the queues.yaml of the source repository):
  # - name: app
  #   change_provider: {type: git}
  #   merger: {type: git}
  #   git: {repository: /srv/git/app.git, repo_key: git.example.com/org/app,
  #         target_branch: main}
  #   build_runner: {type: command, command: ["make", "test"], timeout_s: 1800}
  #   conflict_analyzer: {type: pathoverlap, by: directory}
"""

ADMIN_TOKEN = re.compile(r"^SQ_ADMIN_TOKEN=$", re.MULTILINE)


def env_text(example: str, secret: str) -> str:
    """``.env.example`` as a ``.env``: the same settings and comments, headed by where
    it came from, with the empty admin token set to ``admin:<secret>``."""
    if not ADMIN_TOKEN.search(example):
        raise ValueError(".env.example has no empty SQ_ADMIN_TOKEN= line to fill in")
    body = ADMIN_TOKEN.sub(f"SQ_ADMIN_TOKEN=admin:{secret}", example, count=1)
    return ("# Written by `submitqueue init` from .env.example; read from the working "
            "directory.\n# SQ_ADMIN_TOKEN was generated: keep this file private.\n" + body)


def write_files(directory: Path, *, force: bool) -> list[Path]:
    """Write ``queues.yaml`` and ``.env`` into ``directory``; ``FileExistsError`` (no
    file written) when one exists and not ``force``."""
    if not directory.is_dir():
        raise NotADirectoryError(f"{directory} is not a folder")
    queues, env = directory / "queues.yaml", directory / ".env"
    existing = [p for p in (queues, env) if p.exists()]
    if existing and not force:
        names = " and ".join(p.name for p in existing)
        raise FileExistsError(f"{names} already exist{'s' if len(existing) == 1 else ''} "
                              f"in {directory}; pass --force to overwrite")
    example = resource(".env.example").read_text(encoding="utf-8")
    env_body = env_text(example, secrets.token_urlsafe(32))
    queues.write_text(QUEUES_YAML, encoding="utf-8")
    env.write_text(env_body, encoding="utf-8")
    env.chmod(0o600)
    return [queues, env]


def init_command(
    directory: Annotated[Path, typer.Argument(
        help="Where to write queues.yaml and .env (default: the current directory).")
    ] = Path("."),
    force: Annotated[bool, typer.Option(
        "--force", help="Overwrite queues.yaml and .env if they exist.")] = False,
) -> None:
    """Write a commented queues.yaml (a demo queue on fakes) and a .env to start from."""
    try:
        written = write_files(directory, force=force)
    except (FileExistsError, NotADirectoryError, ResourceMissing, OSError) as exc:
        typer.echo(f"submitqueue init: {exc}", err=True)
        raise typer.Exit(1) from None
    for path in written:
        typer.echo(f"wrote {path}")
    where = "" if directory.resolve() == Path.cwd().resolve() else f"cd {directory} && "
    typer.echo(f"next: {where}submitqueue serve   (then open http://127.0.0.1:8000)")
