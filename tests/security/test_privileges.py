"""Closed by default (docs/decisions/0025-closed-by-default-functions.md): only the calls that
check their caller are executable by PUBLIC; posting, the in-database loop, the transports
and the state machine belong to pgmb's owner and pgmb_admin.
"""

from __future__ import annotations

import psycopg
import pytest
from django.core.checks import Warning as CheckWarning

from pgmb import access, checks

pytestmark = pytest.mark.django_db(transaction=True)

#: Every function of schema pgmb that PUBLIC may execute, and why. Each checks its caller
#: itself (pgmb.may / pgmb.require) and refuses with pgmb's own message and hint. Mirrored
#: in docs/security.md ("Who may call what"); pgmb/sql/schema/access.sql grants them.
REVIEWED_PUBLIC: dict[str, str] = {
    "pgmb.send(uuid,text,jsonb)": "the producer API: checks pgmb_producer",
    "pgmb.send(uuid,text,jsonb,jsonb)": "the producer API: checks pgmb_producer",
    "pgmb.send(uuid,text,jsonb,jsonb,integer)": "the producer API: checks pgmb_producer",
    "pgmb.send(uuid,text,jsonb,jsonb,timestamp with time zone,integer,text,uuid[],text,"
    "integer,double precision)": "the producer API: checks pgmb_producer",
    "pgmb.send(uuid,text,jsonb,jsonb,timestamp with time zone,double precision,"
    "timestamp with time zone,integer,text,uuid[],text,integer,double precision)": (
        "the producer API: checks pgmb_producer"
    ),
    "pgmb.send_unique(uuid,text,jsonb,text,text,jsonb,timestamp with time zone,"
    "double precision,timestamp with time zone,integer,text,integer,double precision)": (
        "the producer API: checks pgmb_producer"
    ),
    "pgmb.read(text,double precision,integer,jsonb)": "pull API: checks the queue grant",
    "pgmb.read_with_poll(text,double precision,integer,double precision,integer,jsonb)": (
        "pull API: checks the queue grant"
    ),
    "pgmb.pop(text,integer)": "pull API: checks the queue grant",
    "pgmb.delete(text,bigint)": "pull API: checks the queue grant",
    "pgmb.delete(text,bigint[])": "pull API: checks the queue grant",
    "pgmb.archive(text,bigint)": "pull API: checks the queue grant",
    "pgmb.archive(text,bigint[])": "pull API: checks the queue grant",
    "pgmb.set_vt(text,bigint,double precision)": "pull API: checks the queue grant",
    "pgmb.set_vt(text,bigint[],double precision)": "pull API: checks the queue grant",
    "pgmb.nack(text,bigint[],integer[],text[])": "pull API: checks the queue grant",
    "pgmb.purge(text)": "pull API: checks the queue grant",
    "pgmb.pull_next_visible(text)": "pull API: checks the queue grant",
    "pgmb.may(text,uuid)": "answers about the caller itself",
    "pgmb.require(text,text)": "refuses the caller itself, naming the grant it lacks",
    "pgmb.grant_publish_access(name)": "checks 'administer'; refuses with the hint",
    "pgmb.revoke_publish_access(name)": "checks 'administer'; refuses with the hint",
    "pgmb.grant_queue_access(text,name)": "checks 'administer'; refuses with the hint",
    "pgmb.revoke_queue_access(text,name)": "checks 'administer'; refuses with the hint",
}

PUBLIC_EXECUTABLE = """
SELECT p.oid::regprocedure::text
FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
WHERE p.pronamespace = 'pgmb'::regnamespace AND a.grantee = 0 AND a.privilege_type = 'EXECUTE'
ORDER BY 1
"""

#: What posts, loops or manages transports and jobs, as a role might call it.
POSTING = [
    "SELECT * FROM pgmb.post(%(url)s, '{}', '{\"Authorization\": \"Bearer forged\"}', 5)",
    "SELECT * FROM pgmb.post_via_http(%(url)s, '{}', '{}', 5)",
    "SELECT * FROM pgmb.post_via_http_headers(%(url)s, '{}', '{}', 5)",
    "SELECT * FROM pgmb.post_via_plpython(%(url)s, '{}', '{}', 5)",
    "SELECT * FROM pgmb.post_run_via_plpython(ARRAY[%(url)s], ARRAY['{}'], ARRAY['{}'::jsonb],"
    " ARRAY[5::float8], 1, 1000, NULL, 0, extract(epoch FROM now()) + 5)",
    "SELECT pgmb.load_plpython_transport()",
    "CALL pgmb.dispatch_loop(0.1, 1)",
    "SELECT pgmb.cron_install()",
    "SELECT pgmb.cron_uninstall()",
    "SELECT pgmb.install_access()",
]


def test_only_the_reviewed_functions_are_executable_by_public(owner):
    found = [r[0] for r in owner.execute(PUBLIC_EXECUTABLE)]
    assert found == sorted(REVIEWED_PUBLIC)


def test_every_function_is_executable_by_its_owner_pgmb_admin_and_no_one_else(owner):
    """Besides PUBLIC for the reviewed list: no role got EXECUTE on the side."""
    grantees = {
        name: sorted(set(roles) - {None})
        for name, roles in owner.execute(
            "SELECT p.oid::regprocedure::text, array_agg(CASE WHEN a.grantee = p.proowner "
            "THEN 'owner' WHEN a.grantee = 0 THEN NULL ELSE pg_get_userbyid(a.grantee) END) "
            "FROM pg_proc p, aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a "
            "WHERE p.pronamespace = 'pgmb'::regnamespace AND a.privilege_type = 'EXECUTE' "
            "GROUP BY 1"
        )
    }
    assert len(grantees) > 50
    assert {
        name: roles for name, roles in grantees.items() if roles != ["owner", "pgmb_admin"]
    } == {}


@pytest.mark.parametrize("call", POSTING)
@pytest.mark.parametrize("groups", [(), ("pgmb_producer",), ("pgmb_consumer",)])
def test_a_role_without_pgmb_admin_cannot_post_or_loop(login_role, recording_server, call, groups):
    _, conn = login_role(*groups)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied for"):
        conn.execute(call, {"url": recording_server.url("/secret")})
    assert recording_server.requests == []


def test_a_pgmb_admin_member_posts(owner, login_role, recording_server):
    if owner.execute("SELECT pgmb.http_transport()").fetchone()[0] is None:
        pytest.skip("no HTTP transport in the test database")
    _, conn = login_role("pgmb_admin")
    (status,) = conn.execute(
        "SELECT status FROM pgmb.post(%s, '{\"a\": 1}', '{}', 5)", [recording_server.url("/hook")]
    ).fetchone()
    assert status == 200
    [request] = recording_server.wait_for(1)
    assert request.json() == {"a": 1}


def test_a_pgmb_admin_member_creates_a_queue_and_reads_its_views(owner, login_role):
    """The views are made after pgmb.install_access ran: they are the owner's, readable."""
    _, conn = login_role("pgmb_admin")
    conn.execute("SELECT pgmb.create('admin_made', 'job.#', 5, NULL)")
    conn.execute("SELECT pgmb.send(gen_random_uuid(), 'job.run', '{\"n\": 1}'::jsonb)")
    rows = conn.execute("SELECT body FROM pgmb.admin_made_queue").fetchall()
    assert rows == [({"n": 1},)]
    assert conn.execute("SELECT count(*) FROM pgmb.admin_made_dead_letter_queue").fetchone() == (0,)
    (view_owner,) = owner.execute(
        "SELECT pg_get_userbyid(relowner) FROM pg_class "
        "WHERE oid = 'pgmb.admin_made_queue'::regclass"
    ).fetchone()
    assert view_owner == owner.info.user


def test_check_warns_while_the_http_extensions_functions_are_public(owner):
    if not owner.execute(
        "SELECT count(*) FROM pg_available_extensions WHERE name = 'http'"
    ).fetchone()[0]:
        pytest.skip("the http stand-in is not installed (tests/pg_http/install.sh)")
    owner.execute("CREATE EXTENSION IF NOT EXISTS http CASCADE")
    try:
        found = [
            w for w in checks.check_http_extension(databases=["default"]) if w.id == "pgmb.W005"
        ]
        assert len(found) == 1 and isinstance(found[0], CheckWarning)
        assert "http_post" in found[0].msg
        owner.execute(found[0].hint.split("run: ", 1)[1])
        assert [w for w in checks.check_http_extension(databases=["default"])] == []
    finally:
        owner.execute("DROP EXTENSION IF EXISTS http")


def test_the_reviewed_list_the_check_reads_is_the_one_granted(owner):
    """pgmb.W008 reads the reviewed list from access.sql's GRANT: the list tested above."""
    signatures = access.reviewed_public_routines()
    normalized = [
        owner.execute("SELECT %s::regprocedure::text", (s,)).fetchone()[0] for s in signatures
    ]
    assert sorted(normalized) == sorted(REVIEWED_PUBLIC)
    assert checks.check_public_routines(databases=["default"]) == []


def test_check_names_a_function_a_superuser_made_open_to_public(owner, login_role):
    """The test database is migrated by a superuser, whose defaults are left as PostgreSQL
    has them: a function it creates in pgmb later is PUBLIC's, and the check says so."""
    owner.execute("CREATE FUNCTION pgmb.made_later() RETURNS int LANGUAGE sql AS 'SELECT 1'")
    try:
        _, conn = login_role()
        assert conn.execute("SELECT pgmb.made_later()").fetchone() == (1,)
        [found] = checks.check_public_routines(databases=["default"])
        assert (found.id, isinstance(found, CheckWarning)) == ("pgmb.W008", True)
        assert "pgmb.made_later()" in found.msg
        owner.execute(found.hint.split("run: ", 1)[1])
        assert checks.check_public_routines(databases=["default"]) == []
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="made_later"):
            conn.execute("SELECT pgmb.made_later()")
    finally:
        owner.execute("DROP FUNCTION pgmb.made_later()")
