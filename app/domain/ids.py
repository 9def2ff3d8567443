"""Identifiers: ``<queue>/<n>`` for requests, ``<queue>/batch/<n>`` for batches.

Queue names are 1..100 characters of ``[A-Za-z0-9._-]`` so ids split unambiguously.
"""

from __future__ import annotations

import re

from app.domain.errors import ValidationError

QUEUE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def check_queue_name(name: str) -> str:
    if not QUEUE_NAME.match(name):
        raise ValidationError(
            f"queue name {name!r} must be 1-100 characters of letters, digits, '.', '_' or '-'"
        )
    return name


def request_id(queue: str, n: int) -> str:
    return f"{queue}/{n}"


def batch_id(queue: str, n: int) -> str:
    return f"{queue}/batch/{n}"


def request_number(sqid: str) -> int:
    """The counter part of a sqid (``demo/12`` -> 12), for numeric ordering."""
    tail = sqid.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def batch_number(bid: str) -> int:
    tail = bid.rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0
