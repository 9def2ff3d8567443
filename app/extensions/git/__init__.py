"""Everything SubmitQueue does with git, in one package.

| Module | What it holds |
|---|---|
| ``cli`` | the async git runner (argv lists, fixed environment, timeouts), ``GitMirror`` (a bare mirror of one repository), change-URI resolution |
| ``locking`` | the per-repository lock (this loop's tasks, then the host's ``flock``) |
| ``apply`` | applying one change in a scratch worktree (cherry-pick, merge, squash), owner-named worktrees |
| ``land`` | applying a request's merge steps in the shape their strategies land them: shared by the merger and the build tree, so both make identical commits |
| ``provider`` | the ``git`` change provider (validates a change against the target) |
| ``merger`` | the ``git`` merger (lands one tested tree as one push with a lease) |
| ``tree`` | a build's speculative tree (target tip, base changes, head changes) |
| ``publish`` | pushing a build's tree to ``refs/sq/builds/<id>`` for a CI that runs elsewhere |

Importing the package imports none of them.
"""  # noqa: E501 - the table reads best unwrapped
