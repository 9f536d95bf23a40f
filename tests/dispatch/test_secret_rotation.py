"""Secret rotation on the external dispatcher: during the overlap a receiver holding the
old secret and one holding the new both accept the requests; once the old one has expired
(or is revoked) only the new one's holder does (docs/decisions/0038-secret-rotation.md)."""

from __future__ import annotations

import base64

import pgmb
from pgmb.models import WorkerSecret
from tests.signatures import receiver_accepts

OLD = "whsec_" + base64.b64encode(b"the old secret, 24 bytes").decode()
NEW = "whsec_" + base64.b64encode(b"the new secret, 24 bytes").decode()
RAW = "a raw secret, 16+ bytes"


def _received(request) -> dict[str, bool]:
    return {
        name: receiver_accepts(secret, request.headers, request.body)
        for name, secret in (("old", OLD), ("new", NEW), ("raw", RAW))
    }


def test_both_secrets_verify_during_the_overlap_then_only_the_new(
    dispatch, recording_server, make_worker, make_queue, sql
):
    worker = make_worker(endpoint=recording_server.url(), secret=OLD)
    make_queue("#", worker=worker)
    worker.secret = NEW
    worker.save()  # the ORM's write; the trigger retires OLD (every writer: tests/sql)

    pgmb.send("k", 1)
    dispatch()
    [during] = recording_server.requests
    assert _received(during) == {"old": True, "new": True, "raw": False}
    assert len(during.headers["webhook-signature"].split(" ")) == 2

    # Expired: it no longer signs, even before housekeeping removes its row.
    sql("UPDATE pgmb_worker_secret SET expires_at = now() - interval '1 second'")
    pgmb.send("k", 2)
    dispatch()
    after = recording_server.requests[1]
    assert _received(after) == {"old": False, "new": True, "raw": False}
    assert len(after.headers["webhook-signature"].split(" ")) == 1
    assert WorkerSecret.objects.count() == 1


def test_a_revoked_secret_stops_signing_at_once(
    dispatch, recording_server, make_worker, make_queue, sql
):
    worker = make_worker(endpoint=recording_server.url(), secret=RAW)
    make_queue("#", worker=worker)
    sql("UPDATE pgmb_worker SET secret = %s WHERE id = %s", (NEW, worker.pk))  # plain SQL
    pgmb.send("k", 1)
    dispatch()
    sql("DELETE FROM pgmb_worker_secret")  # revoked
    pgmb.send("k", 2)
    dispatch()
    first, second = recording_server.requests
    assert _received(first) == {"old": False, "new": True, "raw": True}
    assert _received(second) == {"old": False, "new": True, "raw": False}
