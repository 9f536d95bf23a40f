"""manage.py pgmb_fairness against a real PostgreSQL: it names and lifts a queue's fairness
header, sets a key's settings, shows them, and refuses bad input changing nothing."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from pgmb import fairness


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("pgmb_fairness", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def test_header_keys_and_off(make_queue):
    make_queue("order.*", name="orders")
    assert run("orders") == "queue orders: oldest first (no fairness header)\n"
    assert run("orders", "--header", "tenant", "--key", "acme", "--weight", "2", "--rps", "5") == (
        "queue orders: keys of header 'tenant' in turn\n"
        "  'acme': weight 2, in flight at most -, rps 5\n"
    )
    run("orders", "--key", "slowco", "--max-in-flight", "1")
    shares = fairness.shares("orders")
    assert shares is not None and shares.header == "tenant"
    assert {(k.key, k.weight, k.max_in_flight, k.rps) for k in shares.keys} == {
        ("acme", 2, None, 5.0),
        ("slowco", 1, 1, None),
    }
    assert run("orders", "--off").startswith("queue orders: oldest first")
    assert fairness.shares("orders").header is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], "no queue named 'nope'"),
        (["nope", "--header", "tenant"], "database error"),
        (["orders", "--header", "has blank"], "database error"),
        (
            ["orders", "--header", "tenant", "--key", "acme", "--max-in-flight", "0"],
            "database error",
        ),
        (["orders", "--key", "acme", "--weight", "0"], "database error"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(make_queue, args, message):
    make_queue("order.*", name="orders")
    with pytest.raises(CommandError) as info:
        run(*args)
    assert message in str(info.value)
    shares = fairness.shares("orders")
    assert shares is not None and shares.header is None and shares.keys == []
