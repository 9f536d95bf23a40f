"""The example project's apps, installed for the tests of this folder only.

``example_project`` goes on ``sys.path``; the ``shop`` fixture adds the app to
INSTALLED_APPS, points the URLconf at the example's, and creates the shop's tables inside
the test's transaction (PostgreSQL DDL is transactional, so they vanish with it).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib import admin
from django.db import connection
from django.test.utils import override_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "example_project"
if str(EXAMPLE) not in sys.path:
    sys.path.append(str(EXAMPLE))


def _forget_shop_admin() -> None:
    # The admin site outlives the override: a registered model of an app that is no longer
    # installed would break the admin index of later tests.
    for model in [m for m in admin.site._registry if m._meta.app_label == "shop"]:
        admin.site.unregister(model)


@pytest.fixture
def shop(db):
    """The shop app, installed, with its tables; yields the ``shop.models`` module."""
    with override_settings(
        INSTALLED_APPS=[*settings.INSTALLED_APPS, "shop"], ROOT_URLCONF="example.urls"
    ):
        import shop.admin
        from shop import models

        if models.Order not in admin.site._registry:
            importlib.reload(shop.admin)  # unregistered by an earlier test
        with connection.schema_editor() as editor:
            editor.create_model(models.Order)
            editor.create_model(models.Received)
        try:
            yield models
        finally:
            _forget_shop_admin()
