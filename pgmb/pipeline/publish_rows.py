"""What Spark's executors do with the rows of a ``publish``: check them, then write them.

Both run once per Spark partition (``mapPartitions``) on the executors, which have
neither Django nor pyspark's driver side: this module needs only psycopg and pgmb's
Django-free rules (:mod:`pgmb.routing`, :mod:`pgmb.durations`,
:mod:`pgmb.message_limits`), so that a row is held to exactly what :func:`pgmb.send`
would hold it to. A row that breaks a rule of its form (key, id, JSON, delay) stops the
run before anything is written; a well-formed row that breaks a message limit (depth,
header count and sizes, reserved headers) is refused on its own, with its reason, and the
others are published (docs/decisions/0041-pipeline-rows-refused-one-by-one.md).

A row comes from :func:`pgmb.pipeline.publish_input.prepare`, its fields in the order of
:data:`FIELDS` (the first few of them).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, NamedTuple, Protocol

import psycopg

from pgmb import sql
from pgmb.durations import check_seconds, parse_delay
from pgmb.errors import PgmbError
from pgmb.message_limits import MAX_DEPTH, body_problem, headers_problem
from pgmb.routing import validate_routing_key

from .postgres import CONNECT_TIMEOUT, Database

#: The prepared dataset's columns, in order: the message's id, routing key, body and headers
#: (JSON texts) and delay (seconds as a number, or a text for
#: :func:`pgmb.durations.parse_delay`); the row's position in the read (unique), the
#: reader's note on a line it could not parse, the file the row comes from. The check
#: pass reads :data:`CHECKED`, the publishing pass :data:`WRITTEN`: the fewer columns
#: cross from the JVM to Python, the faster (the file name would be the largest).
FIELDS = ("id", "key", "body", "headers", "delay", "pos", "corrupt", "file")
ID, KEY, BODY, HEADERS, DELAY, POS, CORRUPT, FILE = range(len(FIELDS))
CHECKED = FIELDS[:FILE]
WRITTEN = FIELDS[:CORRUPT]
#: Bad rows a partition reports, with where they are; the total is counted exactly.
EXAMPLES = 3
#: Distinct routing keys whose number of matching queues a partition remembers.
ROUTE_CACHE = 100_000


class Counter(Protocol):
    """A Spark accumulator, as the executors see it."""

    def add(self, term: int) -> None: ...


@dataclass(frozen=True)
class Plan:
    """What every partition needs; pickled once per task.

    ``dsn`` holds the password (it travels with the task, as Spark's JDBC options do), so
    it is left out of ``repr``.
    ``seconds`` or ``at`` (an absolute time as ISO text) is the constant ``--delay``, used
    for rows that carry none. ``patterns`` are the queues' compiled binding keys when the
    run started: what the routing trigger matches, so that deliveries can be counted.
    ``every_refusal``: the partitions return every row the message limits refuse (for
    ``--refused``), not only the first few.
    """

    dsn: str = field(repr=False)
    batch_size: int
    has_id: bool
    seconds: float | None = None
    at: str | None = None
    patterns: tuple[str, ...] = ()
    every_refusal: bool = False


class Bad(NamedTuple):
    """A row that cannot be published: its position in the read, its id and why."""

    pos: int
    id: str | None
    problem: str


class Checked(NamedTuple):
    """One partition's verdict: rows seen, how many are bad, the first few bad ones."""

    rows: int
    bad: int
    examples: list[Bad]


class Written(NamedTuple):
    """One partition's publishing: rows given, messages inserted (the others were already
    there or refused), deliveries those created by the routing rules, the messages no queue
    got, and the rows the message limits refused (the first few with their reasons)."""

    rows: int
    inserted: int
    deliveries: int
    unrouted: int
    unrouted_keys: list[str]
    refused: int
    refusals: list[Bad]


class PublishFailed(Exception):
    """The database refused a batch (or could not be reached from an executor); the message
    says why and how far the partition got."""


# --- Checking. ---


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


def _unstorable(value: Any) -> str | None:
    """What jsonb refuses in a decoded value that Python's JSON accepts: \\u0000 and lone
    surrogates (PostgreSQL checks both; json.loads lets them through)."""
    todo = [value]
    while todo:
        item = todo.pop()
        if isinstance(item, dict):
            todo.extend(item.keys())
            todo.extend(item.values())
        elif isinstance(item, list):
            todo.extend(item)
        elif isinstance(item, str):
            if "\x00" in item:
                return "\\u0000 cannot be stored in PostgreSQL's jsonb"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "it holds an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)"
    return None


def json_problem(text: object, *, want_object: bool = False) -> str | None:
    """Why ``text`` would not be accepted by PostgreSQL as ``jsonb`` (None if it would).

    Python's parser with PostgreSQL's strictness added: no NaN or Infinity, no \\u0000, no
    unpaired surrogates. Numbers are not converted (any length is fine, as in jsonb).
    """
    if not isinstance(text, str):
        return f"expected a JSON text, got {type(text).__name__}"
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=len, parse_float=len)
    except ValueError as e:  # JSONDecodeError and _no_constant's
        return f"not valid JSON ({e})"
    except RecursionError:
        return None  # nested deeper than Python parses: limits_problem refuses it
    if "\\u" in text and (reason := _unstorable(value)):
        return reason
    if want_object and not isinstance(value, dict):
        return f"not a JSON object but {type(value).__name__}"
    return None


_UUID = re.compile(r"[0-9a-fA-F]{8}-?(?:[0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}")


def problem(row: tuple[Any, ...], plan: Plan) -> str | None:
    """Why this row cannot be published, in pgmb's words (None if it can)."""
    if row[CORRUPT] is not None:
        return f"not a JSON object: {_short(row[CORRUPT])}"
    if plan.has_id:
        if row[ID] is None:
            return "it has no message id"
        if not _UUID.fullmatch(row[ID]):
            return f"message id {_short(row[ID])} is not a UUID"
    try:
        validate_routing_key(row[KEY])
    except PgmbError as e:
        return str(e)
    if row[BODY] is None:
        return "it has no body (null)"
    if reason := json_problem(row[BODY]):
        return f"the body is {reason}" if reason.startswith("not") else f"the body: {reason}"
    if row[HEADERS] is not None and (reason := json_problem(row[HEADERS], want_object=True)):
        return f"the headers are {reason}" if reason.startswith("not") else f"headers: {reason}"
    if row[DELAY] is not None:
        try:
            _delay(row[DELAY])
        except PgmbError as e:
            return str(e)
    return None


def _parsed(text: str, what: str) -> tuple[Any, str | None]:
    """``text`` (valid JSON: the check pass saw it) decoded, or why it is too deep to. A
    number longer than Python parses decodes to None: the database's own check of the
    limits (the routing trigger) judges that row."""
    try:
        return json.loads(text), None
    except RecursionError:
        return None, f"{what}: nested deeper than {MAX_DEPTH} levels (limit max_depth)"
    except ValueError:
        return None, None


def limits_problem(body: str, headers: str | None) -> str | None:
    """Why pgmb's message limits refuse a well-formed row's body or headers, in the words
    of :mod:`pgmb.message_limits` (the rule ``pgmb.message_problem`` applies in the
    database), or None. A body whose text opens at most :data:`MAX_DEPTH` containers
    cannot nest deeper, so most bodies are not decoded again."""
    if body.count("{") + body.count("[") > MAX_DEPTH:
        value, deep = _parsed(body, "the body")
        if reason := deep or body_problem(value):
            return reason
    if headers is None or headers == "{}":
        return None
    value, deep = _parsed(headers, "the headers")
    return deep or (headers_problem(value) if isinstance(value, dict) else None)


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_partition(rows: Iterable[tuple[Any, ...]], plan: Plan) -> Iterator[Checked]:
    """``mapPartitions``: every row checked, one :class:`Checked` for the partition."""
    seen = bad = 0
    examples: list[Bad] = []
    for row in rows:
        seen += 1
        if (reason := problem(row, plan)) is not None:
            bad += 1
            if len(examples) < EXAMPLES:
                examples.append(Bad(row[POS], row[ID], reason))
    yield Checked(seen, bad, examples)


# --- Writing. ---


def _delay(value: float | str) -> tuple[float | None, str | None]:
    """A row's delay as (seconds, absolute ISO time), by pgmb's delay rules."""
    if isinstance(value, str):
        parsed = parse_delay(value)
        if isinstance(parsed, datetime):
            return None, parsed.astimezone(timezone.utc).isoformat()
        return parsed, None
    return check_seconds(value), None


def _routes(plan: Plan) -> Callable[[str], int]:
    """Number of queues a routing key goes to, remembered per key."""
    compiled = [re.compile(p) for p in plan.patterns]
    cache: dict[str, int] = {}

    def count(key: str) -> int:
        if (n := cache.get(key)) is None:
            if len(cache) >= ROUTE_CACHE:
                cache.clear()
            # The same test as pgmb.routing.matches and the routing trigger.
            n = cache[key] = sum(1 for p in compiled if p.match("." + key))
        return n

    return count


@dataclass
class Refusals:
    """The rows of a partition that the message limits refuse: how many, and the first few
    (or ``every`` one) with their reasons."""

    every: bool = False
    count: int = 0
    first: list[Bad] = field(default_factory=list)

    def add(self, row: tuple[Any, ...], reason: str) -> None:
        self.count += 1
        if self.every or len(self.first) < EXAMPLES:
            self.first.append(Bad(row[POS], row[ID], reason))


def _batches(
    rows: Iterable[tuple[Any, ...]], plan: Plan, refusals: Refusals
) -> Iterator[list[tuple[Any, ...]]]:
    """The rows as staging rows (id, routing key, body, headers, at, seconds), in lists of
    at most ``batch_size``; those the message limits refuse go to ``refusals`` instead."""
    batch: list[tuple[Any, ...]] = []
    for row in rows:
        if (reason := limits_problem(row[BODY], row[HEADERS])) is not None:
            refusals.add(row, reason)
            continue
        seconds, at = (plan.seconds, plan.at) if row[DELAY] is None else _delay(row[DELAY])
        headers = row[HEADERS] if row[HEADERS] is not None else "{}"
        batch.append((row[ID], row[KEY], row[BODY], headers, at, seconds))
        if len(batch) >= plan.batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


def write_partition(
    rows: Iterable[tuple[Any, ...]], plan: Plan, progress: Counter
) -> Iterator[Written]:
    """``mapPartitions``: publish the partition's rows in batches, each its own transaction.

    A batch is COPYed into a temporary staging table, then moved into ``pgmb_message`` by
    one routed insert that skips ids already stored: a batch written again (a re-run, a
    retried task) adds nothing. A row the message limits refuse is left out, with its
    reason. ``progress`` counts the rows done.
    """
    query = functools.partial(sql.query, "pipeline_publish.sql")
    routes = _routes(plan)
    refusals = Refusals(every=plan.every_refusal)
    seen = inserted = deliveries = unrouted = 0
    unrouted_keys: list[str] = []
    try:
        with psycopg.connect(
            plan.dsn, connect_timeout=CONNECT_TIMEOUT, application_name="pgmb publish"
        ) as conn:
            conn.execute(query("create_staging"))
            conn.commit()
            for batch in _batches(rows, plan, refusals):
                with conn.transaction(), conn.cursor() as cursor:
                    with cursor.copy(query("copy_staging")) as copy:
                        for staged in batch:
                            copy.write_row(staged)
                    for key, count in cursor.execute(query("insert_staged")).fetchall():
                        inserted += count
                        if n := routes(key):
                            deliveries += n * count
                        else:
                            unrouted += count
                            if len(unrouted_keys) < EXAMPLES and key not in unrouted_keys:
                                unrouted_keys.append(key)
                seen += len(batch)
                progress.add(len(batch))
    except psycopg.Error as e:
        reason = Database.from_dsn(plan.dsn).scrub(" ".join(str(e).split()))
        raise PublishFailed(f"a partition failed after {seen:,} of its rows: {reason}") from None
    refused = refusals.count
    progress.add(refused)
    yield Written(
        seen + refused, inserted, deliveries, unrouted, unrouted_keys, refused, refusals.first
    )
