"""The chaos benchmark's workload: which changes, what each one may end as, and the
sandbox repository they are pushed to.

Kinds of change (each adds its own file ``<folder>/c<i>.txt``; folders chain changes
through the ``pathoverlap`` analyzer):

| Kind | Content | Allowed outcome |
|---|---|---|
| ``ok`` | its own file | ``landed`` |
| ``fail`` | its own file with a line ``BROKEN``, URI marker ``sq-fake=build-fail`` | ``error``, "every candidate build failed" |
| ``conflict`` | its own file, and line 1 of ``<folder>/shared-<p>.txt`` rewritten; two changes per pair ``p`` | one of the pair ``landed``, the other ``error``: "merge conflict" (fake builds) or its builds of the conflicting tree failed (command runner); whichever reached ``main`` first wins |

No change may end ``error`` because a message was dead-lettered (an infrastructure
failure, not an outcome of the change).

A change that was also sent a cancel may instead end ``cancelled`` (a cancel loses
the race once the merge is under way). When one of a pair is ``cancelled``, the
other has nothing to conflict with and must not end ``error``.
"""  # noqa: E501 - the table reads best unwrapped

from __future__ import annotations

import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from app.extensions.git.cli import git_env

QUEUE = "sandbox"
REPO_KEY = "sandbox.local/sandbox"
TARGET = "main"


@dataclass
class Change:
    i: int
    kind: str                      # ok | fail | conflict
    folder: str
    pair: int | None = None        # conflict pair number
    cancel_after_s: float | None = None
    sha: str = ""
    uri: str = ""
    sqid: str | None = None
    blind: bool = False            # the answer was lost; the resend (same key) replayed it
    cancel_answer: str | None = None

    @property
    def branch(self) -> str:
        return f"chaos-{self.i}"

    @property
    def subject(self) -> str:
        return f"chaos {self.i} {self.kind}"

    @property
    def own_file(self) -> str:
        return f"{self.folder}/c{self.i}.txt"

    @property
    def own_text(self) -> str:
        return f"change {self.i}\n" + ("BROKEN\n" if self.kind == "fail" else "")

    @property
    def shared_file(self) -> str | None:
        return f"{self.folder}/shared-{self.pair}.txt" if self.pair is not None else None

    @property
    def shared_text(self) -> str:
        return f"pair {self.pair}: the version of change {self.i}\n"

    def files(self) -> dict[str, str]:
        out = {self.own_file: self.own_text}
        if self.shared_file:
            out[self.shared_file] = self.shared_text
        return out


def shared_original(pair: int) -> str:
    return f"pair {pair}: original\n"


def plan(n: int, rng: random.Random, *, cancel_window_s: float) -> list[Change]:
    """``n`` changes: ~15% failing, ~20% in conflicting pairs, ~15% also cancelled."""
    if n < 4:
        raise ValueError("the chaos workload needs at least 4 changes")
    pairs = max(1, n // 10)
    fails = max(1, round(n * 0.15))
    kinds = ["fail"] * fails + ["conflict"] * (2 * pairs)
    kinds += ["ok"] * (n - len(kinds))
    rng.shuffle(kinds)
    folders = [f"f{k}" for k in range(max(2, n // 8))]
    changes = [Change(i=i + 1, kind=k, folder=rng.choice(folders)) for i, k in enumerate(kinds)]
    members = [c for c in changes if c.kind == "conflict"]
    rng.shuffle(members)
    for p in range(pairs):
        a, b = members[2 * p], members[2 * p + 1]
        a.pair = b.pair = p
        b.folder = a.folder
    for c in rng.sample(changes, max(1, round(n * 0.15))):
        c.cancel_after_s = round(rng.uniform(0.0, cancel_window_s), 3)
    return changes


def change_uri(change: Change) -> str:
    ref = quote(f"refs/heads/{change.branch}", safe="")
    marker = "?sq-fake=build-fail" if change.kind == "fail" else ""
    return f"git://{REPO_KEY}/{ref}/{change.sha}{marker}"


class Sandbox:
    """The queue's bare repository (made by the first server: ``create_sandbox``) and
    the bench's own clone that pushes one branch per change."""

    def __init__(self, bare: Path, clone: Path) -> None:
        self.bare = bare
        self.clone = clone
        self.home = clone.parent / "git-home"
        self.setup_sha = ""

    def git(self, *args: str, cwd: Path | None = None, stdin: str | None = None) -> str:
        res = subprocess.run(["git", *args], cwd=cwd or self.clone, env=git_env(self.home),
                             input=stdin, capture_output=True, text=True, check=False,
                             timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)}: {res.stderr.strip()}")
        return res.stdout

    def _write(self, files: dict[str, str]) -> None:
        for name, text in files.items():
            path = self.clone / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def prepare(self, changes: list[Change]) -> None:
        """Seed ``main`` with the pairs' shared files, then push a branch per change."""
        self.home.mkdir(parents=True, exist_ok=True)
        self.git("clone", "--quiet", str(self.bare), str(self.clone), cwd=self.clone.parent)
        self.git("checkout", "--quiet", "-B", TARGET, f"origin/{TARGET}")
        pairs = sorted({c.pair for c in changes if c.pair is not None})
        self._write({f"{c.folder}/shared-{c.pair}.txt": shared_original(c.pair)
                     for c in changes if c.pair is not None})
        self._write({"chaos.md": "Changes land here through the chaos benchmark.\n"})
        self.git("add", "-A")
        self.git("commit", "--quiet", "-m", f"Chaos setup: {len(pairs)} shared files")
        self.git("push", "--quiet", "origin", TARGET)
        self.setup_sha = self.git("rev-parse", "HEAD").strip()
        for c in changes:
            self.git("checkout", "--quiet", "-B", c.branch, self.setup_sha)
            self._write(c.files())
            self.git("add", "-A")
            self.git("commit", "--quiet", "-m", c.subject)
            c.sha = self.git("rev-parse", "HEAD").strip()
            c.uri = change_uri(c)
        self.git("push", "--quiet", "origin", *(f"{c.branch}:refs/heads/{c.branch}"
                                                for c in changes))

    def main_log(self) -> list[tuple[str, str, str]]:
        """``(sha, subject, body)`` of each commit on main after the setup, oldest first."""
        out = self.git("log", "--reverse", "--format=%H%x1f%s%x1f%b%x1e",
                       f"{self.setup_sha}..{TARGET}", cwd=self.bare)
        entries = []
        for record in out.split("\x1e"):
            if record.strip():
                sha, subject, body = record.strip("\n").split("\x1f", 2)
                entries.append((sha, subject, body))
        return entries

    def main_files(self, paths: list[str]) -> dict[str, str | None]:
        """The content of each path on main (None when it is not there)."""
        listed = set(self.git("ls-tree", "-r", "--name-only", TARGET, cwd=self.bare).split("\n"))
        return {p: (self.git("show", f"{TARGET}:{p}", cwd=self.bare) if p in listed else None)
                for p in paths}
