"""Access control (pgmb/sql/schema/access.sql): roles other than the application's publish only as
pgmb_producer's members, consume only queues granted to them, and administer only as
pgmb_admin's members; a refusal is SQLSTATE 42501 with a message naming the role, and it
changes nothing.

Each role here is a real login role; its sessions are real connections (the test cluster
trusts local connections), committed, as another program's would be.
"""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pgmb import access
from pgmb.errors import AccessDenied, UnknownObject
from pgmb.models import Delivery, Message

pytestmark = pytest.mark.django_db(transaction=True)

SEND = "SELECT pgmb.send(gen_random_uuid(), 'order.created', '{}'::jsonb)"


def _denied(conn: psycopg.Connection, statement: str, *params, match: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=match):
        conn.execute(statement, params)


def test_the_three_roles_exist(owner):
    names = {
        r[0]
        for r in owner.execute(
            "SELECT rolname FROM pg_roles WHERE rolname LIKE 'pgmb\\_%' ORDER BY 1"
        )
    }
    assert {"pgmb_producer", "pgmb_consumer", "pgmb_admin"} <= names


def test_a_role_without_a_grant_may_not_publish_and_nothing_is_stored(make_queue, login_role):
    make_queue("order.#")
    name, conn = login_role()
    _denied(conn, SEND, match=f"role {name} may not publish")
    assert Message.objects.count() == 0
    assert Delivery.objects.count() == 0


def test_the_refusal_says_how_to_grant(login_role):
    name, conn = login_role()
    with pytest.raises(psycopg.errors.InsufficientPrivilege) as info:
        conn.execute(SEND)
    assert info.value.diag.message_hint == (
        f"An administrator grants it: SELECT pgmb.grant_publish_access('{name}');"
    )


def test_a_granted_producer_publishes_and_its_message_is_routed(make_queue, login_role):
    queue = make_queue("order.#")
    name, conn = login_role()
    access.grant_publish_access(name)
    (message_id,) = conn.execute(SEND).fetchone()
    assert Delivery.objects.get(message_id=message_id).queue_id == queue.id
    access.revoke_publish_access(name)
    _denied(conn, SEND, match="may not publish")
    assert Message.objects.count() == 1


def test_membership_of_pgmb_producer_is_the_grant(make_queue, login_role):
    make_queue("order.#")
    _, conn = login_role("pgmb_producer")
    conn.execute(SEND)
    assert Delivery.objects.count() == 1


def test_a_producer_has_no_privilege_on_the_tables_themselves(login_role):
    _, conn = login_role("pgmb_producer")
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pgmb_message"):
        conn.execute(
            "INSERT INTO pgmb_message (id, routing_key, body) VALUES (gen_random_uuid(), 'a', '1')"
        )
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="pgmb_delivery"):
        conn.execute("SELECT count(*) FROM pgmb_delivery")


def test_a_role_with_insert_on_the_message_table_keeps_publishing(make_queue, owner, login_role):
    """Roles that a DBA let publish through table privileges before 0021 still may."""
    make_queue("order.#")
    name, conn = login_role()
    owner.execute(f"GRANT INSERT, SELECT ON pgmb_message TO {name}")
    conn.execute(SEND)
    assert Delivery.objects.count() == 1


def test_the_caller_is_the_role_set_by_set_role(make_queue, owner, login_role):
    """A pool that connects as one role and SET ROLEs per client is checked per client."""
    make_queue("order.#")
    name, _ = login_role()
    owner.execute(f"GRANT {name} TO CURRENT_USER")
    owner.execute(f"SET ROLE {name}")
    try:
        _denied(owner, SEND, match=f"role {name} may not publish")
    finally:
        owner.execute("RESET ROLE")
    owner.execute(SEND)
    assert Message.objects.count() == 1


def test_only_an_administrator_grants(make_queue, login_role):
    queue = make_queue("order.#")
    name, conn = login_role("pgmb_producer")
    _denied(
        conn,
        "SELECT pgmb.grant_queue_access(%s, %s)",
        queue.name,
        name,
        match=f"role {name} may not administer pgmb",
    )
    _denied(conn, "SELECT pgmb.grant_publish_access(%s)", name, match="may not administer")
    assert access.queue_grants() == []


def test_an_admin_member_grants_and_may_consume_every_queue(make_queue, login_role):
    queue = make_queue("order.#")
    consumer, _ = login_role()
    _, admin = login_role("pgmb_admin")
    assert admin.execute(
        "SELECT pgmb.grant_queue_access(%s, %s)", [queue.name, consumer]
    ).fetchone() == (True,)
    assert [(g.queue, g.role) for g in access.queue_grants()] == [(queue.name, consumer)]
    assert admin.execute("SELECT pgmb.may('consume', %s)", [queue.id]).fetchone() == (True,)
    admin.execute(SEND)  # pgmb_admin publishes too


def test_queue_grants_are_per_queue_and_revocable(make_queue, login_role):
    granted, other = make_queue("order.#"), make_queue("invoice.#")
    name, conn = login_role()
    assert access.grant_queue_access(granted.name, name) is True
    assert access.grant_queue_access(granted.name, name) is False  # already there

    def may(queue):
        return conn.execute("SELECT pgmb.may('consume', %s)", [queue.id]).fetchone()[0]

    assert (may(granted), may(other)) == (True, False)
    _denied(
        conn,
        "SELECT pgmb.require('consume', %s)",
        other.name,
        match=f"role {name} may not consume queue '{other.name}'",
    )
    conn.execute("SELECT pgmb.require('consume', %s)", [granted.name])
    member = "SELECT pg_has_role(%s, 'pgmb_consumer', 'MEMBER')"
    assert conn.execute(member, [name]).fetchone() == (True,)

    assert access.revoke_queue_access(granted.name, name) is True
    assert access.revoke_queue_access(granted.name, name) is False
    assert may(granted) is False
    # Its last grant gone, the role leaves pgmb_consumer.
    assert conn.execute(member, [name]).fetchone() == (False,)


def test_a_grant_goes_with_its_queue(make_queue, login_role):
    queue = make_queue("order.#")
    name, _ = login_role()
    access.grant_queue_access(queue.name, name)
    queue.delete()
    assert access.queue_grants() == []


def test_unknown_queues_and_roles_are_clear_errors(make_queue, login_role):
    queue = make_queue("order.#")
    name, _ = login_role()
    with pytest.raises(UnknownObject, match="queue 'no_such_queue' does not exist"):
        access.grant_queue_access("no_such_queue", name)
    with pytest.raises(UnknownObject, match="queue 'no_such_queue' does not exist"):
        access.revoke_queue_access("no_such_queue", name)
    with pytest.raises(UnknownObject, match="role no_such_role does not exist"):
        access.grant_queue_access(queue.name, "no_such_role")
    with pytest.raises(UnknownObject, match="role no_such_role does not exist"):
        access.grant_publish_access("no_such_role")
    assert access.queue_grants() == []


def test_the_python_api_says_access_denied(make_queue, owner, login_role):
    """On a Django connection whose role may not administer, AccessDenied, nothing written."""
    from django.db import connection

    queue = make_queue("order.#")
    name, _ = login_role()
    owner.execute(f"GRANT {name} TO CURRENT_USER")
    with connection.cursor() as cursor:
        cursor.execute(f"SET ROLE {name}")
        try:
            with pytest.raises(AccessDenied, match="may not administer"):
                access.grant_queue_access(queue.name, name)
        finally:
            cursor.execute("RESET ROLE")
    assert access.queue_grants() == []


def test_entry_points_act_for_their_caller_with_a_fixed_search_path(owner):
    rows = owner.execute(
        "SELECT p.oid::regprocedure::text, p.prosecdef, p.proconfig FROM pg_proc p "
        "WHERE p.pronamespace = 'pgmb'::regnamespace AND p.prosecdef ORDER BY 1"
    ).fetchall()
    assert [r[0] for r in rows] == [
        "pgmb.archive(text,bigint)",
        "pgmb.archive(text,bigint[])",
        "pgmb.create_queue_views(uuid,text)",
        "pgmb.delete(text,bigint)",
        "pgmb.delete(text,bigint[])",
        "pgmb.drop_queue_views(text)",
        "pgmb.grant_publish_access(name)",
        "pgmb.grant_queue_access(text,name)",
        "pgmb.install_access()",
        "pgmb.may(text,uuid)",
        "pgmb.nack(text,bigint[],integer[],text[])",
        "pgmb.pop(text,integer)",
        "pgmb.pull_next_visible(text)",
        "pgmb.purge(text)",
        "pgmb.read(text,double precision,integer,jsonb)",
        "pgmb.read_with_poll(text,double precision,integer,double precision,integer,jsonb)",
        "pgmb.require(text,text)",
        "pgmb.revoke_publish_access(name)",
        "pgmb.revoke_queue_access(text,name)",
        "pgmb.send(uuid,text,jsonb,jsonb,integer)",
        "pgmb.send(uuid,text,jsonb,jsonb,timestamp with time zone,"
        "double precision,timestamp with time zone,integer,text,uuid[],text,integer,"
        "double precision)",
        "pgmb.send(uuid,text,jsonb,jsonb,timestamp with time zone,"
        "integer,text,uuid[],text,integer,double precision)",
        "pgmb.send_unique(uuid,text,jsonb,text,text,jsonb,timestamp with time zone,"
        "double precision,timestamp with time zone,integer,text,integer,double precision)",
        "pgmb.set_vt(text,bigint,double precision)",
        "pgmb.set_vt(text,bigint[],double precision)",
    ]
    configs = {r[0]: tuple(r[2]) for r in rows}
    # pgmb.read also keeps one generic plan for the session, and its planner
    # settings (tests/sql/test_steady_plans.py).
    assert configs.pop("pgmb.read(text,double precision,integer,jsonb)") == (
        "search_path=pg_catalog, public, pg_temp",
        "plan_cache_mode=force_generic_plan",
        "enable_seqscan=off",
        "enable_bitmapscan=off",
        "enable_sort=off",
        "jit=off",
    )
    assert set(configs.values()) == {("search_path=pg_catalog, public, pg_temp",)}


@pytest.fixture
def pull_queue(owner):
    """A pull queue (no worker) holding three messages, made by the application's role."""
    name = f"pull_{uuid.uuid4().hex[:8]}"
    owner.execute("SELECT pgmb.create(%s, 'job.#', 5, NULL)", [name])
    for _ in range(3):
        owner.execute("SELECT pgmb.send(gen_random_uuid(), 'job.run', '{}'::jsonb)")
    return name


def _read_counts(owner, queue: str) -> list[int]:
    return [
        r[0]
        for r in owner.execute(
            "SELECT d.attempts FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id "
            "WHERE q.name = %s ORDER BY d.id",
            [queue],
        )
    ]


def test_a_granted_consumer_reads_and_deletes_its_queue(owner, pull_queue, login_role):
    name, conn = login_role()
    access.grant_queue_access(pull_queue, name)
    read = conn.execute("SELECT delivery_id FROM pgmb.read(%s, 30, 2)", [pull_queue]).fetchall()
    assert len(read) == 2
    deleted = conn.execute(
        "SELECT pgmb.delete(%s, %s::bigint[])", [pull_queue, [r[0] for r in read]]
    ).fetchall()
    assert sorted(d[0] for d in deleted) == sorted(r[0] for r in read)
    assert _read_counts(owner, pull_queue) == [0]


@pytest.mark.parametrize(
    "call",
    [
        "SELECT * FROM pgmb.read(%(q)s, 30, 10)",
        "SELECT * FROM pgmb.read_with_poll(%(q)s, 30, 10, 0, 10)",
        "SELECT * FROM pgmb.pop(%(q)s, 10)",
        "SELECT pgmb.delete(%(q)s, %(ids)s::bigint[])",
        "SELECT pgmb.archive(%(q)s, %(ids)s::bigint[])",
        "SELECT * FROM pgmb.set_vt(%(q)s, %(ids)s::bigint[], 0)",
        "SELECT pgmb.nack(%(q)s, %(ids)s::bigint[], ARRAY[0, 0, 0])",
        "SELECT pgmb.purge(%(q)s)",
        "SELECT pgmb.pull_next_visible(%(q)s)",
    ],
)
@pytest.mark.parametrize("groups", [(), ("pgmb_producer",), ("pgmb_consumer",)])
def test_a_consumer_without_the_queue_grant_is_refused_and_nothing_changes(
    owner, pull_queue, make_queue, login_role, call, groups
):
    """A producer, or a consumer granted another queue, may not touch this one."""
    name, conn = login_role(*groups)
    if "pgmb_consumer" in groups:
        other = owner.execute("SELECT pgmb.create(%s, 'other.#', 5, NULL)", ["other_" + name])
        assert other.fetchone()
        access.grant_queue_access("other_" + name, name)
    ids = [
        r[0]
        for r in owner.execute(
            "SELECT d.id FROM pgmb_delivery d JOIN pgmb_queue q ON q.id = d.queue_id "
            "WHERE q.name = %s",
            [pull_queue],
        )
    ]
    before = owner.execute(
        "SELECT d.id, d.attempts, d.available_at FROM pgmb_delivery d ORDER BY d.id"
    ).fetchall()
    with pytest.raises(
        psycopg.errors.InsufficientPrivilege, match=f"role {name} may not consume queue"
    ):
        conn.execute(call, {"q": pull_queue, "ids": ids})
    after = owner.execute(
        "SELECT d.id, d.attempts, d.available_at FROM pgmb_delivery d ORDER BY d.id"
    ).fetchall()
    assert after == before
    assert owner.execute(
        "SELECT count(*) FROM pgmb_attempt a JOIN pgmb_queue q ON q.id = a.queue_id "
        "WHERE q.name = %s",
        [pull_queue],
    ).fetchone() == (0,)


def test_pgmb_admin_may_read_and_write_every_table_of_pgmb(owner):
    """A migration that adds a table runs pgmb.install_access() again."""
    tables = [
        r[0]
        for r in owner.execute(
            "SELECT c.oid::regclass::text FROM pg_class c "
            "WHERE c.relkind = 'r' AND c.relname LIKE 'pgmb\\_%' "
            "AND c.relnamespace = (SELECT relnamespace FROM pg_class "
            "WHERE oid = 'pgmb_message'::regclass)"
        )
    ]
    assert "pgmb_task_result" in tables
    missing = [
        t
        for t in tables
        if not owner.execute(
            "SELECT has_table_privilege('pgmb_admin', %s, 'SELECT, INSERT, UPDATE, DELETE')",
            [t],
        ).fetchone()[0]
    ]
    assert missing == []
