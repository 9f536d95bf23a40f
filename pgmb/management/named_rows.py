"""Rows a command's operator named by id or by message id (``pgmb_requeue``,
``pgmb_deliveries``): found and locked in one query, and those that name nothing shown."""

from __future__ import annotations

import uuid
from typing import TypeVar

from django.db.models import Q, QuerySet

from pgmb.models import DeadLetter, Delivery

Row = TypeVar("Row", DeadLetter, Delivery)


def named_rows(rows: QuerySet[Row], refs: list[int | uuid.UUID]) -> tuple[list[Row], list[str]]:
    """The rows ``refs`` name (their ids, or their messages' ids), locked until the
    transaction ends, and the refs that name none of them."""
    numbers = {ref for ref in refs if isinstance(ref, int)}
    message_ids = {ref for ref in refs if isinstance(ref, uuid.UUID)}
    named = Q(pk__in=numbers) | Q(message_id__in=message_ids)
    found_rows = list(rows.select_for_update().filter(named).order_by("pk"))
    found = {row.pk for row in found_rows} | {row.message_id for row in found_rows}
    return found_rows, [str(ref) for ref in dict.fromkeys(refs) if ref not in found]


def listed(refs: list[str]) -> str:
    """The first five refs, and how many more."""
    more = f" and {len(refs) - 5} more" if len(refs) > 5 else ""
    return ", ".join(refs[:5]) + more
