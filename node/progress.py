"""A one-line progress bar on stderr for long work (export, import, reindex, rebuilds).

It draws only when stderr is a terminal and the command was not asked for ``--json``:
scripts and logs get the final summary and nothing else. Redraws are throttled, so a
tight loop can call :meth:`Progress.update` on every item.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]

_REDRAW_INTERVAL = 0.1  # seconds
_WIDTH = 30


class Progress:
    """``with Progress("importing", total) as bar: bar.update(done)``."""

    def __init__(self, label: str, total: int | None, *, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", None) and self.stream.isatty())
        self.enabled = enabled
        self.label = label
        self.total = total
        self.done = 0
        self._drawn_at = 0.0
        self._drew = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, done: int, total: int | None = None, label: str | None = None) -> None:
        self.done = done
        if total is not None:
            self.total = total
        if label is not None:
            self.label = label
        now = time.monotonic()
        if self.enabled and (now - self._drawn_at >= _REDRAW_INTERVAL or done == self.total):
            self._drawn_at = now
            self._draw()

    def _draw(self) -> None:
        if self.total:
            share = min(1.0, self.done / self.total)
            filled = int(share * _WIDTH)
            bar = "#" * filled + "-" * (_WIDTH - filled)
            line = f"{self.label} [{bar}] {self.done}/{self.total} ({share:.0%})"
        else:
            line = f"{self.label} {self.done}"
        self.stream.write("\r" + line + "\x1b[K")
        self.stream.flush()
        self._drew = True

    def close(self) -> None:
        if self._drew:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
            self._drew = False
