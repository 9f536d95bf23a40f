"""Django's Tasks framework on pgmb: ``TASKS = {"default": {"BACKEND": "pgmb.tasks.PgmbBackend"}}``.

Needs the framework: Django 6's ``django.tasks``, or the ``django-tasks`` backport on
Django 5.2 (``pip install 'django-pgmb[tasks]'``, and ``"django_tasks"`` in INSTALLED_APPS).
"""

from __future__ import annotations

from .backend import PgmbBackend, UnroutedTask
from .scheduling import schedule_task

__all__ = ["PgmbBackend", "UnroutedTask", "schedule_task"]
