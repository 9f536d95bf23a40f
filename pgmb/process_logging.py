"""Log lines of pgmb's long-running commands (dispatcher, consumers, tasks worker) on
stderr, at the command's verbosity, unless the project configured logging itself."""

from __future__ import annotations

import logging
import sys


def log_to_stderr(names: tuple[str, ...], verbosity: int) -> None:
    """Send the loggers ``names`` to stderr, one timestamped line a record: WARNING and
    up at verbosity 0, INFO at 1, DEBUG above."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    for name in names:
        logger = logging.getLogger(name)
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
        logger.setLevel(level)
