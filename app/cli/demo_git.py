"""The git side of ``submitqueue demo``: plan the changes, make them in a scratch clone of
the queue's repository and push each as its own branch.

Every git call is ``run_git`` (argv list, fixed environment, never a shell). Demo commits
have the author and committer ``SubmitQueue Demo <demo@submitqueue.invalid>``.

The plan is a pure function of its arguments: change ``i`` (1-based) adds
``files_per_change`` new files under ``demo/<NN>/`` with ``NN`` taken round-robin from
``1..folders``; the ``fail`` broken changes are drawn from ``random.Random(seed)``, and
one file of each contains a line that is exactly ``BROKEN`` (the sandbox's test command,
``sq_test.py``, fails on such a line). File names carry the run tag and the change
number, so changes never touch the same file: they conflict by directory only.
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from urllib.parse import quote

from app.extensions.git.cli import repo_url, run_git

AUTHOR_NAME = "SubmitQueue Demo"
AUTHOR_EMAIL = "demo@submitqueue.invalid"
BROKEN_LINE = "BROKEN"
TEST_SCRIPT = "sq_test.py"  # the sandbox's test, at the root of its target branch
_IDENTITY = {
    "GIT_AUTHOR_NAME": AUTHOR_NAME, "GIT_AUTHOR_EMAIL": AUTHOR_EMAIL,
    "GIT_COMMITTER_NAME": AUTHOR_NAME, "GIT_COMMITTER_EMAIL": AUTHOR_EMAIL,
}


@dataclass(frozen=True, slots=True)
class PlannedChange:
    index: int  # 1-based
    branch: str
    folder: str  # "demo/02"
    files: tuple[tuple[str, str], ...]  # (path, content)
    broken: bool
    subject: str


def plan(tag: str, *, count: int, folders: int, fail: int, seed: int,
         files_per_change: int = 2) -> list[PlannedChange]:
    """The demo's changes; ``ValueError`` if the numbers do not fit together."""
    if count < 1 or folders < 1 or files_per_change < 1:
        raise ValueError("count, folders and files per change must each be at least 1")
    if not 0 <= fail <= count:
        raise ValueError(f"--fail {fail} must be between 0 and --count {count}")
    if folders > 99:
        raise ValueError("--folders must be at most 99 (folders are demo/01 .. demo/99)")
    broken = set(random.Random(seed).sample(range(1, count + 1), fail))
    out: list[PlannedChange] = []
    for i in range(1, count + 1):
        folder = f"demo/{(i - 1) % folders + 1:02d}"
        files = []
        for j in range(1, files_per_change + 1):
            lines = [f"demo run {tag}, change {i} of {count}, file {j}"]
            if i in broken and j == files_per_change:
                lines.append(BROKEN_LINE)
            files.append((f"{folder}/{tag}-{i:03d}-{j}.txt", "\n".join(lines) + "\n"))
        note = " (breaks the test)" if i in broken else ""
        subject = f"Demo {i}/{count}: add {files_per_change} files to {folder}{note}"
        out.append(PlannedChange(index=i, branch=f"demo/{tag}/{i}", folder=folder,
                                 files=tuple(files), broken=i in broken, subject=subject))
    return out


def change_uri(repo_key: str, branch: str, sha: str) -> str:
    return f"git://{repo_key}/{quote(f'refs/heads/{branch}', safe='')}/{sha}"


class ScratchClone:
    """A temporary clone of the queue's repository (removed on exit)."""

    def __init__(self, repository: str, target_branch: str) -> None:
        self.url = repo_url(repository)
        self.target = target_branch
        self._tmp = tempfile.TemporaryDirectory(prefix="sq-demo-")
        root = Path(self._tmp.name)
        self.home = root / "home"
        self.work = root / "work"

    async def __aenter__(self) -> ScratchClone:
        try:
            await run_git(["clone", "--quiet", "--no-tags", "--branch", self.target, "--",
                           self.url, str(self.work)], home=self.home)
        except BaseException:
            self._tmp.cleanup()
            raise
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._tmp.cleanup()

    async def git(self, *args: str) -> str:
        res = await run_git(args, home=self.home, cwd=self.work, env=_IDENTITY)
        return res.stdout.strip()

    async def make(self, change: PlannedChange, *, on_previous: bool) -> str:
        """Commit ``change`` on its branch (from the target, or on top of the current
        HEAD when ``on_previous``) and push the branch; the commit's sha."""
        start = "HEAD" if on_previous else f"origin/{self.target}"
        await self.git("checkout", "--quiet", "-B", change.branch, start)
        for path, content in change.files:
            file = self.work / path
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_text(content, encoding="utf-8")
        await self.git("add", "--", *(p for p, _ in change.files))
        await self.git("commit", "--quiet", "-m", change.subject)
        sha = await self.git("rev-parse", "HEAD")
        await self.git("push", "--quiet", "origin", f"HEAD:refs/heads/{change.branch}")
        return sha

    async def refresh_target(self) -> None:
        await self.git("fetch", "--quiet", "--no-tags", "origin",
                       f"+refs/heads/{self.target}:refs/remotes/origin/{self.target}")

    async def target_files(self, prefix: str) -> set[str]:
        out = await self.git("ls-tree", "-r", "--name-only", f"origin/{self.target}",
                             "--", prefix)
        return set(out.splitlines())

    async def has(self, path: str) -> bool:
        """Whether ``path`` exists on the target branch (as cloned)."""
        return bool(await self.git("ls-tree", "--name-only", f"origin/{self.target}", "--",
                                   path))

    async def target_log(self, n: int) -> str:
        return await self.git("log", "--oneline", f"-n{n}", f"origin/{self.target}")
