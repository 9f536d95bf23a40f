"""The pipeline's one error: bad input or an unusable environment, told in one line."""

from __future__ import annotations


class PipelineError(Exception):
    """A job cannot start or must stop; the message is the whole explanation.

    Raised before a job writes anything whenever the fault can be seen in advance (a
    missing column, an unreadable path, an unreachable database), so that the database is
    left untouched. The command line prints it as one line and exits with status 2.
    """
