"""Merge-queue configuration (``queues.yaml``), validated with pydantic.

```yaml
defaults:            # optional, merged under every queue
  build_budget: 4
queues:
  - name: demo
    change_provider: {type: fake}
    build_runner: {type: fake, delay_ms: 0}
    merger: {type: fake}
    conflict_analyzer: {type: pathoverlap, by: directory}
    scorer: {type: constant, probability: 0.9}
    build_budget: 4
  - name: sandbox    # a real git repository: change_provider/merger type git need `git`
    change_provider: {type: git}
    merger: {type: git}
    git:
      repository: ./var/sandbox.git   # a path or URL (file://, https://, ...)
      repo_key: sandbox.local/sandbox # the {host}/{repo} of this queue's change URIs
      target_branch: main
      work_dir: ./var/git/sandbox     # default ./var/git/<queue name>
      create_sandbox: true            # create + seed a bare repository if it is missing
      move_head_branches: true        # move each landed change's branch to its commit
```

Relative paths (``git.repository``, ``git.work_dir``) resolve against the directory of
the queues file (``load_queues_file`` does it via ``parse_queues(base_dir=...)``), not
against the process's working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from app.domain.errors import ValidationError as ConfigError
from app.domain.freeze import FreezeWindowConfig
from app.domain.github_config import GitHubConfig
from app.domain.ids import check_queue_name
from app.domain.notify_config import NotifyEndpointConfig, check_endpoints
from app.domain.states import LandStrategy
from app.domain.text import ENV_NAME


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChangeProviderConfig(_Cfg):
    """``fake`` (URI markers), ``git`` (the ``git`` block's repository) or ``github``
    (pull requests of the ``github`` block's repository; docs/github.md)."""

    type: Literal["fake", "git", "github"] = "fake"


_RUNNER_KEYS = {
    "fake": {"type", "delay_ms"},
    "command": {"type", "command", "timeout_s", "max_parallel", "sandbox", "network"},
    "webhook": {"type", "url", "secret_env", "timeout_s"},
    "github_checks": {"type", "checks", "checks_start_timeout_s", "timeout_s", "poll_s"},
}


class BuildRunnerConfig(_Cfg):
    """Who runs a queue's builds (``app/extensions/builds/``; docs/builds.md).

    - ``fake``: decides from URI markers; ``delay_ms`` per build.
    - ``command``: builds the speculative tree in a git worktree (the queue needs a
      ``git`` block) and runs ``command`` (an argv list, never a shell; an argument
      ``{python}`` is this server's Python) there, at most ``max_parallel`` at a time,
      each stopped after ``timeout_s`` (default 600). ``sandbox``: ``bwrap`` (default:
      bubblewrap isolates the command, see ``app/extensions/builds/sandbox.py``) or
      ``none`` (unsandboxed: only for trusted changes; warned about at start-up and on
      ``/readyz``). ``network``: whether a sandboxed build may use the host's network
      (default false: loopback of its own only). ``infra_exit_codes`` (default
      ``[75]``, EX_TEMPFAIL): exit codes that mean "the build system failed, not the
      change" (a cache or artifact server down): the build is run again once the
      ``builds`` dependency answers (``docs/outages.md``), never counted as a failure.
    - ``webhook``: POSTs each build to ``url`` signed with the secret held by the
      environment variable ``secret_env``; CI reports back to the callback URL. A
      build with no verdict ``timeout_s`` (default 3600) after its trigger errors.
    - ``github_checks``: pushes each build's tree as the branch ``sq/<queue>/<path>-<n>``
      and waits for GitHub's ``checks`` (required check names; omitted: those the
      target branch's rulesets and branch protection require) on it; none of them
      within ``checks_start_timeout_s`` (default 600) is ``no_ci_started`` (needs the
      ``git`` and ``github`` blocks; docs/github.md). GitHub is asked at most every
      ``poll_s`` (default 15) per build, and at once when a ``check_run``,
      ``check_suite`` or ``status`` webhook names the build's branch.
    """

    type: Literal["fake", "command", "webhook", "github_checks"] = "fake"
    delay_ms: int = Field(default=0, ge=0, le=3_600_000)
    command: tuple[str, ...] = ()
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    max_parallel: int = Field(default=2, ge=1, le=64)
    url: str = ""
    secret_env: str = ""
    sandbox: Literal["bwrap", "none"] = "bwrap"
    network: bool = False
    infra_exit_codes: tuple[int, ...] = (75,)
    checks: tuple[str, ...] = ()
    checks_start_timeout_s: float = Field(default=600.0, gt=0, le=24 * 3600)
    poll_s: float = Field(default=15.0, gt=0, le=3600)

    @field_validator("command")
    @classmethod
    def _argv(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not arg or "\x00" in arg for arg in v):
            raise ValueError("every argument of the command must be a non-empty string")
        return v

    @model_validator(mode="after")
    def _per_type(self) -> BuildRunnerConfig:
        stray = sorted(self.model_fields_set - _RUNNER_KEYS[self.type])
        if stray:
            raise ValueError(f"build_runner type {self.type} takes no {', '.join(stray)} "
                             f"(its keys: {', '.join(sorted(_RUNNER_KEYS[self.type]))})")
        if any(not name.strip() for name in self.checks):
            raise ValueError("build_runner checks must be check names as GitHub shows them, "
                             "e.g. [test, lint]; an empty name matches no check")
        if self.type == "command" and not self.command:
            raise ValueError('build_runner type command needs command: an argv list such as '
                             '["{python}", "sq_test.py"] (run in the tree, never by a shell)')
        if self.sandbox == "none" and "network" in self.model_fields_set:
            raise ValueError("build_runner network applies to sandbox: bwrap only (with "
                             "sandbox: none a build always has the host's network); drop "
                             "network or use sandbox: bwrap")
        if self.type == "webhook":
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError("build_runner type webhook needs url: the CI's http:// or "
                                 "https:// webhook address")
            if not ENV_NAME.match(self.secret_env):
                raise ValueError("build_runner type webhook needs secret_env: the name of the "
                                 "environment variable holding the shared secret (e.g. "
                                 "SQ_WEBHOOK_SECRET_MYQUEUE), not the secret itself")
        return self

    @property
    def effective_timeout_s(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        return 3600.0 if self.type in ("webhook", "github_checks") else 600.0


class MergerConfig(_Cfg):
    """``fake``, ``noop``, ``git`` (push the target branch) or ``github`` (the git
    merger, landing by an API fast-forward without force; needs the ``git`` and
    ``github`` blocks; docs/github.md)."""

    type: Literal["fake", "noop", "git", "github"] = "fake"


_BRANCH_BAD = set(" ~^:?*[\\\x7f")


class GitConfig(_Cfg):
    """The real repository of a queue whose change provider or merger is ``git``."""

    # a local path (relative: to the queues file's directory) or a URL (file://, https://)
    repository: str = Field(min_length=1)
    # the "{host}/{repo}" part of the change URIs that name this repository
    repo_key: str
    target_branch: str = "main"
    # mirrors and scratch worktrees; default ./var/git/<queue> (relative: as repository)
    work_dir: str | None = None
    # create a bare repository seeded with one commit when `repository` does not exist
    create_sandbox: bool = False
    # after landing, move each change's branch (refs/heads/...) to its landed commit
    move_head_branches: bool = False

    @field_validator("repo_key")
    @classmethod
    def _repo_key(cls, v: str) -> str:
        host, sep, repo = v.partition("/")
        if not sep or not host or not repo or any(c.isspace() for c in v) or "?" in v:
            raise ValueError(
                f"{v!r} is not a '{{host}}/{{repo}}' key such as 'sandbox.local/sandbox'"
            )
        return v

    @field_validator("target_branch")
    @classmethod
    def _branch(cls, v: str) -> str:
        if (
            not v
            or v.startswith(("refs/", "-", "/"))
            or v.endswith(("/", ".", ".lock"))
            or ".." in v
            or "//" in v
            or "@{" in v
            or "/." in v
            or any(ord(c) < 32 or c in _BRANCH_BAD for c in v)
        ):
            raise ValueError(f"{v!r} is not a valid branch name (e.g. main)")
        return v


class ConflictAnalyzerConfig(_Cfg):
    type: Literal["all", "none", "pathoverlap"] = "pathoverlap"
    by: Literal["file", "directory"] = "directory"


class SizeBucket(_Cfg):
    """Batches whose total lines changed lie in ``[min_lines, max_lines]`` score ``p``."""

    min_lines: int = Field(ge=0)
    max_lines: int = Field(ge=0)
    p: float = Field(gt=0, lt=1)

    @model_validator(mode="after")
    def _ordered(self) -> SizeBucket:
        if self.min_lines > self.max_lines:
            raise ValueError(f"bucket min_lines {self.min_lines} > max_lines {self.max_lines}")
        return self


DEFAULT_SIZE_BUCKETS = (
    SizeBucket(min_lines=0, max_lines=50, p=0.97),
    SizeBucket(min_lines=51, max_lines=500, p=0.9),
    SizeBucket(min_lines=501, max_lines=1_000_000_000, p=0.75),
)


class ScorerConfig(_Cfg):
    """P(batch lands), used to rank speculation paths.

    ``constant``: ``probability`` for every batch. ``size``: ``buckets`` over the
    batch's total lines changed (first match; no match -> ``default``). ``history``:
    each author's and top-level directory's recent pass rate in this queue's own
    finished builds (last ``window`` per key, smoothed towards ``prior`` with weight
    ``prior_weight``). ``combined``: weighted average of ``children``.
    """

    type: Literal["constant", "size", "history", "combined"] = "constant"
    probability: float = Field(default=0.9, gt=0, lt=1)
    buckets: tuple[SizeBucket, ...] = DEFAULT_SIZE_BUCKETS
    default: float = Field(default=0.85, gt=0, lt=1)
    prior: float = Field(default=0.9, gt=0, lt=1)
    prior_weight: float = Field(default=2.0, gt=0, le=10_000)
    window: int = Field(default=50, ge=1, le=10_000)
    children: tuple[ScorerConfig, ...] = ()
    weights: tuple[float, ...] | None = None

    @model_validator(mode="after")
    def _shape(self) -> ScorerConfig:
        if self.type == "combined":
            if not self.children:
                raise ValueError("scorer type combined needs children: [{type: ...}, ...]")
            if self.weights is not None and (
                    len(self.weights) != len(self.children)
                    or any(w < 0 for w in self.weights) or not sum(self.weights) > 0):
                raise ValueError("scorer weights: one non-negative weight per child, "
                                 "with a positive sum")
        elif self.children or self.weights is not None:
            raise ValueError(f"scorer type {self.type} takes no children or weights "
                             "(only type combined does)")
        return self


class SpeculationConfig(_Cfg):
    """How a queue spends its build budget.

    ``allocator``: ``sticky`` (fill free slots; a funded build keeps its slot) or
    ``preempting`` (cancel running builds whose path fell below the best ones).
    ``coverage``: merge a batch before its dependencies settle when its passed builds
    cover every outcome of at most ``coverage_max_unsettled`` unsettled dependencies
    and the bypass pays: every overtaken dependency is expected to need at least
    ``coverage_min_remaining`` mean build times before it could land (0 = bypass as soon
    as covered). Off by default: the rebuilds it forces on overtaken batches can cost
    more than it saves (see bench/simulate.py). ``coverage_complements``: spend up to
    ``complement_slots`` free build slots on the complementary paths coverage needs.
    ``min_probability``: fund no path less likely than this (each head's most likely
    path is always funded). ``hedge_by_time``: discount a hedge on a dependency whose
    own build reports soon. The defaults are the simulator's ``best-first``.
    ``retries``: how many times a path whose build *failed* is built again before the
    failure counts (default 0; infrastructure errors never count against a change and
    are retried anyway, up to 5 attempts). A retry that passes lands the change and
    marks the earlier failure ``flake_suspected`` in the request's history.
    ``vindication_depth``: a failure is suspect while one of the next N batches that
    depend on the failed one has a build of a tree that contains it: the failed batch is
    not removed while such a build runs, and when one passed, its failed path is built
    once more (``flake_suspected``; it lands only if that build passes). 0 (the default)
    turns it off; see ``app/speculation/vindication.py``.
    ``second_chance``: a request whose batch of one failed its builds goes on once more
    in a new batch at the back of the queue before it is removed, while the queue's
    second chances pass often enough (false, the default; ``app/domain/second_chance.py``).
    """

    allocator: Literal["sticky", "preempting"] = "sticky"
    coverage: bool = False
    coverage_max_unsettled: int = Field(default=2, ge=1, le=4)
    coverage_min_remaining: float = Field(default=1.0, ge=0, le=100)
    coverage_complements: bool = False
    complement_slots: int = Field(default=2, ge=1, le=100)
    min_probability: float = Field(default=0.1, ge=0, lt=1)
    hedge_by_time: bool = True
    retries: int = Field(default=0, ge=0, le=5)
    vindication_depth: int = Field(default=0, ge=0, le=10)
    second_chance: bool = False


class BatchingConfig(_Cfg):
    """How many validated requests one batch takes (``app/domain/batching.py``).

    ``max_size``: at most this many requests of one strategy per batch (1, the default,
    keeps one request per batch). ``max_wait_ms``: a batch that is not full waits at most
    this long after its first request for more (0: it closes at once, so only requests
    that arrive while it is still being analysed join). ``adaptive``: the size limit
    follows an AIMD rule over the queue's last 20 concluded batches (+1 per landing,
    halved per failure). A failed batch of several requests is bisected, never failed
    as a whole; ``high`` and ``hotfix`` requests are never batched with others.
    """

    max_size: int = Field(default=1, ge=1, le=64)
    max_wait_ms: int = Field(default=0, ge=0, le=600_000)
    adaptive: bool = False


class OutageKnobs(_Cfg):
    """Overrides of the process-wide outage settings (``SQ_OUTAGE_*``); unset = inherit."""

    window_s: float | None = Field(default=None, gt=0, le=7 * 24 * 3600)
    threshold: int | None = Field(default=None, ge=1, le=1000)
    probe_initial_ms: int | None = Field(default=None, ge=10, le=3_600_000)
    probe_max_ms: int | None = Field(default=None, ge=10, le=3_600_000)
    notify_after_s: float | None = Field(default=None, ge=0, le=7 * 24 * 3600)


class OutagesConfig(OutageKnobs):
    """How this queue rides out an outage of one of its dependencies
    (``app/domain/outages.py``): the queue's knobs, then per dependency kind
    (``repository``, ``builds``, ``github``, ``notify``) overrides of those."""

    dependencies: dict[Literal["repository", "builds", "github", "notify"], OutageKnobs] = {}


class QuotasConfig(_Cfg):
    """Per actor (a token's label; ``anonymous`` for callers without one under
    ``SQ_AUTH=open``) in this queue: at most ``in_flight`` requests not yet ended and
    ``per_hour`` land requests in any 60 minutes; unset = no limit. A land over either
    is refused with 429 and ``Retry-After``, and nothing is stored."""

    in_flight: int | None = Field(default=None, ge=1, le=1_000_000)
    per_hour: int | None = Field(default=None, ge=1, le=1_000_000)


class QueueConfig(_Cfg):
    name: str
    description: str = ""
    change_provider: ChangeProviderConfig = ChangeProviderConfig()
    build_runner: BuildRunnerConfig = BuildRunnerConfig()
    merger: MergerConfig = MergerConfig()
    conflict_analyzer: ConflictAnalyzerConfig = ConflictAnalyzerConfig()
    scorer: ScorerConfig = ScorerConfig()
    speculation: SpeculationConfig = SpeculationConfig()
    batching: BatchingConfig = BatchingConfig()
    outages: OutagesConfig = OutagesConfig()
    quotas: QuotasConfig = QuotasConfig()
    # actors (token labels) who may land with priority hotfix, besides the admin token
    hotfix_allowed: tuple[str, ...] = ()
    git: GitConfig | None = None
    github: GitHubConfig | None = None  # docs/github.md
    notify: tuple[NotifyEndpointConfig, ...] = ()  # docs/notifications.md
    freeze_windows: tuple[FreezeWindowConfig, ...] = ()  # docs/freeze.md
    build_budget: int = Field(default=4, ge=1, le=1000)
    default_strategy: LandStrategy = LandStrategy.REBASE

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_queue_name(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _git_block(self) -> QueueConfig:
        check_endpoints(self.notify, self.name)
        users = [
            block
            for block, kind in (("change_provider", self.change_provider.type),
                                ("merger", self.merger.type),
                                ("build_runner", self.build_runner.type))
            if kind in ("git", "command", "github_checks")
            or (block == "merger" and kind == "github")
        ]
        gh_users = [f"{block}.type {kind}" for block, kind in (
            ("change_provider", self.change_provider.type), ("merger", self.merger.type),
            ("build_runner", self.build_runner.type)) if kind in ("github", "github_checks")]
        if gh_users and self.github is None:
            raise ValueError(
                f"queue {self.name!r}: {' and '.join(gh_users)} "
                f"{'needs' if len(gh_users) == 1 else 'need'} a 'github' block "
                "(github: {repository: <owner>/<repo>, token_env: <variable holding a "
                "token>}; see docs/github.md)")
        if users and self.git is None:
            needs = "needs" if len(users) == 1 else "need"
            raise ValueError(
                f"queue {self.name!r}: "
                f"{' and '.join(f'{u}.type {self._kind(u)}' for u in users)} "
                f"{needs} a 'git' block (git: {{repository: <path or URL>, "
                "repo_key: <host>/<repo>})"
            )
        return self

    def _kind(self, block: str) -> str:
        return str(getattr(self, block).type)

    def resolved(self, base_dir: Path) -> QueueConfig:
        """This config with relative git paths made absolute against ``base_dir``."""
        if self.git is None:
            return self
        repo = self.git.repository
        if "://" not in repo:
            repo = str((base_dir / repo).resolve())
        work = self.git.work_dir or f"./var/git/{self.name}"
        work = str((base_dir / work).resolve())
        return self.model_copy(
            update={"git": self.git.model_copy(update={"repository": repo, "work_dir": work})}
        )


class QueuesFile(_Cfg):
    defaults: dict[str, Any] = Field(default_factory=dict)
    queues: list[QueueConfig]


def parse_queues(
    text: str, *, source: str = "queues.yaml", base_dir: Path | None = None
) -> dict[str, QueueConfig]:
    """Parse the YAML text; raises ``ConfigError`` with every problem and where it is.

    Relative git paths are resolved against ``base_dir`` (default: the current directory).
    """
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: expected a mapping with a 'queues' list")
    defaults = raw.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{source}: 'defaults' must be a mapping")
    queues = raw.get("queues")
    if not isinstance(queues, list) or not queues:
        raise ConfigError(f"{source}: 'queues' must be a non-empty list")
    merged = [{**defaults, **q} if isinstance(q, dict) else q for q in queues]
    try:
        # the whole mapping, so that an unknown top-level key is reported, not ignored
        parsed = QueuesFile.model_validate({**raw, "defaults": defaults, "queues": merged})
    except ValidationError as exc:
        problems = "; ".join(f"{_where(e['loc'], merged)}: {e['msg']}"
                             for e in exc.errors())
        raise ConfigError(f"{source}: {problems}") from None
    out: dict[str, QueueConfig] = {}
    for q in parsed.queues:
        if q.name in out:
            raise ConfigError(f"{source}: queue {q.name!r} is declared twice")
        out[q.name] = q.resolved(base_dir if base_dir is not None else Path.cwd())
    return out


def _where(loc: tuple[Any, ...], queues: list[Any]) -> str:
    """The dotted location of a problem, naming the queue after its index
    (``queues.0 (queue 'demo').freeze_windows.0.cron``)."""
    where = ".".join(str(p) for p in loc)
    if len(loc) >= 2 and loc[0] == "queues" and isinstance(loc[1], int) \
            and loc[1] < len(queues) and isinstance(queues[loc[1]], dict) \
            and isinstance(queues[loc[1]].get("name"), str):
        rest = "".join(f".{p}" for p in loc[2:])
        return f"queues.{loc[1]} (queue {queues[loc[1]]['name']!r}){rest}"
    return where
