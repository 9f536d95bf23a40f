"""The loop through the http extension keeps its connection between requests: it turns
``http.keepalive`` on in its session and puts it back as found when it ends (that one
connection carries every request: test_indb_dispatch.py's kept connections). A kept
connection the server closes between two requests costs a reconnect, never a delivery
(docs/decisions/0075-the-http-extensions-path-kept-alive.md)."""

from __future__ import annotations

import json

import pytest

import pgmb
from pgmb.models import Attempt, Delivery
from tests.closinghttp import ClosingServer

pytestmark = pytest.mark.parametrize("transport", ["http"], indirect=True)


@pytest.mark.parametrize("was", [None, "off", "on"])
def test_the_loop_puts_the_sessions_keepalive_back(transport, pg, dispatch_loop, was):
    if was is not None:
        pg.execute("SELECT set_config('http.keepalive', %s, false)", (was,))
    dispatch_loop(0.2)
    (now,) = pg.execute("SELECT current_setting('http.keepalive', true)").fetchone()
    # Unset before: RESET (pgsql-http keeps connections whenever the setting has a value).
    assert (now or None) == was


@pytest.mark.parametrize("mode", ["idle", "next"])
def test_a_kept_connection_the_server_closes_costs_a_reconnect_not_a_delivery(
    transport, dispatch_until, make_worker, make_queue, mode
):
    # "idle": closed right after each answer; "next": closed as the next request arrives,
    # unread (the client sees a reset on the kept connection and sends it again on a new one).
    with ClosingServer(mode) as closing:
        make_queue("#", worker=make_worker(endpoint=closing.url()))
        pgmb.send_batch(("k", n) for n in range(5))
        dispatch_until(lambda: not Delivery.objects.exists(), "deliveries are left")
        handled = closing.handled
    # Each posted once, on a connection of its own, and acked at the first attempt.
    assert sorted(json.loads(h.body) for h in handled) == list(range(5))
    assert len({h.client_port for h in handled}) == 5
    assert sorted(Attempt.objects.values_list("outcome", "attempt")) == [("ack", 1)] * 5
