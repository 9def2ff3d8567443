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
```
"""

from __future__ import annotations

from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.domain.errors import ValidationError as ConfigError
from app.domain.ids import check_queue_name
from app.domain.states import LandStrategy


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChangeProviderConfig(_Cfg):
    type: Literal["fake"] = "fake"


class BuildRunnerConfig(_Cfg):
    type: Literal["fake"] = "fake"
    delay_ms: int = Field(default=0, ge=0, le=3_600_000)


class MergerConfig(_Cfg):
    type: Literal["fake", "noop"] = "fake"


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
    build_budget: int = Field(default=4, ge=1, le=1000)
    default_strategy: LandStrategy = LandStrategy.REBASE

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        try:
            return check_queue_name(v)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None


class QueuesFile(_Cfg):
    defaults: dict[str, Any] = Field(default_factory=dict)
    queues: list[QueueConfig]


def parse_queues(text: str, *, source: str = "queues.yaml") -> dict[str, QueueConfig]:
    """Parse the YAML text; raises ``ConfigError`` with every problem and where it is."""
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
        out[q.name] = q
    return out
