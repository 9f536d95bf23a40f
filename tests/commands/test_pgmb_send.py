"""manage.py pgmb_send against a real PostgreSQL: what it stores, routes and refuses."""

from __future__ import annotations

import io
import json
import os
import pty
import signal
import subprocess
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from pgmb.models import Delivery, Message
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def run(*args, stdin=None, **options) -> str:
    """call_command, returning what the command printed."""
    out = io.StringIO()
    call_command("pgmb_send", *args, stdout=out, stderr=io.StringIO(), stdin=stdin, **options)
    return out.getvalue()


def fails(*args, match: str, **options) -> str:
    """Run the command expecting a CommandError whose one-line message contains ``match``."""
    with pytest.raises(CommandError) as info:
        run(*args, **options)
    message = str(info.value)
    assert match in message, message
    assert "\n" not in message
    return message


def stored_delay(message: Message) -> float:
    return (message.available_at - message.created_at).total_seconds()


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


# --- one message --------------------------------------------------------------------------


def test_single_send_stores_body_headers_delay_and_routes(make_queue):
    orders, invoices = make_queue("order.*"), make_queue("invoice.#")
    out = run(
        "order.created",
        '{"order_id": 1, "lines": [1, 2]}',
        headers='{"tenant": "eu"}',
        delay="90",
    )
    message_id = uuid.UUID(out.strip())
    assert out == f"{message_id}\n"
    message = Message.objects.get()
    assert message.id == message_id
    assert message.routing_key == "order.created"
    assert message.body == {"order_id": 1, "lines": [1, 2]}
    assert message.headers == {"tenant": "eu"}
    assert stored_delay(message) == pytest.approx(90, abs=1e-3)
    assert list(Delivery.objects.values_list("queue_id", "message_id")) == [(orders.id, message_id)]
    assert not Delivery.objects.filter(queue=invoices).exists()


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [("1.5", 1.5), ("500ms", 0.5), ("45s", 45), ("10m", 600), ("1h30m", 5400), ("1d", 86400)],
)
def test_delay_forms(db, delay, seconds):
    run("order.created", "{}", delay=delay)
    assert stored_delay(Message.objects.get()) == pytest.approx(seconds, abs=1e-3)


def test_delay_as_iso_time(db):
    at = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=3)
    run("order.created", "1", delay=at.isoformat())
    assert Message.objects.get().available_at == at


def test_delay_in_the_past_means_now(db):
    run("order.created", "1", delay="2001-01-01T00:00:00Z")
    assert stored_delay(Message.objects.get()) == 0


def test_no_delay_no_headers(db):
    run("order.created", '"hello"')
    message = Message.objects.get()
    assert (message.body, message.headers, stored_delay(message)) == ("hello", {}, 0)


def test_given_id_is_used_and_a_duplicate_fails_cleanly(db):
    message_id = uuid.uuid4()
    assert run("order.created", '{"n": 1}', id=str(message_id)) == f"{message_id}\n"
    fails("order.created", '{"n": 2}', id=str(message_id), match="already exists")
    assert list(Message.objects.values_list("id", "body")) == [(message_id, {"n": 1})]


def test_verbosity_zero_prints_nothing(db):
    assert run("order.created", "1", verbosity=0) == ""
    assert Message.objects.count() == 1


@pytest.mark.parametrize(
    ("args", "options", "match"),
    [
        (("order.created", "{'a': 1}"), {}, "BODY is not valid JSON: Expecting property name"),
        (("order.created", "hello"), {}, "needs double quotes, like '\"hello\"'"),
        (("order.created", '{"a": 1'), {}, "BODY is not valid JSON"),
        (("order.created", "NaN"), {}, "BODY is not valid JSON: NaN is not a JSON number"),
        (("order created", "1"), {}, "invalid routing key 'order created'"),
        (("order.*", "1"), {}, "'*' and '#' are wildcards"),
        (("order.created", "1"), {"headers": "[1]"}, "--headers must be a JSON object"),
        (("order.created", "1"), {"headers": "{"}, "--headers is not valid JSON"),
        (("order.created", "1"), {"delay": "-5"}, "must not be negative"),
        (("order.created", "1"), {"delay": "2026-12-01T10:00:00"}, "no time zone"),
        (("order.created", "1"), {"delay": "soon"}, "invalid delay 'soon'"),
        (("order.created", "1"), {"id": "42"}, "--id '42' is not a UUID"),
        (("order.created",), {}, "give a BODY or --file"),
        ((), {}, "give a ROUTING_KEY and a BODY, or --file"),
        (("order.created", "1"), {"batch_size": 10}, "--batch-size only applies to --file"),
        (("order.created", "1"), {"database": "nope"}, "--database 'nope' is not in settings"),
        (("order.created", '"\\u0000"'), {}, "database error: unsupported Unicode escape"),
    ],
)
def test_bad_single_sends_store_nothing(db, args, options, match):
    fails(*args, match=match, **options)
    assert Message.objects.count() == 0


# --- files --------------------------------------------------------------------------------


def test_file_of_bodies_in_batches(make_queue, tmp_path):
    queue = make_queue("order.#")
    other = make_queue("invoice.#")
    path = write_lines(tmp_path / "bodies.jsonl", [json.dumps({"n": n}) for n in range(2500)])
    with CaptureQueriesContext(connection) as queries:
        out = run("order.created", file=str(path), batch_size=1000, headers='{"h": 1}', delay="1m")
    assert out == "sent 2500 messages\n"
    inserts = [q for q in queries if q["sql"].startswith("INSERT INTO pgmb_message")]
    assert len(inserts) == 3  # 1000 + 1000 + 500, one statement each
    assert Message.objects.count() == 2500
    assert sorted(Message.objects.values_list("body__n", flat=True)) == list(range(2500))
    assert list(Message.objects.values("routing_key", "headers").distinct()) == [
        {"routing_key": "order.created", "headers": {"h": 1}}
    ]
    assert {round(stored_delay(m), 3) for m in Message.objects.all()} == {60.0}
    assert Delivery.objects.filter(queue=queue).count() == 2500
    assert Delivery.objects.filter(queue=other).count() == 0


def test_batch_size_defaults_to_the_setting(db, tmp_path, settings):
    settings.PGMB = {"SEND_BATCH_SIZE": 2}
    path = write_lines(tmp_path / "bodies.jsonl", ["1", "2", "3", "4", "5"])
    with CaptureQueriesContext(connection) as queries:
        assert run("a.b", file=str(path)) == "sent 5 messages\n"
    assert sum(q["sql"].startswith("INSERT INTO pgmb_message") for q in queries) == 3


def test_blank_lines_are_skipped_and_line_numbers_count_them(db, tmp_path):
    path = write_lines(tmp_path / "bodies.jsonl", ["1", "", "   ", "2", "{oops}"])
    fails("a.b", file=str(path), match="line 5: invalid JSON")
    path = write_lines(tmp_path / "bodies.jsonl", ["\ufeff1", "", "   ", "2", ""])
    assert run("a.b", file=str(path)) == "sent 2 messages\n"
    assert sorted(Message.objects.values_list("body", flat=True)) == [1, 2]


def test_empty_file_sends_nothing(db, tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert run("a.b", file=str(path)) == "sent 0 messages\n"
    assert Message.objects.count() == 0


def test_one_message_is_singular(db, tmp_path):
    path = write_lines(tmp_path / "one.jsonl", ["1"])
    assert run("a.b", file=str(path)) == "sent 1 message\n"


def test_envelope_lines(make_queue, tmp_path):
    orders = make_queue("order.*")
    invoices = make_queue("invoice.*")
    given = uuid.uuid4()
    at = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    path = write_lines(
        tmp_path / "envelopes.jsonl",
        [
            json.dumps({"routing_key": "order.created", "body": {"n": 1}}),
            json.dumps(
                {
                    "routing_key": "invoice.paid",
                    "body": [1, 2],
                    "headers": {"h": "own"},
                    "delay": 30,
                    "id": str(given),
                }
            ),
            json.dumps({"routing_key": "order.paid", "body": None, "delay": "1h30m"}),
            json.dumps({"routing_key": "order.shipped", "body": "x", "delay": at.isoformat()}),
        ],
    )
    # --headers and --delay are defaults that an envelope's own fields override.
    assert run(file=str(path), headers='{"h": "default", "tenant": "eu"}', delay="2s") == (
        "sent 4 messages\n"
    )
    messages = {m.routing_key: m for m in Message.objects.all()}
    assert messages["order.created"].body == {"n": 1}
    assert messages["order.created"].headers == {"h": "default", "tenant": "eu"}
    assert stored_delay(messages["order.created"]) == pytest.approx(2, abs=1e-3)
    paid = messages["invoice.paid"]
    assert (paid.id, paid.body, paid.headers) == (given, [1, 2], {"h": "own", "tenant": "eu"})
    assert stored_delay(paid) == pytest.approx(30, abs=1e-3)
    assert messages["order.paid"].body is None
    assert stored_delay(messages["order.paid"]) == pytest.approx(5400, abs=1e-3)
    assert messages["order.shipped"].available_at == at
    assert Delivery.objects.filter(queue=orders).count() == 3
    assert list(Delivery.objects.filter(queue=invoices).values_list("message_id", flat=True)) == [
        given
    ]


def _envelope(n: int) -> str:
    return json.dumps({"routing_key": f"order.n{n}", "body": {"n": n}})


@pytest.mark.parametrize(
    ("routing_key", "bad_line", "match"),
    [
        ("order.created", "{not json", "line 1234: invalid JSON: Expecting property name"),
        ("order.created", "Infinity", "line 1234: invalid JSON: Infinity is not a JSON number"),
        ("order.created", '{"s": "\\u0000"}', "line 1234: the database refused it"),
        (None, '{"routing_key": "a", "body": 1, "bdy": 2}', "line 1234: unknown key 'bdy'"),
        (None, '{"routing_key": "a"}', "line 1234: the envelope has no 'body'"),
        (None, "[1, 2]", "line 1234: without a ROUTING_KEY each line must be a JSON object"),
        (None, '{"routing_key": "a b", "body": 1}', "line 1234: invalid routing key 'a b'"),
        (None, '{"routing_key": 7, "body": 1}', "line 1234: invalid routing key 7"),
        (None, '{"routing_key": "a", "body": 1, "headers": 3}', "headers must be a JSON object"),
        (None, '{"routing_key": "a", "body": 1, "delay": -1}', "must not be negative"),
        (None, '{"routing_key": "a", "body": 1, "delay": "2030-01-01"}', "no time zone"),
        (None, '{"routing_key": "a", "body": 1, "delay": true}', "delay must be a number"),
        (None, '{"routing_key": "a", "body": 1, "id": "x"}', "line 1234: id 'x' is not a UUID"),
        ("order.created", "[" * 65 + "]" * 65, "line 1234: message refused: the body: nested"),
        (
            None,
            '{"routing_key": "a", "body": 1, "headers": {"Cookie": "c"}}',
            "line 1234: message refused: header 'Cookie' is reserved",
        ),
    ],
)
def test_a_bad_line_publishes_nothing_and_is_named(db, tmp_path, routing_key, bad_line, match):
    lines = [_envelope(n) if routing_key is None else json.dumps(n) for n in range(1, 2001)]
    lines[1233] = bad_line
    path = write_lines(tmp_path / "input.jsonl", lines)
    args = (routing_key,) if routing_key else ()
    fails(*args, file=str(path), batch_size=500, match=match)
    assert Message.objects.count() == 0
    assert Delivery.objects.count() == 0


def test_a_duplicate_id_in_the_file_names_its_line(db, tmp_path):
    ids = [str(uuid.uuid4()) for _ in range(2000)]
    ids[1233] = ids[99]
    path = write_lines(
        tmp_path / "input.jsonl",
        [json.dumps({"routing_key": "a.b", "body": n, "id": i}) for n, i in enumerate(ids)],
    )
    fails(file=str(path), batch_size=1000, match="line 1234: a message with this id already")
    assert Message.objects.count() == 0


def test_an_id_already_in_the_database_names_its_line(db, tmp_path):
    taken = run("a.b", "0").strip()
    path = write_lines(
        tmp_path / "input.jsonl",
        [
            '{"routing_key": "a.b", "body": 1}',
            json.dumps({"routing_key": "a.b", "body": 2, "id": taken}),
        ],
    )
    fails(file=str(path), match="line 2: a message with this id already exists")
    assert list(Message.objects.values_list("body", flat=True)) == [0]


def test_not_utf8_names_its_line(db, tmp_path):
    path = tmp_path / "input.jsonl"
    path.write_bytes(b'1\n"caf\xe9"\n')
    fails("a.b", file=str(path), match="line 2: not UTF-8 text (byte 5)")
    assert Message.objects.count() == 0


@pytest.mark.parametrize(
    ("args", "options", "match"),
    [
        (("a.b", "1"), {"file": "x.jsonl"}, "give a BODY or --file, not both"),
        (("a.b",), {"file": "x.jsonl", "id": str(uuid.uuid4())}, "--id cannot be used with --file"),
        (("a.b",), {"file": "/nonexistent/x.jsonl"}, "cannot read --file /nonexistent/x.jsonl"),
        (("a.b",), {"file": "/"}, "cannot read --file /: Is a directory"),
        (("a.b",), {"file": "x.jsonl", "batch_size": 0}, "--batch-size must be a whole number"),
        (("a b",), {"file": "x.jsonl"}, "invalid routing key 'a b'"),
        (("a.b",), {"file": "x.jsonl", "headers": "1"}, "--headers must be a JSON object"),
        (("a.b",), {"file": "x.jsonl", "delay": "-1s"}, "must not be negative"),
    ],
)
def test_bad_file_options(db, tmp_path, monkeypatch, args, options, match):
    monkeypatch.chdir(tmp_path)
    write_lines(tmp_path / "x.jsonl", ["1"])
    fails(*args, match=match, **options)
    assert Message.objects.count() == 0


@pytest.mark.parametrize("kind", [io.StringIO, lambda text: io.BytesIO(text.encode())])
def test_stdin_with_dash(make_queue, kind):
    queue = make_queue("#")
    stdin = kind('{"routing_key": "a.b", "body": 1}\n\n{"routing_key": "c", "body": 2}\n')
    assert run(file="-", stdin=stdin) == "sent 2 messages\n"
    assert sorted(Message.objects.values_list("routing_key", "body")) == [("a.b", 1), ("c", 2)]
    assert Delivery.objects.filter(queue=queue).count() == 2


# --- as a real process --------------------------------------------------------------------


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        # The child connects to the database this test is using (pytest's test database).
        "PGMB_DB_NAME": connection.settings_dict["NAME"],
    }


def _manage(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "django", "pgmb_send", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=_env(),
        cwd=ROOT,
        timeout=60,
    )


def test_process_sends_and_prints_the_id(transactional_db, make_queue):
    queue = make_queue("order.*")
    done = _manage("order.created", '{"order_id": 7}', "--delay", "10m")
    assert (done.returncode, done.stderr) == (0, "")
    message = Message.objects.get()
    assert done.stdout == f"{message.id}\n"
    assert message.body == {"order_id": 7}
    assert stored_delay(message) == pytest.approx(600, abs=1e-3)
    assert Delivery.objects.get().queue_id == queue.id


def test_process_reads_stdin(transactional_db, make_queue):
    make_queue("a.*")
    lines = "".join(json.dumps({"n": n}) + "\n" for n in range(30))
    done = _manage("a.b", "--file", "-", "--batch-size", "7", stdin=lines)
    assert (done.returncode, done.stdout, done.stderr) == (0, "sent 30 messages\n", "")
    assert Message.objects.count() == 30


@pytest.mark.parametrize(
    ("args", "stdin", "match"),
    [
        (("order.created", "{oops}"), "", "BODY is not valid JSON"),
        (("order created", "1"), "", "invalid routing key"),
        (("order.created", "1", "--delay", "-3"), "", "must not be negative"),
        (("order.created", "1", "--headers", "[]"), "", "--headers must be a JSON object"),
        (("a.b", "--file", "-"), "1\n2\n{\n", "line 3: invalid JSON"),
        (("a.b", "--file", "/nonexistent"), "", "cannot read --file /nonexistent"),
        (("order.created",), "", "give a BODY or --file"),
    ],
)
def test_process_bad_input_is_one_line_and_nonzero(transactional_db, args, stdin, match):
    done = _manage(*args, stdin=stdin)
    assert done.returncode == 1
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("CommandError: ")
    assert match in lines[0]
    assert "Traceback" not in done.stderr
    assert Message.objects.count() == 0


def test_process_duplicate_id_is_one_line(transactional_db):
    message_id = str(uuid.uuid4())
    assert _manage("a.b", "1", "--id", message_id).returncode == 0
    done = _manage("a.b", "2", "--id", message_id)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1
    assert "already exists" in done.stderr
    assert list(Message.objects.values_list("body", flat=True)) == [1]


def test_progress_bar_on_a_terminal_only(transactional_db, tmp_path, make_queue):
    make_queue("a.*")
    path = write_lines(tmp_path / "bodies.jsonl", [str(n) for n in range(3000)])
    args = [sys.executable, "-m", "django", "pgmb_send", "a.b", "--file", str(path)]

    # Not a terminal: no progress, only the count.
    done = subprocess.run(args, capture_output=True, text=True, env=_env(), timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "sent 3000 messages\n", "")

    # On a terminal: a bar on stderr, cleared before the count is printed.
    leader, follower = pty.openpty()
    child = subprocess.Popen(
        [*args, "--batch-size", "500"], stdout=follower, stderr=follower, env=_env()
    )
    os.close(follower)
    seen = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the child has gone and closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    os.close(leader)
    assert child.wait(timeout=60) == 0
    text = seen.decode()
    assert "100% [##############################] 3,000 messages" in text
    assert text.endswith("\r\x1b[2Ksent 3000 messages\r\n")
    assert Message.objects.count() == 6000


def test_process_interrupted_sends_nothing(transactional_db):
    app = f"pgmb_send_{uuid.uuid4().hex[:8]}"
    child = subprocess.Popen(
        [sys.executable, "-m", "django", "pgmb_send", "a.b", "--file", "-", "--batch-size", "10"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Names the child's connection, so that it is told apart from any other.
        env={**_env(), "PGAPPNAME": app},
    )
    child.stdin.write(b"".join(b"%d\n" % n for n in range(100)))
    child.stdin.flush()

    # Interrupt once the child holds its file transaction open, waiting for more input.
    def holding_its_transaction() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE application_name = %s AND state = 'idle in transaction'",
                [app],
            )
            return bool(cursor.fetchone()[0])

    wait_until(holding_its_transaction, message="pgmb_send to hold its transaction open")
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=60)
    assert (child.returncode, out, err) == (
        130,
        b"",
        b"CommandError: interrupted: nothing was sent\n",
    )
    assert Message.objects.count() == 0


def _run_with_stderr(*args, **options) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("pgmb_send", *args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def test_a_message_no_queue_gets_is_sent_with_a_warning(make_queue):
    make_queue("order.*")
    out, err = _run_with_stderr("invoice.created", "{}")
    assert Message.objects.get().id == uuid.UUID(out.strip())
    assert "warning: the message with routing key 'invoice.created' matched no queue" in err
    out, err = _run_with_stderr("order.created", "{}")
    assert err == ""


def test_bulk_warns_once_naming_the_first_unrouted_line(make_queue, tmp_path):
    make_queue("order.*")
    path = write_lines(
        tmp_path / "e.jsonl",
        [
            '{"routing_key": "order.a", "body": 1}',
            '{"routing_key": "lost.a", "body": 2}',
            '{"routing_key": "order.b", "body": 3}',
            '{"routing_key": "lost.b", "body": 4}',
        ],
    )
    out, err = _run_with_stderr("--file", str(path), "--batch-size", "3")
    assert "sent 4 messages" in out
    assert "2 messages matched no queue (the first: line 2, routing key 'lost.a')" in err
    assert Message.objects.count() == 4
