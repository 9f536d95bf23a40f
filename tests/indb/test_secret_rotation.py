"""Secret rotation on the in-database path, with each transport (PL/Python, pgsql-http),
one request at a time and in runs: during the overlap a receiver holding the old secret and
one holding the new both accept the requests; after the old one expires only the new one's
holder does (docs/decisions/0038-secret-rotation.md)."""

from __future__ import annotations

import base64

import pytest

import pgmb
from pgmb.models import Delivery, Worker
from tests.signatures import receiver_accepts

OLD = "whsec_" + base64.b64encode(b"in-db old secret 0123").decode()
NEW = "whsec_" + base64.b64encode(b"in-db new secret 4567").decode()


@pytest.mark.parametrize("rps", [10, 1000])  # one request at a time; runs (PL/Python)
def test_both_secrets_verify_during_the_overlap_then_only_the_new(
    transport, dispatch_until, recording_server, make_worker, make_queue, pg, rps
):
    worker = make_worker(endpoint=recording_server.url("/in-db"), secret=OLD, rps=rps)
    make_queue("#", worker=worker)
    Worker.objects.filter(pk=worker.pk).update(secret=NEW)  # an UPDATE: the trigger retires OLD

    pgmb.send_batch(pgmb.Outgoing("k", {"n": n}) for n in range(3))
    dispatch_until(lambda: not Delivery.objects.exists(), "the overlap's messages to go")
    pg.execute("UPDATE pgmb_worker_secret SET expires_at = now() - interval '1 second'")
    pgmb.send_batch(pgmb.Outgoing("k", {"n": n}) for n in range(3, 6))
    dispatch_until(lambda: not Delivery.objects.exists(), "the later messages to go")

    verdicts = {
        request.json()["n"]: (
            receiver_accepts(OLD, request.headers, request.body),
            receiver_accepts(NEW, request.headers, request.body),
            len(request.headers["webhook-signature"].split(" ")),
        )
        for request in recording_server.requests
    }
    assert verdicts == {
        **{n: (True, True, 2) for n in range(3)},
        **{n: (False, True, 1) for n in range(3, 6)},
    }
