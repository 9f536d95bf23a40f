"""What a worker receives: a JSON POST with pgmb's headers, signed when it has a secret.

Signing follows Standard Webhooks (https://www.standardwebhooks.com/), so receivers can
verify with existing libraries: ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``. A secret written
``whsec_<base64>`` is used base64-decoded, as those libraries expect; any other secret
is used as its UTF-8 bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from typing import Any

#: Headers a message may not set: they belong to HTTP, to pgmb or to the signature.
RESERVED = frozenset(
    {
        "host",
        "content-type",
        "content-length",
        "connection",
        "transfer-encoding",
        "expect",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        "proxy-connection",
    }
)
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
#: Header values are sent only if they are printable ASCII (no CR/LF injection, no
#: encoding guesswork); the same rule as pgmb.request_headers() in SQL.
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")


def secret_key(secret: str) -> bytes:
    if secret.startswith("whsec_"):
        return base64.b64decode(secret[len("whsec_") :])
    return secret.encode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value for one request."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def message_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """The message's own headers as HTTP headers; unusable or reserved ones are dropped."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        lower = str(name).lower()
        if (
            lower in RESERVED
            or lower.startswith(("pgmb-", "webhook-"))
            or not _TOKEN.fullmatch(name)
        ):
            continue
        # json.dumps spaces JSON as PostgreSQL prints jsonb: both dispatch paths send the same.
        text = value if isinstance(value, str) else json.dumps(value)
        if _PRINTABLE_ASCII.fullmatch(text):
            out[name] = text
    return out


def build_headers(
    *,
    message_id: str,
    routing_key: str,
    queue: str,
    attempt: int,
    headers: Mapping[str, Any] | None,
    body: bytes,
    secret: str,
    timestamp: int,
) -> dict[str, str]:
    """Every header of the POST for one delivery attempt."""
    out = message_headers(headers)
    out.update(
        {
            "Content-Type": "application/json",
            "pgmb-message-id": message_id,
            "pgmb-routing-key": routing_key,
            "pgmb-queue": queue,
            "pgmb-attempt": str(attempt),
        }
    )
    if secret:
        out["webhook-id"] = message_id
        out["webhook-timestamp"] = str(timestamp)
        out["webhook-signature"] = signature(secret, message_id, timestamp, body)
    return out
