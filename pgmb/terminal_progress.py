"""A one-line progress report on a terminal (``pgmb_send --file``), drawn on stderr."""

from __future__ import annotations

import time
from typing import Any


class Progress:
    """A one-line progress report on a terminal, redrawn at most ten times a second."""

    def __init__(self, out: Any, total_bytes: int | None, enabled: bool) -> None:
        self.out, self.total, self.enabled = out, total_bytes, enabled
        self.started = self.drawn = time.monotonic()
        self.shown = False

    def update(self, messages: int, done_bytes: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.drawn < 0.1):
            return
        self.drawn = now
        rate = messages / max(now - self.started, 1e-6)
        text = f"{messages:,} messages, {rate:,.0f}/s"
        if self.total:
            share = min(done_bytes / self.total, 1.0)
            bar = "#" * int(share * 30)
            text = f"{share:4.0%} [{bar:<30}] {text}"
        self._write(f"\r\x1b[2K{text}")
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self._write("\r\x1b[2K")

    def _write(self, text: str) -> None:
        # Plain text: stderr's default style would paint the bar as an error.
        self.out.write(text, style_func=str, ending="")
        self.out.flush()
