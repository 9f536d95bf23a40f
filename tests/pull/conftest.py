"""Pull queues: a queue without a worker, read by clients."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from pgmb.models import Queue

_names = itertools.count(1)


@pytest.fixture
def make_pull_queue(db) -> Callable[..., Queue]:
    def make(binding_key: str = "#", name: str | None = None, **kw) -> Queue:
        return Queue.objects.create(
            name=name or f"pull_{next(_names)}", binding_key=binding_key, worker=None, **kw
        )

    return make


# The admin's tests of pull queues count queries like the admin's own.
from tests.admin.conftest import count_queries  # noqa: E402, F401
