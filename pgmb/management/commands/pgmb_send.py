"""``manage.py pgmb_send``: publish one message, or many from a JSON Lines file.

One message::

    manage.py pgmb_send order.created '{"order_id": 1}' --headers '{"tenant": "eu"}' --delay 10m

Many, each line a body sent with the same routing key, or (without a routing key) each line
an envelope ``{"routing_key": ..., "body": ..., "headers"?: ..., "delay"?: ..., "id"?: ...}``
(and the message options ``priority``, ``group``, ``depends_on``, ``dedup_id``,
``max_retries``, ``retry_delay``, docs/ordering.md)::

    manage.py pgmb_send order.created --file bodies.jsonl
    manage.py pgmb_send --file envelopes.jsonl
    producer | manage.py pgmb_send --file -

A file is published in one transaction, streamed in batches of ``--batch-size``: a bad line
anywhere publishes nothing and the error names the line.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from datetime import datetime
from typing import IO, Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DataError, IntegrityError, connections, transaction
from django.db import Error as DjangoDatabaseError
from django.utils.connection import ConnectionDoesNotExist

from pgmb import conf
from pgmb.durations import check_seconds, parse_delay
from pgmb.errors import PgmbError
from pgmb.publish import Outgoing, send, send_batch, unrouted
from pgmb.routing import validate_routing_key

ENVELOPE_KEYS = (
    "routing_key",
    "body",
    "headers",
    "delay",
    "id",
    "priority",
    "group",
    "depends_on",
    "dedup_id",
    "max_retries",
    "retry_delay",
)
#: The message options (pgmb.send's keywords) a --file applies to every line.
FILE_OPTIONS = ("priority", "group", "max_retries", "retry_delay")
#: The options only a single message (or an envelope) may have.
SINGLE_OPTIONS = ("depends_on", "dedup_id")

Delay = float | datetime | None


class LineError(Exception):
    """Bad input on one line of ``--file``; reported as ``line N: ...``."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


def one_line(text: str) -> str:
    """``text`` on a single line: Django prints a CommandError as one line of stderr."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def database_reason(exc: DjangoDatabaseError) -> str:
    """The database's own words for why it refused a statement (message and detail)."""
    diag = getattr(exc.__cause__, "diag", None)
    if diag is not None and diag.message_primary:
        detail = f" ({diag.message_detail})" if diag.message_detail else ""
        return one_line(f"{diag.message_primary}{detail}")
    return one_line(str(exc))


def _reject_constant(name: str) -> Any:
    # Python's json reads NaN and Infinity, which are not JSON and which jsonb refuses.
    raise ValueError(f"invalid JSON: {name} is not a JSON number")


def parse_json(text: str) -> Any:
    """Decode one JSON text; ``ValueError`` with a short reason if it is not JSON."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        hint = ""
        if exc.pos == 0 and exc.msg == "Expecting value" and text.strip()[:1].isalpha():
            hint = " (a JSON string needs double quotes, like '\"hello\"')"
        raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}{hint}") from None
    except RecursionError:
        raise ValueError("invalid JSON: nested too deeply") from None


def parse_headers(value: Any, where: str) -> dict[str, Any]:
    """Check that decoded headers are a JSON object."""
    if not isinstance(value, dict):
        raise ValueError(
            f'{where} must be a JSON object, like \'{{"tenant": "eu"}}\', not {_json_type(value)}'
        )
    return value


def parse_id(value: Any, where: str) -> uuid.UUID:
    """A message id given as text."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a UUID text, not {_json_type(value)}")
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"{where} {value!r} is not a UUID") from None


def parse_retry_delay(value: Any, where: str = "retry delay") -> float:
    """Seconds between attempts: a JSON number, or a text :func:`parse_delay` reads as a
    duration (not a point in time)."""
    seconds = parse_delay(value) if isinstance(value, str) else value
    if isinstance(seconds, datetime):
        raise ValueError(f"{where} must be seconds or a duration (like 30s or 5m), not a time")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise ValueError(f"{where} must be a number of seconds or a text, not {_json_type(value)}")
    return float(seconds)


def parse_depends_on(value: Any, where: str = "depends_on") -> list[uuid.UUID]:
    """Message ids: a list of UUID texts (an envelope) or comma-separated ones (the option)."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of message ids, not {_json_type(value)}")
    return [parse_id(item, where) for item in value]


def envelope_delay(value: Any) -> Delay:
    """An envelope's ``delay``: seconds as a JSON number, or any text :func:`parse_delay` reads."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_delay(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return check_seconds(value)
    raise ValueError(f"delay must be a number of seconds or a text, not {_json_type(value)}")


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return names.get(type(value), type(value).__name__)


class Progress:
    """A one-line progress report on a terminal, redrawn at most ten times a second."""

    def __init__(self, out: Any, total_bytes: int | None, enabled: bool) -> None:
        self.out, self.total, self.enabled = out, total_bytes, enabled
        self.started = self.drawn = time.monotonic()
        self.shown = False

    def update(self, messages: int, done_bytes: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.drawn < 0.1):
            return
        self.drawn = now
        rate = messages / max(now - self.started, 1e-6)
        text = f"{messages:,} messages, {rate:,.0f}/s"
        if self.total:
            share = min(done_bytes / self.total, 1.0)
            bar = "#" * int(share * 30)
            text = f"{share:4.0%} [{bar:<30}] {text}"
        self._write(f"\r\x1b[2K{text}")
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self._write("\r\x1b[2K")

    def _write(self, text: str) -> None:
        # Plain text: stderr's default style would paint the bar as an error.
        self.out.write(text, style_func=str, ending="")
        self.out.flush()


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
        using = options["database"] or conf.get().DATABASE
        try:
            connections[using]
        except ConnectionDoesNotExist:
            raise CommandError(f"--database {using!r} is not in settings.DATABASES") from None
        headers = (
            parse_headers(self._json(options["headers"], "--headers"), "--headers")
            if options["headers"] is not None
            else None
        )
        delay = parse_delay(options["delay"]) if options["delay"] is not None else None
        message_options: dict[str, Any] = {
            name: options[name]
            for name in (*FILE_OPTIONS, *SINGLE_OPTIONS)
            if options[name] is not None
        }
        if "retry_delay" in message_options:
            message_options["retry_delay"] = parse_retry_delay(
                message_options["retry_delay"], "--retry-delay"
            )
        if "depends_on" in message_options:
            message_options["depends_on"] = parse_depends_on(
                message_options["depends_on"], "--depends-on"
            )

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
            "deliver it (see 'Unrouted messages' in the README)"
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
        progress = Progress(self.stderr, _remaining_bytes(stream), interactive)
        count, done_bytes = 0, 0
        batch: list[tuple[int, Outgoing]] = []
        lost: list[tuple[int | None, str]] = []
        try:
            with transaction.atomic(using=using):
                for number, text, size in _lines(stream, path):
                    done_bytes += size
                    if not text.strip():
                        continue
                    batch.append(
                        (
                            number,
                            _outgoing(number, text, routing_key, headers, delay, message_options),
                        )
                    )
                    if len(batch) >= batch_size:
                        count += _flush(batch, using, lost)
                        batch = []
                        progress.update(count, done_bytes)
                count += _flush(batch, using, lost)
                progress.update(count, done_bytes, force=True)
        finally:
            progress.close()
        if lost:
            self._warn_unrouted(lost)
        return count


def _remaining_bytes(stream: IO) -> int | None:
    """Bytes left in ``stream`` if it is a regular file (a pipe's length is unknown)."""
    try:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            return None
        return max(info.st_size - stream.tell(), 0)
    except (AttributeError, OSError, ValueError):
        return None


def _lines(stream: IO, path: str) -> Iterator[tuple[int, str, int]]:
    """``(line number, text, size in bytes)`` for each line, read one at a time."""
    number = 0
    try:
        for number, raw in enumerate(stream, 1):
            if isinstance(raw, bytes):
                size = len(raw)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise LineError(number, f"not UTF-8 text (byte {exc.start + 1})") from None
            else:
                text, size = raw, len(raw.encode("utf-8", "surrogatepass"))
            yield number, (text.removeprefix("\ufeff") if number == 1 else text), size
    except OSError as exc:
        where = "stdin" if path == "-" else path
        raise CommandError(
            f"cannot read {where} after line {number}: {exc.strerror or exc}"
        ) from exc


def _outgoing(
    number: int,
    text: str,
    routing_key: str | None,
    headers: dict[str, Any] | None,
    delay: Delay,
    message_options: dict[str, Any],
) -> Outgoing:
    """Parse and check one line, so that a bad one is reported with its number."""
    try:
        value = parse_json(text)
        if routing_key is not None:
            return Outgoing(routing_key, value, headers, delay, **message_options)
        return _envelope(value, headers, delay, message_options)
    except (PgmbError, ValueError) as exc:
        raise LineError(number, str(exc)) from exc


def _envelope(
    value: Any, headers: dict[str, Any] | None, delay: Delay, message_options: dict[str, Any]
) -> Outgoing:
    """An envelope line; ``--headers``, ``--delay`` and the file's message options are
    defaults its own fields override."""
    if not isinstance(value, dict):
        raise ValueError(
            "without a ROUTING_KEY each line must be a JSON object "
            f'{{"routing_key": ..., "body": ...}}, not {_json_type(value)}'
        )
    unknown = [key for key in value if key not in ENVELOPE_KEYS]
    if unknown:
        raise ValueError(
            f"unknown key {', '.join(map(repr, unknown))} "
            f"(an envelope has: {', '.join(ENVELOPE_KEYS)})"
        )
    missing = [key for key in ("routing_key", "body") if key not in value]
    if missing:
        raise ValueError(f"the envelope has no {' and no '.join(map(repr, missing))}")
    if value.get("headers") is not None:
        own = parse_headers(value["headers"], "headers")
        headers = {**headers, **own} if headers else own
    chosen = dict(message_options)
    for name in (*FILE_OPTIONS, *SINGLE_OPTIONS):
        if value.get(name) is not None:
            chosen[name] = value[name]
    if "retry_delay" in value and value["retry_delay"] is not None:
        chosen["retry_delay"] = parse_retry_delay(value["retry_delay"])
    if value.get("depends_on") is not None:
        chosen["depends_on"] = parse_depends_on(value["depends_on"])
    return Outgoing(
        validate_routing_key(value["routing_key"]),
        value["body"],
        headers,
        envelope_delay(value["delay"]) if value.get("delay") is not None else delay,
        parse_id(value["id"], "id") if value.get("id") is not None else None,
        **chosen,
    )


def _flush(
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
        _blame(batch, using)
        raise  # no single line fails alone: report the error as it is
    if missing := set(unrouted(ids, using=using)):
        lost.extend(
            (number, item.routing_key)
            for (number, item), mid in zip(batch, ids, strict=True)
            if mid in missing
        )
    return len(batch)


def _blame(batch: list[tuple[int, Outgoing]], using: str) -> None:
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
                    using=using,
                )
        except PgmbError as exc:
            raise LineError(number, str(exc)) from exc
        except (DataError, IntegrityError) as exc:
            raise LineError(number, f"the database refused it: {database_reason(exc)}") from exc
