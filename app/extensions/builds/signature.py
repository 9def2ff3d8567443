"""The ``X-SubmitQueue-Signature`` scheme: an HMAC bound to one build and one moment.

```text
X-SubmitQueue-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<build id>.<raw body>">
```

keyed with the queue's shared secret. Both directions use it: SubmitQueue signs the
trigger it POSTs to CI, CI signs each status report it POSTs back. Binding the build id
means a genuine report of one build cannot be replayed onto another; binding ``t``
means a captured one stops working ``TOLERANCE_S`` seconds after it was signed (and a
timestamp that far in the future is refused too). Within the window a replay onto the
*same* build can only repeat what that build's CI already said, which the receiver
treats idempotently.

``verify`` raises ``BadSignature`` with a message that says what to fix: a missing or
malformed header (naming the expected format), the retired ``sha256=<hex>`` scheme
(the body alone), a timestamp outside the window, or an HMAC that does not match
this build's id and these exact bytes. HMACs are compared with
``hmac.compare_digest``. Several ``v1=`` entries may be sent (while a secret is
rotated); one matching is enough.
"""

from __future__ import annotations

import hashlib
import hmac
import re

from app.domain.errors import BadSignature as BadSignature  # re-exported

SIGNATURE_HEADER = "X-SubmitQueue-Signature"
TOLERANCE_S = 300
FORMAT = 't=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<build id>.<raw body>">'
MAX_HEADER = 1000
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
_SECONDS = re.compile(r"^[0-9]{1,12}$")


def signed_bytes(t: int, build_id: str, body: bytes) -> bytes:
    """What the HMAC covers: ``<t>.<build id>.<raw body>``."""
    return f"{t}.{build_id}.".encode() + body


def sign(secret: bytes, build_id: str, body: bytes, *, t: int) -> str:
    """The header value for ``body`` sent for ``build_id`` at unix time ``t`` (seconds)."""
    mac = hmac.new(secret, signed_bytes(t, build_id, body), hashlib.sha256).hexdigest()
    return f"t={t},v1={mac}"


def _malformed(why: str) -> BadSignature:
    return BadSignature(f"malformed {SIGNATURE_HEADER} header ({why}); expected {FORMAT}, "
                        "keyed with the queue's secret, e.g. t=1700000000,v1=<64 hex digits>")


def parse(header: str | None) -> tuple[int, list[str]]:
    """``(t, [v1, ...])`` of a header, or ``BadSignature`` saying what is wrong with it."""
    if header is None or not header.strip():
        raise BadSignature(f"the {SIGNATURE_HEADER} header is missing; sign every request: "
                           f"{FORMAT}, keyed with the queue's secret")
    text = header.strip()
    if text.lower().startswith("sha256="):
        raise BadSignature(
            f"the {SIGNATURE_HEADER} scheme sha256=<HMAC of the body> is no longer accepted: "
            "it binds neither the build nor a time, so a report could be replayed onto "
            f"another build; send {FORMAT} instead (see docs/builds.md)")
    if len(text) > MAX_HEADER:
        raise _malformed(f"longer than {MAX_HEADER} characters")
    t: int | None = None
    macs: list[str] = []
    for part in text.split(","):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq:
            raise _malformed(f"{part.strip()!r} is not key=value")
        if key == "t":
            if t is not None:
                raise _malformed("t= appears twice")
            if not _SECONDS.match(value):
                raise _malformed(f"t={value!r} is not unix time in whole seconds")
            t = int(value)
        elif key == "v1":
            if not _HEX64.match(value):
                raise _malformed("v1= must be 64 hex digits (an HMAC-SHA256)")
            macs.append(value.lower())
        else:
            raise _malformed(f"unknown key {key!r}")
    if t is None:
        raise _malformed("no t=")
    if not macs:
        raise _malformed("no v1=")
    return t, macs


def verify(secret: bytes, build_id: str, body: bytes, header: str | None, *, now_s: float,
           tolerance_s: int = TOLERANCE_S) -> int:
    """Check ``header`` for ``body`` sent for ``build_id``; return its ``t``.

    ``now_s`` is the receiver's clock (unix seconds); ``|now_s - t|`` must not exceed
    ``tolerance_s``."""
    t, macs = parse(header)
    skew = now_s - t
    if abs(skew) > tolerance_s:
        when = f"{skew:.0f} s old" if skew > 0 else f"{-skew:.0f} s in the future"
        raise BadSignature(
            f"the {SIGNATURE_HEADER} timestamp t={t} is {when}; at most {tolerance_s} s "
            "either way is accepted: sign each request when you send it (t = the current "
            "unix time in seconds) and keep the sender's clock in sync (NTP)")
    expected = hmac.new(secret, signed_bytes(t, build_id, body), hashlib.sha256).hexdigest()
    matched = False
    for mac in macs:  # compare every entry, in constant time each
        matched |= hmac.compare_digest(expected.encode(), mac.encode())
    if not matched:
        raise BadSignature(
            f"the {SIGNATURE_HEADER} header does not match: v1 must be the hex HMAC-SHA256, "
            f'keyed with the queue\'s secret, of "<t>.<build id>.<raw body>" with this '
            f"build's id {build_id!r} and the exact body bytes sent")
    return t
