"""Answers that stop retries: a worker's statuses that dead-letter a delivery at once, the
statuses retried all the same, and the header by which a worker asks for it itself
(docs/delivery.md, Answers that stop retries).

The rules are SQL's too (``pgmb.statuses_problem``, ``pgmb.statuses_normalised`` and the
constants ``pgmb.abort_header()``, ``pgmb.abort_value()``, ``pgmb.aborted_prefix()`` in
pgmb/sql/schema/tables.sql); one table of cases runs both (tests/rules). Whether a failed
attempt is final is decided in SQL only, where the outcome is written
(``pgmb.settle_failures``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

#: The header a worker answers with to have a failed delivery dead-lettered at once, and its
#: value (compared trimmed of blanks, in any case, as any item of the header's comma-separated
#: list): ``Pgmb-Delivery: abort``.
ABORT_HEADER = "Pgmb-Delivery"
ABORT_VALUE = "abort"
#: How the error of such an attempt begins; pgmb.settle_failures knows it by this. A worker's
#: own text comes after ``HTTP <status>: `` in an error, so no worker can write this one.
ABORTED = "the worker answered Pgmb-Delivery: abort, so it is dead-lettered at once: "

_BLANKS = " \t"
_STATUS = re.compile(r"[1345][0-9][0-9]")
_STATUS_OR_CLASS = re.compile(r"[1345][0-9][0-9]|[1345]xx")


def statuses_problem(entries: object, *, classes: bool) -> str | None:
    """What is wrong with a list of statuses (None: nothing), the first bad entry named.

    An entry is a status from 100 to 599 but not a 2xx (that is a success), or, where
    ``classes``, a class of them: 1xx, 3xx, 4xx or 5xx; blanks around it and its case do not
    matter.
    """
    if not isinstance(entries, list | tuple):
        return "a list is required (empty: none)"
    pattern = _STATUS_OR_CLASS if classes else _STATUS
    for entry in entries:
        if not isinstance(entry, str) or not pattern.fullmatch(entry.strip(_BLANKS).lower()):
            shown = "NULL" if entry is None else "'" + str(entry).replace("'", "''") + "'"
            what = (
                "an HTTP status (100 to 599, not 2xx) or a class of them (1xx, 3xx, 4xx or 5xx)"
                if classes
                else "an HTTP status (100 to 599, not 2xx)"
            )
            return f"{shown} is not {what}"
    return None


def normalised(entries: Iterable[str]) -> list[str]:
    """A valid list as stored: each entry trimmed and lower-cased, once, in byte order."""
    return sorted({entry.strip(_BLANKS).lower() for entry in entries})


def in_both(dead: Iterable[str], retried: Iterable[str]) -> str | None:
    """The first status (stored form) that both lists name, which is refused."""
    both = set(normalised(dead)) & set(normalised(retried))
    return min(both) if both else None


def aborts(headers: Mapping[str, str]) -> bool:
    """Whether a failed answer's headers (names lower-cased, repeats joined by commas) ask
    for a dead letter now: the header is a list (RFC 9110, 5.6.1), any item of it will do."""
    value = headers.get(ABORT_HEADER.lower())
    return value is not None and any(
        item.strip(_BLANKS).lower() == ABORT_VALUE for item in value.split(",")
    )
