"""pgmb.pin_definers is the one place that makes a function act for its caller: SECURITY
DEFINER, pinned to pg_catalog, the tables' schema and pg_temp (docs/security.md). The
schema files call it for their entry points; test_definers.py checks them all."""

from __future__ import annotations

import psycopg
import pytest

pytestmark = pytest.mark.django_db(transaction=True)


def test_it_pins_a_function_to_the_tables_schema(owner):
    (tables,) = owner.execute(
        "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = 'pgmb_message'::regclass"
    ).fetchone()
    owner.execute("CREATE FUNCTION pgmb.pinned_here(a int) RETURNS int LANGUAGE sql AS 'SELECT a'")
    try:
        owner.execute("SELECT pgmb.pin_definers(ARRAY['pgmb.pinned_here(integer)'])")
        row = owner.execute(
            "SELECT prosecdef, proconfig FROM pg_proc"
            " WHERE oid = 'pgmb.pinned_here(int)'::regprocedure"
        ).fetchone()
    finally:
        owner.execute("DROP FUNCTION pgmb.pinned_here(int)")
    assert row == (True, [f"search_path=pg_catalog, {tables}, pg_temp"])


def test_an_unknown_signature_is_an_error(owner):
    with pytest.raises(psycopg.errors.UndefinedFunction, match=r"pgmb\.no_such_function"):
        owner.execute(
            "SELECT pgmb.pin_definers(ARRAY['pgmb.may(text, uuid)', 'pgmb.no_such_function()'])"
        )


def test_no_other_role_may_call_it(login_role):
    _, conn = login_role("pgmb_producer")
    with pytest.raises(
        psycopg.errors.InsufficientPrivilege, match="permission denied for function pin_definers"
    ):
        conn.execute("SELECT pgmb.pin_definers(ARRAY['pgmb.may(text, uuid)'])")
