"""The pull functions twice: as SQL clients call them (schema pgmb) and through
pgmb.pull, both returning the same plain values, so one table of cases runs through both."""

from __future__ import annotations

import json
from typing import Any

from django.db import connection
from psycopg.types.json import Jsonb

from pgmb import pull

#: What a test compares of a read message: (handle, body, read count).
Read = tuple[int, Any, int]


def _rows(statement: str, params: list[Any]) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else []


def _jsonb(value: Any) -> Any:
    return None if value is None else Jsonb(value)


class SqlApi:
    """pgmb.read(...) and friends, as any PostgreSQL client calls them."""

    name = "sql"

    @staticmethod
    def _reads(statement: str, params: list[Any]) -> list[Read]:
        return [
            (row[0], json.loads(row[1]), row[2])
            for row in _rows(f"SELECT delivery_id, body, read_ct FROM {statement}", params)
        ]

    def read(self, queue: str, vt: Any, qty: Any, filter: Any = None) -> list[Read]:
        return self._reads("pgmb.read(%s, %s, %s, %s)", [queue, vt, qty, _jsonb(filter)])

    def read_with_poll(
        self, queue: str, vt: Any, qty: Any, max_poll_seconds: Any, poll_interval_ms: Any = 10
    ) -> list[Read]:
        return self._reads(
            "pgmb.read_with_poll(%s, %s, %s, %s, %s)",
            [queue, vt, qty, max_poll_seconds, poll_interval_ms],
        )

    def pop(self, queue: str, qty: Any) -> list[Read]:
        return self._reads("pgmb.pop(%s, %s)", [queue, qty])

    def set_vt(self, queue: str, ids: list[int], vt: Any) -> list[Read]:
        return self._reads("pgmb.set_vt(%s, %s::bigint[], %s)", [queue, ids, vt])

    def delete(self, queue: str, ids: list[int]) -> list[int]:
        return sorted(r[0] for r in _rows("SELECT pgmb.delete(%s, %s::bigint[])", [queue, ids]))

    def archive(self, queue: str, ids: list[int]) -> list[int]:
        return sorted(r[0] for r in _rows("SELECT pgmb.archive(%s, %s::bigint[])", [queue, ids]))

    def nack(self, queue: str, reads: list[Read], error: str) -> int:
        return _rows(
            "SELECT pgmb.nack(%s, %s::bigint[], %s::integer[], %s::text[])",
            [queue, [r[0] for r in reads], [r[2] for r in reads], [error] * len(reads)],
        )[0][0]

    def purge(self, queue: str) -> int:
        return _rows("SELECT pgmb.purge(%s)", [queue])[0][0]


class PythonApi:
    """pgmb.pull, on the test's Django connection."""

    name = "python"

    @staticmethod
    def _reads(messages: list[pull.Message]) -> list[Read]:
        return [(m.id, m.body, m.read_ct) for m in messages]

    def read(self, queue: str, vt: Any, qty: Any, filter: Any = None) -> list[Read]:
        return self._reads(pull.read(queue, vt, qty, filter))

    def read_with_poll(
        self, queue: str, vt: Any, qty: Any, max_poll_seconds: Any, poll_interval_ms: Any = 10
    ) -> list[Read]:
        return self._reads(pull.read_with_poll(queue, vt, qty, max_poll_seconds, poll_interval_ms))

    def pop(self, queue: str, qty: Any) -> list[Read]:
        return self._reads(pull.pop(queue, qty))

    def set_vt(self, queue: str, ids: list[int], vt: Any) -> list[Read]:
        return self._reads(pull.set_vt(queue, ids, vt))

    def delete(self, queue: str, ids: list[int]) -> list[int]:
        return sorted(pull.delete(queue, ids))

    def archive(self, queue: str, ids: list[int]) -> list[int]:
        return sorted(pull.archive(queue, ids))

    def nack(self, queue: str, reads: list[Read], error: str) -> int:
        messages = [pull.Message(r[0], None, r[2], None, None, r[1], {}, "") for r in reads]
        return pull.nack(queue, messages, error)

    def purge(self, queue: str) -> int:
        return pull.purge(queue)


APIS = (SqlApi(), PythonApi())
