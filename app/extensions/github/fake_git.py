"""The fake GitHub's repository: a real bare git repository, driven synchronously.

Commits are written without a work tree (a private index per commit), so a test or the
demo can make a pull request's commits in the very repository the fake serves.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from app.extensions.git.cli import git_env

ZERO = "0" * 40


class BareRepo:
    def __init__(self, path: Path, *, home: Path | None = None) -> None:
        self.path = Path(path)
        self.home = home or self.path.parent / ".fake-github-home"

    def git(self, *args: str, stdin: str | None = None, check: bool = True,
            extra: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        self.home.mkdir(parents=True, exist_ok=True)
        env = git_env(self.home, {"GIT_DIR": str(self.path), **(extra or {})})
        res = subprocess.run(["git", *args], env=env, input=stdin, capture_output=True,
                             text=True, check=False, timeout=60)
        if check and res.returncode != 0:
            raise RuntimeError(f"git {' '.join(args)} exited {res.returncode}: "
                               f"{res.stderr.strip()}")
        return res

    def export(self, sha: str, dest: Path) -> None:
        """Write the tree of commit ``sha`` into the directory ``dest`` (``git archive``)."""
        self.home.mkdir(parents=True, exist_ok=True)
        env = git_env(self.home, {"GIT_DIR": str(self.path)})
        res = subprocess.run(["git", "archive", "--format=tar", sha], env=env,
                             capture_output=True, check=False, timeout=60)
        if res.returncode != 0:
            raise RuntimeError(f"git archive {sha} exited {res.returncode}: "
                               f"{res.stderr.decode(errors='replace').strip()}")
        with tarfile.open(fileobj=io.BytesIO(res.stdout)) as tar:
            if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
                tar.extractall(dest, filter="data")
            else:  # our own repository's archive: no links out of dest
                tar.extractall(dest)

    def out(self, *args: str, stdin: str | None = None) -> str:
        return self.git(*args, stdin=stdin).stdout.strip()

    def init(self, branch: str = "main") -> str:
        """Create the repository with one commit on ``branch`` unless it exists; the tip."""
        if not (self.path / "HEAD").exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.home.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "init", "--bare", "--quiet", f"--initial-branch={branch}",
                            str(self.path)], env=git_env(self.home), check=True,
                           capture_output=True)
            sha = self.commit(None, {"README.md": "# fake GitHub repository\n"},
                              "Initial commit")
            self.set_ref(f"refs/heads/{branch}", sha)
        return self.resolve(f"refs/heads/{branch}") or ""

    def resolve(self, ref: str) -> str | None:
        res = self.git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        return res.stdout.strip() or None

    def commit(self, parent: str | None, files: Mapping[str, str | None], message: str, *,
               author: str = "Octo Cat <octocat@example.com>") -> str:
        """A commit on ``parent`` (a sha, or None for a root) with ``files`` written
        (``None`` deletes a file); returns its sha. No ref moves."""
        name, _, email = author.partition(" <")
        with tempfile.TemporaryDirectory(dir=self.home if self.home.exists() else None) as tmp:
            index = {"GIT_INDEX_FILE": os.path.join(tmp, "index"),
                     "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email.rstrip(">")}
            if parent is not None:
                self.git("read-tree", parent, extra=index)
            written = [p for p, text in files.items() if text is not None]
            for i, path in enumerate(written):  # one hash-object for every blob
                Path(tmp, f"blob-{i}").write_text(files[path] or "", encoding="utf-8")
            blobs = self.out("hash-object", "-w", "--stdin-paths",
                             stdin="".join(f"{tmp}/blob-{i}\n" for i in range(len(written))))
            sha_of = dict(zip(written, blobs.split(), strict=True))
            listing = "".join(f"100644 {sha_of[p]}\t{p}\n" if p in sha_of else
                              f"0 {ZERO}\t{p}\n" for p in files)
            self.git("update-index", "--index-info", stdin=listing, extra=index)
            tree = self.git("write-tree", extra=index).stdout.strip()
            args = ["commit-tree", tree, "-m", message] + (["-p", parent] if parent else [])
            return self.git(*args, extra=index).stdout.strip()

    def set_ref(self, ref: str, sha: str, old: str | None = None) -> bool:
        """Move ``ref`` to ``sha`` (only from ``old`` when given); False if it had moved."""
        args = ["update-ref", ref, sha] + ([old] if old is not None else [])
        return self.git(*args, check=False).returncode == 0

    def delete_ref(self, ref: str) -> None:
        self.git("update-ref", "-d", ref, check=False)

    def is_ancestor(self, old: str, new: str) -> bool:
        return self.git("merge-base", "--is-ancestor", old, new, check=False).returncode == 0

    def has_commit(self, sha: str) -> bool:
        return self.git("cat-file", "-e", f"{sha}^{{commit}}", check=False).returncode == 0

    def merge_base(self, a: str, b: str) -> str | None:
        res = self.git("merge-base", a, b, check=False)
        return res.stdout.strip() or None

    def numstat(self, base: str, head: str) -> list[tuple[str, int, int, str, str | None]]:
        """``(path, added, deleted, status, previous path)`` from ``base`` to ``head``."""
        stats = self.out("diff", "--numstat", "-z", "-M", base, head).split("\x00")
        names = self.out("diff", "--name-status", "-z", "-M", base, head).split("\x00")
        kinds: dict[str, tuple[str, str | None]] = {}
        i = 0
        while i < len(names) and names[i]:
            code = names[i]
            if code.startswith(("R", "C")):
                kinds[names[i + 2]] = ("renamed" if code[0] == "R" else "copied", names[i + 1])
                i += 3
            else:
                kinds[names[i + 1]] = ({"A": "added", "D": "removed"}.get(code[0], "modified"),
                                       None)
                i += 2
        out: list[tuple[str, int, int, str, str | None]] = []
        i = 0
        while i < len(stats):
            head_field = stats[i]
            i += 1
            if not head_field:
                continue
            added, deleted, path = head_field.split("\t", 2)
            if not path:
                path = stats[i + 1]
                i += 2
            kind, prev = kinds.get(path, ("modified", None))
            out.append((path, int(added) if added.isdigit() else 0,
                        int(deleted) if deleted.isdigit() else 0, kind, prev))
        return out

    def merges_cleanly(self, base: str, head: str) -> bool:
        res = self.git("merge-tree", "--write-tree", "--no-messages", base, head, check=False)
        return res.returncode == 0
