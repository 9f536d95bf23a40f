"""The one loader of pgmb's SQL files.

* ``queries/*.sql`` hold named statements that the Python side runs, each introduced by a
  ``-- name: NAME`` line (read with :func:`query`);
* ``schema/*.sql`` are the current schema, by concern, loaded in the order of
  :data:`SCHEMA` (then :data:`PLPYTHON` where the language exists): everything pgmb keeps
  in the database besides its Django models. Edited by hand; the source to read. A line
  ``-- splice: NAME.py`` in a function body stands for the text of ``pgmb/sql/NAME.py``, a
  module ruff and mypy check (the PL/Python transport's code, ``plpython_transport.py``):
  :func:`schema_source` puts it there (:func:`spliced`).
* ``migrations/NNNN_*.sql`` are what each release's one migration runs (with
  :mod:`pgmb.sql.operations`): frozen copies of ``schema/`` (``make schema`` refreshes the
  unreleased one's), never edited once released. ``tests/migrations`` checks that all the
  migrations build what the models and ``schema/`` describe.
"""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
_SPLICE = re.compile(r"^-- splice: (\w+\.py)\n", re.MULTILINE)


@cache
def script(path: str) -> str:
    """The whole text of ``pgmb/sql/<path>``."""
    return resources.files(__package__).joinpath(path).read_text(encoding="utf-8")


#: The files of ``schema/``, in the order they load: everything pgmb keeps in the database
#: besides its Django models (``tables.sql`` adds to the models' tables what Django cannot
#: declare). Each file holds one concern; a later file may use what an earlier one made.
SCHEMA: tuple[str, ...] = (
    "types",
    "routing",
    "tables",
    "views",
    "publish",
    "events",
    "tasks",
    "schedules",
    "deliveries",
    "fairness",
    "breakers",
    "pull",
    "metrics",
    "dispatchers",
    "indb",
    "history",
    "access",
)

#: The PL/Python transport of the in-database loop, loaded after :data:`SCHEMA` only where
#: the database has (or can create) plpython3u.
PLPYTHON: tuple[str, ...] = ("plpython",)


def schema_source(names: tuple[str, ...] = SCHEMA) -> str:
    """The files ``schema/<name>.sql`` of ``names``, in that order, as one script, each
    :func:`spliced`: the SQL that loading them runs."""
    return "\n".join(
        f"-- ==== pgmb/sql/schema/{name}.sql ====\n{spliced(script(f'schema/{name}.sql'))}"
        for name in names
    )


def spliced(text: str) -> str:
    """``text`` with each line ``-- splice: NAME.py`` (inside a function body quoted
    ``$py$``) replaced by the whole text of ``pgmb/sql/NAME.py``."""

    def module(mark: re.Match[str]) -> str:
        source = script(mark.group(1))
        if "$py$" in source:
            raise ValueError(f"pgmb/sql/{mark.group(1)} holds $py$, which would end the body")
        return source if source.endswith("\n") else source + "\n"

    return _SPLICE.sub(module, text)


def migration_script(name: str, *, down: bool = False) -> str:
    """The text of ``migrations/<name>.sql`` (or of its ``.down.sql`` reverse)."""
    return script(f"migrations/{name}{'.down' if down else ''}.sql")


def has_down_script(name: str) -> bool:
    """Whether ``migrations/<name>.sql`` has a ``.down.sql`` reverse."""
    return resources.files(__package__).joinpath(f"migrations/{name}.down.sql").is_file()


@cache
def _queries(filename: str) -> dict[str, str]:
    text = script(f"queries/{filename}")
    marks = list(_NAME.finditer(text))
    return {
        m.group(1): text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else None].strip()
        for i, m in enumerate(marks)
    }


def query(filename: str, name: str) -> str:
    """The statement named ``name`` in ``pgmb/sql/queries/<filename>``."""
    try:
        return _queries(filename)[name]
    except KeyError:
        raise LookupError(f"no query named {name!r} in pgmb/sql/queries/{filename}") from None
