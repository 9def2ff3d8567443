"""The fake extensions, the conflict analyzers, the factory/registry and queues.yaml parsing."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import pytest

from app.domain.entities import ChangeDetails, ChangedFile
from app.domain.errors import NotFound, ValidationError
from app.domain.queue_config import QueueConfig, parse_queues
from app.domain.states import BuildStatus, LandStrategy
from app.extensions.base import (
    BatchChanges,
    BuildRequest,
    ChangeRejected,
    MergeSpec,
    MergeStep,
    QueueExtensions,
)
from app.extensions.builds.fake import FakeBuildRunner, UnknownBuild
from app.extensions.changes.fake import FakeChangeProvider
from app.extensions.conflict.analyzers import (
    AllAnalyzer,
    NoneAnalyzer,
    PathOverlapAnalyzer,
    path_key,
)
from app.extensions.factory import (
    ExtensionRegistry,
    build_extensions,
    load_queues_file,
)
from app.extensions.merger.fake import FakeMerger, NoopMerger
from app.queue import classify
from app.speculation.scoring import ConstantScorer, build_scorer
from tests.support.clocks import FakeClock

ROOT = Path(__file__).resolve().parents[2]
SHA1 = "1" * 40
SHA2 = "2" * 40
SHA3 = "3" * 40


def gh(sha: str = SHA1, query: str = "", n: int = 1) -> str:
    uri = f"github://github.com/org/repo/pull/{n}/{sha}"
    return f"{uri}?{query}" if query else uri


# --- change provider ---------------------------------------------------------------


async def test_provider_reads_files_from_marker_in_order() -> None:
    a = gh(SHA1, "sq-files=src/a.py,docs/b.md")
    b = gh(SHA2, "sq-files=lib/c.py", n=2)
    details = await FakeChangeProvider().get("demo", [a, b])
    assert [d.uri for d in details] == [a, b]
    assert details[0].changed_files == (
        ChangedFile("src/a.py", lines_added=1),
        ChangedFile("docs/b.md", lines_added=1),
    )
    assert details[1].changed_files == (ChangedFile("lib/c.py", lines_added=1),)
    assert {(d.author_name, d.author_email) for d in details} == {
        ("Fake Author", "fake@example.com")
    }


async def test_provider_default_file_per_change() -> None:
    uris = [
        gh(SHA1),
        gh(SHA2, n=2),
        f"git://git.example.com/team/repo/refs%2Fheads%2Fx/{SHA3}",
        "phab://phab.example.com/D7/3",
    ]
    details = await FakeChangeProvider().get("demo", uris)
    paths = [[f.path for f in d.changed_files] for d in details]
    assert paths == [
        [f"org/repo/{SHA1[:12]}/change.txt"],
        [f"org/repo/{SHA2[:12]}/change.txt"],
        [f"team/repo/{SHA3[:12]}/change.txt"],
        ["phab.example.com/D7/change.txt"],
    ]
    # independent changes do not collide, neither by file nor by directory
    batches = [BatchChanges(f"b{i}", tuple(p)) for i, p in enumerate(paths)]
    for by in ("file", "directory"):
        analyzer = PathOverlapAnalyzer(by=by)
        assert analyzer.analyze(batches[0], batches[1:]) == []


async def test_provider_error_token_rejects_naming_the_uri() -> None:
    bad = gh(SHA2, "sq-fake=provider-error", n=2)
    with pytest.raises(ChangeRejected) as info:
        await FakeChangeProvider().get("demo", [gh(SHA1), bad])
    assert repr(bad) in str(info.value)
    assert "provider-error" in str(info.value)
    assert classify(info.value) is False


async def test_provider_rejects_unparseable_uri() -> None:
    with pytest.raises(ChangeRejected, match="not-a-uri"):
        await FakeChangeProvider().get("demo", ["not-a-uri"])


# --- conflict analyzers ------------------------------------------------------------


def _b(batch_id: str, *files: str) -> BatchChanges:
    return BatchChanges(batch_id, files)


def test_all_analyzer_conflicts_with_every_other_batch_in_order() -> None:
    cand = _b("q/batch/9", "x")
    others = [_b("q/batch/3", "a"), _b("q/batch/1"), cand, _b("q/batch/2", "x")]
    assert AllAnalyzer().analyze(cand, others) == ["q/batch/3", "q/batch/1", "q/batch/2"]
    assert AllAnalyzer().analyze(cand, []) == []


def test_none_analyzer_never_conflicts() -> None:
    cand = _b("c", "x")
    assert NoneAnalyzer().analyze(cand, [_b("a", "x"), _b("b", "x")]) == []


@pytest.mark.parametrize(
    ("path", "file_key", "dir_key"),
    [
        ("src/a.py", "src/a.py", "src"),
        ("./src/a.py", "src/a.py", "src"),
        ("/src/a.py", "src/a.py", "src"),
        ("//src/a.py", "src/a.py", "src"),
        ("src//x/../a.py", "src/a.py", "src"),
        ("src/./b/c.py", "src/b/c.py", "src/b"),
        ("README.md", "README.md", "."),
        ("./README.md", "README.md", "."),
        ("/README.md", "README.md", "."),
        ("src/", "src", "."),
    ],
)
def test_path_keys_are_normalised(path: str, file_key: str, dir_key: str) -> None:
    assert path_key(path, "file") == file_key
    assert path_key(path, "directory") == dir_key


def test_pathoverlap_by_file() -> None:
    a = PathOverlapAnalyzer(by="file")
    cand = _b("c", "./src/a.py")
    in_flight = [
        _b("same-dir", "src/b.py"),
        _b("same-file", "/src/a.py"),
        _b("other", "lib/a.py"),
        _b("normalised", "src/x/../a.py"),
    ]
    assert a.analyze(cand, in_flight) == ["same-file", "normalised"]


def test_pathoverlap_by_directory() -> None:
    a = PathOverlapAnalyzer(by="directory")
    cand = _b("c", "src/a.py")
    in_flight = [
        _b("same-dir", "./src/b.py"),
        _b("nested", "src/sub/c.py"),
        _b("parent-root", "README.md"),
        _b("other", "lib/a.py", "docs/x.md"),
        _b("one-of-many", "lib/z.py", "/src/z.py"),
    ]
    assert a.analyze(cand, in_flight) == ["same-dir", "one-of-many"]


def test_pathoverlap_root_files() -> None:
    cand = _b("c", "README.md")
    in_flight = [_b("root", "/setup.py"), _b("sub", "src/README.md")]
    assert PathOverlapAnalyzer(by="directory").analyze(cand, in_flight) == ["root"]
    assert PathOverlapAnalyzer(by="file").analyze(cand, in_flight) == []


def test_pathoverlap_without_files_and_self() -> None:
    a = PathOverlapAnalyzer(by="directory")
    assert a.analyze(_b("c"), [_b("x", "README.md")]) == []
    cand = _b("c", "src/a.py")
    assert a.analyze(cand, [cand, _b("d", "src/b.py")]) == ["d"]


def test_pathoverlap_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="'tree'"):
        PathOverlapAnalyzer(by="tree")  # type: ignore[arg-type]


# --- build runner ------------------------------------------------------------------


def req(head: list[str], base: list[str] | None = None, attempt: int = 1) -> BuildRequest:
    return BuildRequest(
        queue="demo",
        batch_id="demo/batch/1",
        path_id="p" * 64,
        attempt=attempt,
        base_changes=tuple(base or ()),
        head_changes=tuple(head),
    )


async def test_build_succeeds_after_delay() -> None:
    clock = FakeClock(1_000_000)
    runner = FakeBuildRunner(delay_ms=500, clock=clock)
    bid = await runner.trigger(req([gh()]))
    assert re.fullmatch(r"fake-[0-9a-f]{12}-1000500-succeeded", bid)
    assert (await runner.status(bid)).status is BuildStatus.RUNNING
    clock.now += 499
    assert (await runner.status(bid)).status is BuildStatus.RUNNING
    clock.now += 1
    report = await runner.status(bid)
    assert report.status is BuildStatus.SUCCEEDED
    assert report.log_url == ""


async def test_zero_delay_build_is_done_at_once() -> None:
    runner = FakeBuildRunner(clock=FakeClock(1_000_000))
    bid = await runner.trigger(req([gh()]))
    assert (await runner.status(bid)).status is BuildStatus.SUCCEEDED


async def test_build_ids_are_unique_per_trigger() -> None:
    runner = FakeBuildRunner(clock=FakeClock(1_000_000))
    r = req([gh()])
    assert len({await runner.trigger(r) for _ in range(20)}) == 20


async def test_build_ms_marker_overrides_delay_max_over_heads_only() -> None:
    clock = FakeClock(1_000_000)
    runner = FakeBuildRunner(delay_ms=5, clock=clock)
    bid = await runner.trigger(
        req(
            [gh(SHA1, "sq-build-ms=100"), gh(SHA2, "sq-build-ms=300", n=2), gh(SHA3, n=3)],
            base=[gh("4" * 40, "sq-build-ms=9000", n=4)],
        )
    )
    assert bid.split("-")[2] == str(clock.now + 300)
    clock.now += 299
    assert (await runner.status(bid)).status is BuildStatus.RUNNING
    clock.now += 1
    assert (await runner.status(bid)).status is BuildStatus.SUCCEEDED


async def test_build_fail_on_a_base_change_fails_the_build() -> None:
    runner = FakeBuildRunner(clock=FakeClock(1_000_000))
    bid = await runner.trigger(req([gh(SHA1)], base=[gh(SHA2, "sq-fake=build-fail", n=2)]))
    report = await runner.status(bid)
    assert report.status is BuildStatus.FAILED
    assert "build-fail" in report.detail


async def test_build_fail_on_head_fails_after_delay() -> None:
    clock = FakeClock(1_000_000)
    runner = FakeBuildRunner(delay_ms=10, clock=clock)
    bid = await runner.trigger(req([gh(SHA1, "sq-fake=build-fail")]))
    assert (await runner.status(bid)).status is BuildStatus.RUNNING
    clock.now += 10
    assert (await runner.status(bid)).status is BuildStatus.FAILED


async def test_build_error_makes_status_raise_a_retryable_error() -> None:
    runner = FakeBuildRunner(clock=FakeClock(1_000_000))
    bid = await runner.trigger(req([gh(SHA1, "sq-fake=build-fail,build-error")]))
    with pytest.raises(ConnectionError) as info:
        await runner.status(bid)
    assert classify(info.value) is True


async def test_trigger_error_raises_on_trigger() -> None:
    runner = FakeBuildRunner(clock=FakeClock(1_000_000))
    with pytest.raises(ConnectionError, match="refused the trigger") as info:
        await runner.trigger(req([gh(SHA1)], base=[gh(SHA2, "sq-fake=trigger-error", n=2)]))
    assert classify(info.value) is True


async def test_cancel_before_finish_reports_cancelled() -> None:
    clock = FakeClock(1_000_000)
    runner = FakeBuildRunner(delay_ms=100, clock=clock)
    bid = await runner.trigger(req([gh()]))
    other = await runner.trigger(req([gh()]))
    await runner.cancel(bid)
    await runner.cancel(bid)  # idempotent
    assert (await runner.status(bid)).status is BuildStatus.CANCELLED
    assert (await runner.status(other)).status is BuildStatus.RUNNING
    clock.now += 100
    assert (await runner.status(bid)).status is BuildStatus.CANCELLED
    assert (await runner.status(other)).status is BuildStatus.SUCCEEDED


async def test_cancel_after_finish_keeps_the_outcome() -> None:
    clock = FakeClock(1_000_000)
    runner = FakeBuildRunner(delay_ms=100, clock=clock)
    bid = await runner.trigger(req([gh(SHA1, "sq-fake=build-fail")]))
    clock.now += 100
    await runner.cancel(bid)
    assert (await runner.status(bid)).status is BuildStatus.FAILED


async def test_runner_is_stateless_across_restarts() -> None:
    clock = FakeClock(1_000_000)
    first = FakeBuildRunner(delay_ms=100, clock=clock)
    ok = await first.trigger(req([gh(SHA1)]))
    bad = await first.trigger(req([gh(SHA2, "sq-fake=build-fail", n=2)]))
    await first.cancel(ok)
    restarted = FakeBuildRunner(clock=clock)  # another process, other delay
    assert (await restarted.status(ok)).status is BuildStatus.RUNNING  # cancel forgotten
    clock.now += 100
    assert (await restarted.status(ok)).status is BuildStatus.SUCCEEDED
    assert (await restarted.status(bad)).status is BuildStatus.FAILED


@pytest.mark.parametrize(
    "bid",
    ["", "garbage", "fake-123-1-succeeded", "fake-0123456789ab-12-exploded",
     "fake-0123456789AB-12-succeeded", "fake-0123456789ab--succeeded"],
)
async def test_garbage_build_ids_are_rejected(bid: str) -> None:
    runner = FakeBuildRunner(clock=FakeClock(1_000_000))
    with pytest.raises(UnknownBuild, match="unknown build id") as info:
        await runner.status(bid)
    assert isinstance(info.value, ValueError)
    assert repr(bid) in str(info.value)
    assert classify(info.value) is False
    with pytest.raises(UnknownBuild):
        await runner.cancel(bid)


def test_runner_rejects_negative_delay() -> None:
    with pytest.raises(ValueError, match="delay_ms"):
        FakeBuildRunner(delay_ms=-1)


async def test_default_clock_is_wall_clock() -> None:
    runner = FakeBuildRunner(delay_ms=60_000)
    bid = await runner.trigger(req([gh()]))
    assert (await runner.status(bid)).status is BuildStatus.RUNNING


# --- merger ------------------------------------------------------------------------


def spec(*steps: list[str]) -> MergeSpec:
    return MergeSpec(
        queue="demo",
        id="demo/batch/1",
        steps=tuple(
            MergeStep(f"demo/{i}", tuple(uris), LandStrategy.REBASE)
            for i, uris in enumerate(steps, start=1)
        ),
    )


def sha1(uri: str) -> str:
    return hashlib.sha1(uri.encode()).hexdigest()


async def test_merger_success_outputs_one_sha_per_change_in_order() -> None:
    a, b, c = gh(SHA1), gh(SHA2, n=2), "phab://phab.example.com/D1/1"
    for op in (FakeMerger().check, FakeMerger().merge):
        outcome = await op(spec([a, b], [c]))
        assert outcome.succeeded
        assert outcome.outputs == (sha1(a), sha1(b), sha1(c))
        assert all(re.fullmatch(r"[0-9a-f]{40}", o) for o in outcome.outputs)
        assert outcome.conflicting_paths == ()


async def test_merge_conflict_fails_check_and_merge() -> None:
    bad = gh(SHA2, "sq-fake=merge-conflict&sq-files=src/a.py,src/b.py", n=2)
    s = spec([gh(SHA1)], [bad])
    for op in (FakeMerger().check, FakeMerger().merge):
        outcome = await op(s)
        assert not outcome.succeeded
        assert outcome.reason.startswith("merge conflict in src/a.py, src/b.py")
        assert bad in outcome.reason
        assert outcome.conflicting_paths == ("src/a.py", "src/b.py")
        assert outcome.outputs == ()


async def test_merge_conflict_without_files_names_the_default_file() -> None:
    outcome = await FakeMerger().check(spec([gh(SHA1, "sq-fake=merge-conflict")]))
    assert not outcome.succeeded
    assert outcome.conflicting_paths == (f"org/repo/{SHA1[:12]}/change.txt",)


async def test_merge_conflict_late_passes_check_fails_merge() -> None:
    s = spec([gh(SHA1, "sq-fake=merge-conflict-late&sq-files=x.txt")])
    assert (await FakeMerger().check(s)).succeeded
    outcome = await FakeMerger().merge(s)
    assert not outcome.succeeded
    assert outcome.conflicting_paths == ("x.txt",)
    assert "x.txt" in outcome.reason


async def test_merge_error_raises_retryable_on_check_and_merge() -> None:
    s = spec([gh(SHA1)], [gh(SHA2, "sq-fake=merge-error", n=2)])
    for op in (FakeMerger().check, FakeMerger().merge):
        with pytest.raises(ConnectionError) as info:
            await op(s)
        assert classify(info.value) is True


async def test_merge_error_late_raises_only_on_merge() -> None:
    s = spec([gh(SHA1, "sq-fake=merge-error-late")])
    assert (await FakeMerger().check(s)).succeeded
    with pytest.raises(ConnectionError):
        await FakeMerger().merge(s)


async def test_noop_merger_ignores_tokens() -> None:
    a = gh(SHA1, "sq-fake=merge-conflict,merge-error")
    for op in (NoopMerger().check, NoopMerger().merge):
        outcome = await op(spec([a]))
        assert outcome.succeeded
        assert outcome.outputs == (sha1(a),)


# --- scorer ------------------------------------------------------------------------


def test_constant_scorer() -> None:
    changes = [ChangeDetails(uri=gh())]
    assert ConstantScorer(0.25).score("demo/batch/1", changes) == 0.25
    assert ConstantScorer(0.75).score("demo/batch/2", []) == 0.75


@pytest.mark.parametrize("p", [0.0, 1.0, -0.1, 1.5])
def test_constant_scorer_rejects_out_of_range(p: float) -> None:
    with pytest.raises(ValueError, match="between 0 and 1"):
        ConstantScorer(p)


# --- factory and registry ----------------------------------------------------------


def test_build_extensions_follows_the_config() -> None:
    cfg = QueueConfig.model_validate(
        {
            "name": "q",
            "build_runner": {"type": "fake", "delay_ms": 250},
            "merger": {"type": "noop"},
            "conflict_analyzer": {"type": "pathoverlap", "by": "file"},
            "scorer": {"type": "constant", "probability": 0.3},
            "build_budget": 7,
        }
    )
    ext = build_extensions(cfg, build_scorer)
    assert isinstance(ext.provider, FakeChangeProvider)
    assert isinstance(ext.runner, FakeBuildRunner)
    assert ext.runner.delay_ms == 250
    assert isinstance(ext.merger, NoopMerger)
    assert isinstance(ext.analyzer, PathOverlapAnalyzer)
    assert ext.analyzer.by == "file"
    assert isinstance(ext.scorer, ConstantScorer)
    assert ext.scorer.probability == 0.3
    assert ext.build_budget == 7


@pytest.mark.parametrize(
    ("analyzer", "cls"),
    [("all", AllAnalyzer), ("none", NoneAnalyzer), ("pathoverlap", PathOverlapAnalyzer)],
)
def test_build_extensions_analyzer_types(analyzer: str, cls: type) -> None:
    cfg = QueueConfig.model_validate({"name": "q", "conflict_analyzer": {"type": analyzer}})
    assert isinstance(build_extensions(cfg, build_scorer).analyzer, cls)


def test_build_extensions_defaults() -> None:
    ext = build_extensions(QueueConfig(name="q"), build_scorer)
    assert isinstance(ext.merger, FakeMerger)
    assert isinstance(ext.analyzer, PathOverlapAnalyzer)
    assert ext.analyzer.by == "directory"
    assert ext.build_budget == 4


def _configs(*names: str) -> dict[str, QueueConfig]:
    return {n: QueueConfig(name=n) for n in names}


def test_registry_lookup_and_names() -> None:
    reg = ExtensionRegistry(_configs("beta", "alpha"), scorer_factory=build_scorer)
    assert reg.names() == ["beta", "alpha"]
    assert "alpha" in reg
    assert "gamma" not in reg
    assert reg.for_queue("alpha") is reg.for_queue("alpha")
    assert reg.for_queue("alpha") is not reg.for_queue("beta")
    assert reg.for_queue("alpha").runner is not reg.for_queue("beta").runner
    assert reg.config("beta").name == "beta"


def test_registry_unknown_queue_is_not_found() -> None:
    reg = ExtensionRegistry(_configs("demo"), scorer_factory=build_scorer)
    for lookup in (reg.for_queue, reg.config):
        with pytest.raises(NotFound) as info:
            lookup("nope")
        msg = str(info.value)
        assert "'nope'" in msg
        assert "'demo'" in msg
        assert "SQ_QUEUES_FILE" in msg


def test_registry_overrides() -> None:
    custom = QueueExtensions(
        provider=FakeChangeProvider(),
        analyzer=AllAnalyzer(),
        runner=FakeBuildRunner(),
        merger=NoopMerger(),
        scorer=ConstantScorer(0.5),
        build_budget=1,
    )
    reg = ExtensionRegistry(_configs("a", "b"), scorer_factory=build_scorer,
                            overrides={"a": custom})
    assert reg.for_queue("a") is custom
    assert isinstance(reg.for_queue("b").analyzer, PathOverlapAnalyzer)
    with pytest.raises(ValueError, match="'c'"):
        ExtensionRegistry(_configs("a"), scorer_factory=build_scorer, overrides={"c": custom})


def test_load_queues_file_missing(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ValidationError) as info:
        load_queues_file(path)
    assert str(path) in str(info.value)
    assert "SQ_QUEUES_FILE" in str(info.value)


def test_load_queues_file_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="SQ_QUEUES_FILE"):
        load_queues_file(tmp_path)


def test_load_queues_file_reports_the_path(tmp_path: Path) -> None:
    path = tmp_path / "q.yaml"
    path.write_text("queues:\n  - name: a\n    build_budget: 0\n")
    with pytest.raises(ValidationError) as info:
        load_queues_file(path)
    assert str(path) in str(info.value)
    assert "build_budget" in str(info.value)


def test_repository_queues_yaml_defines_the_demo_queue(tmp_path: Path) -> None:
    # A copy, so the sandbox repository it declares is created under tmp_path.
    shutil.copyfile(ROOT / "queues.yaml", tmp_path / "queues.yaml")
    configs = load_queues_file(tmp_path / "queues.yaml")
    assert list(configs) == ["demo", "sandbox"]
    demo = configs["demo"]
    assert demo.change_provider.type == "fake"
    assert (demo.build_runner.type, demo.build_runner.delay_ms) == ("fake", 0)
    assert demo.merger.type == "fake"
    assert (demo.conflict_analyzer.type, demo.conflict_analyzer.by) == ("pathoverlap", "directory")
    assert demo.build_budget == 4
    reg = ExtensionRegistry.from_file(tmp_path / "queues.yaml", scorer_factory=build_scorer)
    assert reg.names() == ["demo", "sandbox"]
    assert reg.for_queue("demo").build_budget == 4


# --- queues.yaml parsing -----------------------------------------------------------


def test_defaults_are_merged_under_each_queue() -> None:
    configs = parse_queues(
        """
defaults:
  build_budget: 7
  merger: {type: noop}
queues:
  - name: a
  - name: b
    build_budget: 2
"""
    )
    assert configs["a"].build_budget == 7
    assert configs["a"].merger.type == "noop"
    assert configs["b"].build_budget == 2
    assert configs["b"].merger.type == "noop"


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("queues:\n  - name: a\n    bild_budget: 3\n", ["bild_budget", "Extra inputs"]),
        ("queues:\n  - name: a\n    build_runner: {type: fake, delay: 3}\n",
         ["build_runner.delay", "Extra inputs"]),
        ("defaults: {colour: red}\nqueues:\n  - name: a\n", ["colour"]),
        ("defualts: {}\nqueues:\n  - name: a\n", ["defualts"]),
        ("queues:\n  - name: a\n  - name: a\n", ["'a'", "declared twice"]),
        ("queues:\n  - name: a\n    build_budget: 0\n", ["build_budget"]),
        ("queues:\n  - name: a\n    build_budget: 1001\n", ["build_budget"]),
        ("queues:\n  - name: a\n    build_budget: many\n", ["build_budget"]),
        ("queues:\n  - name: a\n    merger: {type: git}\n", ["merger.type"]),
        ("queues:\n  - name: a\n    scorer: {probability: 1}\n", ["scorer.probability"]),
        ("queues:\n  - name: 'bad name'\n", ["name", "letters, digits"]),
        ("queues: []\n", ["non-empty list"]),
        ("defaults: 3\nqueues:\n  - name: a\n", ["'defaults' must be a mapping"]),
        ("- a\n- b\n", ["expected a mapping"]),
        ("queues: [\n", ["not valid YAML"]),
    ],
)
def test_config_errors_name_the_problem(text: str, needles: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        parse_queues(text, source="my-queues.yaml")
    msg = str(info.value)
    assert msg.startswith("my-queues.yaml: ")
    for needle in needles:
        assert needle in msg


async def test_cancelled_build_error_reports_cancelled_not_an_error() -> None:
    clock = FakeClock(1_000_000)
    runner = FakeBuildRunner(delay_ms=100, clock=clock)
    bid = await runner.trigger(req([gh(SHA1, "sq-fake=build-error")]))
    await runner.cancel(bid)
    assert (await runner.status(bid)).status is BuildStatus.CANCELLED
