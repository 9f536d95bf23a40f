"""Schedules: a message published at each due time of a cron expression or an interval
(docs/schedules.md, docs/decisions/0089-schedules-fired-by-the-loops.md).

Cron expressions are read by cronsim here and by ``pgmb.cron_next`` in SQL, which the
in-database loop needs: the same rule in both, checked by one table of cases
(tests/rules/test_cron.py). Firing is the database's (``pgmb.fire_due_schedules``), which the
dispatchers and the in-database loop call; this module writes schedules and reads the rule.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
import uuid
import zoneinfo
from typing import Any

from cronsim import CronSim, CronSimError
from django.db import DatabaseError

from . import sql
from .db.error_text import database_reason
from .db.statements import Call, run
from .db.values import scalar
from .errors import InvalidSchedule
from .routing import validate_routing_key

#: How runs missed while nothing fired are handled (``pgmb_schedule.missed``).
MISSED = ("skip", "once", "all")

_ZONE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*")
_FIELDS = "minute hour day-of-month month day-of-week"
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def _refuse(expr: str, detail: str) -> InvalidSchedule:
    # The words of pgmb.cron_refuse.
    return InvalidSchedule(f'bad cron expression "{expr}": {detail}')


def check_cron(expr: str) -> str:
    """``expr`` if it is a 5-field cron expression pgmb supports, else InvalidSchedule with
    the message ``pgmb.cron_fields`` gives: the checks in the same order."""
    parts = expr.upper().split()
    if len(parts) != 5:
        raise _refuse(expr, f"expected 5 fields ({_FIELDS}), got {len(parts)}")
    if "L" in parts[2] or "W" in parts[2] or "L" in parts[4] or "#" in parts[4]:
        raise _refuse(expr, "L, W and # are not supported")
    try:
        CronSim(expr, datetime.datetime(2000, 1, 1))
    except CronSimError as exc:
        # cronsim's "Bad minute", "Bad day-of-month", ...
        raise _refuse(expr, str(exc).lower()) from None
    return expr


def time_zone(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name``, or InvalidSchedule (``pgmb.check_time_zone``'s words)."""
    if not isinstance(name, str) or not _ZONE_NAME.fullmatch(name):
        raise InvalidSchedule(f'unknown time zone "{name}"')
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise InvalidSchedule(f'unknown time zone "{name}"') from None


def cron_next(expr: str, tz: str, after: datetime.datetime) -> datetime.datetime:
    """The first due time of ``expr`` in time zone ``tz`` after ``after`` (aware), in UTC:
    cronsim's next, as ``pgmb.cron_next`` computes it in SQL."""
    check_cron(expr)
    zone = time_zone(tz)
    if after.tzinfo is None:
        raise InvalidSchedule("a time to start from must be aware")
    try:
        due = next(CronSim(expr, after.astimezone(zone)))
    except StopIteration:
        raise _refuse(expr, "no due time within 50 years") from None
    return due.astimezone(datetime.timezone.utc)


def describe(cron: str | None, timezone: str, every: datetime.timedelta | None) -> str:
    """When a schedule is due, as the admin and ``pgmb_schedule list`` show it:
    ``30 2 * * * (Europe/Berlin)`` or ``every 10 s``."""
    if cron is not None:
        return f"{cron} ({timezone})"
    return f"every {every.total_seconds() if every is not None else 0:g} s"


def message_id(schedule_id: int, due: datetime.datetime) -> uuid.UUID:
    """The id of the message schedule ``schedule_id`` publishes for due time ``due``
    (``pgmb.schedule_message_id``): a UUID version 8 whose first 48 bits are the due time's
    Unix milliseconds and whose other bits come from an MD5 of (schedule, due time)."""
    ms = (due - _EPOCH) // datetime.timedelta(milliseconds=1)
    digest = bytearray(
        hashlib.md5(f"pgmb schedule {schedule_id} {ms}".encode(), usedforsecurity=False).digest()
    )
    raw = bytearray(ms.to_bytes(8, "big", signed=True)[2:]) + digest[6:16]
    raw[6] = (raw[6] & 0x0F) | 0x80
    raw[8] = (raw[8] & 0x3F) | 0x80
    return uuid.UUID(bytes=bytes(raw))


def _statement(name: str) -> str:
    return sql.query("schedules.sql", name)


def _run(call: Call[Any], using: str | None) -> Any:
    try:
        return run(call, using)
    except DatabaseError as exc:
        code = getattr(exc.__cause__, "sqlstate", None)
        if code in ("22023", "22004", "23502"):
            raise InvalidSchedule(database_reason(exc)) from exc
        raise


def schedule(
    name: str,
    routing_key: str,
    body: Any,
    *,
    cron: str | None = None,
    every: datetime.timedelta | float | None = None,
    timezone: str = "UTC",
    headers: dict[str, Any] | None = None,
    missed: str = "once",
    first_run: datetime.datetime | None = None,
    task: dict[str, Any] | None = None,
    using: str | None = None,
) -> int:
    """Create schedule ``name``, or change it (``pgmb.schedule``): publish ``body`` (any
    JSON value) to ``routing_key`` at each due time of ``cron`` (5 fields, read in
    ``timezone``) or every ``every`` (a timedelta or seconds, at least 1 s). ``missed``:
    what a fire does with due times that passed while nothing fired: ``"skip"`` them,
    fire ``"once"`` for them, or fire ``"all"``. Returns the schedule's id. In the caller's
    transaction; bad input raises InvalidSchedule and stores nothing. ``task`` is
    :func:`pgmb.tasks.schedule_task`'s (each run then enqueues a Django task)."""
    if (cron is None) == (every is None):
        raise InvalidSchedule(f'schedule "{name}": give either cron or every, not both or neither')
    if cron is not None:
        check_cron(cron)
    time_zone(timezone)
    validate_routing_key(routing_key)
    if missed not in MISSED:
        raise InvalidSchedule(f'schedule "{name}": missed is skip, once or all, not {missed}')
    if every is not None and not isinstance(every, datetime.timedelta):
        every = datetime.timedelta(seconds=every)
    params = {
        "name": name,
        "routing_key": routing_key,
        "body": json.dumps(body),
        "headers": None if headers is None else json.dumps(headers),
        "cron": cron,
        "every": every,
        "timezone": timezone,
        "missed": missed,
        "first_run": first_run,
        "task": None if task is None else json.dumps(task),
    }
    return int(_run(Call(_statement("schedule"), params, scalar), using))


def pause(name: str, *, using: str | None = None) -> bool:
    """Pause schedule ``name``; False if there is none."""
    return bool(_run(Call(_statement("pause"), {"name": name}, scalar), using))


def resume(name: str, *, using: str | None = None) -> bool:
    """Resume schedule ``name`` (runs missed meanwhile follow its ``missed``); False if
    there is none."""
    return bool(_run(Call(_statement("resume"), {"name": name}, scalar), using))


def unschedule(name: str, *, using: str | None = None) -> bool:
    """Delete schedule ``name`` (its messages stay); False if there was none."""
    return bool(_run(Call(_statement("unschedule"), {"name": name}, scalar), using))
