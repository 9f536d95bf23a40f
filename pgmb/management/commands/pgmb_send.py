"""``manage.py pgmb_send``: publish one message, or many from a JSON Lines file.

One message::

    manage.py pgmb_send order.created '{"order_id": 1}' --headers '{"tenant": "eu"}' --delay 10m

Many, each line a body sent with the same routing key, or (without a routing key) each line
an envelope ``{"routing_key": ..., "body": ..., "headers"?: ..., "delay"?: ..., "id"?: ...}``
(and the message options ``priority``, ``group``, ``depends_on``, ``dedup_id``,
``max_retries``, ``retry_delay``, docs/ordering.md, ``ttl`` or ``expires_at``,
docs/delivery.md, and ``unique_key`` and ``on_duplicate``, docs/publishing.md)::

    manage.py pgmb_send order.created --file bodies.jsonl
    manage.py pgmb_send --file envelopes.jsonl
    producer | manage.py pgmb_send --file -

A file is published in one transaction, streamed in batches of ``--batch-size``: a bad line
anywhere publishes nothing and the error names the line.
"""

from __future__ import annotations

import sys
from contextlib import ExitStack
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import Error as DjangoDatabaseError
from django.db import transaction

from pgmb import conf
from pgmb.cli_args import database_alias
from pgmb.db.error_text import database_reason, one_line
from pgmb.durations import parse_delay
from pgmb.errors import PgmbError
from pgmb.message_input import (
    SINGLE_OPTIONS,
    Delay,
    LineError,
    command_options,
    parse_headers,
    parse_id,
    parse_json,
)
from pgmb.publish import send, unrouted
from pgmb.publish_file import remaining_bytes, send_file
from pgmb.routing import validate_routing_key
from pgmb.terminal_progress import Progress


class Command(BaseCommand):
    help = (
        "Publish a message: ROUTING_KEY and a JSON BODY, or many from a JSON Lines --file "
        "(one transaction). Prints the message id, or how many messages were sent."
    )
    # call_command(..., stdin=stream) feeds "--file -" without touching sys.stdin.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "routing_key",
            nargs="?",
            metavar="ROUTING_KEY",
            help="Dot-separated words, e.g. order.created. With --file and no ROUTING_KEY, "
            "each line is an envelope naming its own routing_key.",
        )
        parser.add_argument(
            "body", nargs="?", metavar="BODY", help="The message body, a JSON text."
        )
        parser.add_argument(
            "--headers", metavar="JSON", help="A JSON object passed on to the worker."
        )
        parser.add_argument(
            "--delay",
            metavar="DELAY",
            help="Do not deliver before: seconds (30, 1.5), a duration (500ms, 45s, 10m, 2h, "
            "1h30m, 1d) or an ISO-8601 time with a time zone (2026-12-01T10:00:00+00:00).",
        )
        parser.add_argument("--id", metavar="UUID", help="The message id (default: a new one).")
        options = parser.add_argument_group("message options (docs/ordering.md)")
        options.add_argument(
            "--priority", type=int, metavar="N", help="Lower is delivered first (default 0)."
        )
        options.add_argument(
            "--group",
            metavar="KEY",
            help="An ordered group: a queue delivers its messages one at a time, in order.",
        )
        options.add_argument(
            "--depends-on",
            metavar="UUIDS",
            help="Comma-separated ids of messages that must be settled first.",
        )
        options.add_argument(
            "--dedup-id",
            metavar="ID",
            help="Dropped if a message with this id was published within the dedup window.",
        )
        options.add_argument(
            "--max-retries", type=int, metavar="N", help="Instead of the queue's max_retries."
        )
        options.add_argument(
            "--retry-delay",
            metavar="DURATION",
            help="Seconds or a duration (30s, 5m) between attempts, instead of the backoff.",
        )
        options.add_argument(
            "--ttl",
            metavar="DURATION",
            help="Seconds or a duration (30s, 5m) from now after which the message is not "
            "delivered (docs/delivery.md, Expiry).",
        )
        options.add_argument(
            "--expires-at",
            metavar="TIME",
            help="A time (2030-01-01T12:00:00Z) after which the message is not delivered.",
        )
        options.add_argument(
            "--unique-key",
            metavar="KEY",
            help="Skipped (or, with --on-duplicate replace, replacing the pending one) on each "
            "queue where a delivery with this key is live (docs/publishing.md).",
        )
        options.add_argument(
            "--on-duplicate",
            choices=("skip", "replace"),
            help="What a message with a live unique key does: skip (the default) or replace.",
        )
        parser.add_argument(
            "--file",
            metavar="PATH",
            help="Publish every non-blank line of this JSON Lines file ('-' for stdin), "
            "all in one transaction.",
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            metavar="N",
            help="Messages per INSERT with --file (default: PGMB['SEND_BATCH_SIZE']).",
        )
        parser.add_argument(
            "--database",
            metavar="ALIAS",
            help="Database alias to publish to (default: PGMB['DATABASE']).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except (LineError, PgmbError, ValueError) as exc:
            raise CommandError(one_line(str(exc))) from exc
        except DjangoDatabaseError as exc:
            raise CommandError(f"database error: {database_reason(exc)}") from exc
        except KeyboardInterrupt:
            raise CommandError("interrupted: nothing was sent", returncode=130) from None

    def _handle(self, options: dict[str, Any]) -> None:
        self.verbosity = options["verbosity"]
        routing_key, body, path = options["routing_key"], options["body"], options["file"]
        if path is None:
            if routing_key is None:
                raise CommandError("give a ROUTING_KEY and a BODY, or --file")
            if body is None:
                raise CommandError("give a BODY or --file")
            if options["batch_size"] is not None:
                raise CommandError("--batch-size only applies to --file")
        else:
            if body is not None:
                raise CommandError("give a BODY or --file, not both")
            if options["id"] is not None:
                raise CommandError("--id cannot be used with --file: each message needs its own id")
            for name in SINGLE_OPTIONS:
                if options[name] is not None:
                    flag = "--" + name.replace("_", "-")
                    raise CommandError(
                        f"{flag} cannot be used with --file: give it per line, in an envelope"
                    )
        using = database_alias(options["database"])
        headers = (
            parse_headers(self._json(options["headers"], "--headers"), "--headers")
            if options["headers"] is not None
            else None
        )
        delay = parse_delay(options["delay"]) if options["delay"] is not None else None
        message_options = command_options(options)

        if path is None:
            message_id = parse_id(options["id"], "--id") if options["id"] is not None else None
            value = self._json(body, "BODY")
            with transaction.atomic(using=using):
                sent = send(
                    routing_key,
                    value,
                    headers=headers,
                    delay=delay,
                    message_id=message_id,
                    using=using,
                    **message_options,
                )
                if unrouted([sent], using=using):
                    self._warn_unrouted([(None, routing_key)])
            self._say(str(sent))
            return

        batch_size = options["batch_size"]
        if batch_size is None:
            batch_size = conf.get().SEND_BATCH_SIZE
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise CommandError(f"--batch-size must be a whole number of at least 1: {batch_size}")
        if routing_key is not None:
            validate_routing_key(routing_key)

        with ExitStack() as stack:
            stream = self._open(path, options.get("stdin"), stack)
            count = self._send_file(
                stream, path, routing_key, headers, delay, message_options, batch_size, using
            )
        self._say(f"sent {count:d} message{'' if count == 1 else 's'}")

    def _warn_unrouted(self, lost: list[tuple[int | None, str]]) -> None:
        """Say that messages matched no queue: they are stored, and nothing delivers them."""
        line, key = lost[0]
        which = (
            f"{len(lost)} messages matched no queue (the first: line {line}, routing key {key!r})"
            if len(lost) > 1
            else f"the message{'' if line is None else f' on line {line}'} with routing key "
            f"{key!r} matched no queue"
        )
        self.stderr.write(
            f"warning: {which}; stored, but no queue's binding key matches, so nothing will "
            "deliver it (see 'Unrouted messages' in pgmb's docs/publishing.md)"
        )

    def _say(self, text: str) -> None:
        if self.verbosity > 0:
            self.stdout.write(text)

    @staticmethod
    def _json(text: str, what: str) -> Any:
        try:
            return parse_json(text)
        except ValueError as exc:
            reason = str(exc).removeprefix("invalid JSON: ")
            raise CommandError(f"{what} is not valid JSON: {reason}") from exc

    @staticmethod
    def _open(path: str, stdin: IO | None, stack: ExitStack) -> IO:
        if path == "-":
            stream = stdin if stdin is not None else sys.stdin
            # Bytes where possible: the progress bar counts them and lines decode one by one.
            return getattr(stream, "buffer", stream)
        try:
            return stack.enter_context(open(path, "rb"))
        except OSError as exc:
            raise CommandError(f"cannot read --file {path}: {exc.strerror or exc}") from exc

    def _send_file(
        self,
        stream: IO,
        path: str,
        routing_key: str | None,
        headers: dict[str, Any] | None,
        delay: Delay,
        message_options: dict[str, Any],
        batch_size: int,
        using: str,
    ) -> int:
        interactive = self.verbosity > 0 and self.stdout.isatty() and self.stderr.isatty()
        progress = Progress(self.stderr, remaining_bytes(stream), interactive)
        try:
            count, lost = send_file(
                stream,
                path,
                routing_key,
                headers,
                delay,
                message_options,
                batch_size,
                using,
                progress=progress.update,
            )
            progress.update(count, progress.total or 0, force=True)
        finally:
            progress.close()
        if lost:
            self._warn_unrouted(lost)
        return count
