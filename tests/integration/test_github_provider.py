"""The ``github`` change provider against the fake GitHub (a real bare repository served
on a loopback port): details of a pull request (author, title, every changed file with
its additions and deletions, paged), and each refusal with a reason that says what to
do. Also how a queue configures it in ``queues.yaml``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.domain.errors import ValidationError
from app.domain.github_config import GitHubConfig
from app.domain.queue_config import parse_queues
from app.extensions.base import ChangeRejected
from app.extensions.factory import build_extensions
from app.extensions.git.cli import resolve_change
from app.extensions.github.client import Credentials, GitHubClient
from app.extensions.github.fake import FakeGitHub
from app.extensions.github.provider import GitHubChangeProvider, review_decision
from app.speculation.scoring import build_scorer
from tests.support.fake_github import serve_fake_github


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeGitHub]:
    with serve_fake_github(tmp_path / "widgets.git") as served:
        yield served


def provider(fake: FakeGitHub, **kw: object) -> GitHubChangeProvider:
    config = GitHubConfig.model_validate({"repository": "acme/widgets", "token_env": "T",
                                          "api_url": fake.base_url, **kw})
    return GitHubChangeProvider(config, GitHubClient(config, Credentials(token="fake-token")))


def uri(number: int, sha: str) -> str:
    return f"github://github.com/acme/widgets/pull/{number}/{sha}"


async def test_reads_author_title_and_changed_files(fake: FakeGitHub) -> None:
    base = fake.tip()
    main = fake.repo.commit(base, {"src/old.py": "".join(f"line {i}\n" for i in range(20))},
                            "Add old")
    fake.repo.set_ref("refs/heads/main", main)
    pull = fake.open_pull({"src/new.py": "".join(f"line {i}\n" for i in range(20)) + "x\n",
                           "src/old.py": None, "README.md": "# changed\n"},
                          title="Rename old to new", author="mona")
    [got] = await provider(fake).get("q", [uri(1, pull.head_sha)])
    assert (got.author_name, got.title) == ("mona", "Rename old to new")
    assert {(f.path, f.lines_added, f.lines_deleted) for f in got.changed_files} == {
        ("src/new.py", 1, 0), ("README.md", 1, 1)}  # the rename under its new path


async def test_many_files_are_read_page_by_page(fake: FakeGitHub) -> None:
    pull = fake.open_pull({f"pkg/{i:03}.txt": "a\nb\n" for i in range(230)})
    [got] = await provider(fake).get("q", [uri(1, pull.head_sha)])
    assert len(got.changed_files) == 230
    assert sum(f.lines_added for f in got.changed_files) == 460


async def test_a_head_that_moved_is_stale(fake: FakeGitHub) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    pinned = pull.head_sha
    new = fake.push(1, {"a.txt": "2\n"})
    with pytest.raises(ChangeRejected, match=f"^stale: pull request #1's head is now {new}"):
        await provider(fake).get("q", [uri(1, pinned)])
    assert (await provider(fake).get("q", [uri(1, new)]))[0].uri == uri(1, new)


@pytest.mark.parametrize(("setup", "message"), [
    (lambda f: setattr(f.pulls[1], "draft", True), "is a draft; mark it ready for review"),
    (lambda f: setattr(f.pulls[1], "state", "closed"), "is closed; reopen it"),
    (lambda f: (setattr(f.pulls[1], "state", "closed"), setattr(f.pulls[1], "merged", True)),
     "already merged"),
    (lambda f: (f.repo.set_ref("refs/heads/release", f.tip()),
                setattr(f.pulls[1], "base_ref", "release")), "targets 'release'"),
    (lambda f: setattr(f.pulls[1], "mergeable_override", False), "conflicts with 'main'; rebase"),
    (lambda f: f.review(1, "mona", "CHANGES_REQUESTED"), "has changes requested"),
])
async def test_refusals_say_what_to_do(fake: FakeGitHub, setup: object, message: str) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    setup(fake)  # type: ignore[operator]
    with pytest.raises(ChangeRejected, match=message):
        await provider(fake).get("q", [uri(1, pull.head_sha)])


async def test_a_real_conflict_with_the_base_is_refused(fake: FakeGitHub) -> None:
    pull = fake.open_pull({"README.md": "theirs\n"})
    ours = fake.repo.commit(fake.tip(), {"README.md": "ours\n"}, "Edit README on main")
    fake.repo.set_ref("refs/heads/main", ours)
    with pytest.raises(ChangeRejected, match="conflicts with 'main'"):
        await provider(fake).get("q", [uri(1, pull.head_sha)])


async def test_approval_when_the_queue_requires_it(fake: FakeGitHub) -> None:
    pull = fake.open_pull({"a.txt": "1\n"})
    strict = provider(fake, require_approval=True)
    with pytest.raises(ChangeRejected, match="not approved and this queue requires"):
        await strict.get("q", [uri(1, pull.head_sha)])
    assert await provider(fake).get("q", [uri(1, pull.head_sha)])  # not required: fine
    fake.review(1, "mona", "APPROVED")
    assert await strict.get("q", [uri(1, pull.head_sha)])


def test_review_decision_follows_each_reviewers_latest_review() -> None:
    assert review_decision([]) == "review_required"
    assert review_decision([("a", "COMMENTED")]) == "review_required"
    assert review_decision([("a", "APPROVED"), ("b", "COMMENTED")]) == "approved"
    assert review_decision([("a", "CHANGES_REQUESTED"), ("a", "APPROVED")]) == "approved"
    assert review_decision([("a", "APPROVED"), ("b", "CHANGES_REQUESTED")]) == \
        "changes_requested"
    assert review_decision([("a", "APPROVED"), ("a", "DISMISSED")]) == "review_required"


async def test_unknown_pull_requests_and_other_repositories(fake: FakeGitHub) -> None:
    with pytest.raises(ChangeRejected, match="#9 of acme/widgets was not found"):
        await provider(fake).get("q", [uri(9, "a" * 40)])
    with pytest.raises(ChangeRejected, match="not a pull request of acme/widgets"):
        await provider(fake).get("q", [f"github://github.com/acme/other/pull/1/{'a' * 40}"])
    with pytest.raises(ChangeRejected, match="not a pull request of acme/widgets"):
        await provider(fake).get("q", [f"git://h/r/refs%2Fheads%2Fx/{'a' * 40}"])
    with pytest.raises(ChangeRejected, match="canonical github"):
        await provider(fake).get("q", ["github://github.com/acme/widgets/pull/01/x"])


async def test_a_stack_of_pull_requests_in_order(fake: FakeGitHub) -> None:
    one = fake.open_pull({"a.txt": "1\n"}, title="One")
    two = fake.open_pull({"b.txt": "1\n"}, title="Two")
    got = await provider(fake).get("q", [uri(2, two.head_sha), uri(1, one.head_sha)])
    assert [d.title for d in got] == ["Two", "One"]


QUEUE = """
queues:
  - name: gh
    change_provider: {type: github}
    github: {repository: acme/widgets, token_env: SQ_TEST_GITHUB_TOKEN, api_url: URL}
"""


def test_configured_per_queue_with_the_token_by_variable_name(
        fake: FakeGitHub, monkeypatch: pytest.MonkeyPatch) -> None:
    [config] = parse_queues(QUEUE.replace("URL", fake.base_url)).values()
    monkeypatch.delenv("SQ_TEST_GITHUB_TOKEN", raising=False)
    with pytest.raises(ValidationError, match=r"github\.token_env names the environment variable "
                                              r"SQ_TEST_GITHUB_TOKEN, which is not set"):
        build_extensions(config, build_scorer)
    monkeypatch.setenv("SQ_TEST_GITHUB_TOKEN", "fake-token")
    ext = build_extensions(config, build_scorer)
    assert isinstance(ext.provider, GitHubChangeProvider)


@pytest.mark.parametrize(("text", "message"), [
    ("queues: [{name: gh, change_provider: {type: github}}]",
     "change_provider.type github needs a 'github' block"),
    ("queues: [{name: gh, github: {repository: acme/widgets}}]", "set token_env"),
    ("queues: [{name: gh, change_provider: {type: github}, merger: {type: github}}]",
     "change_provider.type github and merger.type github need a 'github' block"),
    ("queues: [{name: gh, merger: {type: github}, github: {repository: a/b, token_env: T}}]",
     "merger.type github needs a 'git' block"),
    ("queues: [{name: gh, build_runner: {type: github_checks, checks: [' ']}}]",
     "build_runner checks must be check names"),
    ("queues: [{name: gh, build_runner: {type: github_checks, checks: [t], command: [x]}}]",
     "build_runner type github_checks takes no command"),
    ("queues: [{name: gh, build_runner: {type: github_checks, checks: [t]}}]",
     "build_runner.type github_checks needs a 'github' block"),
    ("queues: [{name: gh, github: {repository: a/b, token_env: T, colour: red}}]",
     "github.colour: Extra inputs are not permitted"),
])
def test_config_errors_are_one_clear_line(text: str, message: str) -> None:
    with pytest.raises(ValidationError, match=message) as info:
        parse_queues(text)
    assert "\n" not in str(info.value)


def test_the_git_code_reads_a_pull_request_as_its_head_ref() -> None:
    """The git merger and runners land github:// changes through refs/pull/<n>/head."""
    sha = "a" * 40
    repos = {"github.com/acme/widgets": "/srv/widgets.git"}
    change = resolve_change(f"github://github.com/acme/widgets/pull/12/{sha}?sq-title=x", repos)
    assert (change.key, change.ref, change.sha, change.location) == (
        "github.com/acme/widgets", "refs/pull/12/head", sha, "/srv/widgets.git")
    with pytest.raises(ChangeRejected, match="does not know"):
        resolve_change(f"github://github.com/acme/other/pull/1/{sha}", repos)
    with pytest.raises(ChangeRejected, match=r"not a git:// change.* or github://"):
        resolve_change("phab://phab.example.com/D1/2", repos)
    with pytest.raises(ChangeRejected, match=r"not a git:// change; .*\{sha\} changes only"):
        resolve_change(f"github://github.com/acme/widgets/pull/12/{sha}", repos, github=False)
