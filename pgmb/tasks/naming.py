"""How a Tasks queue maps onto pgmb: its routing key and the pgmb queue that runs it.

A task enqueued on queue ``emails`` is a message with routing key ``tasks.emails``, run
from the pgmb queue ``tasks_emails`` (bound to exactly that key). Both must be valid pgmb
names, hence the rule on Tasks queue names below.
"""

from __future__ import annotations

import re

#: The first word of every task message's routing key.
ROUTING_PREFIX = "tasks"
#: Lower-case letters, digits and ``_``, so that ``tasks_<name>`` is a pgmb queue name
#: (at most 48 characters) and ``tasks.<name>`` a routing key of two words.
QUEUE_NAME_RE = re.compile(r"[a-z0-9_]{1,42}")


def queue_name_problem(name: object) -> str | None:
    """What is wrong with a Tasks queue name for pgmb, or None."""
    if isinstance(name, str) and QUEUE_NAME_RE.fullmatch(name):
        return None
    return (
        f"Tasks queue name {name!r} cannot be used with pgmb: use 1-42 lower-case letters, "
        "digits or '_' (it becomes the routing key 'tasks.<name>' and the pgmb queue "
        "'tasks_<name>')"
    )


def routing_key(queue_name: str) -> str:
    """The routing key of the messages of a Tasks queue."""
    return f"{ROUTING_PREFIX}.{queue_name}"


def pgmb_queue(queue_name: str) -> str:
    """The name of the pgmb queue that runs the tasks of a Tasks queue."""
    return f"{ROUTING_PREFIX}_{queue_name}"
