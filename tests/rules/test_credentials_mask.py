"""One masking, two sides: :func:`pgmb.endpoint_masking.mask_credentials` (the admin, the
dispatcher's errors and logs) and ``pgmb.mask_credentials`` (the view ``pgmb.workers``)
show every endpoint alike, one table of cases run through both."""

from __future__ import annotations

import pytest
from django.db import connection

from pgmb.endpoint_masking import mask_credentials
from pgmb.models import validate_endpoint

pytestmark = pytest.mark.django_db

#: Endpoints (each one the endpoint rule accepts) and how both sides show them.
MASKED = [
    ("https://u:p@h:8443/a?b=1#f", "https://***:***@h:8443/a?b=1#f"),
    ("http://token@h/", "http://***@h/"),
    ("http://u:@h/", "http://***:***@h/"),
    ("http://:p@h/", "http://***:***@h/"),
    ("http://u:p@[::1]:8000/x", "http://***:***@[::1]:8000/x"),
    ("https://u:p%40x@h/", "https://***:***@h/"),
    ("http://a@b@h/", "http://***@h/"),  # the last "@" ends them, as urllib reads it
    ("http://a:b@c:d@h/", "http://***:***@h/"),
    ("HTTPS://U:P@H/in", "https://***:***@H/in"),  # the scheme in lower case
    ("http://u:p@h?q=a@b", "http://***:***@h?q=a@b"),
    ("http://u:p@h#x@y", "http://***:***@h#x@y"),
    ("http://u:p@ドメイン.example/パス", "http://***:***@ドメイン.example/パス"),
    ("http://h:8000/a@b", "http://h:8000/a@b"),  # an "@" in the path is no credential
    ("http://h/?to=a@b.c", "http://h/?to=a@b.c"),
    ("http://h#a@b", "http://h#a@b"),
    ("http://127.0.0.1:9/", "http://127.0.0.1:9/"),
    ("HTTP://H/", "HTTP://H/"),  # nothing to mask: as it is
]


@pytest.mark.parametrize(("endpoint", "shown"), MASKED)
def test_python_and_sql_mask_alike(endpoint, shown):
    validate_endpoint(endpoint)  # a worker could have it
    with connection.cursor() as cursor:
        cursor.execute("SELECT pgmb.mask_credentials(%s)", [endpoint])
        ((in_sql,),) = cursor.fetchall()
    assert (mask_credentials(endpoint), in_sql) == (shown, shown)


def test_the_workers_view_shows_the_endpoint_masked(make_worker):
    make_worker("hooked", "https://hookuser:hookpass42@orders.example.com/in")

    with connection.cursor() as cursor:
        cursor.execute("SELECT name, endpoint FROM pgmb.workers")
        rows = cursor.fetchall()

    assert rows == [("hooked", "https://***:***@orders.example.com/in")]
