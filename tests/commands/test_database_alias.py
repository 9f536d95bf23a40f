"""Every management command that takes ``--database`` refuses an alias settings.DATABASES
lacks, before it connects or writes anything (pgmb.cli_args.database_alias)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from pgmb.models import Message


@pytest.mark.parametrize(
    "argv",
    [
        ("pgmb_history", "premake"),
        ("pgmb_history", "retire", "--older-than", "30"),
        ("pgmb_housekeeping",),
        ("pgmb_requeue", "orders", "--all"),
        ("pgmb_send", "order.created", '{"n": 1}'),
        ("pgmb_stats",),
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
@pytest.mark.django_db
def test_an_unknown_database_alias_is_refused(argv):
    with pytest.raises(CommandError, match=r"--database 'nope' is not in settings\.DATABASES"):
        call_command(*argv, "--database", "nope")
    assert not Message.objects.exists()
