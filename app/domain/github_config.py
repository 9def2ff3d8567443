"""A queue's ``github:`` block (``queues.yaml``; docs/github.md).

```yaml
github:
  repository: acme/widgets              # owner/repo of the pull requests this queue lands
  host: github.com                       # the {host} of its github:// change URIs
  api_url: https://api.github.com        # GitHub Enterprise Server: https://ghes.example.com/api/v3
  target_branch: main                    # pull requests must target it
  token_env: SQ_GITHUB_TOKEN             # a token ... (one of token_env / app_id + private_key_env)
  app_id: 123456                         # ... or a GitHub App: its id,
  private_key_env: SQ_GITHUB_APP_KEY     #     the variable holding its PEM private key,
  installation_id: 7890                  #     its installation (default: looked up per repository)
  webhook_secret_env: SQ_GITHUB_WEBHOOK_SECRET  # POST /api/v1/github/webhook verifies with it
  land_label: merge-queue                # adding it lands the pull request, removing it cancels
  require_approval: true                 # refuse pull requests without an approving review
  check_run: true                        # write the SubmitQueue check-run (token: a commit status)
  removal_comment: false                 # also comment on a pull request the queue removed (once)
  timeout_s: 30                          # per API call
```

Secrets are named by environment variable, never written here.
"""

from __future__ import annotations

import re
from typing import Final
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from app.domain.text import ENV_NAME

_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_HOST = re.compile(r"^[a-z0-9](?:[a-z0-9.-]*[a-z0-9])?(?::[0-9]{1,5})?$")
_LABEL = re.compile(r"^[^\x00-\x1f]{1,50}$")
API_VERSION: Final = "2022-11-28"  # the one REST API version we speak (X-GitHub-Api-Version)
#: the label the ``github`` merger puts on a pull request it landed as other commits
#: (squashed, rebased) before it closes it
MERGED_LABEL: Final = "merged-by-queue"


def _env_name(value: str, key: str) -> str:
    if value and not ENV_NAME.match(value):
        raise ValueError(f"github {key} must name an environment variable (e.g. "
                         f"SQ_GITHUB_TOKEN), not hold the secret itself; got {value[:8]!r}...")
    return value


class GitHubConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    repository: str
    host: str = "github.com"
    api_url: str = "https://api.github.com"
    target_branch: str = "main"
    token_env: str = ""
    app_id: int | None = Field(default=None, ge=1)
    private_key_env: str = ""
    installation_id: int | None = Field(default=None, ge=1)
    webhook_secret_env: str = ""
    land_label: str = "merge-queue"
    require_approval: bool = False
    check_run: bool = True
    removal_comment: bool = False
    timeout_s: float = Field(default=30.0, gt=0, le=300)

    @field_validator("repository")
    @classmethod
    def _repository(cls, v: str) -> str:
        if not _REPO.match(v):
            raise ValueError(f"github repository {v!r} must be 'owner/repo' (e.g. acme/widgets)")
        return v

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not _HOST.match(v):
            raise ValueError(f"github host {v!r} must be a lowercase host[:port] such as "
                             "github.com (the {host} of the queue's github:// change URIs)")
        return v

    @field_validator("api_url")
    @classmethod
    def _api_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"github api_url {v!r} must be an http(s) address: "
                             "https://api.github.com, or https://<host>/api/v3 for GitHub "
                             "Enterprise Server")
        return v.rstrip("/")

    @field_validator("land_label")
    @classmethod
    def _label(cls, v: str) -> str:
        if not _LABEL.match(v):
            raise ValueError("github land_label must be 1-50 printable characters")
        return v

    @model_validator(mode="after")
    def _auth(self) -> GitHubConfig:
        for key in ("token_env", "private_key_env", "webhook_secret_env"):
            _env_name(getattr(self, key), key)
        app = self.app_id is not None or bool(self.private_key_env)
        if self.token_env and app:
            raise ValueError("github: give either token_env or app_id + private_key_env, "
                             "not both")
        if app and (self.app_id is None or not self.private_key_env):
            raise ValueError("github: a GitHub App needs both app_id and private_key_env "
                             "(the variable holding its PEM private key)")
        if not self.token_env and not app:
            raise ValueError("github: set token_env (the variable holding a token) or "
                             "app_id + private_key_env (a GitHub App)")
        if self.installation_id is not None and not app:
            raise ValueError("github installation_id applies to a GitHub App only")
        return self

    @property
    def owner(self) -> str:
        return self.repository.split("/", 1)[0]

    @property
    def repo(self) -> str:
        return self.repository.split("/", 1)[1]
