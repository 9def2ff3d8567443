"""A small async runner for the git CLI, shared by the git change provider and merger.

Every call is ``asyncio.create_subprocess_exec`` with an argv list (never a shell), in a
fixed environment: no prompts, ``LC_ALL=C``, ``HOME`` a private directory, no system or
global configuration, a fixed committer identity and no hooks. A call that outlives its
timeout has its whole process group killed and raises ``TimeoutError`` (retryable).

A failing git command raises ``GitError`` (args, exit code, stderr). It declares itself
``retryable``: callers turn the failures that are the change's fault (conflicts, stale
refs) into rejections or failed outcomes first, so what escapes is infrastructure.
A command that talks to a remote (``ls-remote``, ``fetch``, ``push``, ``clone``) and
fails in transport (the repository is missing or unreadable, connection refused or
reset, DNS, an HTTP 5xx/429 from the host, a hang-up) raises ``Unreachable``, a
``GitError`` with ``dependency_kind = "repository"``: the queue then treats the
repository as down (``app/domain/outages.py``) instead of spending attempts on it.

``mirror_lock(path)`` serialises all work on the repository at ``path`` HOST-WIDE: an
``asyncio.Lock`` per path (per event loop) for the tasks of this process, then an
exclusive ``flock`` on ``<path>.lock`` next to it for every process of the host that
shares the directory (several ``submitqueue serve`` processes with one ``git.work_dir``).
The ``flock`` is taken without blocking the event loop (a non-blocking try, else a
waiting thread) and the kernel drops it when its process dies, so a crashed holder
never wedges the others. Everything that fetches into a mirror, moves its refs or adds,
removes or prunes its worktrees runs under it; so ``git worktree prune`` never races a
``git worktree add`` and two fetches never fight over a ref.

Ref updates that still meet a ref lock (a git process orphaned by a dead server, say)
are retried with a backoff; a lock file older than ``STALE_LOCK_S`` under the mirror
(left by a git process killed at its timeout) is removed first.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from app.domain.change_uri import parse_change_uri
from app.domain.errors import ValidationError
from app.extensions.base import ChangeRejected

DEFAULT_TIMEOUT = 120.0
STALE_LOCK_S = 600.0  # a git lock file this old under a mirror belongs to no live command
REF_LOCK_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # seconds between tries
COMMITTER_NAME = "SubmitQueue"
COMMITTER_EMAIL = "submitqueue@localhost"

_CONFIG = (
    ("user.name", COMMITTER_NAME),
    ("user.email", COMMITTER_EMAIL),
    ("init.defaultBranch", "main"),
    ("commit.gpgSign", "false"),
    ("tag.gpgSign", "false"),
    ("core.hooksPath", os.devnull),
    ("gc.auto", "0"),
    ("advice.detachedHead", "false"),
    ("protocol.ext.allow", "never"),
)


class GitError(Exception):
    """A git command exited non-zero."""

    retryable = True

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        self.git_args = tuple(args)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(
            f"git {' '.join(self.git_args)} exited {returncode}: {stderr.strip()[:2000]}"
        )


class Unreachable(GitError):
    """A git command could not reach its remote repository (a transport failure)."""

    dependency_kind = "repository"


_REMOTE_COMMANDS = frozenset({"ls-remote", "fetch", "push", "clone", "pull"})
_TRANSPORT = re.compile(
    r"does not appear to be a git repository|could not read from remote repository"
    r"|unable to access|could not resolve host|connection (?:refused|reset|timed out)"
    r"|operation timed out|failed to connect|unable to connect|the remote end hung up"
    r"|early eof|ssh: connect to host|network is unreachable|no route to host"
    r"|the requested url returned error: (?:5\d\d|429)|remote: internal server error"
    r"|gnutls_handshake|ssl_connect|tls connection",
    re.IGNORECASE,
)


def is_transport_failure(args: Sequence[str], stderr: str) -> bool:
    """A remote git command failed for want of its remote, not for its content."""
    return any(a in _REMOTE_COMMANDS for a in args[:3]) and \
        _TRANSPORT.search(stderr) is not None


@dataclass(frozen=True, slots=True)
class GitResult:
    stdout: str
    stderr: str
    returncode: int


def git_env(home: Path, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The fixed environment every git command runs in."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
        "HOME": str(home),
        "LC_ALL": "C",
        "LANG": "C",
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "/bin/false",
        "SSH_ASKPASS": "/bin/false",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_COMMITTER_NAME": COMMITTER_NAME,
        "GIT_COMMITTER_EMAIL": COMMITTER_EMAIL,
        "GIT_EDITOR": "true",
        "GIT_PAGER": "cat",
        "GIT_CONFIG_COUNT": str(len(_CONFIG)),
    }
    for i, (key, value) in enumerate(_CONFIG):
        env[f"GIT_CONFIG_KEY_{i}"] = key
        env[f"GIT_CONFIG_VALUE_{i}"] = value
    if extra:
        env.update(extra)
    return env


async def run_git(
    args: Sequence[str],
    *,
    home: Path,
    cwd: Path | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    check: bool = True,
    env: Mapping[str, str] | None = None,
) -> GitResult:
    """Run ``git *args``; raise ``GitError`` on a non-zero exit when ``check``."""
    home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        "git",
        *args,
        cwd=str(cwd) if cwd is not None else None,
        env=git_env(home, env),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except (TimeoutError, asyncio.CancelledError) as exc:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await proc.wait()
        if isinstance(exc, asyncio.CancelledError):
            raise
        raise TimeoutError(f"git {' '.join(args)} timed out after {timeout:g} s") from None
    result = GitResult(
        stdout=out.decode("utf-8", "replace"),
        stderr=err.decode("utf-8", "replace"),
        returncode=proc.returncode if proc.returncode is not None else -1,
    )
    if check and result.returncode != 0:
        if is_transport_failure(args, result.stderr):
            raise Unreachable(args, result.returncode, result.stderr)
        raise GitError(args, result.returncode, result.stderr)
    return result


_LOCK_CONTENTION = re.compile(r"cannot lock ref|unable to update local ref|\.lock': File exists")
_LOCK_FILE = re.compile(r"Unable to create '([^']+\.lock)': File exists")


def _ref_lock_problem(error: GitError) -> tuple[bool, Path | None]:
    """Whether ``error`` is a ref-lock contention, and the lock file it names (if any)."""
    if _LOCK_CONTENTION.search(error.stderr) is None:
        return False, None
    named = _LOCK_FILE.search(error.stderr)
    return True, Path(named.group(1)) if named else None


def _remove_if_stale(lock_file: Path, repo: Path) -> bool:
    """Remove a git lock file under ``repo`` older than ``STALE_LOCK_S``; True if removed."""
    try:
        if not lock_file.resolve().is_relative_to(repo.resolve()):
            return False
        if time.time() - lock_file.stat().st_mtime < STALE_LOCK_S:
            return False
        lock_file.unlink()
    except OSError:
        return False
    return True


def repo_url(location: str) -> str:
    """A configured repository (a path or URL) as something ``git fetch`` accepts."""
    if "://" in location:
        return location
    return str(Path(location).resolve())


EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"


def mirror_name(key: str) -> str:
    """A directory name for the mirror of ``{host}/{repo}``: readable and collision-free."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key).strip("._")
    digest = hashlib.sha1(key.encode("utf-8")).hexdigest()[:10]
    return f"{safe[:80]}-{digest}.git"


class GitMirror:
    """A bare repository of our own that fetches a configured remote on demand.

    Callers hold ``mirror_lock(mirror.path)`` around anything that fetches, reads or moves
    refs, or adds, removes or prunes worktrees.
    """

    def __init__(self, path: Path, url: str, home: Path, timeout: float = DEFAULT_TIMEOUT):
        self.path = path
        self.url = url
        self.home = home
        self.timeout = timeout

    async def git(self, *args: str, check: bool = True, cwd: Path | None = None,
                  env: Mapping[str, str] | None = None) -> GitResult:
        where = cwd if cwd is not None else self.path
        return await run_git(args, home=self.home, cwd=where, timeout=self.timeout,
                             check=check, env=env)

    async def update(self, *args: str) -> GitResult:
        """A git command that moves refs (fetch, update-ref): retried while it meets a ref
        lock; a stale lock file (older than ``STALE_LOCK_S``) is removed first."""
        for delay in (*REF_LOCK_RETRIES, None):
            try:
                return await self.git(*args)
            except GitError as exc:
                contended, lock_file = _ref_lock_problem(exc)
                if not contended or delay is None:
                    raise
                if lock_file is None or not _remove_if_stale(lock_file, self.path):
                    await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def ensure(self) -> None:
        if (self.path / "HEAD").exists():
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        await run_git(["init", "--bare", "--quiet", str(self.path)], home=self.home,
                      timeout=self.timeout)

    async def remote_refs(self, refs: Sequence[str]) -> dict[str, str]:
        """Current value of each of ``refs`` on the remote (missing refs are absent)."""
        out = await self.git("ls-remote", "--refs", "--", self.url, *refs)
        wanted = set(refs)
        found: dict[str, str] = {}
        for line in out.stdout.splitlines():
            sha, _, name = line.partition("\t")
            if name in wanted:
                found[name] = sha
        return found

    async def fetch(self, target_branch: str, refs: Sequence[str]) -> tuple[str, dict[str, str]]:
        """Fetch the target branch and ``refs``; return the target tip and each ref's value.

        The target lands in ``refs/heads/<target>``; each ref that still exists on the
        remote in ``refs/sq/fetch/<n>``. Refs missing on the remote are left out.
        """
        await self.ensure()
        target_ref = f"refs/heads/{target_branch}"
        present = await self.remote_refs([target_ref, *refs])
        if target_ref not in present:
            raise GitError(["ls-remote", self.url, target_ref], 2,
                           f"target branch {target_branch!r} does not exist on the remote")
        wanted = [r for r in dict.fromkeys(refs) if r in present]
        specs = [f"+{target_ref}:{target_ref}"]
        specs += [f"+{ref}:refs/sq/fetch/{i}" for i, ref in enumerate(wanted)]
        await self.update("fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--",
                          self.url, *specs)
        values: dict[str, str] = {}
        for i, ref in enumerate(wanted):
            res = await self.git("rev-parse", "--verify", f"refs/sq/fetch/{i}")
            values[ref] = res.stdout.strip()
        tip = (await self.git("rev-parse", "--verify", target_ref)).stdout.strip()
        return tip, values

    async def has_commit(self, sha: str) -> bool:
        res = await self.git("cat-file", "-e", f"{sha}^{{commit}}", check=False)
        return res.returncode == 0

    async def pin(self, sha: str) -> None:
        """Keep ``sha`` reachable in the mirror whatever its ref does later."""
        await self.update("update-ref", f"refs/sq/pin/{sha}", sha)


@dataclass(frozen=True, slots=True)
class GitChange:
    """A git change URI resolved against the configured repositories."""

    uri: str
    key: str  # "{host}/{repo}"
    location: str  # the configured path or URL
    ref: str
    sha: str


_BAD_REF_CHARS = set(" ~^:?*[\\\x7f")


def ref_problem(ref: str) -> str | None:
    """Why ``ref`` is not a safe, fully qualified ref name (None when it is)."""
    if not ref.startswith("refs/") or ref.endswith(("/", ".", ".lock")):
        return "it must be a full ref name such as refs/heads/<branch>"
    if ".." in ref or "//" in ref or "@{" in ref or "/." in ref:
        return "it contains '..', '//', '@{' or a component starting with '.'"
    if any(ord(c) < 32 or c in _BAD_REF_CHARS for c in ref):
        return "it contains a control character, a space or one of ~^:?*[\\"
    return None


def resolve_change(uri: str, repos: Mapping[str, str], *,
                   github: bool = True) -> GitChange:
    """Parse a ``git://`` change URI (or a ``github://`` one: its ref is the pull
    request's ``refs/pull/<n>/head``, unless ``github`` is False) and find its
    repository; ``ChangeRejected`` if unusable."""
    try:
        change = parse_change_uri(uri)
    except ValidationError as exc:
        raise ChangeRejected(f"cannot read change {uri!r}: {exc}") from None
    ref = change.ref
    if github and change.scheme == "github" and change.sha is not None:
        # a pull request's head is the ref GitHub keeps for it (docs/github.md)
        ref = f"refs/pull/{change.raw.partition('?')[0].split('/')[-2]}/head"
    elif change.scheme != "git" or ref is None or change.sha is None:
        also = " or github://{host}/{owner}/{repo}/pull/{number}/{sha}" if github else ""
        raise ChangeRejected(
            f"change {uri!r} is not a git:// change; this queue lands git://{{host}}/"
            f"{{repo}}/{{percent-encoded ref}}/{{sha}}{also} changes only"
        )
    assert ref is not None and change.sha is not None
    key = f"{change.host}/{change.repo}"
    location = repos.get(key)
    if location is None:
        known = ", ".join(sorted(repos)) or "none"
        raise ChangeRejected(
            f"change {uri!r} names repository {key!r}, which this queue does not know "
            f"(configured: {known})"
        )
    problem = ref_problem(ref)
    if problem is not None:
        raise ChangeRejected(f"change {uri!r} names ref {ref!r}: {problem}")
    return GitChange(uri=uri, key=key, location=location, ref=ref, sha=change.sha)
