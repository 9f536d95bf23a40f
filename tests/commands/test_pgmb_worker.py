"""manage.py pgmb_worker against a real PostgreSQL: it shows a worker's controls, caps and
uncaps its requests in flight, sets its rate and final answers, and refuses bad input (the
database's rule) changing nothing."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pgmb import worker_controls
from pgmb.models import Worker


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("pgmb_worker", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_show_cap_uncap_and_answers(make_worker):
    make_worker("billing", rps=50)
    assert run("billing") == (
        "worker billing: 50 requests a second, in flight no cap\n"
        "  dead-lettered at once: -\n"
        "  retried all the same: -\n"
    )
    out = run("billing", "--max-in-flight", "2", "--dead-statuses", " 410,4XX", "--rps", "20")
    assert out.startswith("worker billing: 20 requests a second, in flight at most 2\n")
    assert "  dead-lettered at once: 410, 4xx\n" in out
    stored = Worker.objects.get(name="billing")
    assert (stored.rps, stored.max_in_flight, stored.dead_statuses) == (20, 2, ["410", "4xx"])

    run("billing", "--no-cap", "--retried-statuses", "429", "--dead-statuses", "")
    assert worker_controls.controls("billing") == worker_controls.Controls(
        "billing", 20, None, [], ["429"]
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no worker named 'nope'"),
        (["nope", "--max-in-flight", "2"], "no worker named 'nope'"),
        (["billing", "--max-in-flight", "0"], "invalid max_in_flight 0 for worker billing"),
        (["billing", "--max-in-flight", "-1", "--rps", "5"], "invalid max_in_flight -1"),
        (["billing", "--rps", "0"], "invalid rps 0"),
        (["billing", "--dead-statuses", "200"], "database error"),
        (["billing", "--dead-statuses", "410", "--retried-statuses", "410"], "database error"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(make_worker, args, message):
    make_worker("billing", rps=50, max_in_flight=3)
    with pytest.raises(CommandError) as info:
        run(*args)
    assert message in str(info.value)
    assert worker_controls.controls("billing") == worker_controls.Controls("billing", 50, 3, [], [])
