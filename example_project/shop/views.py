"""Endpoints for the demo workers: they record what pgmb POSTs to them.

A worker receives the message body as JSON, and headers naming the message id (stable
across retries, for de-duplication), the routing key, the queue and the attempt.
"""

from __future__ import annotations

import json
import uuid

from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .models import Received

#: The request headers worth keeping (lower-case prefixes).
KEPT_HEADERS = ("pgmb-", "webhook-", "content-type", "user-agent")


def _uuid(value: str | None) -> uuid.UUID | None:
    try:
        return uuid.UUID(value) if value else None
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def _record(request: HttpRequest, endpoint: str, body: object, status: int) -> Received:
    headers = request.headers
    return Received.objects.create(
        endpoint=endpoint,
        status=status,
        # Standard Webhooks' webhook-id carries the same id when the worker signs requests.
        message_id=_uuid(headers.get("pgmb-message-id") or headers.get("webhook-id")),
        routing_key=headers.get("pgmb-routing-key", "")[:255],
        queue=headers.get("pgmb-queue", "")[:48],
        attempt=_int(headers.get("pgmb-attempt")),
        body=body,
        headers={k.lower(): v for k, v in headers.items() if k.lower().startswith(KEPT_HEADERS)},
    )


def _json_body(request: HttpRequest) -> tuple[bool, object]:
    try:
        return True, json.loads(request.body or b"null")
    except ValueError:
        return False, None


@csrf_exempt
@require_POST
def receive(request: HttpRequest, name: str) -> JsonResponse:
    """A healthy worker: records the message and answers 200 (the broker acks)."""
    ok, body = _json_body(request)
    if not ok:
        # 4xx counts as a failure for the broker; pgmb only ever sends JSON.
        return JsonResponse({"error": "the body is not JSON"}, status=400)
    received = _record(request, name, body, 200)
    return JsonResponse({"received": received.pk})


@csrf_exempt
@require_POST
def flaky(request: HttpRequest) -> JsonResponse:
    """A broken worker: records the attempt and answers 500, so the broker retries and,
    once the queue's retries are used up, dead-letters the message."""
    _, body = _json_body(request)
    _record(request, "flaky", body, 500)
    return JsonResponse({"error": "flaky by design"}, status=500)
