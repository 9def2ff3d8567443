"""Which text may be stored: the rules every string from outside (a client, a CI
callback) passes before it reaches the database.

``check_line`` (identifiers, change URIs, search terms, cursors, keys) refuses every
control character; ``check_text`` (free text: a cancel or admin reason, a build's
detail) allows tab, newline and carriage return. Both refuse lone surrogates
(``\\ud800``: not encodable as UTF-8, so no database can store them) and NUL
(PostgreSQL text columns reject it). A refusal is a ``ValueError`` saying what and
where, for pydantic to report against the field.
"""

from __future__ import annotations

import re
from typing import Any

#: The name of an environment variable: configuration names secrets by it, never holds them.
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

_CONTROL = "\x00-\x08\x0b\x0c\x0e-\x1f\x7f"
_NOT_IN_TEXT = re.compile(f"[{_CONTROL}\ud800-\udfff]")
_NOT_IN_LINE = re.compile(f"[{_CONTROL}\t\n\r\ud800-\udfff]")


def _refuse(pattern: re.Pattern[str], value: Any) -> Any:
    if not isinstance(value, str):
        return value  # the str schema reports the wrong type
    bad = pattern.search(value)
    if bad is None:
        return value
    code = ord(bad.group())
    what = ("a lone surrogate" if 0xD800 <= code <= 0xDFFF
            else "NUL" if code == 0 else "a control character")
    raise ValueError(f"contains {what} (U+{code:04X}) at position {bad.start()}; "
                     "send printable UTF-8 text")


def check_text(value: Any) -> Any:
    """No NUL, lone surrogate or control character other than tab, newline and CR."""
    return _refuse(_NOT_IN_TEXT, value)


def check_line(value: Any) -> Any:
    """No NUL, lone surrogate or control character at all."""
    return _refuse(_NOT_IN_LINE, value)
