"""Expiry through the in-database loop with each transport: the same cases as the external
dispatcher's (tests/expiry.py)."""

from tests.expiry import arrange, check, settled


def test_expired_messages_are_never_posted(
    transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    server = make_recording_server()
    arrange(make_worker, make_queue, server)
    dispatch_until(settled, "every delivery posted or expired")
    check(server)
