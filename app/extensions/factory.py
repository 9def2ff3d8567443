"""Build each queue's extensions from its configuration (``queues.yaml``).

```python
registry = ExtensionRegistry(load_queues_file(settings.queues_file),
                             scorer_factory=build_scorer)  # app.speculation.scoring
ext = registry.for_queue("demo")      # QueueExtensions; NotFound for an unknown queue
await ext.runner.trigger(...)
```
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, assert_never
from urllib.parse import unquote, urlsplit

from app.domain.errors import NotFound, ValidationError
from app.domain.notify_config import check_url
from app.domain.queue_config import GitConfig, QueueConfig, ScorerConfig, parse_queues
from app.extensions.base import (
    BuildRunner,
    BuildStore,
    ChangeProvider,
    CheckPublisher,
    ConflictAnalyzer,
    Merger,
    PeriodicJob,
    QueueExtensions,
    Scorer,
    Service,
)
from app.extensions.builds.command import CommandBuildRunner
from app.extensions.builds.fake import FakeBuildRunner
from app.extensions.builds.memory import MemoryBuildStore
from app.extensions.builds.sandbox import Bwrap
from app.extensions.builds.webhook import WebhookBuildRunner
from app.extensions.changes.fake import FakeChangeProvider
from app.extensions.conflict.analyzers import AllAnalyzer, NoneAnalyzer, PathOverlapAnalyzer
from app.extensions.git.cli import git_env
from app.extensions.git.merger import GitMerger
from app.extensions.git.provider import GitChangeProvider
from app.extensions.git.publish import TreePublisher
from app.extensions.merger.fake import FakeMerger, NoopMerger
from app.extensions.notify.webhook import WebhookSink


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
        case "github":
            return _github_provider(config)
        case other:
            assert_never(other)


def _github_provider(config: QueueConfig) -> ChangeProvider:
    """Imported here, not at the top: githubkit costs ~0.3 s and ~13 MiB at start-up
    (docs/github.md), paid only by a server with a GitHub queue."""
    from app.extensions.github.provider import GitHubChangeProvider

    client = _github_client(config)
    return GitHubChangeProvider(client.config, client)


def _github_client(config: QueueConfig) -> Any:
    from app.extensions.github.client import GitHubClient, credentials

    if config.github is None:  # the config validator requires it
        raise ValidationError(f"queue {config.name!r}: a github extension needs a "
                              "'github' block")
    return GitHubClient(config.github, credentials(config.github, config.name))


def _github_check(config: QueueConfig) -> CheckPublisher | None:
    """A queue with a ``github:`` block writes its requests' ``SubmitQueue`` check-run
    (``github.check_run``, default on)."""
    if config.github is None or not config.github.check_run:
        return None
    from app.extensions.github.checkrun import CheckRunPublisher

    return CheckRunPublisher(_github_client(config),
                             comment_removals=config.github.removal_comment)


def _github_runner(config: QueueConfig, store: BuildStore) -> BuildRunner:
    from app.extensions.github.runner import GitHubChecksRunner

    git, cfg = _git(config), config.build_runner
    publisher = TreePublisher({git.repo_key: git.repository}, git.target_branch,
                              _work_dir(config) / "published")
    return GitHubChecksRunner(queue=config.name, publisher=publisher,
                              client=_github_client(config), store=store, checks=cfg.checks,
                              start_timeout_s=cfg.checks_start_timeout_s,
                              timeout_s=cfg.effective_timeout_s, poll_s=cfg.poll_s,
                              target_branch=git.target_branch)


def _github_merger(config: QueueConfig) -> Merger:
    from app.extensions.github.merger import GitHubMerger

    git = _git(config)
    return GitHubMerger({git.repo_key: git.repository}, git.target_branch,
                        _work_dir(config) / "merger", client=_github_client(config),
                        move_head_branches=git.move_head_branches)


DEFAULT_PUBLIC_URL = "http://127.0.0.1:8000"


def _runner(config: QueueConfig, store: BuildStore, public_url: str) -> BuildRunner:
    cfg = config.build_runner
    match cfg.type:
        case "fake":
            return FakeBuildRunner(delay_ms=cfg.delay_ms)
        case "command":
            git = _git(config)
            return CommandBuildRunner(
                queue=config.name, command=cfg.command, repos={git.repo_key: git.repository},
                target_branch=git.target_branch, work_dir=_work_dir(config) / "builds",
                store=store, timeout_s=cfg.effective_timeout_s, max_parallel=cfg.max_parallel,
                sandbox=Bwrap(network=cfg.network) if cfg.sandbox == "bwrap" else None,
                infra_exit_codes=cfg.infra_exit_codes)
        case "webhook":
            secret = os.environ.get(cfg.secret_env, "")
            if not secret:
                raise ValidationError(
                    f"queue {config.name!r}: build_runner.secret_env names the environment "
                    f"variable {cfg.secret_env}, which is not set or empty; export the shared "
                    "webhook secret in it before starting the server")
            publisher = None
            if config.git is not None:
                publisher = TreePublisher({config.git.repo_key: config.git.repository},
                                          config.git.target_branch,
                                          _work_dir(config) / "published")
            return WebhookBuildRunner(queue=config.name, url=cfg.url, secret=secret,
                                      public_url=public_url, store=store,
                                      timeout_s=cfg.effective_timeout_s, publisher=publisher)
        case "github_checks":
            return _github_runner(config, store)
        case other:
            assert_never(other)


def _env(config: QueueConfig, endpoint: str, key: str, name: str) -> str:
    value = os.environ.get(name, "")
    if not value:
        raise ValidationError(
            f"queue {config.name!r}: notify endpoint {endpoint!r} {key} names the environment "
            f"variable {name}, which is not set or empty; export it before starting the server")
    return value


def _notify(config: QueueConfig, public_url: str) -> tuple[WebhookSink, ...]:
    """The queue's ``notify:`` endpoints with their URLs and secrets read from the
    environment (a missing variable fails start-up, naming it)."""
    sinks = []
    for e in config.notify:
        url = e.url or _env(config, e.name, "url_env", e.url_env)
        try:
            check_url(url, f"queue {config.name!r}: notify endpoint {e.name!r} url_env {e.url_env}")
        except ValueError as exc:
            raise ValidationError(str(exc)) from None
        secret = _env(config, e.name, "secret_env", e.secret_env) if e.secret_env else ""
        sinks.append(WebhookSink(queue=config.name, name=e.name, url=url, secret=secret,
                                 events=frozenset(e.events), fmt=e.format,
                                 timeout_s=e.timeout_s, public_url=public_url))
    return tuple(sinks)


def _merger(config: QueueConfig) -> Merger:
    match config.merger.type:
        case "fake":
            return FakeMerger()
        case "noop":
            return NoopMerger()
        case "git":
            git = _git(config)
            return GitMerger({git.repo_key: git.repository}, git.target_branch,
                             _work_dir(config) / "merger",
                             move_head_branches=git.move_head_branches)
        case "github":
            return _github_merger(config)
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
        test = _git_sync(["hash-object", "-w", "--stdin"], home, tmp, sandbox_test_script())
        tree = _git_sync(["mktree"], home, tmp, f"100644 blob {blob}\tREADME.md\n"
                                                f"100644 blob {test}\t{SANDBOX_TEST}\n")
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


SANDBOX_TEST = "sq_test.py"


def sandbox_test_script() -> str:
    """The sandbox's test command (``app/extensions/builds/sq_test.py``): prints each
    file it checks, fails when a file has a line that is exactly ``BROKEN``."""
    return (Path(__file__).parent / "builds" / "sq_test.py").read_text(encoding="utf-8")


def _add_sandbox_test(git_dir: Path, branch: str, home: Path) -> None:
    """Give a sandbox made before it existed its ``sq_test.py`` (one commit on the branch).

    Only a repository whose README.md is the sandbox's own is touched."""
    ref = f"refs/heads/{branch}"
    try:
        _git_sync(["cat-file", "-e", f"{ref}:{SANDBOX_TEST}"], home, git_dir)
        return
    except RuntimeError:
        pass
    try:
        readme = _git_sync(["cat-file", "-p", f"{ref}:README.md"], home, git_dir)
    except RuntimeError:
        return
    if readme != SANDBOX_README.strip():
        return
    tip = _git_sync(["rev-parse", "--verify", ref], home, git_dir)
    entries = _git_sync(["ls-tree", "-z", tip], home, git_dir).split("\0")
    blob = _git_sync(["hash-object", "-w", "--stdin"], home, git_dir, sandbox_test_script())
    listing = "".join(f"{e}\0" for e in entries if e) + f"100644 blob {blob}\t{SANDBOX_TEST}\0"
    tree = _git_sync(["mktree", "-z"], home, git_dir, listing)
    commit = _git_sync(["commit-tree", tree, "-p", tip, "-m",
                        f"Add {SANDBOX_TEST}, the sandbox's build command"], home, git_dir)
    _git_sync(["update-ref", ref, commit, tip], home, git_dir)


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
    if git.create_sandbox:
        try:
            _add_sandbox_test(git_dir, git.target_branch, home)
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            raise ValidationError(f"{where}: cannot add {SANDBOX_TEST} to the sandbox: {exc}"
                                  ) from None


ScorerFactory = Callable[[ScorerConfig], Scorer]


def build_extensions(config: QueueConfig,
                     scorer_factory: ScorerFactory, *,
                     build_store: BuildStore | None = None,
                     public_url: str = DEFAULT_PUBLIC_URL) -> QueueExtensions:
    """Fresh extension instances for one queue, as its configuration selects them.

    A queue with a ``git`` block has its repository checked (and, with
    ``create_sandbox``, created) here, synchronously: a missing or unusable repository
    fails start-up with ``ValidationError`` naming the queue and the path.
    ``build_store`` keeps the runs of the command and webhook runners (default: this
    process's memory); ``public_url`` is where CI reaches this server's callbacks.
    """
    if config.git is not None:
        prepare_repository(config.name, config.git, _work_dir(config))
    return QueueExtensions(
        provider=_provider(config),
        analyzer=_analyzer(config),
        runner=_runner(config, build_store or MemoryBuildStore(), public_url),
        merger=_merger(config),
        scorer=scorer_factory(config.scorer),
        build_budget=config.build_budget,
        speculation=config.speculation,
        batching=config.batching,
        notify=_notify(config, public_url),
        github_check=_github_check(config),
    )


class ExtensionRegistry:
    """The extensions of every configured queue, built once, looked up by queue name.

    ``scorer_factory`` builds a queue's scorer from its configuration: the scorers are
    pure and live in the speculation layer, so the composition root passes
    ``app.speculation.scoring.build_scorer``. ``overrides`` replaces the built extensions
    of some queues (tests inject their own fakes this way); each overridden queue must
    be configured.
    """

    def __init__(
        self,
        configs: Mapping[str, QueueConfig],
        *,
        scorer_factory: ScorerFactory,
        overrides: Mapping[str, QueueExtensions] | None = None,
        build_store: BuildStore | None = None,
        public_url: str = DEFAULT_PUBLIC_URL,
    ) -> None:
        unknown = sorted(set(overrides or {}) - set(configs))
        if unknown:
            raise ValueError(f"overrides for queues that are not configured: {unknown}")
        self._configs: dict[str, QueueConfig] = dict(configs)
        self.build_store: BuildStore = build_store or MemoryBuildStore()
        self._extensions: dict[str, QueueExtensions] = {
            name: (overrides or {}).get(name) or build_extensions(
                cfg, scorer_factory, build_store=self.build_store, public_url=public_url)
            for name, cfg in configs.items()
        }
        self._started: list[Service] = []

    async def start(self) -> None:
        """Start the extensions that run in the background (the command runners)."""
        for ext in self._extensions.values():
            if isinstance(ext.runner, Service) and ext.runner not in self._started:
                self._started.append(ext.runner)  # stop() copes with a failed start
                await ext.runner.start()

    def periodic_jobs(self) -> list[PeriodicJob]:
        """What the background extensions want run periodically (their heartbeats); a
        job of a runner that is not started does nothing."""
        return [job for ext in self._extensions.values() if isinstance(ext.runner, Service)
                for job in ext.runner.periodic_jobs()]

    async def stop(self) -> None:
        while self._started:
            await self._started.pop().stop()

    def build_readiness(self) -> dict[str, Any]:
        """The ``builds`` readiness check: each started command runner's sandbox state.

        Not ok while a queue's builds cannot be sandboxed as configured (they end
        ``errored``); ok but with a ``warning`` naming the queues that run unsandboxed."""
        queues = {name: ext.runner.readiness() for name, ext in self._extensions.items()
                  if isinstance(ext.runner, CommandBuildRunner) and ext.runner in self._started}
        check: dict[str, Any] = {"ok": all(q["ok"] for q in queues.values()), "queues": queues}
        bare = [name for name, q in queues.items() if q["sandbox"] == "none"]
        if bare:
            check["warning"] = (f"builds of {', '.join(bare)} run unsandboxed "
                                "(build_runner.sandbox: none): a change's build can read this "
                                "server's secrets")
        return check

    @classmethod
    def from_file(cls, path: Path, *, scorer_factory: ScorerFactory) -> ExtensionRegistry:
        return cls(load_queues_file(path), scorer_factory=scorer_factory)

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


def webhook_secrets(configs: Mapping[str, QueueConfig]) -> list[str]:
    """The shared secrets the webhook runners and notify endpoints of ``configs`` read
    from the environment, and notify URLs given by variable (a Slack webhook URL is a
    secret): the composition root masks them in stored build logs."""
    names = [cfg.build_runner.secret_env for cfg in configs.values()
             if cfg.build_runner.type == "webhook"]
    names += [name for cfg in configs.values() for e in cfg.notify
              for name in (e.secret_env, e.url_env) if name]
    return [secret for name in names if (secret := os.environ.get(name, ""))]


def load_queues_file(path: Path) -> dict[str, QueueConfig]:
    """Read and validate the queues file; ``ValidationError`` says what is wrong and where."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValidationError(
            f"queues file {str(path)!r} does not exist; run `submitqueue init` to write "
            "one (and a .env) here, or set SQ_QUEUES_FILE to the path of one"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(
            f"queues file {str(path)!r} cannot be read ({exc}); fix it or set "
            "SQ_QUEUES_FILE to another file"
        ) from None
    return parse_queues(text, source=str(path), base_dir=path.resolve().parent)
