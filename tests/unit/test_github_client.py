"""The GitHub client (``app/extensions/github/client.py``) against the fake GitHub over an
in-process ASGI transport: the pinned API version, token and GitHub App auth (a real
RS256 JWT the fake verifies, an installation token cached across calls), a GHES base
URL, and how GitHub's failures are classified. The ``github`` block's validation too."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from app.domain.errors import ValidationError
from app.domain.github_config import GitHubConfig
from app.extensions.github.client import (
    Credentials,
    GitHubClient,
    GitHubNotFound,
    GitHubUnavailable,
    credentials,
)
from app.extensions.github.fake import FakeGitHub, app_key_pair
from app.queue.classify import classify

API = "http://fake-github.test"


def _config(**kw: object) -> GitHubConfig:
    return GitHubConfig.model_validate({"repository": "acme/widgets", "api_url": API,
                                        "token_env": "SQ_TEST_GH_TOKEN", **kw})


def _client(fake: FakeGitHub, config: GitHubConfig, creds: Credentials) -> GitHubClient:
    fake.base_url = config.api_url
    return GitHubClient(config, creds, transport=httpx.ASGITransport(app=fake.app))


@pytest.fixture
def fake(tmp_path: Path) -> FakeGitHub:
    return FakeGitHub(tmp_path / "widgets.git")


async def test_every_call_sends_the_pinned_api_version(fake: FakeGitHub) -> None:
    pull = fake.open_pull({"a.txt": "1\n"}, title="One")
    client = _client(fake, _config(), Credentials(token="fake-token"))
    got = await client.pull(pull.number)
    assert (got.number, got.head.sha, got.title) == (1, pull.head_sha, "One")
    assert [f.filename for f in await client.files(1)] == ["a.txt"]
    assert await client.reviews(1) == []
    assert fake.api_versions == ["2022-11-28"] * 3


async def test_a_refused_token_is_retryable_and_says_what_to_fix(fake: FakeGitHub) -> None:
    fake.open_pull({"a.txt": "1\n"})
    client = _client(fake, _config(), Credentials(token="wrong"))
    with pytest.raises(GitHubUnavailable, match="credentials were refused") as info:
        await client.pull(1)
    assert classify(info.value)


async def test_missing_pull_request_is_not_found_not_retryable(fake: FakeGitHub) -> None:
    client = _client(fake, _config(), Credentials(token="fake-token"))
    with pytest.raises(GitHubNotFound) as info:
        await client.pull(99)
    assert not classify(info.value)


@pytest.mark.parametrize("status", [500, 502, 429])
async def test_server_errors_are_retryable(status: int) -> None:
    transport = httpx.MockTransport(lambda r: httpx.Response(status, json={"message": "x"}))
    client = GitHubClient(_config(), Credentials(token="t"), transport=transport)
    with pytest.raises(GitHubUnavailable) as info:
        await client.pull(1)
    assert classify(info.value)


async def test_unreachable_github_is_retryable() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    client = GitHubClient(_config(), Credentials(token="t"), transport=httpx.MockTransport(refuse))
    with pytest.raises(GitHubUnavailable, match="could not be reached") as info:
        await client.pull(1)
    assert classify(info.value)


async def test_github_app_trades_a_jwt_for_a_cached_installation_token(tmp_path: Path) -> None:
    private, public = app_key_pair()
    fake = FakeGitHub(tmp_path / "w.git", app_id=4242, app_public_key=public,
                      installation_id=77)
    fake.open_pull({"a.txt": "1\n"})
    config = _config(token_env="", app_id=4242, private_key_env="SQ_TEST_GH_KEY")
    client = _client(fake, config, Credentials(app_id=4242, private_key=private))
    assert (await client.pull(1)).number == 1
    assert (await client.pull(1)).number == 1
    assert len(fake.installation_tokens) == 1  # looked up once, then cached
    wrong, _ = app_key_pair()  # a key GitHub does not know: the JWT does not verify
    other = _client(fake, config, Credentials(app_id=4242, private_key=wrong))
    with pytest.raises(GitHubUnavailable):
        await other.pull(1)


async def test_ghes_api_url_with_a_path(tmp_path: Path) -> None:
    fake = FakeGitHub(tmp_path / "w.git", prefix="/api/v3")
    fake.open_pull({"a.txt": "1\n"})
    client = _client(fake, _config(api_url=f"{API}/api/v3/"), Credentials(token="fake-token"))
    assert (await client.pull(1)).number == 1


async def test_permission_levels_and_strangers(fake: FakeGitHub) -> None:
    fake.permissions.update({"mona": "write", "tri": "triage", "boss": "admin"})
    client = _client(fake, _config(), Credentials(token="fake-token"))
    assert [await client.permission(u) for u in ("mona", "tri", "boss", "nobody")] == \
        ["write", "triage", "admin", "none"]


def test_credentials_come_from_the_named_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SQ_TEST_GH_TOKEN", " tok \n")
    assert credentials(_config(), "q").token == "tok"
    monkeypatch.delenv("SQ_TEST_GH_TOKEN")
    with pytest.raises(ValidationError, match="SQ_TEST_GH_TOKEN, which is not set"):
        credentials(_config(), "q")
    app = _config(token_env="", app_id=1, private_key_env="SQ_TEST_GH_KEY", installation_id=9)
    monkeypatch.setenv("SQ_TEST_GH_KEY", "PEM")
    assert credentials(app, "q") == Credentials(app_id=1, private_key="PEM", installation_id=9)


@pytest.mark.parametrize(("block", "message"), [
    ({"repository": "widgets", "token_env": "T"}, "must be 'owner/repo'"),
    ({"repository": "a/b"}, "set token_env"),
    ({"repository": "a/b", "token_env": "T", "app_id": 1, "private_key_env": "K"},
     "either token_env or app_id"),
    ({"repository": "a/b", "app_id": 1}, "needs both app_id and private_key_env"),
    ({"repository": "a/b", "token_env": "ghp_secret-value"}, "must name an environment"),
    ({"repository": "a/b", "token_env": "T", "installation_id": 3}, "GitHub App only"),
    ({"repository": "a/b", "token_env": "T", "api_url": "api.github.com"}, r"http\(s\) address"),
    ({"repository": "a/b", "token_env": "T", "host": "GitHub.com"}, "lowercase host"),
    ({"repository": "a/b", "token_env": "T", "land_label": ""}, "1-50 printable"),
])
def test_github_block_errors_say_what_to_do(block: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GitHubConfig.model_validate(block)
