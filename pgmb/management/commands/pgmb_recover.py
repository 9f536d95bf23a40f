"""``manage.py pgmb_recover``: requeue the dead letters of a queue that died in a window
(``pgmb.recover``)::

    manage.py pgmb_recover orders --since 2h
    manage.py pgmb_recover orders --since 2026-11-29T08:00:00Z --until 2026-11-29T09:00:00Z

``--since`` and ``--until`` (default: now) are a duration ago or an ISO-8601 time. At most
``--limit`` a call (default 10,000), oldest first; a dead letter requeued is no longer
one, so a second run requeues nothing more. Bad input is a one-line error and changes
nothing. ``pgmb_requeue`` requeues dead letters by id, or all of a queue's.
"""

from __future__ import annotations

from pgmb import deliveries
from pgmb.management.window_command import WindowCommand


class Command(WindowCommand):
    help = "Requeue the dead letters of QUEUE that died in a window."
    action = staticmethod(deliveries.recover)
    things = ("dead letter", "dead letters")
    report = "recovered {n} {things} of queue {queue}"
    since_example = "2h, 1d"
