"""Expiry through the external dispatcher: a delivery whose time to live ran out before it
was posted is never posted (tests/expiry.py holds the cases)."""

from tests.expiry import arrange, check, settled


def test_expired_messages_are_never_posted(
    dispatch, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    arrange(make_worker, make_queue, server)
    dispatch()
    assert settled()
    check(server)
