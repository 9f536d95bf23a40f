"""The admin (the broker's console), /metrics and the endpoints the demo workers POST to."""

from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView
from shop import views

urlpatterns = [
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
    path("admin/", admin.site.urls),
    path("", include("pgmb.urls")),  # /metrics (Prometheus), see the README's Operations
    # Before the generic route: "flaky" is a worker name that always fails.
    path("worker/flaky/", views.flaky, name="worker-flaky"),
    path("worker/<slug:name>/", views.receive, name="worker"),
]
