"""The pure pieces of secret masking: which values the settings call secret, how a
``SecretMask`` replaces them, and which query parameters the log redaction masks."""

from __future__ import annotations

import logging
import logging.config
import uuid

import pytest
import uvicorn

from app.domain.redaction import REDACTED, SecretMask
from app.logs import redact_text
from app.settings import Settings
from tests.support.logs import captured_logs


def test_the_settings_name_the_admin_token_and_the_database_passwords() -> None:
    settings = Settings(
        _env_file=None,  # type: ignore[call-arg]
        admin_token="ops-alice:s3cret-part",
        database_url="postgresql+asyncpg://sq:p%40ss-word@db:5432/sq",
        queue_database_url="postgresql+asyncpg://q:queue-pass@db/q")
    assert settings.secret_values() == ["ops-alice:s3cret-part", "s3cret-part",
                                        "p%40ss-word", "queue-pass"]
    plain = Settings(_env_file=None)  # type: ignore[call-arg]
    assert plain.secret_values() == []  # no token; SQLite has no password


def test_a_mask_replaces_every_known_value_also_url_encoded_longest_first() -> None:
    mask = SecretMask.of(["ops:s3cret-part", "s3cret-part", "p%40ss-word", "short", None, ""])
    text = ("token ops:s3cret-part; part s3cret-part; url postgresql://sq:p%40ss-word@db; "
            "decoded p@ss-word; short stays")
    assert mask(text) == (f"token {REDACTED}; part {REDACTED}; url postgresql://sq:{REDACTED}"
                          f"@db; decoded {REDACTED}; short stays")
    assert SecretMask.of([])("anything") == "anything"


def test_secret_query_values_are_masked_and_others_kept() -> None:
    line = ('127.0.0.1:1 - "GET /api/v1/admin/topics?token=abc&limit=5&access_token=def'
            '&API_KEY=ghi&sig=jkl&cursor=mno&secret_env=SQ_X HTTP/1.1" 401')
    assert redact_text(line) == (
        f'127.0.0.1:1 - "GET /api/v1/admin/topics?token={REDACTED}&limit=5&access_token='
        f'{REDACTED}&API_KEY={REDACTED}&sig={REDACTED}&cursor=mno&secret_env=SQ_X HTTP/1.1" 401')
    assert redact_text("/queues/demo/requests?sq-files=a.py&sq-fake=build-fail") == \
        "/queues/demo/requests?sq-files=a.py&sq-fake=build-fail"


def test_the_access_log_is_masked_also_when_uvicorn_configured_its_own_logging(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``uvicorn --factory app.main:app_factory`` installs uvicorn's logging config (an
    access handler of its own on stdout) before the factory runs configure_logging."""
    names = ("uvicorn", "uvicorn.error", "uvicorn.access")
    saved = {n: (list(logging.getLogger(n).handlers), logging.getLogger(n).propagate,
                 logging.getLogger(n).level) for n in names}
    secret = uuid.uuid4().hex
    try:
        logging.config.dictConfig(uvicorn.config.LOGGING_CONFIG)
        with captured_logs("INFO") as out:
            logging.getLogger("uvicorn.access").info(
                '%s - "%s %s HTTP/%s" %d', "127.0.0.1:1", "GET",
                f"/api/v1/admin/topics?token={secret}", "1.1", 401)
    finally:
        for n, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(n)
            logger.handlers[:], logger.propagate = handlers, propagate
            logger.setLevel(level)
    printed = capsys.readouterr()
    assert secret not in printed.out + printed.err
    assert secret not in out.text
    assert "/api/v1/admin/topics?token=[redacted] HTTP/1.1" in out.text
