"""A dispatch process (``manage.py pgmb_dispatch``): the databases it serves, checked; its
options, from the command line and the settings; one dispatcher per database, run by a
:class:`~.supervisor.Supervisor` on a garbage collector set up for it."""

from __future__ import annotations

import asyncio
import logging

from django.db import DatabaseError, connections
from django.utils.connection import ConnectionDoesNotExist

from .. import conf
from ..db.conninfo import conninfo_from_django, direct_conninfo
from ..db.error_text import database_reason
from ..housekeeping import Thresholds
from ..models import Queue
from . import gc_tuning
from .engine import Options
from .supervisor import Served, Supervisor

log = logging.getLogger("pgmb.dispatch")


def check_aliases(given: list[str]) -> list[str]:
    """The aliases to serve, in order; ``ValueError`` for anything pgmb cannot serve."""
    for alias in given:
        try:
            vendor = connections[alias].vendor
        except ConnectionDoesNotExist:
            raise ValueError(f"--database {alias!r} is not in settings.DATABASES") from None
        if vendor != "postgresql":
            raise ValueError(
                f"--database {alias!r} is {vendor}, not PostgreSQL: pgmb needs "
                "django.db.backends.postgresql"
            )
    if twice := sorted({alias for alias in given if given.count(alias) > 1}):
        raise ValueError(f"--database given twice: {', '.join(map(repr, twice))}")
    return given


def unknown_queues(aliases: list[str], names: list[str]) -> tuple[list[str], list[str]]:
    """The ``names`` no database served has, and why a database could not be read.

    A database that cannot be read now (unreachable, not migrated) is that database's
    problem, as it is once dispatching: its queues are not counted.
    """
    known: set[str] = set()
    unread = []
    for alias in aliases:
        try:
            known.update(
                Queue.objects.using(alias).filter(name__in=names).values_list("name", flat=True)
            )
        except DatabaseError as exc:
            unread.append(
                f"could not read the queues of database {alias!r}: {database_reason(exc)}"
            )
        finally:
            # The dispatcher has connections of its own; this one would only idle.
            connections[alias].close()
    return sorted(set(names) - known), unread


def options(
    queues: list[str] | None,
    concurrency: int,
    batch: int,
    poll_interval: float,
    until_idle: bool,
    max_seconds: float | None,
    give_up_after: float | None,
) -> Options:
    """The dispatchers' options: the command line's, the rest from ``PGMB``."""
    settings = conf.get()
    return Options(
        queues=queues,
        concurrency=concurrency,
        batch=batch,
        poll_interval=poll_interval,
        reclaim_interval=settings.DISPATCH_RECLAIM_INTERVAL,
        until_idle=until_idle,
        max_seconds=max_seconds,
        give_up_after=give_up_after or (settings.DISPATCH_GIVE_UP if until_idle else None),
        body_limit=settings.RESPONSE_BODY_LIMIT,
        heartbeat_interval=settings.DISPATCH_HEARTBEAT_INTERVAL,
        housekeeping_interval=settings.HOUSEKEEPING_INTERVAL,
        housekeeping_thresholds=Thresholds.from_settings(),
        vacuum_every=settings.HOUSEKEEPING_VACUUM_EVERY,
    )


def serve(aliases: list[str], options: Options) -> dict[str, Served]:
    """Dispatch from every database of ``aliases`` until stopped (SIGTERM, SIGINT), idle
    or out of time; what each one did."""
    direct = {alias: info for alias in aliases if (info := direct_conninfo(alias)) is not None}
    supervisor = Supervisor(
        {alias: conninfo_from_django(alias) for alias in aliases}, options, direct
    )
    frozen = gc_tuning.settle()
    log.debug(
        "heap settled: %d objects frozen, young collections every %d allocations",
        frozen,
        gc_tuning.YOUNG_THRESHOLD,
    )
    return asyncio.run(supervisor.run())
