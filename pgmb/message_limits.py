"""What a message's body and headers may be: bounded, and free of names the worker trusts.

The rule, the same as ``pgmb.message_problem()`` in SQL (pgmb/sql/schema/publish.sql),
which the routing trigger runs on every row written to ``pgmb_message`` by any producer
(``pgmb.send``, a plain INSERT, COPY); tests/rules checks both sides against one table of
cases (docs/decisions/0031-message-size-limits.md):

* the body, and the headers, nest containers (objects, arrays) at most :data:`MAX_DEPTH`
  deep (the value itself is 1);
* at most :data:`MAX_HEADERS` headers, each name and value together at most
  :data:`MAX_HEADER_BYTES` bytes of UTF-8 (a value that is not a string counts as its JSON
  text), all of them together at most :data:`MAX_HEADERS_BYTES`;
* no header named in :data:`pgmb.worker_request.RESERVED` or starting with one of
  :data:`pgmb.worker_request.RESERVED_PREFIXES`, whatever its case: HTTP's framing, the
  credentials and proxy headers a receiver trusts, and what pgmb sets itself
  (docs/decisions/0030-reserved-message-headers.md).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from .worker_request import reserved_header

#: Containers inside containers, the value itself being 1: deeper values crash renderers
#: and parsers that recurse (Python's json, Django's admin) long before PostgreSQL's limit.
MAX_DEPTH = 64
MAX_HEADERS = 64
MAX_HEADER_BYTES = 8 * 1024
MAX_HEADERS_BYTES = 32 * 1024


def body_problem(body: Any, what: str = "the body") -> str | None:
    """Why ``body`` nests too deep, or None. Iterative: a deep body cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, Mapping):
            children: Any = value.values()
        elif isinstance(value, (list, tuple)):
            children = value
        else:
            continue
        if depth > MAX_DEPTH:
            return f"{what}: nested deeper than {MAX_DEPTH} levels (limit max_depth)"
        stack.extend((child, depth + 1) for child in children)
    return None


def header_text(value: Any) -> str:
    """A header's value as sent: a string as is, anything else as its JSON text."""
    return value if isinstance(value, str) else json.dumps(value)


def headers_problem(headers: Mapping[str, Any]) -> str | None:
    """Why a message may not carry ``headers``, or None. The same verdicts as SQL, in its words."""
    if len(headers) > MAX_HEADERS:
        return f"{len(headers)} headers, at most {MAX_HEADERS} (limit max_headers)"
    # A header's value may be JSON too: its depth is held as the body's (the dispatcher and
    # the admin turn it into text).
    deep = body_problem(headers, "the headers")
    if deep is not None:
        return deep
    total = 0
    for name, value in headers.items():
        if reserved_header(str(name)):
            return f"header {str(name)!r} is reserved: the broker or the worker sets it"
        size = len(str(name).encode()) + len(header_text(value).encode())
        if size > MAX_HEADER_BYTES:
            return (
                f"header {str(name)[:64]!r} has {size} bytes, at most {MAX_HEADER_BYTES} "
                "(limit max_header_bytes)"
            )
        total += size
    if total > MAX_HEADERS_BYTES:
        return (
            f"the headers have {total} bytes, at most {MAX_HEADERS_BYTES} (limit max_headers_bytes)"
        )
    return None
