from django.apps import AppConfig
from django.db.models.signals import post_migrate


class PgmbConfig(AppConfig):
    name = "pgmb"
    verbose_name = "Message broker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks  # noqa: F401  (registers the system checks)
        from .migrate_report import report

        # Once per migrate run: only this app's signal.
        post_migrate.connect(report, sender=self, dispatch_uid="pgmb.migrate_report")
