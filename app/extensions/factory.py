"""Build each queue's extensions from its configuration (``queues.yaml``).

```python
registry = ExtensionRegistry(load_queues_file(settings.queues_file))
ext = registry.for_queue("demo")      # QueueExtensions; NotFound for an unknown queue
await ext.runner.trigger(...)
```
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import assert_never
from urllib.parse import unquote, urlsplit

from app.domain.errors import NotFound, ValidationError
from app.domain.queue_config import GitConfig, QueueConfig, parse_queues
from app.extensions.base import (
    BuildRunner,
    ChangeProvider,
    ConflictAnalyzer,
    Merger,
    QueueExtensions,
    Scorer,
)
from app.extensions.builds.fake import FakeBuildRunner
from app.extensions.changes.fake import FakeChangeProvider
from app.extensions.changes.git import GitChangeProvider
from app.extensions.conflict.analyzers import AllAnalyzer, NoneAnalyzer, PathOverlapAnalyzer
from app.extensions.gitutil import git_env
from app.extensions.merger.fake import FakeMerger, NoopMerger
from app.extensions.merger.git import GitMerger
from app.extensions.scorer.constant import ConstantScorer


def _git(config: QueueConfig) -> GitConfig:
    if config.git is None:  # the config validator requires it; keep mypy and us honest
        raise ValidationError(f"queue {config.name!r}: a git extension needs a 'git' block")
    return config.git


def _work_dir(config: QueueConfig) -> Path:
    return Path(_git(config).work_dir or f"./var/git/{config.name}")


def _provider(config: QueueConfig) -> ChangeProvider:
    match config.change_provider.type:
        case "fake":
            return FakeChangeProvider()
        case "git":
            git = _git(config)
            return GitChangeProvider({git.repo_key: git.repository}, git.target_branch,
                                     _work_dir(config) / "provider")
        case other:
            assert_never(other)


def _runner(config: QueueConfig) -> BuildRunner:
    cfg = config.build_runner
    match cfg.type:
        case "fake":
            return FakeBuildRunner(delay_ms=cfg.delay_ms)
        case other:
            assert_never(other)


def _merger(config: QueueConfig) -> Merger:
    match config.merger.type:
        case "fake":
            return FakeMerger()
        case "noop":
            return NoopMerger()
        case "git":
            git = _git(config)
            return GitMerger({git.repo_key: git.repository}, git.target_branch,
                             _work_dir(config) / "merger")
        case other:
            assert_never(other)


def _analyzer(config: QueueConfig) -> ConflictAnalyzer:
    cfg = config.conflict_analyzer
    match cfg.type:
        case "all":
            return AllAnalyzer()
        case "none":
            return NoneAnalyzer()
        case "pathoverlap":
            return PathOverlapAnalyzer(by=cfg.by)
        case other:
            assert_never(other)


def _scorer(config: QueueConfig) -> Scorer:
    cfg = config.scorer
    match cfg.type:
        case "constant":
            return ConstantScorer(cfg.probability)
        case other:
            assert_never(other)


SANDBOX_README = """\
# SubmitQueue sandbox

A bare repository created by SubmitQueue for its `sandbox` queue (create_sandbox: true).
Clone it, push a branch, and land it through the queue; see the README of SubmitQueue.
"""


def _local_path(repository: str) -> Path | None:
    """The filesystem path of a configured repository (None for a remote URL)."""
    if "://" not in repository:
        return Path(repository)
    parts = urlsplit(repository)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        return Path(unquote(parts.path))
    return None


def _git_sync(args: list[str], home: Path, git_dir: Path | None = None,
              stdin: str | None = None) -> str:
    extra = {"GIT_DIR": str(git_dir)} if git_dir is not None else None
    home.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["git", *args], env=git_env(home, extra), input=stdin,
                         capture_output=True, text=True, check=False, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"git {' '.join(args)} exited {res.returncode}: {res.stderr.strip()}")
    return res.stdout.strip()


def _create_sandbox(path: Path, branch: str, home: Path) -> None:
    """A bare repository at ``path`` with one commit on ``branch`` (made aside, renamed in)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        _git_sync(["init", "--bare", "--quiet", f"--initial-branch={branch}", str(tmp)], home)
        _git_sync(["config", "core.logAllRefUpdates", "true"], home, tmp)
        blob = _git_sync(["hash-object", "-w", "--stdin"], home, tmp, SANDBOX_README)
        tree = _git_sync(["mktree"], home, tmp, f"100644 blob {blob}\tREADME.md\n")
        commit = _git_sync(["commit-tree", tree, "-m", "Initial commit of the sandbox"],
                           home, tmp)
        _git_sync(["update-ref", f"refs/heads/{branch}", commit, ""], home, tmp)
        try:
            tmp.rename(path)
        except OSError:
            if not (path / "HEAD").exists():  # lost a race to another process: reuse its
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def prepare_repository(queue: str, git: GitConfig, work_dir: Path) -> None:
    """Check the queue's repository exists and has its target branch (or create it)."""
    path = _local_path(git.repository)
    if path is None:  # a remote URL: checked on first use (fetch errors are retryable)
        return
    where = f"queue {queue!r}: git.repository {str(path)!r}"
    home = work_dir / ".home"
    if not path.exists():
        if not git.create_sandbox:
            raise ValidationError(
                f"{where} does not exist; create the repository (git init --bare), fix the "
                "path (relative paths are relative to the queues file) or set "
                "create_sandbox: true for a demo repository"
            )
        try:
            _create_sandbox(path, git.target_branch, home)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            raise ValidationError(f"{where}: cannot create the sandbox repository: {exc}") from None
    git_dir = path / ".git" if (path / ".git").exists() else path
    try:
        _git_sync(["rev-parse", "--git-dir"], home, git_dir)
    except (OSError, RuntimeError, subprocess.SubprocessError):
        raise ValidationError(f"{where} is not a git repository") from None
    try:
        _git_sync(["rev-parse", "--verify", "--quiet", f"refs/heads/{git.target_branch}"],
                  home, git_dir)
    except (OSError, RuntimeError, subprocess.SubprocessError):
        raise ValidationError(
            f"{where} has no branch {git.target_branch!r} (git.target_branch); push it first"
        ) from None


def build_extensions(config: QueueConfig) -> QueueExtensions:
    """Fresh extension instances for one queue, as its configuration selects them.

    A queue with a ``git`` block has its repository checked (and, with
    ``create_sandbox``, created) here, synchronously: a missing or unusable repository
    fails start-up with ``ValidationError`` naming the queue and the path.
    """
    if config.git is not None:
        prepare_repository(config.name, config.git, _work_dir(config))
    return QueueExtensions(
        provider=_provider(config),
        analyzer=_analyzer(config),
        runner=_runner(config),
        merger=_merger(config),
        scorer=_scorer(config),
        build_budget=config.build_budget,
    )


class ExtensionRegistry:
    """The extensions of every configured queue, built once, looked up by queue name.

    ``overrides`` replaces the built extensions of some queues (tests inject their own
    fakes this way); each overridden queue must be configured.
    """

    def __init__(
        self,
        configs: Mapping[str, QueueConfig],
        *,
        overrides: Mapping[str, QueueExtensions] | None = None,
    ) -> None:
        unknown = sorted(set(overrides or {}) - set(configs))
        if unknown:
            raise ValueError(f"overrides for queues that are not configured: {unknown}")
        self._configs: dict[str, QueueConfig] = dict(configs)
        self._extensions: dict[str, QueueExtensions] = {
            name: (overrides or {}).get(name) or build_extensions(cfg)
            for name, cfg in configs.items()
        }

    @classmethod
    def from_file(cls, path: Path) -> ExtensionRegistry:
        return cls(load_queues_file(path))

    def names(self) -> list[str]:
        """Configured queue names, in configuration order."""
        return list(self._extensions)

    def __contains__(self, name: object) -> bool:
        return name in self._extensions

    def for_queue(self, name: str) -> QueueExtensions:
        try:
            return self._extensions[name]
        except KeyError:
            raise NotFound(self._unknown(name)) from None

    def config(self, name: str) -> QueueConfig:
        """The queue's configuration (e.g. its ``default_strategy``)."""
        try:
            return self._configs[name]
        except KeyError:
            raise NotFound(self._unknown(name)) from None

    def _unknown(self, name: str) -> str:
        known = ", ".join(repr(n) for n in self._extensions) or "none"
        return (
            f"queue {name!r} is not configured (configured queues: {known}); "
            "add it to the queues file (SQ_QUEUES_FILE) and restart"
        )


def load_queues_file(path: Path) -> dict[str, QueueConfig]:
    """Read and validate the queues file; ``ValidationError`` says what is wrong and where."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(
            f"queues file {str(path)!r} does not exist; create it (the repository's "
            "queues.yaml is an example) or set SQ_QUEUES_FILE to the path of one"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(
            f"queues file {str(path)!r} cannot be read ({exc}); fix it or set "
            "SQ_QUEUES_FILE to another file"
        ) from None
    return parse_queues(text, source=str(path), base_dir=path.resolve().parent)
