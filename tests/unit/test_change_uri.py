"""Change-URI grammar: the three schemes in canonical form, markers, stacks."""

from __future__ import annotations

import pytest

from app.domain.change_uri import (
    MAX_URI_BYTES,
    parse_change_uri,
    stack_identities,
    validate_stack,
)
from app.domain.errors import ValidationError

SHA = "0123456789abcdef0123456789abcdef01234567"
GH = f"github://github.com/org/repo/pull/12/{SHA}"
PHAB = "phab://phab.example.com/D123/456"
GIT = f"git://git.example.com/team/repo/refs%2Fheads%2Fmain/{SHA}"


@pytest.mark.parametrize(
    ("uri", "scheme", "host", "repo", "ref", "sha"),
    [
        (GH, "github", "github.com", "org/repo", None, SHA),
        (f"github://ghe.example.com:8443/org/sub/repo/pull/1/{SHA}", "github",
         "ghe.example.com:8443", "org/sub/repo", None, SHA),
        (PHAB, "phab", "phab.example.com", "", None, None),
        ("phab://phab.example.com:9000/D1/1", "phab", "phab.example.com:9000", "", None, None),
        (GIT, "git", "git.example.com", "team/repo", "refs/heads/main", SHA),
        (f"git://git.example.com/repo/refs%2ftags%2Fv1.0/{SHA}", "git", "git.example.com",
         "repo", "refs/tags/v1.0", SHA),
    ],
)
def test_valid_uris_parse(
    uri: str, scheme: str, host: str, repo: str, ref: str | None, sha: str | None
) -> None:
    c = parse_change_uri(uri)
    assert (c.raw, c.scheme, c.host, c.repo, c.ref, c.sha) == (uri, scheme, host, repo, ref, sha)
    assert c.markers == {}
    assert c.fake_tokens == set()
    assert c.files == []


@pytest.mark.parametrize(
    ("uri", "needle"),
    [
        # github
        (f"github://GitHub.com/org/repo/pull/12/{SHA}", "canonical github://"),
        (f"github://github.com/org/repo/pull/12/{SHA.upper()}", "canonical github://"),
        (f"github://github.com/org/repo/pull/012/{SHA}", "canonical github://"),
        (f"github://github.com/org/repo/pull/0/{SHA}", "canonical github://"),
        (f"github://github.com/org/repo/pull/12/{SHA[:-1]}", "canonical github://"),
        (f"github://github.com/repo/pull/12/{SHA}", "canonical github://"),  # no org
        (f"github://github.com/org//repo/pull/12/{SHA}", "canonical github://"),
        (f"github://github.com/org/repo/pull/12/{SHA}/", "canonical github://"),
        # phab
        ("phab://Phab.example.com/D123/456", "canonical phab://"),
        ("phab://phab.example.com/D0123/456", "canonical phab://"),
        ("phab://phab.example.com/D123/0456", "canonical phab://"),
        ("phab://phab.example.com/d123/456", "canonical phab://"),
        ("phab://phab.example.com/D123", "canonical phab://"),
        # git
        (f"git://GIT.example.com/team/repo/refs%2Fheads%2Fmain/{SHA}", "canonical git://"),
        (f"git://git.example.com/team/repo/refs/heads/main/{SHA}", "percent-encoded"),
        (f"git://git.example.com/team/repo/heads%2Fmain/{SHA}", "canonical git://"),
        (f"git://git.example.com/team/repo/main/{SHA}", "canonical git://"),
        (f"git://git.example.com/team/repo/refs%2Fheads%2Fmain/{SHA.upper()}", "canonical"),
        (f"git://git.example.com/refs%2Fheads%2Fmain/{SHA}", "canonical git://"),  # no repo
        # scheme
        (f"https://github.com/org/repo/pull/12/{SHA}", "unknown scheme"),
        ("github.com/org/repo/pull/12", "unknown scheme"),
    ],
)
def test_non_canonical_uris_are_rejected(uri: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_change_uri(uri)
    assert needle in str(info.value)
    assert repr(uri) in str(info.value)


def test_rejects_empty_and_oversized() -> None:
    with pytest.raises(ValidationError, match="non-empty"):
        parse_change_uri("")
    long_repo = "r" * MAX_URI_BYTES
    with pytest.raises(ValidationError, match=f"longer than {MAX_URI_BYTES}"):
        parse_change_uri(f"git://h/{long_repo}/refs%2Fheads%2Fx/{SHA}")


def test_markers_are_parsed() -> None:
    c = parse_change_uri(f"{GH}?sq-fake=build-fail,merge-conflict&sq-files=a/b.py,c.py"
                         "&sq-build-ms=250")
    assert c.raw.endswith("sq-build-ms=250")
    assert c.sha == SHA
    assert c.fake_tokens == {"build-fail", "merge-conflict"}
    assert c.files == ["a/b.py", "c.py"]
    assert c.markers["sq-build-ms"] == "250"


def test_repeated_marker_keys_are_joined() -> None:
    c = parse_change_uri(f"{PHAB}?sq-fake=build-fail&sq-fake=merge-error&sq-files=x")
    assert c.fake_tokens == {"build-fail", "merge-error"}
    assert c.files == ["x"]


def test_markers_on_every_scheme() -> None:
    for base in (GH, PHAB, GIT):
        assert parse_change_uri(f"{base}?sq-fake=t").fake_tokens == {"t"}


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("foo=1", "unknown query keys ['foo']"),
        ("sq-fake=x&sq_files=a", "unknown query keys ['sq_files']"),
        ("", "empty query"),
        ("sq-build-ms=fast", "sq-build-ms must be a whole number"),
        ("sq-build-ms=-5", "sq-build-ms must be a whole number"),
    ],
)
def test_bad_queries_are_rejected(query: str, needle: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_change_uri(f"{GH}?{query}")
    assert needle in str(info.value)


def test_validate_stack_returns_parsed_in_order() -> None:
    parsed = validate_stack([GIT, GH, PHAB])
    assert [c.raw for c in parsed] == [GIT, GH, PHAB]
    assert [c.scheme for c in parsed] == ["git", "github", "phab"]


def test_validate_stack_rejects_empty() -> None:
    with pytest.raises(ValidationError, match="at least one"):
        validate_stack([])


def test_validate_stack_rejects_duplicates() -> None:
    with pytest.raises(ValidationError, match="appears twice"):
        validate_stack([GH, PHAB, GH])


def test_validate_stack_rejects_too_many() -> None:
    uris = [f"phab://p.example.com/D{n}/1" for n in range(1, 4)]
    assert len(validate_stack(uris, max_changes=3)) == 3
    with pytest.raises(ValidationError, match="at most 2 changes, got 3"):
        validate_stack(uris, max_changes=2)
    many = [f"phab://p.example.com/D{n}/1" for n in range(1, 102)]
    with pytest.raises(ValidationError, match="at most 100"):
        validate_stack(many)


def test_validate_stack_rejects_an_invalid_member() -> None:
    with pytest.raises(ValidationError, match="canonical phab://"):
        validate_stack([GH, "phab://phab.example.com/D01/1"])


# --- change identity (the claim key: one live or landed request per change) ---------


@pytest.mark.parametrize(("uri", "identity"), [
    (GIT, f"git://git.example.com/team/repo@{SHA}"),
    (f"git://git.example.com/team/repo/refs%2Fheads%2Fother/{SHA}?sq-files=a,b&sq-fake=x",
     f"git://git.example.com/team/repo@{SHA}"),  # branch and markers do not count
    (GH, f"github://github.com/org/repo@{SHA}"),
    (f"github://github.com/org/repo/pull/13/{SHA}", f"github://github.com/org/repo@{SHA}"),
    (PHAB, PHAB),
    (f"{PHAB}?sq-files=x", PHAB),
])
def test_identity_is_the_commit_or_the_diff(uri: str, identity: str) -> None:
    assert parse_change_uri(uri).identity == identity


def test_identities_tell_changes_apart() -> None:
    other_sha = "f" * 40
    distinct = [
        GIT,
        f"git://git.example.com/team/repo/refs%2Fheads%2Fmain/{other_sha}",  # new commit
        f"git://git.example.com/team/fork/refs%2Fheads%2Fmain/{SHA}",  # other repository
        f"git://git.example.com:2222/team/repo/refs%2Fheads%2Fmain/{SHA}",  # other host
        GH,  # same sha, other scheme
        "phab://phab.example.com/D123/457",  # next diff of the revision
    ]
    assert len({parse_change_uri(u).identity for u in distinct}) == len(distinct)


def test_stack_identities_refuse_one_change_twice() -> None:
    alias = f"git://git.example.com/team/repo/refs%2Fheads%2Falias/{SHA}"
    assert stack_identities([parse_change_uri(u) for u in (GIT, PHAB)]) == [
        f"git://git.example.com/team/repo@{SHA}", PHAB]
    with pytest.raises(ValidationError, match="name the same change"):
        stack_identities([parse_change_uri(u) for u in (GIT, PHAB, alias)])
    with pytest.raises(ValidationError, match="name the same change"):
        stack_identities([parse_change_uri(u) for u in (PHAB, f"{PHAB}?sq-files=a")])
