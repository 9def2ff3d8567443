"""The sandbox repository's test (seeded as ``sq_test.py`` at its root; stdlib only).

Run from the root of a tree: prints every file it checks (``checked: <relative
path>``, sorted, one per line), then fails (exit 1) naming each file that has a line
that is exactly ``BROKEN``, or passes (exit 0) with ``ok: <n> files``. A demo "breaks"
a change by adding a file containing such a line.
"""

from __future__ import annotations

import os
import sys

MARKER = "BROKEN"


def tree_files(root: str) -> list[str]:
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            if name == ".git" and folder == root:  # a worktree's link to its repository
                continue
            rel = os.path.relpath(os.path.join(folder, name), root)
            found.append(rel.replace(os.sep, "/"))
    return sorted(found)


def is_broken(path: str) -> bool:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return any(line.rstrip("\r\n") == MARKER for line in fh)


def main(root: str = ".") -> int:
    files = tree_files(root)
    broken = []
    for rel in files:
        print(f"checked: {rel}")
        if is_broken(os.path.join(root, rel)):
            broken.append(rel)
    if broken:
        print(f"FAILED: a line that is exactly {MARKER} in: {', '.join(broken)}")
        return 1
    print(f"ok: {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
