"""`submitqueue demo` against the real app with a sandbox queue on a real git repository.

The queues file in tmp_path names ``./sandbox.git`` with ``create_sandbox: true``: the
server creates it at start-up, the demo clones it, pushes branches and lands them.
"""

from __future__ import annotations

import asyncio
import io
import re
import subprocess
from pathlib import Path
from typing import get_args

import pytest
from typer.testing import CliRunner

from app.cli.client import HistoryEntry
from app.cli.demo import DemoOptions, run_demo
from app.cli.demo_git import AUTHOR_EMAIL, AUTHOR_NAME, plan
from app.cli.root import cli
from app.cli.table import LiveTable, Row, trail
from app.domain.queue_config import BuildRunnerConfig
from app.extensions.git.cli import git_env
from tests.conftest import BACKENDS
from tests.e2e.harness import free_port, serve

pytestmark = pytest.mark.timeout(120)

FAKE_BUILDS = "{type: fake, delay_ms: 0}"
COMMAND_BUILDS = '{type: command, command: ["{python}", "sq_test.py"], timeout_s: 60}'


def queues_yaml(build_runner: str) -> str:
    return f"""\
queues:
  - name: sandbox
    change_provider: {{type: git}}
    merger: {{type: git}}
    git:
      repository: ./sandbox.git
      repo_key: sandbox.local/sandbox
      target_branch: main
      create_sandbox: true
    build_runner: {build_runner}
    conflict_analyzer: {{type: pathoverlap, by: directory}}
    default_strategy: squash_rebase
  - name: demo
    change_provider: {{type: fake}}
"""


def _runner_types() -> tuple[str, ...]:
    annotation = BuildRunnerConfig.model_fields["type"].annotation
    return tuple(get_args(annotation)) if annotation is not None else ()


HAS_COMMAND_RUNNER = "command" in _runner_types()


def sandbox_git(tmp_path: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=tmp_path / "sandbox.git",
                         env=git_env(tmp_path / "home"), capture_output=True, text=True,
                         check=True, timeout=30)
    return res.stdout.strip()


def options(url: str, tmp_path: Path, **kw: object) -> DemoOptions:
    base: dict[str, object] = {"url": url, "queues_file": tmp_path / "queues.yaml",
                               "poll_s": 0.2, "timeout_s": 90, "seed": 11}
    base.update(kw)
    return DemoOptions(**base)  # type: ignore[arg-type]


def test_plan_is_deterministic_per_seed_and_spreads_folders() -> None:
    a = plan("t", count=8, folders=3, fail=2, seed=5)
    assert [c.folder for c in a] == ["demo/01", "demo/02", "demo/03"] * 2 + ["demo/01",
                                                                             "demo/02"]
    assert [c.broken for c in a] == [c.broken for c in plan("t", count=8, folders=3, fail=2,
                                                            seed=5)]
    assert sum(c.broken for c in a) == 2
    assert len({p for c in a for p, _ in c.files}) == 16  # unique file names
    for c in a:
        has_line = any("BROKEN" in content.splitlines() for _, content in c.files)
        assert has_line == c.broken
    with pytest.raises(ValueError, match="between 0 and --count"):
        plan("t", count=2, folders=1, fail=3, seed=1)


def test_trail_and_the_live_table(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "120")  # the table fits the terminal: fix its width
    monkeypatch.setenv("LINES", "24")

    def status(name: str, t: int) -> HistoryEntry:
        return HistoryEntry(timestamp_ms=t, type="status", name=name, last_error="")

    def event(name: str, t: int) -> HistoryEntry:
        return HistoryEntry(timestamp_ms=t, type="event", name=name, last_error="")

    history = [status("accepted", 0), status("speculating", 5), status("speculating", 6),
               event("building", 7), event("building", 8), event("built", 9),
               status("landed", 1500)]
    assert trail(history) == ["accepted", "speculating", "building\u00d72", "built", "landed"]
    assert trail(history, fancy=False)[2] == "buildingx2"

    row = Row(sqid="sandbox/1", changes="#1 demo/01")
    row.history, row.status, row.received_at_ms, row.ended_at_ms = history, "landed", 0, 1500
    out = io.StringIO()
    table = LiveTable(out, tty=True, fancy=False)
    table.draw([row], "title")
    table.draw([row], "title")
    first, second = out.getvalue().split("\x1b[J")[:2]
    assert first.startswith("\x1b[2Ktitle\n")  # nothing drawn before: no rewind
    assert second.startswith("\x1b[3F")  # back over title, header and the row: in place
    assert "1.5s  landed      accepted > speculating > buildingx2 > built > landed" in second


@pytest.mark.parametrize("database_url", BACKENDS, indirect=True)
async def test_demo_lands_every_change_and_reruns_on_the_same_sandbox(
    database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "queues.yaml").write_text(queues_yaml(FAKE_BUILDS))
    async with serve(database_url, tmp_path) as server:
        out = io.StringIO()
        code = await run_demo(options(server.base_url, tmp_path, count=4, folders=2), out)
        assert code == 0, out.getvalue()
        subjects = sandbox_git(tmp_path, "log", "--format=%s", "main").splitlines()
        # changes in different folders land in any order; each once, as its own commit
        assert sorted(subjects[:4]) == [f"Demo {i}/4: add 2 files to demo/0{2 - i % 2} "
                                        f"(sandbox/{i})" for i in (1, 2, 3, 4)]
        assert subjects[4:] == ["Initial commit of the sandbox"]
        authors = sandbox_git(tmp_path, "log", "-4", "--format=%an <%ae>", "main")
        assert set(authors.splitlines()) == {f"{AUTHOR_NAME} <{AUTHOR_EMAIL}>"}
        files = sandbox_git(tmp_path, "ls-tree", "-r", "--name-only", "main", "demo")
        assert len(files.splitlines()) == 8
        text = out.getvalue()
        assert "requests: 4 landed, 0 error, 0 cancelled (expected 4 landed, 0 error)" in text
        assert "demo passed" in text

        again = io.StringIO()  # a second run on the reused sandbox: new branches, new files
        code = await run_demo(options(server.base_url, tmp_path, count=2, folders=2), again)
        assert code == 0, again.getvalue()
        assert len(sandbox_git(tmp_path, "log", "--format=%s", "main").splitlines()) == 7


async def test_stacked_demo_is_one_request_through_the_cli(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(queues_yaml(FAKE_BUILDS))
    async with serve(f"sqlite+aiosqlite:///{tmp_path}/db.sqlite", tmp_path) as server:
        r = await asyncio.to_thread(
            CliRunner().invoke, cli,
            ["demo", "--stacked", "--count", "3", "--folders", "2", "--url", server.base_url,
             "--queues-file", str(tmp_path / "queues.yaml"), "--timeout", "90"])
        assert r.exit_code == 0, r.output
        assert "one stacked request" in r.stdout
        assert "#1-#3 stack " in r.stdout
        statuses = await server.statuses_of_queue("sandbox")
        assert statuses == {"sandbox/1": "landed"}
    subjects = sandbox_git(tmp_path, "log", "-3", "--format=%s", "main").splitlines()
    assert all(s.endswith("(sandbox/1)") for s in subjects), subjects


async def test_demo_fails_when_a_broken_change_lands(tmp_path: Path) -> None:
    """With fake builds nothing runs sq_test.py, so the broken change lands: the demo
    must notice and exit 1 rather than report success."""
    (tmp_path / "queues.yaml").write_text(queues_yaml(FAKE_BUILDS))
    async with serve(f"sqlite+aiosqlite:///{tmp_path}/db.sqlite", tmp_path) as server:
        out = io.StringIO()
        opts = options(server.base_url, tmp_path, count=2, folders=1, fail=1)
        assert await run_demo(opts, out) == 1
    text = out.getvalue()
    assert "builds with the fake runner" in text
    assert "expected error, got landed" in text and "demo FAILED" in text


@pytest.mark.skipif(not HAS_COMMAND_RUNNER,
                    reason="needs the command build runner (build_runner type 'command' in "
                           "app/domain/queue_config.py); turns on by itself once it exists")
async def test_broken_changes_end_in_error_and_the_rest_land(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(queues_yaml(COMMAND_BUILDS))
    async with serve(f"sqlite+aiosqlite:///{tmp_path}/db.sqlite", tmp_path) as server:
        out = io.StringIO()
        opts = options(server.base_url, tmp_path, count=4, folders=2, fail=1)
        code = await run_demo(opts, out)
        assert code == 0, out.getvalue()
    text = out.getvalue()
    assert "requests: 3 landed, 1 error, 0 cancelled (expected 3 landed, 1 error)" in text
    # the broken change's error prints whole; any build log it names is a full URL
    expected = next(ln for ln in text.splitlines() if "ended error as expected" in ln)
    links = re.findall(r"\(failed, (\S+)\)", expected)
    assert all(re.fullmatch(re.escape(server.base_url.rstrip("/"))
                            + r"/api/v1/builds/cmd-[0-9a-f]{32}/log", u) for u in links), expected
    files = sandbox_git(tmp_path, "ls-tree", "-r", "--name-only", "main", "demo").splitlines()
    assert len(files) == 6  # three changes of two files each; the broken one is not there
    contents = [sandbox_git(tmp_path, "show", f"main:{f}") for f in files]
    assert not any("BROKEN" in c.splitlines() for c in contents)


async def test_demo_refuses_a_queue_that_is_not_git(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(queues_yaml(FAKE_BUILDS))
    out = io.StringIO()
    code = await run_demo(options(f"http://127.0.0.1:{free_port()}", tmp_path, queue="demo"),
                          out)
    assert code == 2
    assert "queue 'demo' is not a git queue" in out.getvalue()


async def test_demo_says_when_the_server_is_unreachable(tmp_path: Path) -> None:
    (tmp_path / "queues.yaml").write_text(queues_yaml(FAKE_BUILDS))
    dead = f"http://127.0.0.1:{free_port()}"
    r = await asyncio.to_thread(
        CliRunner().invoke, cli,
        ["demo", "--url", dead, "--queues-file", str(tmp_path / "queues.yaml")])
    assert r.exit_code == 2
    assert f"cannot reach the SubmitQueue server at {dead}" in r.output
    assert "Traceback" not in r.output


def test_the_summary_prints_an_expected_error_whole_with_its_log_links_openable() -> None:
    """The summary cut an error at 160 characters, halfway through its log URL; now the
    whole error prints and its server paths become full URLs."""
    from app.cli.demo import absolute_links

    err = ("no speculation path could pass; every candidate build failed; last builds: "
           "cmd-" + "9f" * 16 + " (failed, /api/v1/builds/cmd-" + "9f" * 16 + "/log), "
           "cmd-" + "ab" * 16 + " (failed, /api/v1/builds/cmd-" + "ab" * 16 + "/log)")
    out = absolute_links(err, "http://127.0.0.1:8000/")
    assert out.count("http://127.0.0.1:8000/api/v1/builds/cmd-") == 2
    assert out.endswith("ab" * 16 + "/log)")
    assert "(failed, http://127.0.0.1:8000/api/v1/builds/cmd-" + "9f" * 16 + "/log)" in out
    assert absolute_links("see http://x/api/v1/a", "http://s") == "see http://x/api/v1/a"
