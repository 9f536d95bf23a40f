"""The options of a message: priority, ordered group, dependencies, de-duplication id and
its own retries (docs/ordering.md).

:func:`check_options` holds the rules, the same as ``pgmb.message_options_problem()`` in
SQL (tests/rules checks both sides against one table of cases):

* ``priority``: a whole number from -32768 to 32767; lower is delivered first; 0 by default;
* ``group`` and ``dedup_id``: 1 to 128 characters, no blanks or control characters (the
  character rule of keys, :data:`pgmb.routing.KEY_FORBIDDEN`);
* ``depends_on``: 1 to 100 message ids, not the message's own; each must exist when it
  is published (checked by the database);
* ``max_retries``: 0 to 1,000,000;
* ``retry_delay``: seconds, the delay rule (finite, not negative) and at most 30 days,
  the longest backoff of a queue.

:func:`check_expiry` holds the rule of a message's expiry, the same as
``pgmb.expiry_problem()`` in SQL (tests/rules): a ``ttl`` (seconds from publication,
positive, finite, ending before the year 10000) or an ``expires_at`` (an aware datetime
within the years 1 to 9999 in UTC; a past one expires the message at once), not both.

:func:`check_unique_key` holds the rule of a unique key, the same as
``pgmb.unique_key_problem()`` in SQL (tests/rules): a key of 1 to 128 characters, no blanks or
control characters; ``on_duplicate`` ``'skip'`` (the default) or ``'replace'``, the latter only
with a key (docs/publishing.md, Unique while live).
"""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from .errors import InvalidOption
from .routing import KEY_FORBIDDEN

MIN_PRIORITY = -32768
MAX_PRIORITY = 32767
MAX_GROUP_LENGTH = 128
MAX_DEDUP_ID_LENGTH = 128
MAX_UNIQUE_KEY_LENGTH = 128
#: What a message with a unique key does where a delivery with its key is live: ``skip``
#: (it is not delivered there) or ``replace`` (the pending one makes way for it).
ON_DUPLICATE = ("skip", "replace")
MAX_DEPENDENCIES = 100
MAX_RETRIES = 1_000_000
#: The longest retry delay: 30 days, as a queue's backoff (models.MAX_QUEUE_SECONDS).
MAX_RETRY_DELAY = 30 * 24 * 3600

_FORBIDDEN = re.compile(KEY_FORBIDDEN)


@dataclass(frozen=True, slots=True)
class Options:
    """Checked options, as stored (``group`` is the column ``group_key``)."""

    priority: int = 0
    group: str | None = None
    depends_on: list[uuid.UUID] | None = None
    dedup_id: str | None = None
    max_retries: int | None = None
    retry_delay: float | None = None


NONE = Options()


def _text(value: object, what: str, longest: int) -> str:
    if not isinstance(value, str) or not value or len(value) > longest or _FORBIDDEN.search(value):
        raise InvalidOption(
            f"invalid {what} {value!r}: 1 to {longest} characters, no blanks or control characters"
        )
    return value


def _whole(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidOption(
            f"invalid {what} {value!r}: it must be a whole number from {low} to {high}"
        )
    return value


def _uuid(value: object) -> uuid.UUID:
    if isinstance(value, uuid.UUID):
        return value
    try:
        return uuid.UUID(str(value))
    except ValueError:
        raise InvalidOption(f"invalid depends_on: {value!r} is not a message id") from None


def check_options(
    message_id: uuid.UUID,
    *,
    priority: int = 0,
    group: str | None = None,
    depends_on: Iterable[uuid.UUID | str] | None = None,
    dedup_id: str | None = None,
    max_retries: int | None = None,
    retry_delay: float | timedelta | None = None,
) -> Options:
    """Return the options checked and normalised, or raise :class:`InvalidOption`."""
    if (
        type(priority) is int
        and priority == 0
        and group is None
        and depends_on is None
        and dedup_id is None
        and max_retries is None
        and retry_delay is None
    ):
        return NONE  # the common case, on every publish: nothing to check
    priority = _whole(priority, "priority", MIN_PRIORITY, MAX_PRIORITY)
    if group is not None:
        _text(group, "group", MAX_GROUP_LENGTH)
    if dedup_id is not None:
        _text(dedup_id, "dedup id", MAX_DEDUP_ID_LENGTH)
    if max_retries is not None:
        _whole(max_retries, "max_retries", 0, MAX_RETRIES)
    delay: float | None = None
    if retry_delay is not None:
        if isinstance(retry_delay, timedelta):
            retry_delay = retry_delay.total_seconds()
        if (
            isinstance(retry_delay, bool)
            or not isinstance(retry_delay, (int, float))
            or not math.isfinite(retry_delay)
            or not 0 <= retry_delay <= MAX_RETRY_DELAY
        ):
            raise InvalidOption(
                f"invalid retry delay {retry_delay!r}: it must be from 0 to {MAX_RETRY_DELAY} "
                "seconds (30 days)"
            )
        delay = float(retry_delay)
    ids: list[uuid.UUID] | None = None
    if depends_on is not None:
        if isinstance(depends_on, (str, uuid.UUID)):
            depends_on = [depends_on]
        ids = [_uuid(i) for i in depends_on]
        if not 1 <= len(ids) <= MAX_DEPENDENCIES:
            raise InvalidOption(
                f"invalid depends_on: name 1 to {MAX_DEPENDENCIES} messages (or none at all: None)"
            )
        if message_id in ids:
            raise InvalidOption(f"invalid depends_on: message {message_id} cannot depend on itself")
    return Options(priority, group, ids, dedup_id, max_retries, delay)


def check_expiry(
    ttl: float | timedelta | None = None, expires_at: datetime | None = None
) -> tuple[float | None, datetime | None]:
    """Return (ttl in seconds, expires_at) checked, at most one of them set, or raise
    :class:`InvalidOption` (docs/delivery.md, Expiry)."""
    if ttl is None and expires_at is None:
        return None, None
    if ttl is not None and expires_at is not None:
        raise InvalidOption("give a message a ttl or an expires_at, not both")
    if ttl is not None:
        if isinstance(ttl, timedelta):
            ttl = ttl.total_seconds()
        if (
            isinstance(ttl, bool)
            or not isinstance(ttl, (int, float))
            or not math.isfinite(ttl)
            or ttl <= 0
        ):
            raise InvalidOption(
                f"invalid ttl {ttl!r}: it must be a positive, finite number of seconds"
            )
        try:
            datetime.now(timezone.utc) + timedelta(seconds=ttl)
        except OverflowError:
            raise InvalidOption(f"invalid ttl {ttl!r}: too long (past the year 9999)") from None
        return float(ttl), None
    if not isinstance(expires_at, datetime) or expires_at.utcoffset() is None:
        raise InvalidOption(
            f"invalid expires_at {expires_at!r}: it must be a timezone-aware datetime"
        )
    try:
        expires_at.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidOption(
            f"invalid expires_at {expires_at.isoformat()}: "
            "a time must be from the year 1 to the year 9999 (UTC)"
        ) from None
    return None, expires_at


def check_unique_key(unique_key: str | None, on_duplicate: str | None = "skip") -> str | None:
    """Return ``on_duplicate`` as stored (None without a key: nothing to decide), or raise
    :class:`InvalidOption` (docs/publishing.md, Unique while live)."""
    if on_duplicate is not None and on_duplicate not in ON_DUPLICATE:
        raise InvalidOption(
            f"invalid on_duplicate {on_duplicate!r}: it must be 'skip' or 'replace'"
        )
    if unique_key is None:
        if on_duplicate == "replace":
            raise InvalidOption("on_duplicate 'replace' needs a unique key")
        return None
    _text(unique_key, "unique key", MAX_UNIQUE_KEY_LENGTH)
    return on_duplicate or "skip"
