"""History partitioned by the day of the message id (pgmb/sql/schema/history.sql,
docs/decisions/0076): where messages and attempts are stored, the days made ahead, and
retention that drops a day's tables but keeps its unfinished messages."""

from __future__ import annotations

import uuid
from datetime import UTC, date, datetime, timedelta

import psycopg
import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

import pgmb
from pgmb import conf, deliveries, history, ids
from pgmb.db.statements import run
from pgmb.deliveries import Failure, Success
from pgmb.models import Attempt, DeadLetter, Delivery, Message


def today() -> date:
    return datetime.now(UTC).date()


def id_of_day(day: date) -> uuid.UUID:
    """A version 7 id of noon of ``day`` (UTC)."""
    ms = int(datetime(day.year, day.month, day.day, 12, tzinfo=UTC).timestamp() * 1000)
    return uuid.UUID(int=(ms << 80) | (ids.uuid7().int & ((1 << 80) - 1)))


def stored_in(sql, message_id: uuid.UUID) -> tuple[str, str | None]:
    """The partitions holding a message and (the first of) its attempts."""
    [(message, attempt)] = sql(
        "SELECT (SELECT tableoid::regclass::text FROM pgmb_message WHERE id = %(id)s),"
        " (SELECT tableoid::regclass::text FROM pgmb_attempt WHERE message_id = %(id)s LIMIT 1)",
        {"id": message_id},
    )
    return message, attempt


def days(sql) -> set[tuple[str, date]]:
    return set(sql("SELECT parent::text, day FROM pgmb.history_days()"))


def test_the_days_ahead_and_the_far_partitions_exist_for_both_tables(sql):
    made = {today() + timedelta(days=n) for n in range(conf.get().HISTORY_PREMAKE_DAYS + 1)}
    assert {(t, d) for t, d in days(sql) if d in made} == {
        (t, d) for t in ("pgmb_message", "pgmb_attempt") for d in made
    }
    far = sql(
        "SELECT c.relname::text, pg_get_expr(c.relpartbound, c.oid) FROM pg_class c"
        " WHERE c.relname LIKE 'pgmb\\_%%\\_far' ORDER BY 1"
    )
    [(floor,)] = sql("SELECT pgmb.day_floor(pgmb.history_far_day())")
    bound = f"FOR VALUES FROM ('{floor}') TO (MAXVALUE)"
    assert far == [("pgmb_attempt_far", bound), ("pgmb_message_far", bound)]


def test_the_sql_default_of_the_days_ahead_is_the_settings_default(sql):
    [(default,)] = sql(
        "SELECT pg_get_function_arguments('pgmb.premake_history(integer, bigint)'::regprocedure)"
    )
    assert default.startswith(f"days integer DEFAULT {conf.DEFAULT_HISTORY_PREMAKE_DAYS},")


def test_a_message_and_its_attempts_are_stored_in_its_day(make_queue, sql):
    make_queue("order.*")
    message_id = pgmb.send("order.created", {"n": 1})
    [claim] = deliveries.claim(None, 10)
    deliveries.ack([Success(claim.delivery_id, 200, 1.0)])
    part = f"p{ids_day(message_id):%Y%m%d}"
    assert stored_in(sql, message_id) == (f"pgmb_message_{part}", f"pgmb_attempt_{part}")


def ids_day(message_id: uuid.UUID) -> date:
    return datetime.fromtimestamp(ids.milliseconds(message_id) / 1000, UTC).date()


def v4_id(first_byte: int) -> uuid.UUID:
    """A UUID v4 whose random first byte is ``first_byte``."""
    return uuid.UUID(bytes=bytes([first_byte]) + uuid.uuid4().bytes[1:])


def test_ids_with_no_day_are_stored_and_delivered(make_queue, sql):
    make_queue("order.*")
    # A UUID v4 mostly falls past the year 2100 (its first 48 bits random); one that falls
    # before it, or an id of a day not made yet, goes to the default partition.
    past_2100, before_2100 = v4_id(0xC3), v4_id(0x00)
    later = id_of_day(today() + timedelta(days=400))
    for n, given in enumerate((past_2100, before_2100, later)):
        assert pgmb.send("order.created", {"n": n}, message_id=given) == given
    claims = deliveries.claim(None, 10)
    assert {uuid.UUID(str(c.message_id)) for c in claims} == {past_2100, before_2100, later}
    deliveries.ack([Success(c.delivery_id, 200, 1.0) for c in claims])
    assert stored_in(sql, past_2100) == ("pgmb_message_far", "pgmb_attempt_far")
    for message_id in (before_2100, later):
        assert stored_in(sql, message_id) == ("pgmb_message_default", "pgmb_attempt_default")


def test_a_new_day_takes_the_rows_the_default_partition_holds_of_it(make_queue, sql):
    make_queue("order.*")
    later = today() + timedelta(days=20)
    early = pgmb.send("order.created", {"n": 1}, message_id=id_of_day(later))
    deliveries.fail(
        [Failure(c.delivery_id, c.lease_id, 500, "down") for c in deliveries.claim(None, 10)]
    )
    assert stored_in(sql, early) == ("pgmb_message_default", "pgmb_attempt_default")

    [(made,)] = sql("SELECT pgmb.make_history_days(%s, %s)", (later, later))

    assert made == 2
    part = f"p{later:%Y%m%d}"
    assert stored_in(sql, early) == (f"pgmb_message_{part}", f"pgmb_attempt_{part}")
    assert Attempt.objects.filter(message_id=early).count() == 1
    # Moved, not sent again: its one delivery goes on, retried.
    [delivery] = Delivery.objects.filter(message_id=early)
    assert delivery.attempts == 1
    [(routed,)] = sql("SELECT count(*) FROM pgmb_delivery WHERE message_id = %s", (early,))
    assert routed == 1


def test_days_are_not_made_over_a_default_partition_bigger_than_the_limit(make_queue, sql):
    make_queue("order.*")
    later = today() + timedelta(days=30)
    for n in range(3):
        pgmb.send("order.created", {"n": n}, message_id=id_of_day(today() + timedelta(days=400)))
    sql("ANALYZE pgmb_message_default, pgmb_attempt_default")

    assert run(history.premake_call(31, scan_limit=2)) == 0
    assert ("pgmb_message", later) not in days(sql)
    assert [d.rows for d in run(history.defaults_call()) if d.name == "pgmb_message_default"] == [3]
    assert run(history.premake_call(31, scan_limit=3)) == 2 * (31 - conf.get().HISTORY_PREMAKE_DAYS)
    assert ("pgmb_attempt", later) in days(sql)
    with pytest.raises(ValueError, match="scan limit"):
        history.premake_call(scan_limit=-1)


def test_days_are_not_made_while_a_default_partition_stays_busy(sql):
    later = today() + timedelta(days=30)
    with psycopg.connect(**connection.get_connection_params()) as other:
        # The lock an open transaction that published into the default partition holds.
        other.execute("LOCK TABLE pgmb_message_default IN ROW EXCLUSIVE MODE")
        [(made,)] = sql("SELECT pgmb.make_history_days(%s, %s)", (later, later))
        assert made == 0
        assert ("pgmb_message", later) not in days(sql)
        # The lock wait it set for itself is put back.
        [(wait,)] = sql("SHOW lock_timeout")
        assert wait == "0"
        other.rollback()
    [(made,)] = sql("SELECT pgmb.make_history_days(%s, %s)", (later, later))
    assert made == 2


def test_premake_through_python_makes_the_days_missing(sql):
    assert run(history.premake_call()) == 0
    assert run(history.premake_call(conf.get().HISTORY_PREMAKE_DAYS + 2)) == 4
    assert ("pgmb_attempt", today() + timedelta(days=5)) in days(sql)


def old_day_with_messages(make_queue, sql, age_days: int = 10):
    """A day ``age_days`` ago with four messages: two acked, one live, one dead-lettered."""
    day = today() - timedelta(days=age_days)
    [(made,)] = sql("SELECT pgmb.make_history_days(%s, %s)", (day, day))
    assert made == 2
    make_queue("order.*", max_retries=0)
    sent = [pgmb.send("order.created", {"n": n}, message_id=id_of_day(day)) for n in range(4)]
    claims = {uuid.UUID(str(c.message_id)): c for c in deliveries.claim(None, 10)}
    deliveries.ack([Success(claims[m].delivery_id, 200, 1.0) for m in sent[:2]])
    deliveries.fail([Failure(claims[sent[3]].delivery_id, claims[sent[3]].lease_id, 500, "down")])
    # sent[2] stays claimed: a live delivery.
    assert DeadLetter.objects.filter(message_id=sent[3]).exists()
    return day, sent


def test_retirement_keeps_a_days_unfinished_messages_and_drops_the_rest(make_queue, sql):
    day, sent = old_day_with_messages(make_queue, sql)
    today_id = pgmb.send("order.created", {"n": "today"})

    retired = run(history.retire_call(1))

    # Two acked messages and their attempts dropped; the live one and the dead-lettered
    # one (with its attempt) kept, in their day.
    assert retired == [history.RetiredDay(day, 2, 2, 2)]
    assert set(Message.objects.values_list("id", flat=True)) == {sent[2], sent[3], today_id}
    assert set(Attempt.objects.values_list("message_id", flat=True)) == {sent[3]}
    part = f"p{day:%Y%m%d}"
    assert stored_in(sql, sent[3]) == (f"pgmb_message_{part}", f"pgmb_attempt_{part}")
    # The kept ones go on as before: the live one acked, the dead letter requeued.
    [live] = Delivery.objects.filter(message_id=sent[2])
    assert deliveries.ack([Success(live.id, 200, 1.0)]) == 1
    [dead] = DeadLetter.objects.filter(message_id=sent[3])
    assert run(deliveries.requeue_call(dead.id)) == 1
    assert {uuid.UUID(str(c.message_id)) for c in deliveries.claim(None, 10)} == {sent[3], today_id}


def test_a_day_with_nothing_left_is_dropped(make_queue, sql):
    day, sent = old_day_with_messages(make_queue, sql)
    run(history.retire_call(1))
    Delivery.objects.filter(message_id=sent[2]).delete()
    DeadLetter.objects.filter(message_id=sent[3]).delete()

    # Not counted: the day's tables are dropped unread.
    assert run(history.retire_call(1, count=False)) == [history.RetiredDay(day, None, None, 0)]

    assert ("pgmb_message", day) not in days(sql)
    assert ("pgmb_attempt", day) not in days(sql)
    [(tables,)] = sql("SELECT count(*) FROM pg_class WHERE relname LIKE %s", (f"%p{day:%Y%m%d}",))
    assert tables == 0
    assert not Message.objects.filter(id__in=sent).exists()


def test_a_day_younger_than_the_age_is_not_retired(make_queue, sql):
    _, sent = old_day_with_messages(make_queue, sql, age_days=3)
    assert run(history.retire_call(5)) == []
    assert Message.objects.filter(id__in=sent).count() == 4


def test_retirement_refuses_a_bad_age(sql):
    with pytest.raises(ValueError, match="retention age"):
        history.retire_call(-1)
    with pytest.raises(DatabaseError, match="invalid age"):
        sql("SELECT * FROM pgmb.retire_history(interval '-1 day')")


def test_the_command_premakes_and_retires(make_queue, sql, capsys):
    day, _ = old_day_with_messages(make_queue, sql)
    call_command("pgmb_history", "premake", "--days", "6")
    assert "made 6 history partition(s)" in capsys.readouterr().out
    call_command("pgmb_history", "retire", "--older-than", "2")
    assert f"{day.isoformat()}: 2 messages and 2 attempts removed, kept 2" in (
        capsys.readouterr().out
    )


def test_the_command_says_why_it_made_no_partition(make_queue, sql, capsys):
    make_queue("order.*")
    pgmb.send("order.created", {"n": 1}, message_id=id_of_day(today() + timedelta(days=400)))
    sql("ANALYZE pgmb_message_default")
    call_command("pgmb_history", "premake", "--days", "6", "--scan-limit", "0")
    out = capsys.readouterr().out
    assert "made 0 history partition(s)" in out
    assert "pgmb_message_default holds about 1 row(s), over the limit of 0" in out
    assert ("pgmb_message", today() + timedelta(days=6)) not in days(sql)
    with pytest.raises(CommandError, match="--scan-limit -1"):
        call_command("pgmb_history", "premake", "--scan-limit", "-1")


def test_a_day_of_which_the_default_partition_holds_many_rows_is_left_out(sql):
    crowded, after = today() + timedelta(days=40), today() + timedelta(days=41)
    # More rows of one day than premaking moves (as when a day began before its partition
    # was made), written straight into the default partition.
    sql(
        "INSERT INTO pgmb_message_default (id, routing_key, body, created_at, available_at)"
        " SELECT encode(substring(uuid_send(pgmb.day_floor(%s)) FROM 1 FOR 6)"
        "              || substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid,"
        "        'order.created', '{}', now(), now()"
        " FROM generate_series(1, 10001)",
        (crowded,),
    )

    [(made,)] = sql("SELECT pgmb.make_history_days(%s, %s)", (crowded, after))

    assert made == 2
    assert ("pgmb_message", crowded) not in days(sql)
    assert ("pgmb_attempt", crowded) not in days(sql)
    assert ("pgmb_message", after) in days(sql)
    [(kept,)] = sql("SELECT count(*) FROM pgmb_message_default")
    assert kept == 10001
    # Asked for that day alone, there is nothing left to make.
    [(again,)] = sql("SELECT pgmb.make_history_days(%s, %s)", (crowded, crowded))
    assert again == 0
    assert ("pgmb_message", crowded) not in days(sql)


@pytest.mark.parametrize(
    "given, partition",
    [
        (lambda: ids.uuid7(), f"pgmb_message_p{today():%Y%m%d}"),
        (lambda: v4_id(0xC3), "pgmb_message_far"),
        (lambda: id_of_day(today() + timedelta(days=400)), "pgmb_message_default"),
    ],
    ids=["day", "far", "default"],
)
def test_a_taken_id_is_a_duplicate_wherever_it_is_stored(make_queue, sql, given, partition):
    make_queue("order.*")
    message_id = given()
    pgmb.send("order.created", {"n": 1}, message_id=message_id)
    assert stored_in(sql, message_id)[0] == partition
    with pytest.raises(pgmb.DuplicateMessage, match=str(message_id)), transaction.atomic():
        pgmb.send("order.created", {"n": 2}, message_id=message_id)
    assert list(Message.objects.filter(id=message_id).values_list("body", flat=True)) == [{"n": 1}]


def test_a_publish_locks_only_the_partition_it_writes(make_queue, sql):
    make_queue("order.*")
    pgmb.send("order.created", {"n": 1})
    locked = sql(
        "SELECT c.relname::text FROM pg_locks l JOIN pg_class c ON c.oid = l.relation"
        " JOIN pg_inherits i ON i.inhrelid = c.oid"
        " WHERE l.pid = pg_backend_pid() AND i.inhparent = 'pgmb_message'::regclass"
    )
    # The routing statement plans no read of the history (its de-duplication is a
    # function call): publishing costs the same whatever the number of days kept.
    assert [name for (name,) in locked] == [f"pgmb_message_p{today():%Y%m%d}"]


def test_the_archive_takes_a_day_by_detaching_it_and_keeps_its_unfinished_messages(make_queue, sql):
    day, sent = old_day_with_messages(make_queue, sql)
    [(run_id,)] = sql(
        "INSERT INTO pgmb_archive_run (output, cutoff) VALUES ('file:/a', now()) RETURNING id"
    )
    # After now(): the acks, made in this test's transaction, are older.
    cutoff = "now() + interval '1 minute'"

    [(kept,)] = sql(f"SELECT pgmb.claim_history_day(%s, %s, {cutoff})", (run_id, day))

    # The live and the dead-lettered message, with the dead one's attempt, are in the
    # default partitions; the day is no partition any more, its tables renamed for the run.
    assert kept == 2
    assert ("pgmb_message", day) not in days(sql) and ("pgmb_attempt", day) not in days(sql)
    assert stored_in(sql, sent[2]) == ("pgmb_message_default", None)
    assert stored_in(sql, sent[3]) == ("pgmb_message_default", "pgmb_attempt_default")
    messages, attempts = (f"pgmb_archive_{run_id}_{t}_{day:%Y%m%d}" for t in ("message", "attempt"))
    assert {m for (m,) in sql(f"SELECT id FROM {messages}")} == set(sent[:2])
    assert {m for (m,) in sql(f"SELECT message_id FROM {attempts}")} == set(sent[:2])
    assert sql("SELECT run_id, day, message_table, attempt_table, kept FROM pgmb_archive_day") == [
        (run_id, day, messages, attempts, 2)
    ]
    assert set(Message.objects.values_list("id", flat=True)) == {sent[2], sent[3]}
    # The taken messages are replayed nowhere; the kept ones go on.
    assert deliveries.replay(sent[:2]) == 0
    [live] = Delivery.objects.filter(message_id=sent[2])
    assert deliveries.ack([Success(live.id, 200, 1.0)]) == 1
    [dead] = DeadLetter.objects.filter(message_id=sent[3])
    assert run(deliveries.requeue_call(dead.id)) == 1


def test_the_archive_takes_only_a_day_that_ended_before_its_cutoff(make_queue, sql):
    day, sent = old_day_with_messages(make_queue, sql)
    [(run_id,)] = sql(
        "INSERT INTO pgmb_archive_run (output, cutoff) VALUES ('file:/a', now()) RETURNING id"
    )
    with pytest.raises(DatabaseError, match="the day must end before it"), transaction.atomic():
        sql(
            "SELECT pgmb.claim_history_day(%s, %s, %s)",
            (run_id, day, datetime.now(UTC) - timedelta(days=11)),
        )
    # Messages published (created_at: now) or attempted after the cutoff are kept: all four.
    cutoff = datetime.combine(day + timedelta(days=1), datetime.min.time(), UTC)
    [(kept,)] = sql("SELECT pgmb.claim_history_day(%s, %s, %s)", (run_id, day, cutoff))
    assert kept == 4
    assert set(Message.objects.values_list("id", flat=True)) == set(sent)
