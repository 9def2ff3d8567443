"""``Memo``: a row is parsed again exactly when one of its columns changed."""

from __future__ import annotations

from typing import Any

from app.db.memo import Memo


def decode(row: Any) -> dict[str, Any]:
    return {"id": row[0], "value": row[1]}


def test_an_unchanged_row_is_not_parsed_again_and_a_changed_one_is() -> None:
    memo: Memo[dict[str, Any]] = Memo()
    first = memo.get("a", ("a", "v1", 1), decode)
    memo.fresh()
    assert memo.get("a", ("a", "v1", 1), decode) is first
    assert memo.decoded == 1
    # the same version with other contents (a rewritten row, a database restored under
    # the process) is read as stored
    changed = memo.get("a", ("a", "v2", 1), decode)
    assert changed == {"id": "a", "value": "v2"} and memo.decoded == 2


def test_rows_not_read_for_a_whole_round_are_forgotten() -> None:
    memo: Memo[dict[str, Any]] = Memo()
    memo.get("a", ("a", 1), decode)
    memo.get("b", ("b", 1), decode)
    memo.fresh()
    memo.get("a", ("a", 1), decode)  # b not read in this round
    memo.fresh()
    memo.get("b", ("b", 1), decode)
    assert memo.decoded == 3
    memo.fresh()
    memo.fresh()  # a round that read nothing keeps what the one before held
    memo.get("b", ("b", 1), decode)
    assert memo.decoded == 3
