"""Schedules in SQL (pgmb/sql/schema/schedules.sql): pgmb.schedule's checks, firing
(pgmb.fire_schedules) with each policy for missed runs, pause and resume, the message ids
derived from (schedule, due time), and pgmb.next_wakeup counting the next schedule. The
due time is moved into the past rather than waited for."""

from __future__ import annotations

import datetime
import json

import pytest
from django.db import transaction

from pgmb import schedules
from pgmb.models import Message, Schedule

pytestmark = pytest.mark.django_db

UTC = datetime.timezone.utc


def _every(sql, name: str, seconds: int = 60, missed: str = "once", key: str = "sched.test") -> int:
    return sql(
        "SELECT pgmb.schedule(name => %s, routing_key => %s, body => '{\"n\": 1}',"
        " every => make_interval(secs => %s), missed => %s)",
        (name, key, seconds, missed),
    )[0][0]


def _move_back(sql, name: str, seconds: float) -> datetime.datetime:
    """The schedule's next due time moved ``seconds`` into the past (as after downtime);
    returns it."""
    return sql(
        "UPDATE pgmb_schedule SET next_run_at = now() - make_interval(secs => %s)"
        " WHERE name = %s RETURNING next_run_at",
        (seconds, name),
    )[0][0]


def _fired(sql, key: str = "sched.test") -> list[tuple]:
    return sql("SELECT id, body FROM pgmb_message WHERE routing_key = %s ORDER BY id", (key,))


def test_a_due_schedule_fires_once_and_advances(sql):
    sid = _every(sql, "tick", 60)
    due = _move_back(sql, "tick", 10)
    assert sql("SELECT pgmb.fire_schedules()") == [(1,)]
    # Fired again at once: nothing is due.
    assert sql("SELECT pgmb.fire_schedules()") == [(0,)]
    [(message_id, body)] = _fired(sql)
    assert message_id == schedules.message_id(sid, due)
    assert json.loads(body) == {"n": 1}
    s = Schedule.objects.get(name="tick")
    assert s.next_run_at == due + datetime.timedelta(seconds=60)
    assert s.last_runs == [due] and s.runs == 1 and s.last_error is None


def test_the_same_due_time_is_never_published_twice(sql):
    """A fire that ran again for a due time already published (its row put back, as a
    crash between a publish and a commit elsewhere could not, but an operator could) finds
    the message by its derived id and stores nothing more."""
    _every(sql, "again", 60)
    due = _move_back(sql, "again", 5)
    sql("SELECT pgmb.fire_schedules()")
    sql("UPDATE pgmb_schedule SET next_run_at = %s WHERE name = 'again'", (due,))
    assert sql("SELECT pgmb.fire_schedules()") == [(0,)]
    assert len(_fired(sql)) == 1
    assert Schedule.objects.get(name="again").next_run_at > due


@pytest.mark.parametrize(
    ("missed", "published"),
    [("skip", 0), ("once", 1), ("all", 4)],
)
def test_missed_runs_follow_the_policy(sql, missed, published):
    """Four due times passed (the next 35 s ago, every 10 s): skip fires none, once fires
    one (the first missed), all fires each; then the schedule is due after now."""
    sid = _every(sql, "late", 10, missed)
    first = _move_back(sql, "late", 35)
    for _ in range(6):
        sql("SELECT pgmb.fire_schedules()")
    ids = [row[0] for row in _fired(sql)]
    expected = [
        schedules.message_id(sid, first + datetime.timedelta(seconds=10 * n))
        for n in range(published)
    ]
    assert sorted(ids) == sorted(expected)
    s = Schedule.objects.get(name="late")
    assert s.next_run_at == first + datetime.timedelta(seconds=40)
    assert s.runs == published


def test_pause_and_resume(sql):
    _every(sql, "paused", 60)
    _move_back(sql, "paused", 1)
    assert sql("SELECT pgmb.pause_schedule('paused')") == [(True,)]
    assert sql("SELECT pgmb.fire_schedules()") == [(0,)]
    assert sql("SELECT pgmb.resume_schedule('paused')") == [(True,)]
    assert sql("SELECT pgmb.fire_schedules()") == [(1,)]
    assert sql("SELECT pgmb.pause_schedule('none such')") == [(None,)]
    assert sql("SELECT pgmb.unschedule('paused')") == [(True,)]
    assert not Schedule.objects.filter(name="paused").exists()
    assert len(_fired(sql)) == 1  # its messages stay


def test_a_cron_schedule_in_a_time_zone(sql):
    sid = sql(
        "SELECT pgmb.schedule(name => 'nightly', routing_key => 'sched.test', body => '1',"
        " cron => '30 2 * * *', timezone => 'Europe/Berlin', first_run => '2026-03-29 00:00+00')"
    )[0][0]
    sql("SELECT pgmb.fire_schedules()")
    s = Schedule.objects.get(name="nightly")
    # 02:30 does not exist on 2026-03-29 in Berlin: cronsim's rule makes it 03:00 CEST.
    assert s.last_runs == [datetime.datetime(2026, 3, 29, 0, 0, tzinfo=UTC)]
    assert s.next_run_at > datetime.datetime.now(UTC)
    assert s.next_run_at == schedules.cron_next(
        "30 2 * * *", "Europe/Berlin", datetime.datetime.now(UTC)
    )
    [(message_id, _)] = _fired(sql)
    assert message_id == schedules.message_id(sid, datetime.datetime(2026, 3, 29, tzinfo=UTC))


def test_changing_a_schedule_keeps_its_next_due_time_unless_when_changes(sql):
    _every(sql, "kept", 60)
    before = Schedule.objects.get(name="kept").next_run_at
    sql(
        "SELECT pgmb.schedule(name => 'kept', routing_key => 'sched.other', body => '2',"
        " every => interval '60 seconds')"
    )
    s = Schedule.objects.get(name="kept")
    assert (s.next_run_at, s.routing_key, s.body) == (before, "sched.other", 2)
    sql(
        "SELECT pgmb.schedule(name => 'kept', routing_key => 'sched.other', body => '2',"
        " every => interval '2 hours')"
    )
    assert Schedule.objects.get(name="kept").next_run_at > before + datetime.timedelta(minutes=30)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ("cron => '0 0 * * * *'", "expected 5 fields"),
        ("cron => '61 * * * *'", "bad minute"),
        ("cron => '0 0 * * *', timezone => 'Mars/Olympus'", 'unknown time zone "Mars/Olympus"'),
        ("every => interval '0.5 seconds'", "at least 1 second"),
        ("cron => '0 0 * * *', every => interval '1 minute'", "either cron or every"),
        ("", "either cron or every"),
        ("every => interval '1 minute', missed => 'never'", "skip, once or all"),
        (
            "every => interval '1 minute', headers => '[1]'",
            "the headers are a JSON object, not array",
        ),
    ],
)
def test_bad_input_stores_nothing(sql, raises_sql, args, words):
    with raises_sql("22023", words), transaction.atomic():
        sql(
            "SELECT pgmb.schedule(name => 'bad', routing_key => 'sched.test', body => '1',"
            f" {args or 'cron => NULL'})"
        )
    assert not Schedule.objects.exists()


def test_python_refuses_the_same_before_the_database(sql):
    for kwargs, words in [
        ({"cron": "0 0 * * * *"}, "expected 5 fields"),
        ({"cron": "61 * * * *"}, "bad minute"),
        ({"cron": "0 0 * * *", "timezone": "Mars/Olympus"}, "unknown time zone"),
        ({"every": 0.5}, "at least 1 second"),
        ({"every": 60, "routing_key": "order.*"}, "routing key"),
    ]:
        kwargs = {"routing_key": "sched.test", **kwargs}
        # A routing key's refusal is InvalidRoutingKey; every refusal is a ValueError.
        with pytest.raises(ValueError, match=words), transaction.atomic():
            schedules.schedule("bad", body=1, **kwargs)
    assert not Schedule.objects.exists()
    sid = schedules.schedule("good", "sched.test", {"a": 1}, every=datetime.timedelta(seconds=5))
    assert Schedule.objects.get(id=sid).every == datetime.timedelta(seconds=5)
    assert schedules.pause("good") and schedules.resume("good") and schedules.unschedule("good")
    assert not schedules.pause("good")


def test_next_wakeup_counts_the_next_schedule_still_to_come(sql, make_queue):
    make_queue("nothing.here", name="wq")
    assert sql("SELECT pgmb.next_wakeup(NULL)") == [(None,)]
    _every(sql, "soon", 30)
    [(wake_in,)] = sql("SELECT pgmb.next_wakeup(NULL)")
    assert 0 < wake_in <= 30
    # Overdue, it wakes nobody: the loops that fire keep their own time (0.1.1's would spin).
    _move_back(sql, "soon", 5)
    assert sql("SELECT pgmb.next_wakeup(NULL)") == [(None,)]
    sql("SELECT pgmb.pause_schedule('soon')")
    assert sql("SELECT pgmb.next_wakeup(NULL)") == [(None,)]


def test_a_schedule_that_cannot_publish_records_why_and_moves_on(sql):
    _every(sql, "broken", 60)
    _every(sql, "fine", 60, key="sched.fine")
    _move_back(sql, "broken", 1)
    _move_back(sql, "fine", 1)
    # A body past what messages may carry, written behind pgmb.schedule's back.
    sql("UPDATE pgmb_schedule SET routing_key = '' WHERE name = 'broken'")
    assert sql("SELECT pgmb.fire_schedules()") == [(1,)]
    broken = Schedule.objects.get(name="broken")
    assert broken.last_error and broken.next_run_at > datetime.datetime.now(UTC)
    assert Message.objects.filter(routing_key="sched.fine").count() == 1


@pytest.mark.parametrize(
    ("cron", "first", "fired"),
    [
        # Wall time (minute and hour fixed): 02:30 happens twice on 2026-10-25 in Berlin and
        # fires once, the first time (CEST); then 02:30 CET the next day.
        ("30 2 * * *", "2026-10-25T00:30:00", ["2026-10-25T00:30:00", "2026-10-26T01:30:00"]),
        # Real time: every half hour fires through the repeated hour, both times.
        (
            "*/30 * * * *",
            "2026-10-25T00:30:00",
            ["2026-10-25T00:30:00", "2026-10-25T01:00:00", "2026-10-25T01:30:00"],
        ),
        # The skipped hour (2026-03-29 02:00 → 03:00): 02:30 fires at 03:00 CEST.
        ("30 2 * * *", "2026-03-28T01:30:00", ["2026-03-28T01:30:00", "2026-03-29T01:00:00"]),
    ],
)
def test_dst_edges_fire_each_due_time_once(sql, cron, first, fired):
    """Due times in the past, missed 'all': each pass fires the next one, in order."""
    sid = sql(
        "SELECT pgmb.schedule(name => 'dst', routing_key => 'sched.test', body => '1',"
        " cron => %s, timezone => 'Europe/Berlin', missed => 'all', first_run => %s)",
        (cron, datetime.datetime.fromisoformat(first).replace(tzinfo=UTC)),
    )[0][0]
    for _ in fired:
        assert sql("SELECT pgmb.fire_schedules(1)") == [(1,)]
    due = [datetime.datetime.fromisoformat(t).replace(tzinfo=UTC) for t in fired]
    assert Schedule.objects.get(id=sid).last_runs == list(reversed(due))
    assert [row[0] for row in _fired(sql)] == [schedules.message_id(sid, d) for d in due]
