"""What a function the owner creates after migrating gets: no EXECUTE for PUBLIC, in schema
pgmb and, as the price of closing pgmb, in the owner's other schemas of this database
(docs/decisions/0060-an-owner-that-is-not-a-superuser.md). Run as the database's owner
that is not a superuser, and called by a role with no grant. (A superuser's defaults are
left alone, and the check pgmb.W008 names what it opens: tests/security/test_privileges.py.)"""

from __future__ import annotations

import psycopg
import pytest

PUBLIC_EXECUTE = """
SELECT count(*) FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.oid = %s::regprocedure AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
"""


@pytest.mark.parametrize("schema", ["pgmb", "public"])
def test_a_function_the_owner_creates_later_is_closed_to_public(owned_database, schema):
    owned = owned_database()
    owned.manage("migrate", "--noinput")
    with owned.connect() as conn:
        conn.execute(
            f"CREATE FUNCTION {schema}.owner_made() RETURNS text LANGUAGE sql AS $$SELECT 'x'$$"
        )
        assert conn.execute(PUBLIC_EXECUTE, (f"{schema}.owner_made()",)).fetchone() == (0,)
        assert conn.execute(f"SELECT {schema}.owner_made()").fetchone() == ("x",)
        # The reviewed functions are still PUBLIC's.
        assert conn.execute(PUBLIC_EXECUTE, ("pgmb.may(text, uuid)",)).fetchone() == (1,)

    stranger = owned.login_role()
    refused = pytest.raises(psycopg.errors.InsufficientPrivilege, match="owner_made")
    with owned.connect(stranger) as conn, refused:
        conn.execute(f"SELECT {schema}.owner_made()")
