"""Build each queue's extensions from its configuration (``queues.yaml``).

```python
registry = ExtensionRegistry(load_queues_file(settings.queues_file))
ext = registry.for_queue("demo")      # QueueExtensions; NotFound for an unknown queue
await ext.runner.trigger(...)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import assert_never

from app.domain.errors import NotFound, ValidationError
from app.domain.queue_config import QueueConfig, parse_queues
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
from app.extensions.conflict.analyzers import AllAnalyzer, NoneAnalyzer, PathOverlapAnalyzer
from app.extensions.merger.fake import FakeMerger, NoopMerger
from app.extensions.scorer.constant import ConstantScorer


def _provider(config: QueueConfig) -> ChangeProvider:
    match config.change_provider.type:
        case "fake":
            return FakeChangeProvider()
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


def build_extensions(config: QueueConfig) -> QueueExtensions:
    """Fresh extension instances for one queue, as its configuration selects them."""
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
    return parse_queues(text, source=str(path))
