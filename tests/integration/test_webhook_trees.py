"""The webhook runner with a repository: the queue makes the build's tree, pushes it to
``refs/sq/builds/<build id>``, sends its sha / tree / base in the signed trigger, and
accepts a verdict only for that sha."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from app.db.repos.build_runs import SqlBuildStore
from app.domain.errors import InvalidState
from app.domain.states import BuildStatus, LandStrategy
from app.extensions.base import BuildRequest, MergeStep
from app.extensions.builds.signature import SIGNATURE_HEADER, sign
from app.extensions.builds.webhook import WebhookBuildRunner
from app.extensions.git.publish import TreePublisher, build_ref
from tests.ci_standin import CI, SECRET, running_ci
from tests.conftest import BACKENDS
from tests.support.gitremote import KEY, Remote, uri

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.parametrize("database_url", BACKENDS, indirect=True)]


@pytest.fixture
async def ci() -> AsyncIterator[CI]:
    async with running_ci() as service:
        yield service


def request(*uris: str, strategy: LandStrategy = LandStrategy.SQUASH_REBASE) -> BuildRequest:
    return BuildRequest(queue="ciq", batch_id="ciq/batch/1", path_id="p1", attempt=1,
                        base_changes=(), head_changes=uris, batch_created_at_ms=1,
                        steps=(MergeStep("ciq/1", uris, strategy),))


def signed_report(build_id: str, body: dict[str, object]) -> tuple[bytes, str]:
    raw = json.dumps(body).encode()
    return raw, sign(SECRET.encode(), build_id, raw, t=int(time.time()))


async def test_the_queue_ref_is_pushed_and_only_its_sha_gets_a_verdict(
    ci: CI, store: SqlBuildStore, tmp_path: Path
) -> None:
    remote = Remote(tmp_path)
    head = remote.commit("feature", {"f.txt": "1\n"}, "a feature", base="main")
    tip = remote.main()
    publisher = TreePublisher({KEY: f"file://{remote.bare}"}, "main", tmp_path / "pub")
    runner = WebhookBuildRunner(queue="ciq", url=ci.url, secret=SECRET,
                                public_url="https://sq.example", store=store,
                                publisher=publisher)
    req = request(uri("feature", head))
    build_id = await runner.trigger(req)
    [(body, headers)] = ci.received
    sent = json.loads(body)
    assert SIGNATURE_HEADER.lower() in headers and ci.refused == []
    assert sent["ref"] == build_ref(build_id) == f"refs/sq/builds/{build_id}"
    assert sent["base"] == tip
    # the CI can fetch exactly that commit; it is the squash the merger would make
    assert remote.bare_git("rev-parse", sent["ref"]) == sent["sha"]
    assert remote.bare_git("rev-parse", f"{sent['sha']}^{{tree}}") == sent["tree"]
    assert remote.bare_git("log", "-1", "--format=%s", sent["sha"]) == "a feature (ciq/1)"
    # a trigger sent again carries the same tree (made once)
    await runner.trigger(req)
    assert json.loads(ci.received[-1][0])["sha"] == sent["sha"]
    # a verdict without the sha, or for another commit, is not this build's
    for wrong in ({"status": "succeeded"}, {"status": "succeeded", "sha": "0" * 40}):
        raw, sig = signed_report(build_id, wrong)
        with pytest.raises(InvalidState, match=sent["sha"]):
            await runner.accept_callback(build_id, raw, sig)
    raw, sig = signed_report(build_id, {"status": "succeeded", "sha": sent["sha"]})
    await runner.accept_callback(build_id, raw, sig)
    report = await runner.status(build_id)
    assert report.status is BuildStatus.SUCCEEDED and report.tested is not None
    assert (report.tested.commit, report.tested.tree, report.tested.base) == (
        sent["sha"], sent["tree"], tip)


async def test_changes_that_do_not_combine_fail_before_anything_is_sent(
    ci: CI, store: SqlBuildStore, tmp_path: Path
) -> None:
    remote = Remote(tmp_path)
    one = remote.commit("one", {"a.txt": "mine\n"}, "one", base="main")
    two = remote.commit("two", {"a.txt": "theirs\n"}, "two", base="main")
    publisher = TreePublisher({KEY: f"file://{remote.bare}"}, "main", tmp_path / "pub")
    runner = WebhookBuildRunner(queue="ciq", url=ci.url, secret=SECRET,
                                public_url="https://sq.example", store=store,
                                publisher=publisher)
    build_id = await runner.trigger(request(uri("one", one), uri("two", two),
                                            strategy=LandStrategy.REBASE))
    assert ci.received == []
    report = await runner.status(build_id)
    assert report.status is BuildStatus.FAILED and "merge conflict in a.txt" in report.detail
