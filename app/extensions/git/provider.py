"""A change provider for plain git repositories (local paths, ``file://`` or any git URL).

Change URIs: ``git://{host}/{repo}/{percent-encoded full ref}/{40-hex sha}``; the
``{host}/{repo}`` key must be configured in ``repos`` (key -> path or URL).

Per call, under the mirror's lock: fetch the target branch and every change's ref into
our own bare mirror; each ref must still point at the pinned SHA (else the change is
rejected as stale). Changed files come from ``git diff --numstat -M`` against the merge
base with the target (first change of a stack) or the previous change (later ones);
binary files count 0 lines; a rename is reported under its new path. The author and
the title (the subject line) are the pinned commit's.

Rejected (``ChangeRejected``): a non-git URI, an unknown repository, an unsafe ref, a
ref that no longer exists or has moved. Git or network failures propagate (retryable).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from app.domain.entities import ChangeDetails, ChangedFile
from app.extensions.base import ChangeRejected
from app.extensions.git.cli import (
    DEFAULT_TIMEOUT,
    EMPTY_TREE,
    GitChange,
    GitMirror,
    mirror_name,
    repo_url,
    resolve_change,
)
from app.extensions.git.locking import mirror_lock


class GitChangeProvider:
    def __init__(
        self,
        repos: Mapping[str, str],
        target_branch: str,
        mirror_dir: Path,
        *,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self.repos = dict(repos)
        self.target_branch = target_branch
        self.mirror_dir = Path(mirror_dir)
        self.timeout = timeout

    def mirror(self, key: str) -> GitMirror:
        return GitMirror(
            self.mirror_dir / mirror_name(key),
            repo_url(self.repos[key]),
            self.mirror_dir / ".home",
            self.timeout,
        )

    async def get(self, queue: str, change_uris: Sequence[str]) -> list[ChangeDetails]:
        # github:// changes are the github provider's (their pull request's checks)
        changes = [resolve_change(uri, self.repos, github=False) for uri in change_uris]
        if not changes:
            return []
        keys = {c.key for c in changes}
        if len(keys) > 1:
            raise ChangeRejected(
                f"a stack must stay in one repository; it names {', '.join(sorted(keys))}"
            )
        mirror = self.mirror(changes[0].key)
        async with mirror_lock(mirror.path):
            tip, values = await mirror.fetch(self.target_branch, [c.ref for c in changes])
            for change in changes:
                check_pinned(change, values.get(change.ref))
                if not await mirror.has_commit(change.sha):
                    raise ChangeRejected(f"change {change.uri!r}: commit {change.sha} not found")
                await mirror.pin(change.sha)
            out: list[ChangeDetails] = []
            previous: str | None = None
            for change in changes:
                base = previous or await merge_base(mirror, tip, change.sha)
                out.append(await details(mirror, change, base))
                previous = change.sha
            return out


def check_pinned(change: GitChange, current: str | None) -> None:
    if current is None:
        raise ChangeRejected(
            f"stale: ref {change.ref} no longer exists (change pinned {change.sha})"
        )
    if current != change.sha:
        raise ChangeRejected(
            f"stale: ref {change.ref} now points at {current}, not {change.sha}"
        )


async def merge_base(mirror: GitMirror, a: str, b: str) -> str:
    res = await mirror.git("merge-base", a, b, check=False)
    if res.returncode == 1:  # unrelated histories: everything is new
        return EMPTY_TREE
    if res.returncode != 0:
        await mirror.git("merge-base", a, b)  # raises GitError with the details
    return res.stdout.strip()


async def details(mirror: GitMirror, change: GitChange, base: str) -> ChangeDetails:
    numstat = await mirror.git(
        "diff", "--numstat", "-z", "-M", "--no-ext-diff", "--no-textconv", base, change.sha
    )
    author = await mirror.git("show", "-s", "--format=%an%x00%ae%x00%s", change.sha)
    name, _, rest = author.stdout.rstrip("\n").partition("\x00")
    email, _, subject = rest.partition("\x00")
    return ChangeDetails(
        uri=change.uri,
        author_name=name,
        author_email=email,
        title=subject.strip()[:500],
        changed_files=tuple(parse_numstat(numstat.stdout)),
    )


def parse_numstat(text: str) -> list[ChangedFile]:
    """Parse ``git diff --numstat -z`` output (renames: ``a\\td\\t\\0old\\0new\\0``)."""
    fields = text.split("\x00")
    files: list[ChangedFile] = []
    i = 0
    while i < len(fields):
        head = fields[i]
        i += 1
        if not head:
            continue
        added, deleted, path = head.split("\t", 2)
        if not path:  # a rename or copy: the old and new paths follow
            path = fields[i + 1]
            i += 2
        files.append(
            ChangedFile(
                path,
                lines_added=int(added) if added.isdigit() else 0,
                lines_deleted=int(deleted) if deleted.isdigit() else 0,
            )
        )
    return files
