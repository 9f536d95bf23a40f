"""pgmb: PostgreSQL as a message broker for Django.

The public API, imported lazily so that ``import pgmb`` works before Django is set up::

    import pgmb
    pgmb.send("order.created", {"order_id": 123})
    ids = pgmb.send_batch([("order.created", {"order_id": n}) for n in range(100)])
    pgmb.unrouted(ids)  # those that matched no queue: stored, but nothing delivers them
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

#: The release, as in setup.cfg (tests/docs checks that they agree).
__version__ = "0.2.0.dev0"

if TYPE_CHECKING:
    from .errors import (
        DuplicateMessage,
        InvalidBindingKey,
        InvalidBody,
        InvalidDelay,
        InvalidName,
        InvalidOption,
        InvalidRoutingKey,
        PgmbError,
        UnknownDependency,
    )
    from .publish import Outgoing, send, send_batch, unrouted

__all__ = [
    "DuplicateMessage",
    "InvalidBindingKey",
    "InvalidBody",
    "InvalidDelay",
    "InvalidName",
    "InvalidOption",
    "InvalidRoutingKey",
    "Outgoing",
    "PgmbError",
    "UnknownDependency",
    "send",
    "send_batch",
    "unrouted",
]

_WHERE = {"Outgoing": "publish", "send": "publish", "send_batch": "publish", "unrouted": "publish"}


def __getattr__(name: str) -> Any:
    if name in __all__:
        from importlib import import_module

        value = getattr(import_module(f".{_WHERE.get(name, 'errors')}", __name__), name)
        globals()[name] = value  # later look-ups skip __getattr__ (send is a hot path)
        return value
    raise AttributeError(f"module 'pgmb' has no attribute {name!r}")
