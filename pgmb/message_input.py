"""Messages given as text: a command's arguments, or the lines of a JSON Lines file.

Each function checks one piece of input and says in one line what is wrong with it
(``ValueError``, or :class:`LineError` naming the line), so a bad line is reported before
anything is sent. ``manage.py pgmb_send`` and ``pgmb_requeue`` read their input with these.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import IO, Any

from .durations import check_seconds, parse_delay
from .errors import PgmbError
from .publish import Outgoing
from .routing import validate_routing_key

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
    "ttl",
    "expires_at",
    "unique_key",
    "on_duplicate",
)
#: The message options (pgmb.send's keywords) a --file applies to every line.
FILE_OPTIONS = (
    "priority",
    "group",
    "max_retries",
    "retry_delay",
    "ttl",
    "expires_at",
    "on_duplicate",
)
#: The options only a single message (or an envelope) may have.
SINGLE_OPTIONS = ("depends_on", "dedup_id", "unique_key")

Delay = float | datetime | None


class LineError(Exception):
    """Bad input on one line of ``--file``; reported as ``line N: ...``."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


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
            f'{where} must be a JSON object, like \'{{"tenant": "eu"}}\', not {json_type(value)}'
        )
    return value


def parse_id(value: Any, where: str) -> uuid.UUID:
    """A message id given as text."""
    if not isinstance(value, str):
        raise ValueError(f"{where} must be a UUID text, not {json_type(value)}")
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
        raise ValueError(f"{where} must be a number of seconds or a text, not {json_type(value)}")
    return float(seconds)


def parse_expires_at(value: Any, where: str = "expires_at") -> datetime:
    """A time (a text :func:`parse_delay` reads as a point in time, not a duration)."""
    try:
        moment = parse_delay(value) if isinstance(value, str) else None
    except ValueError:
        moment = None
    if not isinstance(moment, datetime):
        raise ValueError(f"{where} must be a time (like 2030-01-01T12:00:00Z), not {value!r}")
    return moment


def _parse_expiry(chosen: dict[str, Any], flags: bool) -> None:
    """``ttl`` and ``expires_at`` of ``chosen`` parsed in place (the rule itself is
    pgmb.options.check_expiry's, when the message is sent)."""
    if chosen.get("ttl") is not None:
        chosen["ttl"] = parse_retry_delay(chosen["ttl"], "--ttl" if flags else "ttl")
    if chosen.get("expires_at") is not None:
        where = "--expires-at" if flags else "expires_at"
        chosen["expires_at"] = parse_expires_at(chosen["expires_at"], where)


def parse_depends_on(value: Any, where: str = "depends_on") -> list[uuid.UUID]:
    """Message ids: a list of UUID texts (an envelope) or comma-separated ones (the option)."""
    if isinstance(value, str):
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a list of message ids, not {json_type(value)}")
    return [parse_id(item, where) for item in value]


def envelope_delay(value: Any) -> Delay:
    """An envelope's ``delay``: seconds as a JSON number, or any text :func:`parse_delay` reads."""
    if value is None:
        return None
    if isinstance(value, str):
        return parse_delay(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return check_seconds(value)
    raise ValueError(f"delay must be a number of seconds or a text, not {json_type(value)}")


def json_type(value: Any) -> str:
    """How an error names a decoded JSON value's type ("an object", "null" …)."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return names.get(type(value), type(value).__name__)


def read_lines(stream: IO, path: str) -> Iterator[tuple[int, str, int]]:
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
        raise ValueError(f"cannot read {where} after line {number}: {exc.strerror or exc}") from exc


def outgoing(
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
        return envelope(value, headers, delay, message_options)
    except (PgmbError, ValueError) as exc:
        raise LineError(number, str(exc)) from exc


def envelope(
    value: Any, headers: dict[str, Any] | None, delay: Delay, message_options: dict[str, Any]
) -> Outgoing:
    """An envelope line; ``--headers``, ``--delay`` and the file's message options are
    defaults its own fields override."""
    if not isinstance(value, dict):
        raise ValueError(
            "without a ROUTING_KEY each line must be a JSON object "
            f'{{"routing_key": ..., "body": ...}}, not {json_type(value)}'
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
    # A line's own expiry replaces the file's, whichever of the two each gives.
    if value.get("ttl") is not None or value.get("expires_at") is not None:
        chosen["ttl"], chosen["expires_at"] = value.get("ttl"), value.get("expires_at")
    _parse_expiry(chosen, flags=False)
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


def command_options(options: dict[str, Any]) -> dict[str, Any]:
    """The message options (:data:`FILE_OPTIONS`, :data:`SINGLE_OPTIONS`) a command was
    given, parsed (``--retry-delay``, ``--depends-on``); those not given are left out."""
    chosen: dict[str, Any] = {
        name: options[name]
        for name in (*FILE_OPTIONS, *SINGLE_OPTIONS)
        if options[name] is not None
    }
    if "retry_delay" in chosen:
        chosen["retry_delay"] = parse_retry_delay(chosen["retry_delay"], "--retry-delay")
    if "depends_on" in chosen:
        chosen["depends_on"] = parse_depends_on(chosen["depends_on"], "--depends-on")
    _parse_expiry(chosen, flags=True)
    return chosen
