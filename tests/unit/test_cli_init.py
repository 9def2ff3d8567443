"""``submitqueue init``: a commented queues.yaml and a .env that the server accepts, never
over files that exist unless ``--force``; and ``app.resources`` finding what it writes
from (the bundled copy first, the checkout's only in a checkout)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from app.cli.init import QUEUES_YAML, env_text, init_command
from app.domain.queue_config import parse_queues
from app.resources import NAMES, ResourceMissing, resource
from app.settings import Settings

ROOT = Path(__file__).resolve().parents[2]


def run_init(*args: str) -> tuple[int, str, str]:
    app = typer.Typer()
    app.command()(init_command)
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_init_writes_a_demo_queue_on_fakes_and_an_env_the_server_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SQ_ADMIN_TOKEN", raising=False)  # the .env's value, not the caller's
    code, out, err = run_init(str(tmp_path))
    assert (code, err) == (0, ""), err
    assert out.splitlines()[:2] == [f"wrote {tmp_path / 'queues.yaml'}",
                                    f"wrote {tmp_path / '.env'}"]
    assert f"cd {tmp_path} && submitqueue serve" in out
    queues = parse_queues((tmp_path / "queues.yaml").read_text(), base_dir=tmp_path)
    demo = queues["demo"]
    assert list(queues) == ["demo"]
    assert {demo.change_provider.type, demo.build_runner.type, demo.merger.type} == {"fake"}
    assert (tmp_path / "queues.yaml").read_text().count("\n#") >= 3  # commented
    settings = Settings(_env_file=tmp_path / ".env")  # type: ignore[call-arg]
    label, _, secret = (settings.admin_token or "").partition(":")
    assert label == "admin" and len(secret) >= 40
    assert (tmp_path / ".env").stat().st_mode & 0o077 == 0  # a secret: private to its owner
    # every other setting is the example's default, comments included
    example = resource(".env.example").read_text().splitlines()
    written = (tmp_path / ".env").read_text().splitlines()[2:]
    assert [a for a, b in zip(example, written, strict=True) if a != b] == ["SQ_ADMIN_TOKEN="]


def test_each_init_generates_its_own_secret(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert run_init(str(tmp_path / "a"))[0] == run_init(str(tmp_path / "b"))[0] == 0
    assert (tmp_path / "a" / ".env").read_text() != (tmp_path / "b" / ".env").read_text()


@pytest.mark.parametrize("existing", [["queues.yaml"], [".env"], ["queues.yaml", ".env"]])
def test_init_refuses_to_overwrite_without_force(tmp_path: Path, existing: list[str]) -> None:
    for name in existing:
        (tmp_path / name).write_text("mine\n")
    code, out, err = run_init(str(tmp_path))
    names = " and ".join(existing)
    verb = "exists" if len(existing) == 1 else "exist"
    assert (code, out) == (1, "")
    assert err == f"submitqueue init: {names} already {verb} in {tmp_path}; pass --force " \
                  "to overwrite\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(existing)  # nothing written
    assert all((tmp_path / name).read_text() == "mine\n" for name in existing)
    code, _, err = run_init(str(tmp_path), "--force")
    assert (code, err) == (0, "")
    assert (tmp_path / "queues.yaml").read_text() == QUEUES_YAML
    assert (tmp_path / ".env").read_text().count("SQ_ADMIN_TOKEN=admin:") == 1


def test_init_into_a_missing_folder_is_one_line(tmp_path: Path) -> None:
    code, out, err = run_init(str(tmp_path / "nope"))
    assert (code, out, err) == (1, "", f"submitqueue init: {tmp_path / 'nope'} is not a folder\n")


def test_env_text_needs_the_empty_admin_token_line() -> None:
    assert "SQ_ADMIN_TOKEN=admin:s3cret\n" in env_text("A=1\nSQ_ADMIN_TOKEN=\nB=2\n", "s3cret")
    with pytest.raises(ValueError, match="no empty SQ_ADMIN_TOKEN= line"):
        env_text("SQ_ADMIN_TOKEN=set-already\n", "s3cret")


def test_resource_prefers_the_bundle_then_a_checkout_then_says_what_is_missing(
    tmp_path: Path,
) -> None:
    bundle, checkout = tmp_path / "site" / "app" / "_bundle", tmp_path / "src"
    (checkout / "frontend-static").mkdir(parents=True)
    # no pyproject.toml beside app/: not a checkout (e.g. site-packages/alembic is the library)
    with pytest.raises(ResourceMissing, match="frontend-static is missing from this install"):
        resource("frontend-static", bundle_dir=bundle, checkout_dir=checkout)
    (checkout / "pyproject.toml").write_text("")
    assert resource("frontend-static", bundle_dir=bundle,
                    checkout_dir=checkout) == checkout / "frontend-static"
    (bundle / "frontend-static").mkdir(parents=True)
    assert resource("frontend-static", bundle_dir=bundle,
                    checkout_dir=checkout) == bundle / "frontend-static"
    with pytest.raises(ValueError, match="unknown resource 'nope'"):
        resource("nope")


def test_in_the_checkout_every_resource_is_the_checkouts_own() -> None:
    assert {name: resource(name) for name in NAMES} == {name: ROOT / name for name in NAMES}
