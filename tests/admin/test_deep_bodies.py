"""The admin renders any stored body: one nested 5,000 deep (stored before the depth limit,
or by the tables' owner, who may UPDATE past it) made the message list, search and detail
pages answer 500 (RecursionError in json.loads and json.dumps) (issue 21)."""

from __future__ import annotations

import pytest

import pgmb
from pgmb.message_limits import MAX_DEPTH

from .conftest import url

pytestmark = pytest.mark.django_db

DEPTH = 5000


@pytest.fixture
def deep(make_queue, sql):
    """A message whose stored body is DEPTH arrays around {"leaf": 1}, and a plain one."""
    make_queue("deep.#")
    mid = pgmb.send("deep.body", 1, headers={"tenant": "eu"})
    plain = pgmb.send("deep.plain", {"shallow": [1, 2]})
    body = "[" * DEPTH + '{"leaf": 1}' + "]" * DEPTH
    # Stored before the limit (0.1.0 checked INSERTs only): an UPDATE is refused now.
    sql("ALTER TABLE pgmb_message DISABLE TRIGGER USER")
    sql("UPDATE pgmb_message SET body = %s::jsonb WHERE id = %s", (body, mid))
    sql("ALTER TABLE pgmb_message ENABLE TRIGGER USER")
    return mid, plain


def test_list_search_and_detail_answer_for_a_deep_body(admin_client, deep):
    mid, plain = deep
    listed = admin_client.get(url("message_changelist"))
    assert listed.status_code == 200
    assert str(mid) in listed.content.decode() and str(plain) in listed.content.decode()
    for term in ("deep", str(mid)):
        found = admin_client.get(url("message_changelist"), {"q": term})
        assert found.status_code == 200 and str(mid) in found.content.decode()
    detail = admin_client.get(url("message_change", mid))
    assert detail.status_code == 200
    html = detail.content.decode()
    assert "nested too deep" in html.lower()
    # Shown as stored, compactly: the leaf and the brackets are all there.
    assert "[" * DEPTH + "{&quot;leaf&quot;: 1}" + "]" * DEPTH in html
    assert "&quot;tenant&quot;: &quot;eu&quot;" in html


def test_a_body_within_the_limit_is_still_indented(admin_client, deep):
    _, plain = deep
    html = admin_client.get(url("message_change", plain)).content.decode()
    assert "&quot;shallow&quot;: [\n    1,\n    2\n  ]" in html
    limit = pgmb.send("deep.limit", _nested(MAX_DEPTH))
    html = admin_client.get(url("message_change", limit)).content.decode()
    assert "nested too deep" not in html.lower() and "\n" + " " * 2 * MAX_DEPTH + "1" in html


def _nested(depth: int) -> list:
    value: list = [1]
    for _ in range(depth - 1):
        value = [value]
    return value
