"""Answers that stop retries, through the external dispatcher: a worker's dead_statuses and
its abort header dead-letter at once, everything else is retried (tests/final_answers.py)."""

from tests.final_answers import arrange, check, settled


def test_answers_that_stop_retries(dispatch, make_recording_server, make_worker, make_queue):
    servers = arrange(make_recording_server, make_worker, make_queue)
    dispatch()
    assert settled()
    check(servers)
