"""manage.py pgmb_backfill, pgmb_recover and pgmb_events against a real PostgreSQL: what
they add, requeue and switch, and their one-line refusals that change nothing."""

from __future__ import annotations

import datetime as dt
import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

import pgmb
from pgmb.models import DeadLetter, Delivery


def run(command: str, *args: str) -> str:
    out = io.StringIO()
    call_command(command, *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def fails(command: str, *args: str, match: str) -> None:
    with pytest.raises(CommandError) as info:
        run(command, *args)
    assert match in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_backfill_gives_the_later_queue_its_older_messages_once(make_queue):
    make_queue("order.*", name="orders")
    ids = [pgmb.send("order.created", {"n": n}) for n in range(2)]
    make_queue("order.#", name="audit")

    assert (
        run("pgmb_backfill", "audit", "--since", "1h") == "backfilled 2 messages to queue audit\n"
    )
    assert (
        run("pgmb_backfill", "audit", "--since", "1h") == "backfilled 0 messages to queue audit\n"
    )
    assert set(
        Delivery.objects.filter(queue__name="audit").values_list("message_id", flat=True)
    ) == set(ids)


def test_backfill_and_recover_refuse_bad_input_in_one_line(make_queue):
    make_queue("order.*", name="orders")
    pgmb.send("order.created", {"n": 1})
    before = set(Delivery.objects.values_list("message_id", "queue_id"))
    for command in ("pgmb_backfill", "pgmb_recover"):
        fails(
            command, "nope", "--since", "1h", match="queue 'nope' does not exist; nothing changed"
        )
        fails(command, "orders", "--since", "1h", "--until", "2h", match="until")
        fails(command, "orders", "--since", "yesterday", match="invalid time 'yesterday'")
    assert set(Delivery.objects.values_list("message_id", "queue_id")) == before


def test_recover_requeues_the_windows_dead_letters(make_queue):
    orders = make_queue("order.*", name="orders")
    letters = []
    for hours in (3, 0.5):
        message_id = pgmb.send("order.created", {"n": hours})
        Delivery.objects.filter(message_id=message_id).delete()
        letters.append(
            DeadLetter.objects.create(
                message_id=message_id,
                queue=orders,
                attempts=1,
                created_at=timezone.now() - dt.timedelta(hours=hours),
            )
        )

    assert (
        run("pgmb_recover", "orders", "--since", "1h")
        == "recovered 1 dead letter of queue orders\n"
    )
    assert list(Delivery.objects.values_list("message_id", flat=True)) == [letters[1].message_id]
    assert list(DeadLetter.objects.values_list("pk", flat=True)) == [letters[0].pk]


def test_events_switch_on_off_and_status(transactional_db):
    assert run("pgmb_events", "status") == "events are off\n"
    try:
        assert run("pgmb_events", "on") == "events are on\n"
        assert run("pgmb_events", "status") == "events are on\n"
    finally:
        assert run("pgmb_events", "off") == "events are off\n"
