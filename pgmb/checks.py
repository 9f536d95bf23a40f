"""System checks: misconfiguration is reported by ``manage.py check``, not at run time."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import Error, Tags, register
from django.db import connections

from . import conf


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    problems = [
        Error(text, hint="See 'Configuration' in pgmb's README.", id="pgmb.E001")
        for text in conf.errors(getattr(settings, "PGMB", {}))
    ]
    if not apps.is_installed("pgtrigger"):
        problems.append(
            Error(
                "pgmb needs django-pgtrigger: its routing trigger is installed by migrations.",
                hint="Add 'pgtrigger' to INSTALLED_APPS.",
                id="pgmb.E002",
            )
        )
    if problems:
        return problems
    alias = conf.get().DATABASE
    if alias not in settings.DATABASES:
        return [
            Error(
                f"PGMB['DATABASE'] names {alias!r}, which is not in DATABASES.",
                id="pgmb.E003",
            )
        ]
    if connections[alias].vendor != "postgresql":
        problems.append(
            Error(
                f"pgmb needs PostgreSQL; database {alias!r} is {connections[alias].vendor}.",
                hint="Use django.db.backends.postgresql with psycopg 3.",
                id="pgmb.E004",
            )
        )
    return problems


@register(Tags.database)
def check_server(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[Error]:
    """Runs only when asked for database checks (``check --database default``, ``migrate``)."""
    alias = conf.get().DATABASE
    if not databases or alias not in databases or connections[alias].vendor != "postgresql":
        return []
    version = connections[alias].cursor().connection.info.server_version
    if version < 130000:
        return [
            Error(
                f"pgmb needs PostgreSQL 13 or later; the server is {version // 10000}.",
                id="pgmb.E005",
            )
        ]
    return []
