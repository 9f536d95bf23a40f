"""``manage.py pgmb_backfill``: give a queue made later the stored messages its binding
matches, published in a window (``pgmb.backfill``)::

    manage.py pgmb_backfill audit --since 7d
    manage.py pgmb_backfill audit --since 2026-11-01T00:00:00Z --until 2026-11-02T00:00:00Z

``--since`` and ``--until`` (default: now) are a duration ago or an ISO-8601 time. At most
``--limit`` deliveries a call (default 10,000), oldest first; a second run adds what the
first left, and then nothing. Bad input (an unknown queue, a window that ends before it
starts) is a one-line error and changes nothing.
"""

from __future__ import annotations

from pgmb import deliveries
from pgmb.management.window_command import WindowCommand


class Command(WindowCommand):
    help = (
        "Give QUEUE the stored messages of a window that its binding matches and that it "
        "never had (published before it was made)."
    )
    action = staticmethod(deliveries.backfill)
    things = ("message", "messages")
    report = "backfilled {n} {things} to queue {queue}"
    since_example = "7d, 2h"
