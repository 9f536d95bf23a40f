"""The garbage collector's settings for a process that runs dispatchers.

A dispatcher process holds a large, settled heap (Django, psycopg: some 77,000
tracked objects) and, while it delivers, a few thousand objects of its requests in flight.
With CPython's defaults, a young-generation collection ran every 16 deliveries, each
traversing the requests in flight (all alive), and every tenth of those promoted them on,
until a full collection traversed the whole heap: together about a fifth of the process's
time per delivery (docs/benchmarks.md).
"""

from __future__ import annotations

import gc

#: Allocations (net of deallocations) between young-generation collections: above what
#: the requests in flight hold at once, so that collections find garbage rather than
#: live requests. (CPython's default is 700.)
YOUNG_THRESHOLD = 10_000


def settle() -> int:
    """Collect once, then leave what the process holds after start-up out of every later
    collection (``gc.freeze``), and collect the young generation less often; the number
    of objects frozen.

    Meant for a process's entry point, once everything is imported and set up: the
    settings are the whole process's.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
    return gc.get_freeze_count()
