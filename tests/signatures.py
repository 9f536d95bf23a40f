"""The receiver's side of a signed request: what a worker that holds one secret accepts.

Verification is the Standard Webhooks reference library's (PyPI ``standardwebhooks``), as a
receiver would run it, not pgmb's code: it takes a request whose ``webhook-signature`` has
a ``v1,`` signature made with its secret among the space-separated ones, with a timestamp
within five minutes of now.
"""

from __future__ import annotations

from collections.abc import Mapping

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def receiver_accepts(secret: str, headers: Mapping[str, str], body: bytes) -> bool:
    """Whether a receiver holding only ``secret`` accepts a request with these headers and
    body (a raw secret is given to the library as its UTF-8 bytes, as docs/security.md says)."""
    hook = Webhook(secret) if secret.startswith("whsec_") else Webhook(secret.encode())
    try:
        hook.verify(body, dict(headers), json_parse=False)
    except WebhookVerificationError:
        return False
    return True
