"""A real git "server" for tests in tmp_path: a bare ``remote.git`` (with reflogs) and a
working clone that pushes ``main`` and feature branches to it; change URIs and merge
specs for its branches.
"""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import quote

from app.domain.states import LandStrategy
from app.extensions.base import MergeSpec, MergeStep
from app.extensions.git.cli import git_env

KEY = "example.com/team/repo"
ALICE = {"GIT_AUTHOR_NAME": "Alice Author", "GIT_AUTHOR_EMAIL": "alice@example.com"}


class Remote:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.bare = root / "remote.git"
        self.work = root / "work"
        self.git("init", "--bare", "--quiet", str(self.bare), cwd=root)
        self.git("config", "core.logAllRefUpdates", "true", cwd=self.bare)
        self.git("init", "--quiet", "-b", "main", str(self.work), cwd=root)
        self.git("remote", "add", "origin", str(self.bare))
        big = "".join(f"line {i}\n" for i in range(40))
        self.write({"a.txt": "one\ntwo\nthree\n", "big.txt": big})
        self.git("add", "-A")
        self.git("commit", "--quiet", "-m", "initial")
        self.git("push", "--quiet", "origin", "main")

    def git(self, *args: str, cwd: Path | None = None,
            env: Mapping[str, str] | None = None) -> str:
        res = subprocess.run(
            ["git", *args], cwd=cwd or self.work, env=git_env(self.home, env),
            capture_output=True, text=True, check=False, timeout=30,
        )
        assert res.returncode == 0, f"git {args}: {res.stderr}"
        return res.stdout.strip()

    def bare_git(self, *args: str) -> str:
        return self.git(*args, cwd=self.bare)

    def write(self, files: Mapping[str, str | bytes | None]) -> None:
        for name, content in files.items():
            path = self.work / name
            if content is None:
                path.unlink()
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                path.write_bytes(content)
            else:
                path.write_text(content)

    def commit(self, branch: str, files: Mapping[str, str | bytes | None], message: str,
               *, base: str | None = None, env: Mapping[str, str] | None = None) -> str:
        """Commit on ``branch`` (created from ``base`` on the remote) and push it."""
        if base is not None:
            self.git("fetch", "--quiet", "origin")
            self.git("checkout", "--quiet", "-B", branch, f"origin/{base}")
        else:
            self.git("checkout", "--quiet", branch)
        self.write(files)
        self.git("add", "-A")
        self.git("commit", "--quiet", "-m", message, env=env)
        self.git("push", "--quiet", "--force", "origin", f"HEAD:refs/heads/{branch}")
        return self.git("rev-parse", "HEAD")

    def main(self) -> str:
        return self.bare_git("rev-parse", "refs/heads/main")

    def main_moves(self) -> int:
        return len(self.bare_git("reflog", "show", "main").splitlines())

    def show(self, path: str, rev: str = "main") -> str:
        return self.bare_git("show", f"{rev}:{path}")


def uri(branch: str, sha: str, key: str = KEY) -> str:
    return f"git://{key}/{quote('refs/heads/' + branch, safe='')}/{sha}"


def spec(strategy: LandStrategy, *uris: str, step_id: str = "SQ1") -> MergeSpec:
    return MergeSpec(queue="q", id=step_id, steps=(MergeStep(step_id, tuple(uris), strategy),))
