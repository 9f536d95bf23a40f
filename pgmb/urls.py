"""pgmb's URLs: ``path("pgmb/", include("pgmb.urls"))`` serves ``pgmb/metrics``."""

from django.urls import path

from .views import metrics_view

app_name = "pgmb"
urlpatterns = [path("metrics", metrics_view, name="metrics")]
