"""Every function of the SQL API page runs for each role it is documented for.

Generated from the docs: each table row of docs/sql-api.md whose first cell names a
``pgmb.`` function is one call (a new row is tested without touching this file); the roles
come from docs/access.md's table of the three roles (``pgmb_producer`` publishes with
every ``pgmb.send``, ``pgmb_consumer`` runs the pull functions it names, ``pgmb_admin``
runs everything) and the application's role (the owner) runs everything too. Each call
resolves to exactly one function in the catalog (the page and the schema agree), then runs
in a real login session of the role with values of the argument's name or type.

Issue 26: ``pgmb.send(id, key, body, headers, delay integer)`` failed for a producer with
``permission denied for function check_delay``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from pgmb.models import Queue, Worker

pytestmark = pytest.mark.django_db(transaction=True)

DOCS = Path(__file__).resolve().parents[2] / "docs"
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


def documented_calls() -> list[Documented]:
    calls = []
    for line in (DOCS / "sql-api.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        first_cell = line.split(" | ")[0]
        for match in _CALL.finditer(first_cell):
            text, name, arguments = match.groups()
            parts = [a.strip() for a in arguments.split(",") if a.strip()]
            calls.append(
                Documented(
                    text=text,
                    name=name,
                    procedure=text.startswith("CALL "),
                    positional=tuple(_argument(a) for a in parts if not a.endswith("=>")),
                    named=tuple(a[:-2].strip() for a in parts if a.endswith("=>")),
                    elided=parts == ["..."],
                )
            )
    return calls


def documented_roles() -> dict[str, set[str] | None]:
    """Each group role's function names from docs/access.md (None: every function)."""
    roles: dict[str, set[str] | None] = {}
    for line in (DOCS / "access.md").read_text().splitlines():
        match = re.match(r"\| `(pgmb_\w+)` \| (.*) \|$", line)
        if match:
            role, may = match.groups()
            names = set(re.findall(r"`(?:pgmb\.)?(\w+)(?:\(|`)", may))
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
    ("dispatcher_start", "kind"): "'external'",
    ("worker", "name"): "'w' || md5(random()::text)",
    ("create", "name"): "'q' || left(md5(random()::text), 20)",
    ("dispatch_loop", "seconds"): "0",
    ("breaker_admit", "lease"): "gen_random_uuid()",
    ("post", "body"): "'{}'",
    ("post_via_plpython", "body"): "'{}'",
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
    (message_id,) = owner.execute(
        "SELECT pgmb.send(gen_random_uuid(), 'doc.created', '{}'::jsonb)"
    ).fetchone()
    (dispatcher_id,) = owner.execute(
        "SELECT pgmb.dispatcher_start('external', 'doc-host', 1)"
    ).fetchone()
    return {
        "worker_id": worker.id,
        "queue": queue.name,
        "message_id": message_id,
        "dispatcher_id": dispatcher_id,
    }


def test_the_page_documents_calls_for_every_role():
    assert len(CALLS) > 40
    assert ROLES["pgmb_producer"] == {"send"} and ROLES["pgmb_admin"] is None
    assert sum(call.name == "send" for call in CALLS) == 5


@pytest.mark.parametrize(("call", "role"), CASES)
def test_a_documented_call_runs_for_its_role(owner, login_role, world, call, role):
    needs = {"cron_install": "pg_cron", "cron_uninstall": "pg_cron"}.get(call.name)
    if call.name.endswith("_via_plpython"):
        needs = "plpython3u"
    if (
        needs
        and not owner.execute(
            "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = %s)", [needs]
        ).fetchone()[0]
    ):
        pytest.skip(f"{call.name} needs {needs}, which this server lacks")
    function = _resolve(owner, call)
    conn = owner if role == "owner" else login_role(role)[1]
    statement = _statement(call, function)
    try:
        if function.procedure:
            conn.execute(statement, world)
        else:
            with conn.transaction(force_rollback=True):
                conn.execute(statement, world)
    except psycopg.Error as exc:
        pytest.fail(f"{role}: {statement}: {exc.sqlstate} {exc}")
