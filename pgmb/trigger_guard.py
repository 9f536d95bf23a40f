"""A pgtrigger trigger whose ``pgtrigger.ignore()`` check costs a publish next to nothing.

pgtrigger starts every trigger function with ``_pgtrigger_should_ignore(TG_NAME)``, which
reads the setting ``pgtrigger.ignore`` inside a block with an exception handler: a
subtransaction entered, and while nothing is ignored (the setting does not exist) an error
raised and caught, at every call. For the routing trigger, which runs once per publishing
statement, that was a tenth of the server's time for a one-message ``pgmb.send``
(docs/decisions/0073-publishing-write-path.md). The guard below reads the setting without
an error first: while it is unset or empty, as it is outside ``pgtrigger.ignore()``, the
function is not called; otherwise pgtrigger's own function decides, as before.
"""

from __future__ import annotations

from typing import Any

import pgtrigger
from django.db import models
from pgtrigger import compiler

#: The check pgtrigger's template opens each trigger function with.
PGTRIGGER_CHECK = "IF ({ignore_func_name}(TG_NAME) IS TRUE) THEN"
#: The same decision, asked of pgtrigger's function only when something is ignored at all
#: ("{}": the empty list pgtrigger leaves set; braces doubled for str.format). A CASE, so
#: that the function is never evaluated for an unset setting.
GUARDED_CHECK = (
    "IF (CASE WHEN coalesce(current_setting('pgtrigger.ignore', true), '') IN ('', '{{}}')"
    " THEN false ELSE {ignore_func_name}(TG_NAME) IS TRUE END) THEN"
)


class GuardedUpsertTriggerSql(compiler.UpsertTriggerSql):
    """pgtrigger's installation SQL with :data:`GUARDED_CHECK` in place of its check."""

    def get_template(self) -> str:
        template = super().get_template()
        if PGTRIGGER_CHECK not in template:  # a pgtrigger whose template changed
            raise RuntimeError(f"pgtrigger's trigger template no longer has {PGTRIGGER_CHECK!r}")
        return template.replace(PGTRIGGER_CHECK, GUARDED_CHECK)


class GuardedTrigger(pgtrigger.Trigger):
    """A :class:`pgtrigger.Trigger` installed through :class:`GuardedUpsertTriggerSql`."""

    def compile(self, model: models.Model) -> compiler.Trigger:
        compiled = super().compile(model)
        kwargs: dict[str, Any] = dict(compiled.sql.kwargs)
        return compiler.Trigger(name=compiled.name, sql=GuardedUpsertTriggerSql(**kwargs))
