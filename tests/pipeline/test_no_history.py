"""A pull queue that keeps no history: its deleted messages left no attempt, and the
archive and stats jobs say so in their reports, naming the queue."""

from __future__ import annotations

import pytest
from django.db import connection

import pgmb
from pgmb import pull
from pgmb.models import Queue
from pgmb.pipeline import no_history

from .history import STRAY_DAYS, id_back, read_archive


def _consume(queue: Queue, n: int) -> list[str]:
    # Ids of a day with no partition: a day not ended yet is not archived whole, and its
    # rows are not archived one by one.
    ids = [
        str(pgmb.send(f"{queue.name}.job", {"n": i}, message_id=id_back(STRAY_DAYS)))
        for i in range(n)
    ]
    assert len(pull.delete(queue.name, pull.read(queue.name, 30, n))) == n
    return ids


def test_the_note_names_the_queues_without_history(db):
    Queue.objects.create(name="kept", binding_key="kept.#")
    with connection.cursor() as cursor:
        assert no_history.queues(cursor.connection) == []
    assert no_history.note("stats", []) is None
    Queue.objects.create(name="bare_b", binding_key="b.#", keep_history=False)
    Queue.objects.create(name="bare_a", binding_key="a.#", keep_history=False)
    with connection.cursor() as cursor:
        names = no_history.queues(cursor.connection)
    assert names == ["bare_a", "bare_b"]
    assert no_history.note("archive", names) == (
        "archive: queues that keep no history: bare_a, bare_b (their deleted messages are "
        "archived without an attempt: none was recorded)"
    )


@pytest.mark.spark
def test_the_jobs_report_what_they_cannot_count(run_pipeline, tmp_path):
    kept = Queue.objects.create(name="kept", binding_key="kept.#")
    bare = Queue.objects.create(name="bare", binding_key="bare.#", keep_history=False)
    _consume(kept, 2)
    bare_ids = _consume(bare, 3)

    stats = run_pipeline("stats", "--hours", "2")
    assert "stats: queues that keep no history: bare (their deleted messages are not " in stats
    assert "stats: 2 attempts in PostgreSQL" in stats

    out = tmp_path / "archive"
    report = run_pipeline("archive", "--output", str(out), "--older-than", "0")
    assert "archive: queues that keep no history: bare (their deleted messages are " in report
    archive = read_archive(out)
    # The bare queue's messages are archived, without any attempt.
    assert set(bare_ids) <= set(archive.messages)
    assert {v[0] for v in archive.attempts.values()}.isdisjoint(bare_ids)
    assert "archived 5 messages and 2 attempts" in report
