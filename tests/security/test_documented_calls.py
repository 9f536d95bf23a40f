"""Every function of the SQL API and pull pages runs for each role it is documented for.

Generated from the docs: each table row of docs/sql-api.md and docs/pull.md whose first
cell names ``pgmb.`` functions is one call per function named (a new row is tested without
touching this file; an argument written ``a or b`` is one call per alternative); the roles
come from docs/access.md's table of the three roles (``pgmb_producer`` publishes with
every ``pgmb.send``, ``pgmb_consumer`` runs the pull functions it names, ``pgmb_admin``
runs everything) and the application's role (the owner) runs everything too. Each call
resolves to exactly one function in the catalog (the page and the schema agree, checked
for every row before any role runs one), then runs in a real login session of the role with
values of the argument's name or type. The pull page's calls act on a pull queue; the
consumer's session is of a login role granted that queue (``pgmb.grant_queue_access``,
which makes it a member of ``pgmb_consumer``), as docs/access.md says a consumer is made.

Issue 26: ``pgmb.send(id, key, body, headers, delay integer)`` failed for a producer with
``permission denied for function check_delay``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgmb.models import Delivery, Queue, Worker

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = Path(__file__).resolve().parents[2] / "docs"
#: The pages whose tables document calls; the pull page's act on a pull queue.
PAGES = ("sql-api.md", "pull.md")
_CALL = re.compile(r"`((?:CALL )?pgmb\.(\w+)\((.*?)\))`")
_TYPES = {
    "timestamptz": "timestamp with time zone",
    "float8": "double precision",
    "int": "integer",
    "int[]": "integer[]",
    "float8[]": "double precision[]",
}


@dataclass(frozen=True)
class Documented:
    text: str  # as the page writes it
    page: str
    name: str
    procedure: bool
    #: (name, type or None) of the arguments written in order; named ones (``x =>``) apart.
    positional: tuple[tuple[str, str | None], ...]
    named: tuple[str, ...]
    #: The page says "..." (the arguments are elsewhere): any overload of the name.
    elided: bool

    def __str__(self) -> str:
        return self.text


def _argument(text: str) -> tuple[str, str | None]:
    words = re.split(r"\s*(?:=|\bDEFAULT\b).*$", text.strip())[0].split(maxsplit=1)
    kind = words[1].strip() if len(words) > 1 else None
    return words[0], _TYPES.get(kind, kind) if kind else None


def documented_rows(page: str) -> list[str]:
    """The first cells of the page's table rows that name a ``pgmb.`` function (called with
    parentheses: a view is named without)."""
    rows = []
    for line in (DOCS / page).read_text().splitlines():
        if line.startswith("| `"):
            first_cell = line.split(" | ")[0]
            if re.search(r"`(CALL )?pgmb\.\w+\s*\(", first_cell):
                rows.append(first_cell)
    return rows


def _calls_of(page: str, first_cell: str) -> list[Documented]:
    calls = []
    for match in _CALL.finditer(first_cell):
        text, name, arguments = match.groups()
        parts = [a.strip() for a in arguments.split(",") if a.strip()]
        # "delivery_ids bigint[] or delivery_id bigint": one call per alternative.
        procedure = text.startswith("CALL ")
        for chosen in itertools.product(*(re.split(r"\s+or\s+", part) for part in parts)):
            calls.append(
                Documented(
                    text=f"{'CALL ' if procedure else ''}pgmb.{name}({', '.join(chosen)})",
                    page=page,
                    name=name,
                    procedure=procedure,
                    positional=tuple(_argument(a) for a in chosen if not a.endswith("=>")),
                    named=tuple(a[:-2].strip() for a in chosen if a.endswith("=>")),
                    elided=list(chosen) == ["..."],
                )
            )
    return calls


def documented_calls() -> list[Documented]:
    return [
        call for page in PAGES for row in documented_rows(page) for call in _calls_of(page, row)
    ]


def documented_roles() -> dict[str, set[str] | None]:
    """Each group role's function names from docs/access.md (None: every function)."""
    roles: dict[str, set[str] | None] = {}
    for line in (DOCS / "access.md").read_text().splitlines():
        match = re.match(r"\| `(pgmb_\w+)` \| (.*) \|$", line)
        if match:
            role, may = match.groups()
            # "what it may do: the functions, ...": the functions follow the first colon.
            names = set(re.findall(r"`(?:pgmb\.)?(\w+)(?:\(|`)", may.partition(":")[2]))
            roles[role] = None if may.startswith("everything") else names
    return roles


CALLS = documented_calls()
ROLES = documented_roles()
CASES = [
    pytest.param(call, role, id=f"{role}:{call}")
    for call in CALLS
    for role in ["owner", *ROLES]
    if role == "owner" or ROLES[role] is None or call.name in (ROLES[role] or ())
]

WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
CLAIMED = (
    "ROW(1, gen_random_uuid(), 1, 2, gen_random_uuid(), 'q', gen_random_uuid(), 'doc.created',"
    f" '{{}}', '{{}}'::jsonb, now(), gen_random_uuid(), 'http://127.0.0.1:9/', 1.0,"
    f" ARRAY['{WHSEC}'], 10, 60)::pgmb.claimed"
)
#: Values by (function, argument) first, then by argument name: SQL expressions, with
#: %(…)s for the fixtures' objects. Anything else gets a value of its type (_BY_TYPE).
_BY_FUNCTION = {
    ("archive_lock_key", "kind"): "'job'",
    # A time to live, or an expiry time: not both.
    ("send", "expires_at"): "NULL",
    ("send_unique", "expires_at"): "NULL",
    ("send_unique", "unique_key"): "'u-' || gen_random_uuid()",
    ("send_unique", "on_duplicate"): "'replace'",
    ("dispatcher_start", "kind"): "'external'",
    ("worker", "name"): "'w' || md5(random()::text)",
    ("create", "name"): "'q' || left(md5(random()::text), 20)",
    ("dispatch_loop", "seconds"): "0",
    ("schedule", "name"): "'s' || md5(random()::text)",
    ("schedule", "cron"): "'0 * * * *'",
    ("schedule", "every"): "NULL",
    ("schedule", "timezone"): "'Europe/Berlin'",
    ("schedule", "missed"): "'once'",
    ("schedule", "task"): "NULL",
    ("cron_next", "expr"): "'0 * * * *'",
    ("cron_next", "tz"): "'Europe/Berlin'",
    ("breaker_admit", "lease"): "gen_random_uuid()",
    ("post", "body"): "'{}'",
    ("post_via_plpython", "body"): "'{}'",
    ("publish_event", "routing_key"): "'pgmb.doc'",
    ("delivery_event", "routing_key"): "'pgmb.doc'",
    ("backfill", "since"): "now() - interval '1 hour'",
    ("backfill", "until"): "now()",
    ("recover", "since"): "now() - interval '1 hour'",
    ("recover", "until"): "now()",
}
_BY_NAME = {
    "id": "gen_random_uuid()",
    "routing_key": "'doc.created'",
    "key": "'doc.created'",
    "binding_key": "'doc.#'",
    "body": "'{\"n\": 1}'",
    "endpoint": "'http://127.0.0.1:9/'",
    "url": "'http://127.0.0.1:9/'",
    "urls": "ARRAY['http://127.0.0.1:9/']",
    "bodies": "ARRAY['{}']",
    "timeouts": "ARRAY[1.0]",
    "timeout": "1",
    "lease": "60",
    "worker_id": "%(worker_id)s",
    "worker_ids": "ARRAY[%(worker_id)s]::uuid[]",
    "queue_name": "%(queue)s",
    "queue_names": "ARRAY[%(queue)s]",
    "message_ids": "ARRAY[%(message_id)s]::uuid[]",
    "dispatcher_id": "%(dispatcher_id)s",
    "secret": f"'{WHSEC}'",
    "current": "''",
    "value": "'120'",
    "status": "503",
    "c": CLAIMED,
    "requests": f"ARRAY[{CLAIMED}]",
    "unix_time": "extract(epoch FROM now())",
    "deadline": "extract(epoch FROM now()) + 5",
    "host": "'doc-host'",
    "keep": "'1 day'",
    "budget_ms": "1000",
    "stopped_at": "NULL",
    "priority": "1",
    "group_key": "'g'",
    "depends_on": "ARRAY[%(message_id)s]::uuid[]",
    "dedup_id": "'d-' || gen_random_uuid()",
    "retry_delay": "1.5",
    "vt": "30",
    "qty": "10",
    "filter": '\'{"body": {"n": 1}}\'',
    "max_poll_seconds": "0",
    "poll_interval_ms": "10",
    "delivery_id": "%(delivery_id)s",
    "delivery_ids": "ARRAY[%(delivery_id)s]::bigint[]",
    "read_counts": "ARRAY[1]",
    "errors": "ARRAY['handler failed']",
    # Valid for a push queue too (one with a worker may not turn it off).
    "keep_history": "true",
}
_BY_TYPE = {
    "uuid": "gen_random_uuid()",
    "text": "'x'",
    "integer": "1",
    "bigint": "1",
    "smallint": "1",
    "double precision": "1",
    "boolean": "false",
    "jsonb": "'{}'",
    "interval": "'1 day'",
    "bytea": "'\\x01'",
    "timestamp with time zone": "now() + interval '1 minute'",
    "date": "current_date",
}


@dataclass(frozen=True)
class Function:
    signature: str
    arguments: tuple[tuple[str, str], ...]  # the IN arguments: (name, type)
    defaults: int
    procedure: bool


def _functions(owner: psycopg.Connection, name: str) -> list[Function]:
    rows = owner.execute(
        """
        SELECT p.oid::regprocedure::text, p.proargnames, p.proargmodes,
               array(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t),
               p.pronargdefaults, p.prokind = 'p'
        FROM pg_proc p WHERE p.pronamespace = 'pgmb'::regnamespace AND p.proname = %s
        """,
        [name],
    ).fetchall()
    found = []
    for signature, names, modes, types, defaults, procedure in rows:
        ins = [
            n
            for n, m in zip(names or [], modes or ["i"] * len(names or []), strict=False)
            if m in ("i", "b", "v")
        ]
        found.append(Function(signature, tuple(zip(ins, types, strict=True)), defaults, procedure))
    return found


def _resolve(owner: psycopg.Connection, call: Documented) -> Function:
    """The one function the page's row names."""
    matches = []
    for f in _functions(owner, call.name):
        if call.elided:
            matches.append(f)
            continue
        given = len(call.positional)
        names = [n for n, _ in f.arguments]
        if [n for n, _ in call.positional] != names[:given]:
            continue
        if any(t and t != f.arguments[i][1] for i, (_, t) in enumerate(call.positional)):
            continue
        if not set(call.named) <= set(names[given:]) or len(names) - given > f.defaults:
            continue
        matches.append(f)
    if call.elided:
        matches = matches[:1]
    assert len(matches) == 1, f"{call}: {len(matches)} functions match in the catalog"
    return matches[0]


def _missing_extension(owner: psycopg.Connection, call: Documented) -> str | None:
    """The extension the call's function needs, if the server lacks it (None: it has it)."""
    needs = {"cron_install": "pg_cron", "cron_uninstall": "pg_cron"}.get(call.name)
    if call.name.endswith("_via_plpython"):
        needs = "plpython3u"
    if needs is None:
        return None
    query = "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = %s)"
    row = owner.execute(query, [needs]).fetchone()
    return None if row and row[0] else needs


def _statement(call: Documented, function: Function) -> str:
    written = {n for n, _ in call.positional} | set(call.named)
    if call.elided:  # the required arguments only
        written = {n for n, _ in function.arguments[: len(function.arguments) - function.defaults]}
    # Positionally, each cast to its type, up to what the page writes in order (overloads
    # with the same argument names differ in their order); the options by name after them.
    values = []
    for name, kind in function.arguments:
        if name not in written:
            continue
        value = _BY_FUNCTION.get((call.name, name)) or _BY_NAME.get(name)
        if value is None:
            value = "'{}'" if kind.endswith("[]") else _BY_TYPE[kind]
        label = f"{name} => " if name in call.named else ""
        values.append(f"{label}({value})::{kind}")
    verb = "CALL" if function.procedure else "SELECT * FROM"
    return f"{verb} pgmb.{call.name}({', '.join(values)})"


@pytest.fixture
def world(owner, make_worker, make_queue) -> dict[str, object]:
    worker: Worker = make_worker()
    queue: Queue = make_queue("doc.#", name="documented", worker=worker)
    pull_queue = Queue.objects.create(name="documented_pull", binding_key="doc.#", worker=None)
    (message_id,) = owner.execute(
        "SELECT pgmb.send(gen_random_uuid(), 'doc.created', '{\"n\": 1}'::jsonb)"
    ).fetchone()
    (dispatcher_id,) = owner.execute(
        "SELECT pgmb.dispatcher_start('external', 'doc-host', 1)"
    ).fetchone()
    # Read once and visible again at once: its read count is 1, which nack's fence wants.
    assert owner.execute(
        "SELECT count(*) FROM pgmb.read(%s, 0, 1)", [pull_queue.name]
    ).fetchone() == (1,)
    return {
        "worker_id": worker.id,
        "queue": queue.name,
        "pull_queue": pull_queue.name,
        "message_id": message_id,
        "delivery_id": Delivery.objects.get(queue=pull_queue, message_id=message_id).id,
        "dispatcher_id": dispatcher_id,
    }


def _session(owner, login_role, world, role: str) -> psycopg.Connection:
    """A login session of the role, made as docs/access.md says such a role is made."""
    if role == "owner":
        return owner
    if role == "pgmb_consumer":  # a consumer is a role granted a queue
        name, conn = login_role()
        owner.execute("SELECT pgmb.grant_queue_access(%s, %s)", [world["pull_queue"], name])
        return conn
    return login_role(role)[1]


def test_the_page_documents_calls_for_every_role():
    assert len(CALLS) > 40
    assert ROLES["pgmb_producer"] == {"send", "send_unique"} and ROLES["pgmb_admin"] is None
    assert sum(call.name == "send" for call in CALLS) == 6
    assert {"read", "set_vt", "pull_next_visible"} <= (ROLES["pgmb_consumer"] or set())
    # set_vt's "delivery_ids bigint[] or delivery_id bigint"; archive's row names two calls.
    assert sum(call.name == "set_vt" for call in CALLS) == 2
    assert sum(call.name == "archive" for call in CALLS) == 2


@pytest.mark.parametrize("page", PAGES)
def test_every_row_names_calls(page):
    """A row naming a function the pattern does not read would be skipped unseen."""
    rows = documented_rows(page)
    assert rows, f"{page} documents no calls"
    assert [row for row in rows if not _calls_of(page, row)] == []


def test_every_row_resolves_to_one_catalog_function(owner):
    """Every row at once, so that no row goes unchecked behind a skip or a failure."""
    unresolved = []
    for call in CALLS:
        if _missing_extension(owner, call):
            continue
        try:
            _resolve(owner, call)
        except AssertionError as exc:
            unresolved.append(str(exc).splitlines()[0])
    assert unresolved == []


def test_every_function_a_role_is_documented_for_is_documented():
    """Each function docs/access.md lets a role run has a row to run it from."""
    documented = {call.name for call in CALLS}
    for role, names in ROLES.items():
        assert (names or set()) <= documented, f"{role}: {(names or set()) - documented}"


@pytest.mark.parametrize(("call", "role"), CASES)
def test_a_documented_call_runs_for_its_role(owner, login_role, world, call, role):
    if needs := _missing_extension(owner, call):
        pytest.skip(f"{call.name} needs {needs}, which this server lacks")
    function = _resolve(owner, call)
    conn = _session(owner, login_role, world, role)
    statement = _statement(call, function)
    # The pull page's calls read, settle and purge a pull queue.
    values = world | {"queue": world["pull_queue"]} if call.page == "pull.md" else world
    rows: list[tuple[object, ...]] = []
    try:
        if function.procedure:
            conn.execute(statement, values)
        else:
            with conn.transaction(force_rollback=True):
                rows = conn.execute(statement, values).fetchall()
    except psycopg.Error as exc:
        pytest.fail(f"{role}: {statement}: {exc.sqlstate} {exc}")
    if call.page == "pull.md":
        # The pull queue holds one visible message, read once: every call finds it (a role
        # refused the queue's ids would get no rows, NULL or false back, not an error).
        found = rows and rows[0][0] is not None and rows[0][0] is not False
        assert found, f"{role}: {statement}: {rows}"
