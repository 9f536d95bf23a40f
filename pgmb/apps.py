from django.apps import AppConfig


class PgmbConfig(AppConfig):
    name = "pgmb"
    verbose_name = "Message broker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
