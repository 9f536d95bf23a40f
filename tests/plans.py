"""Reading the plans of the statements a call runs, nested ones included (auto_explain)."""

from __future__ import annotations

from collections.abc import Callable

from django.db import connection


def plans_of(call: Callable[[], object], *, analyze: bool = False) -> list[str]:
    """The plans auto_explain shows for the statements ``call()`` runs on Django's connection
    (with ``analyze``, the rows each node handled)."""
    plans: list[str] = []
    raw = connection.connection
    handler = plans.append

    def on_notice(diagnostic) -> None:
        handler(diagnostic.message_primary or "")

    settings = ["log_min_duration = 0", "log_nested_statements = on", "log_level = notice"]
    if analyze:
        settings += ["log_analyze = on", "log_timing = off"]
    with connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for setting in settings:
            cursor.execute(f"SET auto_explain.{setting}")
        raw.add_notice_handler(on_notice)
        try:
            call()
        finally:
            raw.remove_notice_handler(on_notice)
            for setting in settings:
                cursor.execute(f"RESET auto_explain.{setting.split(' ')[0]}")
    return plans
