"""Exceptions raised by pgmb's Python API, and the Spark pipeline's one error.

Every error is also a ``ValueError`` (bad input) or carries the database error it came
from, so callers can catch broadly or precisely.
"""

from __future__ import annotations


class PgmbError(Exception):
    """Base class of every pgmb error."""


class InvalidName(PgmbError, ValueError):
    """A worker or queue name breaks the naming rule."""


class InvalidRoutingKey(PgmbError, ValueError):
    """A routing key is empty, too long, or contains wildcards or blanks."""


class InvalidBindingKey(PgmbError, ValueError):
    """A binding key is malformed (for example a wildcard inside a word)."""


class InvalidBody(PgmbError, ValueError):
    """A message body or headers cannot be stored as JSON."""


class InvalidDelay(PgmbError, ValueError):
    """A delay is negative, naive, or not understood."""


class DuplicateMessage(PgmbError):
    """A message with this id already exists."""


class AccessDenied(PgmbError, PermissionError):
    """The database role in effect may not do this (SQLSTATE 42501); nothing was changed."""


class UnknownObject(PgmbError, LookupError):
    """A queue or role named in a call does not exist (SQLSTATE 42704)."""


class InvalidOption(PgmbError, ValueError):
    """A message option (priority, group, depends_on, dedup id, retries) breaks its rule."""


class InvalidSchedule(PgmbError, ValueError):
    """A schedule's cron expression, time zone, interval or message breaks its rule."""


class UnknownDependency(PgmbError, ValueError):
    """A message depends on a message that does not exist (checked by the database)."""


# The Spark pipeline's error is not a PgmbError: a job's caller handles it on its own (the
# command line prints it and exits with status 2), and nothing that catches PgmbError
# around publishing should swallow it.
class PipelineError(Exception):
    """A job cannot start or must stop; the message is the whole explanation.

    Raised before a job writes anything whenever the fault can be seen in advance (a
    missing column, an unreadable path, an unreachable database), so that the database is
    left untouched. The command line prints it as one line and exits with status 2.
    """
