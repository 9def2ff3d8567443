"""The queue page's compact rows (pure): title, branch and author, building apart from
waiting for a build slot; the 24 h chart's fold; a build log's failing lines; a
removal in a person's words with its next steps."""

from __future__ import annotations

import pytest

from app.db.repos.views import FinishedCount
from app.domain.entities import Batch, ChangeDetails, PathEntry, SpeculationPath
from app.domain.states import Assumption, BatchState, PathStatus
from app.views import explain, logtail, rows, throughput
from app.views.trail import BuildFact, Removal

S, F = Assumption.SUCCEEDS, Assumption.FAILS
SHA = "a" * 40


def batch(n: int, state: BatchState = BatchState.SPECULATING, deps: tuple[int, ...] = ()
          ) -> Batch:
    return Batch(queue="q", id=f"q/batch/{n}", contains=(f"q/{n}",),
                 dependencies=tuple(f"q/batch/{d}" for d in deps), state=state, version=1)


def entry(head: int, deps: dict[int, Assumption], status: PathStatus) -> PathEntry:
    return PathEntry(path=SpeculationPath(
        head=f"q/batch/{head}",
        dependencies=tuple((f"q/batch/{d}", a) for d, a in deps.items())), status=status)


@pytest.mark.parametrize(("uri", "branch"), [
    (f"git://h.example/team/repo/refs%2Fheads%2Ffix%2Flogin/{SHA}?sq-files=a", "fix/login"),
    (f"git://h.example/repo/refs%2Ftags%2Fv1/{SHA}", "refs/tags/v1"),
    (f"github://github.com/org/repo/pull/12/{SHA}", "org/repo#12"),
    ("phab://phab.example/D7/3", "D7"),
])
def test_the_branch_is_read_from_the_uri_without_percent_encoding(uri: str, branch: str) -> None:
    assert rows.branch_of(uri) == branch


def test_who_is_the_first_changes_title_and_author_and_empty_before_validation() -> None:
    a = f"git://h.example/r/refs%2Fheads%2Fa/{SHA}"
    b = f"git://h.example/r/refs%2Fheads%2Fb/{'b' * 40}"
    details = [ChangeDetails(uri=b, author_name="Bo", title="Second"),
               ChangeDetails(uri=a, author_name="", author_email="ada@example.com",
                             title="First")]
    assert rows.who([a, b], details) == rows.Who("First", "a", "ada@example.com",
                                                 "ada@example.com")
    assert rows.who([a], []) == rows.Who("", "a", "", "")


def test_building_apart_from_waiting_for_a_slot_and_built() -> None:
    b1, b2, b3 = batch(1), batch(2, deps=(1,)), batch(3)
    entries = {b1.id: [entry(1, {}, PathStatus.BUILDING)],
               b2.id: [entry(2, {1: S}, PathStatus.PASSED)],
               b3.id: []}
    full = rows.slots(1, entries, [b1, b2, b3])
    assert (full.in_use, full.full, full.text) == (1, True, "1/1 in use")
    batches = rows.resolutions({b.id: b for b in (b1, b2, b3)})
    act = rows.activity
    assert act("speculating", b1, entries[b1.id], batches, full) == rows.Activity(
        "building", "building")
    assert act("speculating", b2, entries[b2.id], batches, full) == rows.Activity(
        "built", "built; waiting for the batches ahead (q/batch/1)")
    assert act("speculating", b3, [], batches, full) == rows.Activity(
        "waiting_for_slot", "waiting for a build slot (1/1 in use)")
    roomy = rows.slots(4, entries, [b1, b2, b3])
    assert act("speculating", b3, [], batches, roomy).code == "queued"
    assert act("incoming", None, [], batches, roomy).code == "validating"
    # a path a settled batch contradicts holds no promise: b2 assumed b1 lands, b1 failed
    failed = rows.resolutions({b.id: b for b in (batch(1, BatchState.FAILED), b2, b3)})
    assert act("speculating", b2, entries[b2.id], failed, full).code == "waiting_for_slot"
    merging = batch(3, BatchState.MERGING)
    assert act("speculating", merging, [], batches, full).code == "landing"


def test_slots_count_only_active_batches_live_paths() -> None:
    b1 = batch(1)
    entries = {b1.id: [entry(1, {}, PathStatus.BUILDING), entry(1, {}, PathStatus.CANCELLING),
                       entry(1, {}, PathStatus.FAILED)],
               "q/batch/9": [entry(9, {}, PathStatus.BUILDING)]}  # not active: not counted
    assert rows.slots(4, entries, [b1]).in_use == 2


def test_the_chart_counts_per_hour_and_the_mean_wait_to_land() -> None:
    since, until = throughput.window(10 * throughput.BUCKET_MS + 5)
    assert until == 11 * throughput.BUCKET_MS and until - since == 24 * throughput.BUCKET_MS
    out = throughput.fold([
        FinishedCount(0, "landed", 2, 6000, 4000), FinishedCount(0, "error", 1, 50, 50),
        FinishedCount(23, "landed", 1, 1000, 1000), FinishedCount(23, "cancelled", 3, 9, 5),
        FinishedCount(24, "landed", 9, 9, 9),  # outside the window: ignored
    ], since_ms=since, until_ms=until)
    assert len(out.buckets) == 24 and out.buckets[1].landed == 0
    first, last = out.buckets[0], out.buckets[23]
    assert (first.landed, first.failed, first.mean_wait_ms, first.max_wait_ms) == (
        2, 1, 3000, 4000)
    assert (last.landed, last.cancelled, last.start_ms) == (
        1, 3, since + 23 * throughput.BUCKET_MS)
    assert (out.landed, out.failed, out.cancelled, out.mean_wait_ms) == (3, 1, 3, 2333)
    assert out.buckets[5].mean_wait_ms is None


def test_the_excerpt_is_the_tail_around_the_first_failure() -> None:
    log = "\n".join([f"line {i}" for i in range(1, 31)] + [
        "[sq] exit code 1", "FAILED tests/test_a.py::test_x - assert 1 == 2",
        "E   assert 1 == 2", *[f"after {i}" for i in range(1, 30)]]) + "\n\n"
    ex = logtail.excerpt(log)
    assert ex is not None and ex.first_failure == 32  # not the runner's own line 31
    assert ex.lines[0].n == 32 - logtail.BEFORE and ex.lines[-1].n == 32 + logtail.AFTER
    failing = [x.n for x in ex.lines if x.failing]
    assert failing == [32, 33]
    assert ex.total_lines == 62


def test_without_a_failure_line_the_excerpt_is_the_tail_and_long_lines_are_cut() -> None:
    ex = logtail.excerpt("\n".join(f"ok {i}" for i in range(100)) + "\n" + "x" * 1000)
    assert ex is not None and ex.first_failure is None
    assert len(ex.lines) == logtail.TAIL and ex.lines[-1].n == 101
    assert len(ex.lines[-1].text) == logtail.MAX_LINE_CHARS
    assert not any(x.failing for x in ex.lines)
    assert logtail.excerpt("\n \n") is None
    only_runner = logtail.excerpt("building\n[sq] exit code 2\n")
    assert only_runner is not None and only_runner.first_failure == 2


def test_a_build_failure_is_told_in_requests_not_paths() -> None:
    b1, b2, b3 = batch(1), batch(2), batch(3, deps=(1, 2))
    batches = {b.id: b for b in (b1, b2, b3)}
    assumptions = {"p-alone": (), "p-on": (("q/batch/1", S), ("q/batch/2", F)),
                   "p-both": (("q/batch/1", S), ("q/batch/2", S))}
    planner = Removal("build_failed", "Its build failed on path p-alone (...)", ())
    one = explain.build_failed(planner, [explain.FailedBuild("b9", "p-on", "/log/b9")],
                               assumptions, batches, "q/3", "main")
    assert one.text == ("Its build failed when tested on main together with q/1, which was "
                        "ahead of it, and without q/2, so it was taken out of the queue.")
    assert [(e.label, e.url) for e in one.evidence] == [
        ("log of build b9 (tested on main together with q/1, which was ahead of it, and "
         "without q/2)", "/log/b9")]
    many = explain.build_failed(planner, [explain.FailedBuild("b1", "p-alone", None),
                                          explain.FailedBuild("b2", "p-both", None)],
                                assumptions, batches, "q/3", "main")
    assert many.text == ("All 2 builds of it failed (on main alone; on main together with "
                         "q/1 and q/2, which were ahead of it), so no way of landing it was "
                         "left and it was taken out of the queue.")
    assert "its runner published no log" in many.evidence[0].label
    assert "path" not in one.text + many.text and "batch" not in one.text + many.text


def test_failed_builds_come_from_the_table_then_the_history() -> None:
    from tests.unit.test_view_trail import ev

    facts = [BuildFact("b1", "p1", "failed", "/l/b1"), BuildFact("b2", "p2", "succeeded")]
    history = [ev(1, "building", build_id="b3", build_status="failed", path_id="p3",
                  build_url="javascript:x"), ev(2, "building", build_id="b1",
                                                build_status="failed")]
    assert explain.failed_builds(history, facts) == [
        explain.FailedBuild("b1", "p1", "/l/b1"), explain.FailedBuild("b3", "p3", None)]


def test_every_removal_says_what_to_do_next() -> None:
    for kind in ("merge_conflict", "cancelled", "dead_lettered", "dependency_unavailable",
                 "duplicate", "rejected", "error", "something new"):
        assert explain.next_steps(Removal(kind, "x"))
    failed = Removal("build_failed", "x")
    assert explain.next_steps(failed, has_log=True)[0].startswith(
        "Read the failing lines of the log above")
    assert len(explain.next_steps(failed, alone_failed=False)) == 2
    assert len(explain.next_steps(failed, alone_failed=True)) == 1
