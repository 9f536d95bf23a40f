"""The dispatcher process's garbage-collector settings: what start-up left is frozen, young
collections are rarer, and garbage made afterwards is still collected without being asked.

Each case runs in a fresh interpreter: the settings are the whole process's.
"""

import json
import subprocess
import sys

from pgmb.dispatch.gc_tuning import YOUNG_THRESHOLD
from tests.dispatch.test_databases import _command

PROBE = """
import gc, json, weakref
from pgmb.dispatch import gc_tuning

before = gc.get_threshold()
gc_tuning.settle()
settled = {"threshold": gc.get_threshold(), "before": before, "frozen": gc.get_freeze_count()}

class Node:
    pass

# Garbage that only the collector can free (each node is in a cycle), well past the young
# threshold: it must go without an explicit gc.collect().
watched = []
for _ in range(5 * gc_tuning.YOUNG_THRESHOLD):
    node = Node()
    node.self = node
    if len(watched) < 100:
        watched.append(weakref.ref(node))
    del node
settled["alive"] = sum(ref() is not None for ref in watched)
print(json.dumps(settled))
"""


def _probe() -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out)


def test_settle_freezes_start_up_and_keeps_collecting_garbage():
    settled = _probe()
    assert settled["frozen"] > 1000  # at least the imported modules' objects
    assert settled["threshold"][0] == YOUNG_THRESHOLD > settled["before"][0]
    assert settled["threshold"][1:] == settled["before"][1:]
    assert settled["alive"] == 0


def test_the_dispatch_command_settles_the_heap(transactional_db):
    # The command is the one place that calls it: a library embedding Dispatcher keeps its
    # own process's settings.
    result = _command("--until-idle", "-v", "2")
    assert result.returncode == 0, result.stderr
    assert f"objects frozen, young collections every {YOUNG_THRESHOLD} allocations" in (
        result.stderr
    )
