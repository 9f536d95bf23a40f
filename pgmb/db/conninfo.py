"""psycopg connection arguments of a Django database alias, for the processes that hold
their own connections (the external dispatcher, consumers, housekeeping)."""

from __future__ import annotations

from typing import Any

from django.db import connections

#: Seconds a connection attempt may take unless the settings say otherwise: an unreachable
#: host must not stall a process for the system's TCP timeout (minutes).
CONNECT_TIMEOUT = 10


def conninfo_from_django(alias: str) -> dict[str, Any]:
    """psycopg connection arguments of a Django database alias."""
    params = dict(connections[alias].get_connection_params())
    for django_only in ("cursor_factory", "context", "prepare_threshold"):
        params.pop(django_only, None)
    params.setdefault("connect_timeout", CONNECT_TIMEOUT)
    return params
