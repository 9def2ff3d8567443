"""The fake change provider's titles and authors: the ``sq-title`` and ``sq-author``
markers, else made up from the URI; stored details without a title read back as ""."""

from __future__ import annotations

from app.domain.entities import ChangeDetails
from app.extensions.changes.fake import FakeChangeProvider

SHA = "c" * 40


async def test_titles_and_authors_from_markers_else_from_the_uri() -> None:
    git = f"git://h.example/r/refs%2Fheads%2Ffix-login_bug/{SHA}"
    uris = [f"{git}?sq-title=Fix%20the%20login%20form&sq-author=Ada%20L%20%3Cada%40x.org%3E",
            git, f"github://github.com/o/r/pull/12/{SHA}", "phab://p.example/D7/3",
            f"{git}?sq-author=grace%40x.org"]
    got = await FakeChangeProvider().get("q", uris)
    assert [(d.title, d.author_name, d.author_email) for d in got] == [
        ("Fix the login form", "Ada L", "ada@x.org"),
        ("Fix login bug", "Fake Author", "fake@example.com"),
        ("Pull request #12", "Fake Author", "fake@example.com"),
        ("Revision D7", "Fake Author", "fake@example.com"),
        ("Fix login bug", "grace@x.org", "grace@x.org"),
    ]


def test_details_round_trip_their_title_and_old_ones_have_none() -> None:
    d = ChangeDetails(uri="u", author_name="A", title="Subject")
    assert ChangeDetails.from_json("u", d.to_json()) == d
    assert ChangeDetails.from_json("u", {"author": {"name": "A"}}).title == ""
