"""What a worker receives: a JSON POST with pgmb's headers, signed when it has a secret.

Signing follows Standard Webhooks (https://www.standardwebhooks.com/), so receivers can
verify with existing libraries: ``webhook-id``, ``webhook-timestamp`` and
``webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">``, one such
signature per signing secret, space-separated, the worker's current secret first. More
than one while a replaced secret is retiring (rotation): a receiver holding either the
old or the new secret verifies. Which secrets sign is ``pgmb.signing_secrets()`` in SQL,
whose answer the claim hands over (docs/decisions/0038-secret-rotation.md).

The secret rule (here and in ``pgmb.secret_problem``/``pgmb.secret_key`` in SQL, which the
worker trigger and ``pgmb.request_headers`` use). A worker's secret is one of:

* empty: requests are not signed;
* ``whsec_`` then standard-alphabet base64 (``A-Za-z0-9+/``) with zero to two ``=`` of
  padding, whose data part (without the ``=``) has a length that is not 1 more than a
  multiple of 4 and decodes to at least one byte. Its key is those bytes, decoded as the
  Standard Webhooks libraries do (``b64decode(data + "==")``): padding is added as needed,
  so padded and unpadded secrets give the same key;
* any other non-empty text without control characters (U+0000-U+001F, U+007F-U+009F):
  a raw secret, whose key is its UTF-8 bytes (receivers give the libraries these bytes).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

#: Headers a message may not set (publish refuses them, delivery drops them from rows stored
#: before the rule): HTTP's framing and encoding, what a receiver or a proxy in front of it
#: or its framework trusts (credentials, the client's address, the proxies passed, the method
#: or URL to act on instead), and what pgmb sets on every request. The same list
#: as pgmb.reserved_header() in SQL (tests/rules checks both with one table of cases).
RESERVED = frozenset(
    {
        "host",
        "content-type",
        "content-length",
        "content-encoding",
        "connection",
        "transfer-encoding",
        "expect",
        "upgrade",
        "te",
        "trailer",
        "keep-alive",
        "proxy-connection",
        "user-agent",
        "authorization",
        "proxy-authorization",
        "cookie",
        "forwarded",
        "x-forwarded",
        "via",
        "x-real-ip",
        "true-client-ip",
        "x-client-ip",
        "cf-connecting-ip",
        "x-http-method-override",
        "x-http-method",
        "x-method-override",
        "x-original-url",
        "x-rewrite-url",
    }
)
#: Prefixes of reserved names: pgmb's own headers, the signature's, and the proxies'.
RESERVED_PREFIXES = ("pgmb-", "webhook-", "x-forwarded-")


def reserved_header(name: str) -> bool:
    """Whether a message may not set header ``name`` (any case)."""
    lower = name.lower()
    return lower in RESERVED or lower.startswith(RESERVED_PREFIXES)


_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}")
#: Header values are sent only if they are printable ASCII (no CR/LF injection, no
#: encoding guesswork); the same rule as pgmb.request_headers() in SQL.
_PRINTABLE_ASCII = re.compile(r"[\x20-\x7e]*")


#: What the ``pgmb-routing-key`` header keeps as it is of a routing key: printable ASCII but
#: ``%``. A routing key may hold any Unicode letter (AMQP's keys are UTF-8); every other
#: character is sent as the percent-encoded bytes of its UTF-8 (RFC 3986, section 2.1,
#: upper-case hex), so the header is ASCII on every path and a worker gets the key back with
#: any URL-unquote (``urllib.parse.unquote``, ``decodeURIComponent``): ``c.zoé`` is sent as
#: ``c.zo%C3%A9``, ``100%`` as ``100%25``. The same rule as ``pgmb.routing_key_header()`` in
#: SQL (tests/rules/test_routing_key_header.py runs one table of cases through both).
ROUTING_KEY_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if c != 0x25)
_KEPT_AS_IS = re.compile(r"[\x21-\x24\x26-\x7e]*")


def routing_key_header(routing_key: str) -> str:
    """The value of the ``pgmb-routing-key`` header of ``routing_key`` (see above)."""
    if _KEPT_AS_IS.fullmatch(routing_key):  # most keys: no copy, no encoding
        return routing_key
    return quote(routing_key, safe=ROUTING_KEY_HEADER_SAFE)


#: A ``whsec_`` secret; the group is the base64 data. The same regex text as in SQL.
WHSEC_PATTERN = r"^whsec_([A-Za-z0-9+/]*)={0,2}$"
#: Control characters, which a raw secret may not hold. The same regex text as in SQL.
SECRET_CONTROL = r"[\u0000-\u001f\u007f-\u009f]"  # noqa: S105 (a regex)
_WHSEC = re.compile(WHSEC_PATTERN)
_SECRET_CONTROL = re.compile(SECRET_CONTROL)


def secret_problem(secret: str) -> str | None:
    """What breaks the secret rule (see the module's docstring), or None if ``secret`` is fine.

    The sentences are those of ``pgmb.secret_problem()`` in SQL; they never quote the secret.
    """
    if secret == "":
        return None
    if secret.startswith("whsec_"):
        match = _WHSEC.fullmatch(secret)
        if match is None:
            return (
                "after 'whsec_' comes standard base64 (A-Z, a-z, 0-9, + and /) "
                "with at most two '=' at the end"
            )
        if len(match[1]) % 4 == 1:
            return "the base64 after 'whsec_' is cut short (4n+1 characters encode no bytes)"
        if not match[1]:
            return "'whsec_' must be followed by the base64 of at least one byte"
        return None
    if _SECRET_CONTROL.search(secret):
        return "a secret may not contain control characters"
    return None


def secret_key(secret: str) -> bytes:
    """The HMAC key of a worker secret; ``ValueError`` if the secret breaks the rule."""
    problem = secret_problem(secret)
    if problem is not None:
        raise ValueError(f"invalid worker secret: {problem}")
    if secret.startswith("whsec_"):
        data = secret[len("whsec_") :].rstrip("=")
        return base64.b64decode(data + "=" * (-len(data) % 4), validate=True)
    return secret.encode()


def signature(secret: str, message_id: str, timestamp: int, body: bytes) -> str:
    """One secret's ``v1,`` signature of one request."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(secret_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signatures(secrets: Sequence[str], message_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: each secret's signature, in order, space-separated."""
    return " ".join(signature(s, message_id, timestamp, body) for s in secrets)


def message_headers(headers: Mapping[str, Any] | None) -> dict[str, str]:
    """The message's own headers as HTTP headers; unusable or reserved ones are dropped."""
    out: dict[str, str] = {}
    for name, value in (headers or {}).items():
        if reserved_header(str(name)) or not _TOKEN.fullmatch(name):
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
    secrets: Sequence[str],
    timestamp: int,
) -> dict[str, str]:
    """Every header of the POST for one delivery attempt; ``secrets`` are those that sign
    (``pgmb.signing_secrets()``, current first), none for an unsigned request."""
    out = message_headers(headers)
    out.update(
        {
            "Content-Type": "application/json",
            "pgmb-message-id": message_id,
            "pgmb-routing-key": routing_key_header(routing_key),
            "pgmb-queue": queue,
            "pgmb-attempt": str(attempt),
        }
    )
    if secrets:
        out["webhook-id"] = message_id
        out["webhook-timestamp"] = str(timestamp)
        out["webhook-signature"] = signatures(secrets, message_id, timestamp, body)
    return out
