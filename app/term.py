"""Colour on a terminal, and nowhere else.

Colours are for people: they appear only when the stream is a TTY and ``NO_COLOR``
(https://no-color.org) is not set, so pipes, files and ``--json`` stay plain text.
"""

from __future__ import annotations

import os
from typing import TextIO

__all__ = ["colour_enabled", "paint"]

_CODES = {"green": "32", "yellow": "33", "red": "31", "bold": "1", "dim": "2"}


def colour_enabled(stream: TextIO) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def paint(text: str, colour: str, stream: TextIO) -> str:
    """``text`` in ``colour`` (green, yellow, red, bold, dim) if ``stream`` shows colour."""
    if not colour_enabled(stream):
        return text
    return f"\x1b[{_CODES[colour]}m{text}\x1b[0m"
