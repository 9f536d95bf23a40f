"""The metrics endpoint (``/metrics`` of :mod:`pgmb.urls`), for Prometheus and the like.

Allowed for a logged-in staff user with the permission ``pgmb.view_dashboard`` (the
dashboard's), or for a request carrying ``Authorization: Bearer <PGMB["METRICS_TOKEN"]>``
when that setting is not empty. Anything else gets 401 (no credentials, or a wrong token) or
403 (logged in, but not staff with that permission).
"""

from __future__ import annotations

import hmac

from django.http import HttpRequest, HttpResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import conf, metrics

#: The permission a logged-in user needs, the dashboard's: the same figures.
PERMISSION = "pgmb.view_dashboard"


def _bearer(request: HttpRequest) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else None


def _unauthorized(reason: str) -> HttpResponse:
    response = HttpResponse(reason + "\n", status=401, content_type="text/plain")
    response["WWW-Authenticate"] = 'Bearer realm="pgmb metrics"'
    return response


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    token = conf.get().METRICS_TOKEN
    offered = _bearer(request)
    if offered is not None:
        if not token or not hmac.compare_digest(offered.encode(), token.encode()):
            return _unauthorized("invalid bearer token")
    else:
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated:
            return _unauthorized("authentication required")
        if not (user.is_staff and user.has_perm(PERMISSION)):
            return HttpResponse(
                f"staff with the permission {PERMISSION} only\n",
                status=403,
                content_type="text/plain",
            )
    body = metrics.render(metrics.collect())
    return HttpResponse(body, content_type=metrics.CONTENT_TYPE)
