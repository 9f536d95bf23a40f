"""Bad input to the pull functions: a clear error with its SQLSTATE, through SQL and
through pgmb.pull alike, and nothing written."""

from __future__ import annotations

import pytest

import pgmb
from tests.pull.apis import APIS

UNDEFINED, WRONG_TYPE, INVALID, NULL = "42704", "42809", "22023", "22004"


@pytest.fixture
def world(make_pull_queue, make_queue, sql):
    """A pull queue with two read messages, another pull queue with one, a push queue."""
    pull = make_pull_queue("a", name="pull_a")
    other = make_pull_queue("b", name="pull_b")
    make_queue("a", name="push_a")
    pgmb.send("a", {"n": 1})
    pgmb.send("a", {"n": 2})
    pgmb.send("b", {"n": 3})
    mine = [r[0] for r in sql("SELECT delivery_id FROM pgmb.read('pull_a', 0, 2)")]
    theirs = [r[0] for r in sql("SELECT delivery_id FROM pgmb.read('pull_b', 0, 1)")]
    return {"pull": pull.name, "other": other.name, "mine": mine, "theirs": theirs}


def _state(sql) -> list:
    return sql(
        "SELECT (SELECT array_agg((id, queue_id, attempts, available_at, state) ORDER BY id)::text"
        "        FROM pgmb_delivery),"
        "       (SELECT count(*) FROM pgmb_attempt), (SELECT count(*) FROM pgmb_dead_letter)"
    )


CASES = [
    # (id, call, SQLSTATE, words of the message)
    (
        "unknown queue",
        lambda api, w: api.read("nope", 30, 1),
        UNDEFINED,
        "queue 'nope' does not exist",
    ),
    (
        "push queue",
        lambda api, w: api.read("push_a", 30, 1),
        WRONG_TYPE,
        "not a pull queue: worker",
    ),
    ("push queue delete", lambda api, w: api.delete("push_a", [1]), WRONG_TYPE, "not a pull queue"),
    ("push queue purge", lambda api, w: api.purge("push_a"), WRONG_TYPE, "not a pull queue"),
    (
        "negative vt",
        lambda api, w: api.read(w["pull"], -1, 1),
        INVALID,
        "invalid visibility timeout -1",
    ),
    ("absurd vt", lambda api, w: api.read(w["pull"], 1e9, 1), INVALID, "from 0 to 2592000 seconds"),
    (
        "NaN vt",
        lambda api, w: api.read(w["pull"], float("nan"), 1),
        INVALID,
        "invalid visibility timeout nan",
    ),
    (
        "null vt",
        lambda api, w: api.read(w["pull"], None, 1),
        INVALID,
        "invalid visibility timeout null",
    ),
    ("zero qty", lambda api, w: api.read(w["pull"], 30, 0), INVALID, "invalid qty 0"),
    ("negative qty", lambda api, w: api.pop(w["pull"], -3), INVALID, "invalid qty -3"),
    ("absurd qty", lambda api, w: api.read(w["pull"], 30, 1_000_000), INVALID, "from 1 to 10000"),
    (
        "filter array",
        lambda api, w: api.read(w["pull"], 30, 1, [1]),
        INVALID,
        "must be a JSON object, not array",
    ),
    ("filter string", lambda api, w: api.read(w["pull"], 30, 1, "x"), INVALID, "not string"),
    (
        "filter key",
        lambda api, w: api.read(w["pull"], 30, 1, {"kind": "a"}),
        INVALID,
        "unknown key 'kind'",
    ),
    (
        "filter headers",
        lambda api, w: api.read(w["pull"], 30, 1, {"headers": 1}),
        INVALID,
        '"headers" must be a json object',
    ),
    (
        "delete ids of another queue",
        lambda api, w: api.delete(w["pull"], w["mine"] + w["theirs"]),
        INVALID,
        "are not in queue 'pull_a'",
    ),
    (
        "archive ids of another queue",
        lambda api, w: api.archive(w["pull"], w["theirs"]),
        INVALID,
        "are not in queue",
    ),
    (
        "set_vt ids of another queue",
        lambda api, w: api.set_vt(w["pull"], w["theirs"], 0),
        INVALID,
        "are not in queue",
    ),
    (
        "set_vt negative vt",
        lambda api, w: api.set_vt(w["pull"], w["mine"], -5),
        INVALID,
        "invalid visibility timeout",
    ),
    (
        "nack ids of another queue",
        lambda api, w: api.nack(w["other"], [(w["mine"][0], {}, 1)], "x"),
        INVALID,
        "are not in queue 'pull_b'",
    ),
    (
        "null id",
        lambda api, w: api.delete(w["pull"], [w["mine"][0], None]),
        NULL,
        "NULL is not a message id",
    ),
    (
        "poll negative",
        lambda api, w: api.read_with_poll(w["pull"], 30, 1, -1),
        INVALID,
        "invalid max_poll_seconds -1",
    ),
    (
        "poll absurd interval",
        lambda api, w: api.read_with_poll(w["pull"], 30, 1, 1, 0),
        INVALID,
        "invalid poll_interval_ms 0",
    ),
]


@pytest.mark.parametrize("api", APIS, ids=lambda a: a.name)
@pytest.mark.parametrize(
    ("call", "sqlstate", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_is_refused_and_nothing_is_written(
    api, world, sql, raises_sql, call, sqlstate, words
):
    before = _state(sql)
    with raises_sql(sqlstate, words):
        call(api, world)
    assert _state(sql) == before
