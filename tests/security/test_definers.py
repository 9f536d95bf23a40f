"""No SECURITY DEFINER function of pgmb's can be made to run a caller's code as its owner
(docs/decisions/0026-definers-refuse-writable-schemas.md).

The attack: a role that may create in the tables' schema (public; the default before
PostgreSQL 15) plants an operator of the exact argument types a definer's body compares,
say public.=(varchar, text). PostgreSQL prefers an exact match to pg_catalog's coercing
operator wherever the match sits in the search_path, so the definer would run the planted
code as its owner. Every definer is pinned to pg_catalog, the tables' schema, pg_temp, and
refuses to run at all while another role may create in those schemas.
"""

from __future__ import annotations

import psycopg
import pytest
from django.core.checks import ERROR

from pgmb import access, checks

pytestmark = pytest.mark.django_db(transaction=True)

DEFINERS = """
SELECT p.oid::regprocedure::text, p.proconfig
FROM pg_proc p WHERE p.pronamespace = 'pgmb'::regnamespace AND p.prosecdef ORDER BY 1
"""

QUEUE = "shadowed"

#: A call of each SECURITY DEFINER function; a new definer fails
#: test_every_definer_is_called_here until it is added.
CALLS: dict[str, str] = {
    "pgmb.send(uuid,text,jsonb,jsonb,timestamp with time zone,integer,text,uuid[],text,"
    "integer,double precision)": "SELECT pgmb.send(gen_random_uuid(), 'job.run', '{}'::jsonb,"
    " '{}'::jsonb, now(), 0, 'g', NULL, 'dedup-1', 1, 1.0)",
    "pgmb.send(uuid,text,jsonb,jsonb,integer)": (
        "SELECT pgmb.send(gen_random_uuid(), 'job.run', '{}'::jsonb, '{}'::jsonb, 5)"
    ),
    "pgmb.send(uuid,text,jsonb,jsonb,timestamp with time zone,double precision,"
    "timestamp with time zone,integer,text,uuid[],text,integer,double precision)": (
        "SELECT pgmb.send(gen_random_uuid(), 'job.run', '{}'::jsonb, '{}'::jsonb, now(),"
        " ttl => 60, group_key => 'g')"
    ),
    "pgmb.send_unique(uuid,text,jsonb,text,text,jsonb,timestamp with time zone,"
    "double precision,timestamp with time zone,integer,text,integer,double precision)": (
        "SELECT pgmb.send_unique(gen_random_uuid(), 'job.run', '{}'::jsonb, 'key-1')"
    ),
    "pgmb.read(text,double precision,integer,jsonb)": (
        "SELECT * FROM pgmb.read(%(q)s, 30, 1, '{\"body\": {}}')"
    ),
    "pgmb.read_with_poll(text,double precision,integer,double precision,integer,jsonb)": (
        "SELECT * FROM pgmb.read_with_poll(%(q)s, 30, 1, 0.5, 10)"
    ),
    "pgmb.pop(text,integer)": "SELECT * FROM pgmb.pop(%(q)s, 1)",
    "pgmb.delete(text,bigint)": "SELECT pgmb.delete(%(q)s, 1::bigint)",
    "pgmb.delete(text,bigint[])": "SELECT pgmb.delete(%(q)s, ARRAY[1]::bigint[])",
    "pgmb.archive(text,bigint)": "SELECT pgmb.archive(%(q)s, 1::bigint)",
    "pgmb.archive(text,bigint[])": "SELECT pgmb.archive(%(q)s, ARRAY[1]::bigint[])",
    "pgmb.set_vt(text,bigint,double precision)": "SELECT * FROM pgmb.set_vt(%(q)s, 1::bigint, 0)",
    "pgmb.set_vt(text,bigint[],double precision)": (
        "SELECT * FROM pgmb.set_vt(%(q)s, ARRAY[1]::bigint[], 0)"
    ),
    "pgmb.nack(text,bigint[],integer[],text[])": (
        "SELECT pgmb.nack(%(q)s, ARRAY[1]::bigint[], ARRAY[1])"
    ),
    "pgmb.purge(text)": "SELECT pgmb.purge(%(q)s)",
    "pgmb.pull_next_visible(text)": "SELECT pgmb.pull_next_visible(%(q)s)",
    "pgmb.may(text,uuid)": "SELECT pgmb.may('consume', gen_random_uuid())",
    "pgmb.require(text,text)": "SELECT pgmb.require('consume', %(q)s)",
    "pgmb.grant_publish_access(name)": "SELECT pgmb.grant_publish_access(current_user)",
    "pgmb.revoke_publish_access(name)": "SELECT pgmb.revoke_publish_access(current_user)",
    "pgmb.grant_queue_access(text,name)": "SELECT pgmb.grant_queue_access(%(q)s, current_user)",
    "pgmb.revoke_queue_access(text,name)": "SELECT pgmb.revoke_queue_access(%(q)s, current_user)",
    "pgmb.install_access()": "SELECT pgmb.install_access()",
    "pgmb.create_queue_views(uuid,text)": (
        "SELECT pgmb.create_queue_views(gen_random_uuid(), 'planted')"
    ),
    "pgmb.drop_queue_views(text)": "SELECT pgmb.drop_queue_views(%(q)s)",
}

#: Operators of argument types pg_catalog has no exact match for, which pgmb's bodies
#: compare (varchar columns with text, float8 with integer constants, jsonb with a literal).
SHADOWED_OPERATORS = [
    ("=", "varchar", "text"),
    ("=", "text", "varchar"),
    ("=", "varchar", "varchar"),
    ("<", "double precision", "integer"),
    (">", "double precision", "integer"),
    ("->", "jsonb", "jsonb"),
]


def _plant(conn: psycopg.Connection, me: str) -> None:
    """Operators in public that raise when they run as anyone but the attacker."""
    for n, (op, left, right) in enumerate(SHADOWED_OPERATORS):
        returns = "jsonb" if op == "->" else "boolean"
        conn.execute(
            f"CREATE FUNCTION public.shadow_{n}(a {left}, b {right}) RETURNS {returns} "
            "LANGUAGE plpgsql SET search_path = pg_catalog AS $$ BEGIN "
            f"IF current_user <> '{me}' THEN "
            "RAISE EXCEPTION 'hijacked: ran as %', current_user; END IF; RETURN NULL; END $$"
        )
        conn.execute(
            f"CREATE OPERATOR public.{op} (LEFTARG = {left}, RIGHTARG = {right}, "
            f"FUNCTION = public.shadow_{n})"
        )


@pytest.fixture
def writable_public(owner):
    """Schema public writable by PUBLIC, as before PostgreSQL 15; closed again after."""
    owner.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    try:
        yield
    finally:
        owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")


def test_every_definer_is_pinned_to_pg_catalog_the_tables_schema_and_pg_temp(owner):
    (tables,) = owner.execute(
        "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'pgmb_message'::regclass"
    ).fetchone()
    paths = {
        name: [c for c in config or [] if c.startswith("search_path=")]
        for name, config in owner.execute(DEFINERS)
    }
    assert paths and {name: f"search_path=pg_catalog, {tables}, pg_temp" for name in paths} == {
        name: path[0] if path else None for name, path in paths.items()
    }


def test_every_definer_is_called_here(owner):
    assert sorted(r[0] for r in owner.execute(DEFINERS)) == sorted(CALLS)


@pytest.mark.parametrize("groups", [("pgmb_producer",), ("pgmb_admin",)])
@pytest.mark.parametrize("signature", sorted(CALLS))
def test_no_definer_runs_a_planted_operator_as_its_owner(owner, login_role, groups, signature):
    owner.execute("SELECT pgmb.create(%s, 'job.#', 5, NULL)", [QUEUE])
    name, conn = login_role(*groups)
    access.grant_queue_access(QUEUE, name)
    # The schema becomes writable once the queue and its grant exist.
    owner.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
    try:
        _plant(conn, name)
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as refused:
            conn.execute(CALLS[signature], {"q": QUEUE})
    finally:
        owner.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    message = str(refused.value)
    assert "hijacked" not in message
    if groups == ("pgmb_admin",) or "permission denied for function" not in message:
        assert message.startswith("pgmb refuses to act for its callers while other roles")
        assert refused.value.diag.message_hint == (
            "As the schema's owner or a superuser: REVOKE CREATE ON SCHEMA public FROM PUBLIC;"
            " (docs/security.md)"
        )


def test_a_writable_schema_fails_the_check_and_install_access(owner, writable_public):
    [error] = checks.check_writable_schemas(databases=["default"])
    assert (error.id, error.level) == ("pgmb.E006", ERROR)
    assert "schema public (PUBLIC)" in error.msg
    assert "REVOKE CREATE ON SCHEMA public FROM PUBLIC;" in error.hint
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pgmb refuses to act"):
        owner.execute("SELECT pgmb.install_access()")


def test_a_role_granted_create_in_pgmb_is_named_too(owner, login_role):
    name, _ = login_role()
    owner.execute(f"GRANT CREATE ON SCHEMA pgmb TO {name}")
    assert access.schema_writers() == [("pgmb", name)]
    owner.execute(f"REVOKE CREATE ON SCHEMA pgmb FROM {name}")
    assert access.schema_writers() == []
    assert checks.check_writable_schemas(databases=["default"]) == []
