"""Publishing a JSON Lines file in one transaction, batch by batch (``pgmb_send --file``).

A batch is one INSERT; when the database refuses one, its lines are sent again one at a
time to name the line at fault (:class:`~pgmb.message_input.LineError`), and the error
rolls back the whole file: a bad line anywhere publishes nothing.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import IO, Any

from django.db import DataError, IntegrityError, transaction

from .db.error_text import database_reason
from .errors import PgmbError
from .message_input import Delay, LineError, outgoing, read_lines
from .publish import Outgoing, send, send_batch, unrouted


def send_file(
    stream: IO,
    path: str,
    routing_key: str | None,
    headers: dict[str, Any] | None,
    delay: Delay,
    message_options: dict[str, Any],
    batch_size: int,
    using: str,
    progress: Callable[[int, int], None] = lambda messages, done_bytes: None,
) -> tuple[int, list[tuple[int | None, str]]]:
    """Publish every non-blank line of ``stream``; returns how many messages were sent and
    (line, routing key) of those that matched no queue.

    ``progress`` hears (messages sent, bytes read) after each batch.
    """
    count, done_bytes = 0, 0
    batch: list[tuple[int, Outgoing]] = []
    lost: list[tuple[int | None, str]] = []
    with transaction.atomic(using=using):
        for number, text, size in read_lines(stream, path):
            done_bytes += size
            if not text.strip():
                continue
            batch.append(
                (number, outgoing(number, text, routing_key, headers, delay, message_options))
            )
            if len(batch) >= batch_size:
                count += send_batch_or_blame(batch, using, lost)
                batch = []
                progress(count, done_bytes)
        count += send_batch_or_blame(batch, using, lost)
    return count, lost


def remaining_bytes(stream: IO) -> int | None:
    """Bytes left in ``stream`` if it is a regular file (a pipe's length is unknown)."""
    try:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        return max(info.st_size - stream.tell(), 0)
    except (AttributeError, OSError, ValueError):
        return None


def send_batch_or_blame(
    batch: list[tuple[int, Outgoing]], using: str, lost: list[tuple[int | None, str]]
) -> int:
    """Publish a batch in one INSERT; if the database refuses it, find the line to blame.

    Lines whose message matched no queue are added to ``lost``.
    """
    if not batch:
        return 0
    try:
        with transaction.atomic(using=using):
            ids = send_batch([item for _, item in batch], using=using)
    except (PgmbError, DataError, IntegrityError):
        blame(batch, using)
        raise  # no single line fails alone: report the error as it is
    if missing := set(unrouted(ids, using=using)):
        lost.extend(
            (number, item.routing_key)
            for (number, item), mid in zip(batch, ids, strict=True)
            if mid in missing
        )
    return len(batch)


def blame(batch: list[tuple[int, Outgoing]], using: str) -> None:
    """Send the batch's messages one by one, raising :class:`LineError` at the first refusal.

    Only runs once a batch has failed, so its cost does not matter; the messages it sends
    go away with the file's transaction, which the error rolls back.
    """
    for number, item in batch:
        try:
            with transaction.atomic(using=using):
                send(
                    item.routing_key,
                    item.body,
                    headers=item.headers,
                    delay=item.delay,
                    message_id=item.message_id,
                    priority=item.priority,
                    group=item.group,
                    depends_on=item.depends_on,
                    dedup_id=item.dedup_id,
                    max_retries=item.max_retries,
                    retry_delay=item.retry_delay,
                    unique_key=item.unique_key,
                    on_duplicate=item.on_duplicate,
                    using=using,
                )
        except PgmbError as exc:
            raise LineError(number, str(exc)) from exc
        except (DataError, IntegrityError) as exc:
            raise LineError(number, f"the database refused it: {database_reason(exc)}") from exc
