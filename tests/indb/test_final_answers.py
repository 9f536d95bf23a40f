"""Answers that stop retries, through the in-database loop with each transport (the http
extension's stand-in and PL/Python): the same cases as the external dispatcher's
(tests/final_answers.py)."""

from tests.final_answers import arrange, check, settled


def test_answers_that_stop_retries(
    transport, dispatch_until, make_recording_server, make_worker, make_queue
):
    servers = arrange(make_recording_server, make_worker, make_queue)
    dispatch_until(settled, "every case dead-lettered")
    check(servers)
