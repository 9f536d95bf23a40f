"""Handlers for the pgmb_consume tests (run in the command's process): each appends what
it got, one JSON line per call, to the file named by $PGMB_CONSUME_OUT."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from pgmb.pull import Message


def _write(record: object) -> None:
    with open(os.environ["PGMB_CONSUME_OUT"], "a") as out:
        out.write(json.dumps(record) + "\n")


def record(message: Message) -> None:
    """One message; a body with "fail" raises."""
    _write({"id": message.id, "body": message.body, "read_ct": message.read_ct})
    if isinstance(message.body, dict) and message.body.get("fail"):
        raise ValueError(f"refused {message.body['n']}")


def record_batch(messages: list[Message]) -> None:
    """A list of messages; fails the whole batch if any body has "fail"."""
    _write([m.body for m in messages])
    if any(isinstance(m.body, dict) and m.body.get("fail") for m in messages):
        raise RuntimeError("a bad batch")


def held(message: Message) -> None:
    """Records the message, then returns only once $PGMB_CONSUME_GATE exists."""
    _write({"id": message.id, "body": message.body, "read_ct": message.read_ct})
    while not Path(os.environ["PGMB_CONSUME_GATE"]).exists():
        time.sleep(0.01)


NOT_CALLABLE = 42
