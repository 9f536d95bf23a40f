"""manage.py pgmb_send with the message options (docs/ordering.md): what it stores and
refuses, for one message, a file of bodies and envelopes."""

from __future__ import annotations

import datetime
import json
import uuid

from pgmb.models import Delivery, Message
from tests.commands.test_pgmb_send import fails, run, write_lines


def test_single_send_stores_every_option(make_queue):
    make_queue("#")
    first = uuid.UUID(run("order.created", "1").strip())
    out = run(
        "order.created",
        "2",
        priority=-2,
        group="order-7",
        depends_on=str(first),
        dedup_id="o7",
        max_retries=1,
        retry_delay="1m30s",
    )
    m = Message.objects.get(pk=out.strip())
    assert (m.priority, m.group_key, m.depends_on, m.dedup_id) == (-2, "order-7", [first], "o7")
    assert (m.max_retries, m.retry_delay) == (1, 90.0)
    assert Delivery.objects.get(message=m).state == "waiting"  # behind its dependency
    # A duplicate prints the id of the message it duplicates.
    assert run("order.created", "3", dedup_id="o7") == out


def test_bad_options_are_refused_and_store_nothing(db):
    fails("k", "1", priority=40000, match="invalid priority 40000")
    fails("k", "1", group="a b", match="invalid group")
    fails("k", "1", retry_delay="2026-12-01T10:00:00Z", match="not a time")
    fails("k", "1", depends_on="nope", match="is not a UUID")
    fails("k", "1", depends_on=str(uuid.uuid4()), match="does not exist")
    assert Message.objects.count() == 0


def test_a_file_takes_group_and_priority_for_every_line_and_envelopes_their_own(
    make_queue, tmp_path
):
    make_queue("#")
    bodies = write_lines(tmp_path / "b.jsonl", ["1", "2"])
    run("k", file=str(bodies), group="g", priority=3)
    assert set(Message.objects.values_list("group_key", "priority")) == {("g", 3)}
    envelopes = write_lines(
        tmp_path / "e.jsonl",
        [
            json.dumps({"routing_key": "k", "body": 1, "dedup_id": "x", "retry_delay": 5}),
            json.dumps({"routing_key": "k", "body": 2, "dedup_id": "x"}),
            json.dumps({"routing_key": "k", "body": 3, "group": "h", "max_retries": 0}),
        ],
    )
    assert run(file=str(envelopes)) == "sent 3 messages\n"
    assert Message.objects.filter(dedup_id="x").count() == 1
    assert Message.objects.get(group_key="h").max_retries == 0
    fails(file=str(envelopes), dedup_id="y", match="--dedup-id cannot be used with --file")
    bad = write_lines(
        tmp_path / "bad.jsonl", [json.dumps({"routing_key": "k", "body": 1, "priority": "hi"})]
    )
    fails(file=str(bad), match="line 1: invalid priority")


def test_expiry_from_the_command_and_from_envelopes(make_queue, tmp_path):
    """--ttl and --expires-at (docs/delivery.md, Expiry); a line's own replaces the file's."""
    make_queue("#")
    one = Message.objects.get(pk=run("k", "1", ttl="5m").strip())
    assert one.expires_at - one.created_at == datetime.timedelta(minutes=5)
    two = Message.objects.get(pk=run("k", "2", expires_at="2030-01-01T00:00:00Z").strip())
    assert two.expires_at == datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone.utc)
    lines = write_lines(
        tmp_path / "e.jsonl",
        [
            json.dumps({"routing_key": "k", "body": 3}),
            json.dumps({"routing_key": "k", "body": 4, "expires_at": "2031-01-01T00:00:00Z"}),
        ],
    )
    assert run(file=str(lines), ttl=60) == "sent 2 messages\n"
    ttl, at = (Message.objects.get(body=n) for n in (3, 4))
    assert ttl.expires_at - ttl.created_at == datetime.timedelta(seconds=60)
    assert at.expires_at.year == 2031


def test_bad_expiry_is_refused_and_stores_nothing(db):
    fails("k", "1", ttl="-5", match="must not be negative")
    fails("k", "1", ttl="0", match="invalid ttl")
    fails("k", "1", ttl="2030-01-01T00:00:00Z", match="not a time")
    fails("k", "1", expires_at="5m", match="--expires-at must be a time")
    fails("k", "1", ttl="5", expires_at="2030-01-01T00:00:00Z", match="not both")
    assert Message.objects.count() == 0


def test_unique_keys_from_the_command_and_from_envelopes(make_queue, tmp_path):
    make_queue("#")
    first = run("order.created", "1", unique_key="order-7")
    # Skipped: it prints the live one's id.
    assert run("order.created", "2", unique_key="order-7") == first
    replaced = run("order.created", "3", unique_key="order-7", on_duplicate="replace")
    assert replaced != first
    assert list(Delivery.objects.values_list("message_id", "unique_key")) == [
        (uuid.UUID(replaced.strip()), "order-7")
    ]
    envelopes = write_lines(
        tmp_path / "e.jsonl",
        [
            json.dumps({"routing_key": "k", "body": 1, "unique_key": "u"}),
            json.dumps({"routing_key": "k", "body": 2, "unique_key": "v"}),
        ],
    )
    assert run(file=str(envelopes), on_duplicate="replace") == "sent 2 messages\n"
    assert set(Message.objects.filter(unique_key__in=["u", "v"]).values_list("on_duplicate")) == {
        ("replace",)
    }


def test_bad_unique_keys_are_refused_and_store_nothing(db):
    fails("k", "1", unique_key="a b", match="invalid unique key")
    fails("k", "1", unique_key="x" * 129, match="invalid unique key")
    fails("k", "1", on_duplicate="replace", match="needs a unique key")
    fails("k", file="-", unique_key="u", match="--unique-key cannot be used with --file")
    assert Message.objects.count() == 0
