"""manage.py pgmb_requeue against a real PostgreSQL: what it requeues, purges and refuses."""

from __future__ import annotations

import io
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

import pgmb
from pgmb.models import DeadLetter, Delivery, Message


def run(*args, **options) -> str:
    """call_command, returning what the command printed."""
    out = io.StringIO()
    call_command("pgmb_requeue", *args, stdout=out, stderr=io.StringIO(), **options)
    return out.getvalue()


def fails(*args, match: str) -> str:
    """Run the command expecting a one-line CommandError containing ``match``."""
    with pytest.raises(CommandError) as info:
        run(*args)
    message = str(info.value)
    assert match in message, message
    assert "\n" not in message
    return message


def kill(message_id, queue):
    Delivery.objects.filter(message_id=message_id, queue=queue).delete()
    return DeadLetter.objects.create(
        message_id=message_id,
        queue=queue,
        attempts=queue.max_retries + 1,
        last_status=503,
        created_at=timezone.now(),
    )


@pytest.fixture
def dead(make_queue):
    """orders with three dead letters, audit with one (of a message orders also had)."""
    orders = make_queue("order.*", name="order_queue")
    audit = make_queue("#", name="audit")
    ids = [pgmb.send("order.created", {"n": n}) for n in range(3)]
    letters = [kill(mid, orders) for mid in ids]
    other = kill(ids[0], audit)
    Delivery.objects.all().delete()  # audit's other live deliveries: not what we look at
    return {"orders": orders, "audit": audit, "ids": ids, "letters": letters, "other": other}


def state():
    """(dead letters, live deliveries), as (message id, queue name) pairs."""
    return (
        set(DeadLetter.objects.values_list("message_id", "queue__name")),
        set(Delivery.objects.values_list("message_id", "queue__name")),
    )


def test_all_requeues_every_dead_letter_of_the_queue(dead):
    out = run("order_queue", "--all")

    assert out == "requeued 3 dead letters of queue order_queue\n"
    assert state() == (
        {(dead["ids"][0], "audit")},
        {(mid, "order_queue") for mid in dead["ids"]},
    )
    assert set(Delivery.objects.values_list("attempts", "state")) == {(0, "ready")}


def test_id_requeues_those_message_ids(dead):
    first, second, third = dead["ids"]

    out = run("order_queue", "--id", str(first), "--id", str(third))

    assert out == "requeued 2 dead letters of queue order_queue\n"
    assert state() == (
        {(second, "order_queue"), (first, "audit")},
        {(first, "order_queue"), (third, "order_queue")},
    )


def test_id_takes_several_values_and_dead_letter_ids(dead):
    first, second, _third = dead["ids"]

    out = run("order_queue", "--id", str(first), str(dead["letters"][1].pk), str(first))

    assert out == "requeued 2 dead letters of queue order_queue\n"
    assert state()[1] == {(first, "order_queue"), (second, "order_queue")}


def test_one_is_singular(dead):
    assert run("audit", "--all") == "requeued 1 dead letter of queue audit\n"


def test_purge_all_deletes_them_and_keeps_the_messages(dead):
    out = run("order_queue", "--all", "--purge")

    assert out == "purged 3 dead letters of queue order_queue\n"
    assert state() == ({(dead["ids"][0], "audit")}, set())
    assert Message.objects.count() == 3


def test_purge_ids(dead):
    out = run("order_queue", "--purge", "--id", str(dead["ids"][1]))

    assert out == "purged 1 dead letter of queue order_queue\n"
    assert len(state()[0]) == 3
    assert (dead["ids"][1], "order_queue") not in state()[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--all"], "would requeue 3 dead letters of queue order_queue"),
        (["--all", "--purge"], "would purge 3 dead letters of queue order_queue"),
        (["--id", "ID0", "ID2"], "would requeue 2 dead letters of queue order_queue"),
        (["--id", "ID1", "--purge"], "would purge 1 dead letter of queue order_queue"),
    ],
)
def test_dry_run_says_what_would_happen_and_changes_nothing(dead, args, expected):
    args = [str(dead["ids"][int(a[2:])]) if a.startswith("ID") else a for a in args]
    before = state()

    out = run("order_queue", "--dry-run", *args)

    assert out == f"{expected} (dry run: nothing changed)\n"
    assert state() == before


def test_dry_run_lists_the_ids_when_verbose(dead):
    out = run("order_queue", "--dry-run", "--id", str(dead["ids"][2]), verbosity=2)

    assert out.splitlines() == [
        f"{dead['ids'][2]} (dead letter {dead['letters'][2].pk})",
        "would requeue 1 dead letter of queue order_queue (dry run: nothing changed)",
    ]


@pytest.mark.parametrize("purge", [[], ["--purge"]])
@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["no_such_queue", "--all"], "no queue named 'no_such_queue'"),
        (["order_queue", "--id", "not-a-uuid"], "--id 'not-a-uuid' is not a UUID"),
        (["order_queue", "--id", "OK", "6f1c2a4e"], "--id '6f1c2a4e' is not a UUID"),
        (["order_queue", "--id", "OK", "NEW"], "not a dead letter of queue order_queue: NEW"),
        (["order_queue", "--id", "OK", "99999999"], "order_queue: 99999999; nothing"),
        (["audit", "--id", "OK", "ID1", "ID2"], "not dead letters of queue audit: ID1, ID2"),
        (["order_queue", "--id", "OTHER"], "not a dead letter of queue order_queue: OTHER"),
        (["order_queue"], "one of the arguments --all --id is required"),
        (["order_queue", "--all", "--id", "OK"], "argument --id: not allowed with argument --all"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_changes_nothing(dead, purge, args, match):
    names = {
        "OK": str(dead["ids"][0]),
        "ID1": str(dead["ids"][1]),
        "ID2": str(dead["ids"][2]),
        "NEW": str(uuid.uuid4()),
        "OTHER": str(dead["other"].pk),
    }
    args = [names.get(a, a) for a in args]
    match = " ".join(names.get(w.rstrip(","), w.rstrip(",")) + ("," if w.endswith(",") else "")
                     for w in match.split(" "))  # fmt: skip
    before = state()

    fails(*args, *purge, match=match)

    assert state() == before
