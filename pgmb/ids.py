"""Message ids: time-ordered UUIDs (version 7, RFC 9562).

The first 48 bits are the Unix time in milliseconds and the rest is random, so new ids
sort after older ones and the message key index grows at its right edge: a publish touches
the same few hot index pages instead of a random page of a table larger than memory.
``pgmb.uuid_v7()`` is the same layout in SQL (the default of ``pgmb_message.id``); ids
given by callers may be any UUID.
"""

from __future__ import annotations

import os
import time
import uuid

_VERSION = 0x7 << 76
_VARIANT = 0b10 << 62
_RAND_A = (1 << 12) - 1
_RAND_B = (1 << 62) - 1


def uuid7() -> uuid.UUID:
    """A new version 7 UUID: the current time in milliseconds, then 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (
        (ms & 0xFFFF_FFFF_FFFF) << 80
        | _VERSION
        | ((rand >> 62) & _RAND_A) << 64
        | _VARIANT
        | (rand & _RAND_B)
    )
    return uuid.UUID(int=value)


def milliseconds(value: uuid.UUID) -> int:
    """The Unix time in milliseconds that a version 7 UUID carries."""
    return value.int >> 80
