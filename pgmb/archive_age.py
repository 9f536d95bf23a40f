"""How old a finished message must be before the archive job moves it out of PostgreSQL.

One home for the default, the limit and the rule, shared by the settings
(``PGMB['PIPELINE_ARCHIVE_OLDER_THAN_DAYS']``, :mod:`pgmb.conf`) and the Spark job's
``--older-than`` (:mod:`pgmb.pipeline.archive`). It imports nothing: the settings stay a
leaf, and the pipeline, which runs without Django, may use it.
"""

from __future__ import annotations

import math

#: Messages are archived once they are this many days old (and finished).
DEFAULT_OLDER_THAN_DAYS = 7.0
#: The most --older-than accepts (about 270 years back).
MAX_OLDER_THAN_DAYS = 100_000.0


def days_problem(value: object) -> str | None:
    """Why ``value`` is not a usable age in days, or None. 0 is: every finished message,
    up to now."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "must be a number of days, 0 or more"
    if value < 0:
        return "must be a number of days, 0 or more"
    if value > MAX_OLDER_THAN_DAYS:
        return f"must be at most {MAX_OLDER_THAN_DAYS:g} days"
    return None
