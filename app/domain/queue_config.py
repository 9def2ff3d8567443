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
```

Relative paths (``git.repository``, ``git.work_dir``) resolve against the directory of
the queues file (``load_queues_file`` does it via ``parse_queues(base_dir=...)``), not
against the process's working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

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
from app.domain.ids import check_queue_name
from app.domain.states import LandStrategy


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChangeProviderConfig(_Cfg):
    type: Literal["fake", "git"] = "fake"


class BuildRunnerConfig(_Cfg):
    type: Literal["fake"] = "fake"
    delay_ms: int = Field(default=0, ge=0, le=3_600_000)


class MergerConfig(_Cfg):
    type: Literal["fake", "noop", "git"] = "fake"


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


class ScorerConfig(_Cfg):
    type: Literal["constant"] = "constant"
    probability: float = Field(default=0.9, gt=0, lt=1)


class QueueConfig(_Cfg):
    name: str
    description: str = ""
    change_provider: ChangeProviderConfig = ChangeProviderConfig()
    build_runner: BuildRunnerConfig = BuildRunnerConfig()
    merger: MergerConfig = MergerConfig()
    conflict_analyzer: ConflictAnalyzerConfig = ConflictAnalyzerConfig()
    scorer: ScorerConfig = ScorerConfig()
    git: GitConfig | None = None
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
        users = [
            block
            for block, kind in (("change_provider", self.change_provider.type),
                                ("merger", self.merger.type))
            if kind == "git"
        ]
        if users and self.git is None:
            needs = "needs" if len(users) == 1 else "need"
            raise ValueError(
                f"queue {self.name!r}: {' and '.join(f'{u}.type git' for u in users)} "
                f"{needs} a 'git' block (git: {{repository: <path or URL>, "
                "repo_key: <host>/<repo>})"
            )
        return self

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
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        raise ConfigError(f"{source}: {problems}") from None
    out: dict[str, QueueConfig] = {}
    for q in parsed.queues:
        if q.name in out:
            raise ConfigError(f"{source}: queue {q.name!r} is declared twice")
        out[q.name] = q.resolved(base_dir if base_dir is not None else Path.cwd())
    return out
