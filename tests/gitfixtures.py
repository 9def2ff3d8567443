"""Real git sandboxes for tests: a bare repository in tmp_path (usually with a seeded
``main``) and a working clone that commits and pushes feature branches to it, run with
the project's git environment (its own HOME), plus the change URIs naming those
branches and the queues file that points a server at them."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Self
from urllib.parse import quote

from app.extensions.git.cli import git_env

SANDBOX_KEY = "sandbox.local/sandbox"
SEED = {"a.txt": "one\ntwo\nthree\n"}


def run_git(cwd: Path, home: Path, *args: str) -> str:
    """``git args`` in ``cwd``; asserts it succeeds and returns its stripped stdout."""
    res = subprocess.run(["git", *args], cwd=cwd, env=git_env(home), capture_output=True,
                         text=True, check=False, timeout=30)
    assert res.returncode == 0, f"git {args}: {res.stderr}"
    return res.stdout.strip()


def change_uri(repo_key: str, branch: str, sha: str) -> str:
    """The change URI naming commit ``sha`` on ``refs/heads/<branch>`` of ``repo_key``."""
    return f"git://{repo_key}/{quote('refs/heads/' + branch, safe='')}/{sha}"


def write_queues(folder: Path, text: str) -> Path:
    """Write ``folder/queues.yaml`` (repositories in it are named relative to folder)."""
    path = folder / "queues.yaml"
    path.write_text(text)
    return path


FAKE_BUILDS = "{type: fake, delay_ms: 0}"


def git_queue(name: str = "gitq", *, repository: str = "./remote.git",
              repo_key: str = SANDBOX_KEY, build_runner: str = FAKE_BUILDS,
              conflicts: str | None = "{type: pathoverlap, by: directory}",
              git_extra: str = "", extra: str = "") -> str:
    """One git queue of a queues file (YAML, indented for ``queues:``): the git change
    provider and merger on ``repository``'s ``main``, squash-rebase by default.
    ``git_extra`` and ``extra`` are further lines of its ``git`` block and of the queue."""
    lines = [f"  - name: {name}", "    change_provider: {type: git}", "    merger: {type: git}",
             "    git:", f"      repository: {repository}", f"      repo_key: {repo_key}",
             "      target_branch: main"]
    lines += [f"      {line.strip()}" for line in git_extra.splitlines() if line.strip()]
    lines += [f"    build_runner: {build_runner}"]
    if conflicts:
        lines.append(f"    conflict_analyzer: {conflicts}")
    lines.append("    default_strategy: squash_rebase")
    lines += [f"    {line.strip()}" for line in extra.splitlines() if line.strip()]
    return "\n".join(lines) + "\n"


def queues_file(*queues: str) -> str:
    """A queues file holding ``queues`` (each from :func:`git_queue` or alike)."""
    return "queues:\n" + "".join(queues)


class GitSandbox:
    """A bare repository ``root/<bare>`` and a working clone ``root/<work>`` of it.

    The constructor only names the paths; ``seeded`` creates both, or call ``clone``
    when the bare repository already exists."""

    def __init__(self, root: Path, repo_key: str, *, bare: str = "remote.git",
                 work: str = "work") -> None:
        self.root = root
        self.repo_key = repo_key
        self.home = root / "home"
        self.bare = root / bare
        self.work = root / work

    @classmethod
    def seeded(cls, root: Path, repo_key: str, *, files: Mapping[str, str] = SEED,
               bare: str = "remote.git", work: str = "work") -> Self:
        """A new bare repository whose ``main`` is one commit ("initial") of ``files``,
        and its clone, on ``main``."""
        repo = cls(root, repo_key, bare=bare, work=work)
        repo.git("init", "--bare", "--quiet", "--initial-branch=main", str(repo.bare), cwd=root)
        repo.clone()
        repo.git("checkout", "--quiet", "-b", "main")
        repo.commit(files, "initial")
        repo.git("push", "--quiet", "origin", "main")
        return repo

    def clone(self) -> None:
        self.git("clone", "--quiet", str(self.bare), str(self.work), cwd=self.root)

    def git(self, *args: str, cwd: Path | None = None) -> str:
        return run_git(cwd or self.work, self.home, *args)

    def commit(self, files: Mapping[str, str], message: str) -> str:
        """Write ``files`` into the clone and commit everything; returns the new sha."""
        for name, content in files.items():
            path = self.work / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
        self.git("add", "-A")
        self.git("commit", "--quiet", "-m", message)
        return self.git("rev-parse", "HEAD")

    def push(self, branch: str, sha: str) -> str:
        """Force-push ``sha`` to ``refs/heads/<branch>``; returns its change URI."""
        self.git("push", "--quiet", "--force", "origin", f"{sha}:refs/heads/{branch}")
        return change_uri(self.repo_key, branch, sha)

    def branch(self, name: str, files: Mapping[str, str], message: str,
               base: str = "origin/main") -> str:
        """One commit on ``name`` (from ``base``, after a fetch), pushed; returns its
        change URI."""
        self.git("fetch", "--quiet", "origin")
        self.git("checkout", "--quiet", "-B", name, base)
        return self.push(name, self.commit(files, message))

    def main(self, *args: str) -> str:
        """``git args`` in the bare repository."""
        return self.git(*args, cwd=self.bare)

    def tip(self, branch: str = "main") -> str:
        return self.main("rev-parse", branch)
