"""PGMB["DIRECT_DATABASES"]: each pooled alias mapped to an alias of the same database
that connects directly; a mapping that cannot be is refused by the system checks."""

import pytest
from django.test import override_settings

from pgmb import conf
from pgmb.checks import check_settings
from pgmb.db.conninfo import conninfo_from_django, direct_conninfo


@pytest.mark.parametrize(
    ("mapping", "text"),
    [
        ({"default": "nope"}, "PGMB['DIRECT_DATABASES']['default']: 'nope' is not in"),
        ({"nope": "second"}, "PGMB['DIRECT_DATABASES']['nope']: 'nope' is not in"),
        ({"default": "default"}, "names the same alias"),
        ({"default": 5}, "must map a database alias to a database alias"),
        (["default"], "PGMB['DIRECT_DATABASES'] must be dict"),
    ],
)
def test_a_direct_alias_that_cannot_be_is_refused(mapping, text):
    with override_settings(PGMB={"DIRECT_DATABASES": mapping}):
        problems = check_settings()
        assert [p.id for p in problems] == ["pgmb.E001"]
        assert text in problems[0].msg
        with pytest.raises(Exception, match=text.replace("[", r"\[").replace("]", r"\]")):
            conf.get()


def test_the_direct_alias_is_the_one_mapped():
    assert direct_conninfo("default") is None  # none by default
    with override_settings(PGMB={"DIRECT_DATABASES": {"default": "second"}}):
        assert direct_conninfo("default") == conninfo_from_django("second")
        assert direct_conninfo("second") is None
