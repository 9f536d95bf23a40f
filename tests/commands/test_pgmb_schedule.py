"""manage.py pgmb_schedule against a real PostgreSQL: add (and change), list, pause, resume,
remove, and bad input refused in one line with nothing stored."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pgmb.models import Schedule

pytestmark = pytest.mark.django_db


def run(*args) -> str:
    out = io.StringIO()
    call_command("pgmb_schedule", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def fails(*args, match: str) -> None:
    with pytest.raises(CommandError) as info:
        run(*args)
    assert match in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_add_list_pause_resume_remove():
    assert run(
        "add",
        "nightly",
        "--cron",
        "30 2 * * *",
        "--timezone",
        "Europe/Berlin",
        "--routing-key",
        "report.nightly",
        "--body",
        '{"k": 1}',
    ).startswith("scheduled nightly")
    run("add", "beat", "--every", "5", "--routing-key", "ops.beat", "--missed", "skip")
    s = Schedule.objects.get(name="nightly")
    assert (s.cron, s.timezone, s.body, s.missed) == (
        "30 2 * * *",
        "Europe/Berlin",
        {"k": 1},
        "once",
    )
    assert Schedule.objects.get(name="beat").every.total_seconds() == 5
    listed = run("list").splitlines()
    assert [line.split("\t")[:3] for line in listed] == [
        ["beat", "running", "every 5 s"],
        ["nightly", "running", "30 2 * * * (Europe/Berlin)"],
    ]
    run("pause", "nightly")
    assert Schedule.objects.get(name="nightly").paused
    run("resume", "nightly")
    assert not Schedule.objects.get(name="nightly").paused
    assert run("remove", "beat").strip() == "removed beat"
    assert list(Schedule.objects.values_list("name", flat=True)) == ["nightly"]


def test_bad_input_is_one_line_and_stores_nothing():
    fails("add", "x", "--cron", "61 * * * *", "--routing-key", "a.b", match="bad minute")
    fails("add", "x", "--cron", "0 0 * * * *", "--routing-key", "a.b", match="expected 5 fields")
    fails(
        "add",
        "x",
        "--cron",
        "0 0 * * *",
        "--timezone",
        "Mars/Olympus",
        "--routing-key",
        "a.b",
        match="unknown time zone",
    )
    fails("add", "x", "--every", "0.5", "--routing-key", "a.b", match="at least 1 second")
    fails("add", "x", "--every", "5", "--routing-key", "a.b", "--body", "{", match="JSON")
    fails("pause", "none-such", match='no schedule named "none-such"')
    assert not Schedule.objects.exists()
