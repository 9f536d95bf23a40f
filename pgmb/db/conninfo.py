"""psycopg connection arguments of a Django database alias, for the processes that hold
their own connections (the external dispatcher, consumers, housekeeping)."""

from __future__ import annotations

from typing import Any

from django.db import connections

from .. import conf
from .pooler import PREPARE_THRESHOLD

#: Seconds a connection attempt may take unless the settings say otherwise: an unreachable
#: host must not stall a process for the system's TCP timeout (minutes).
CONNECT_TIMEOUT = 10


def conninfo_from_django(alias: str) -> dict[str, Any]:
    """psycopg connection arguments of a Django database alias.

    ``prepare_threshold`` is kept only when the alias's ``OPTIONS`` name it: Django turns
    prepared statements off otherwise, where pgmb's connections decide by themselves
    (:mod:`.pooler`: on, unless a pooler is in between).
    """
    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context"):
        params.pop(django_only, None)
    if PREPARE_THRESHOLD not in connections[alias].settings_dict.get("OPTIONS", {}):
        params.pop(PREPARE_THRESHOLD, None)
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    return params


def direct_conninfo(alias: str) -> dict[str, Any] | None:
    """The connection arguments of the alias ``PGMB["DIRECT_DATABASES"]`` gives ``alias``
    (the same database without the pooler: for LISTEN and housekeeping), or None."""
    direct = conf.get().DIRECT_DATABASES.get(alias)
    return None if direct is None else conninfo_from_django(direct)
