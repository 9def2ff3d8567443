"""``submitqueue`` tables (app/cli/output.py): whole cells, one line per row when piped."""

from __future__ import annotations

import pytest

from app.cli.output import print_table


def test_a_piped_table_keeps_every_row_on_one_line_and_every_cell_whole(
        capsys: pytest.CaptureFixture[str]) -> None:
    error = "merge conflict in " + "/".join(f"dir{i}" for i in range(60)) + "/[bold]x.txt"
    print_table(("REQUEST", "STATUS", "ERROR"),
                [("demo/12", "error", error), ("demo/3", "landed", "")], right=("STATUS",))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ["REQUEST", "STATUS", "ERROR"]
    assert lines[1].split()[:2] == ["demo/12", "error"] and lines[1].endswith(error)
    assert lines[2].split() == ["demo/3", "landed"]  # no trailing padding
    assert lines[1].index("error") + len("error") == lines[2].index("landed") + len("landed")
