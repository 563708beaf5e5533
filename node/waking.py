"""Waking trio tasks from worker threads, once per batch rather than once per task.

A worker thread that finishes a batch for many waiting tasks calls into each trio loop
once (``run_sync_soon`` writes to a wake-up socket: doing that per task costs more
than the work itself at thousands of operations a second).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import trio

__all__ = ["Waker", "current_waker", "wake_all"]

Waker = tuple[Any, trio.Event]  # (trio token, event)


def current_waker() -> Waker:
    return trio.lowlevel.current_trio_token(), trio.Event()


def wake_all(wakers: Iterable[Waker | None]) -> None:
    by_token: dict[Any, list[trio.Event]] = {}
    for waker in wakers:
        if waker is not None:
            by_token.setdefault(waker[0], []).append(waker[1])
    for token, events in by_token.items():
        try:
            token.run_sync_soon(_set_all, events)
        except trio.RunFinishedError:
            pass


def _set_all(events: list[trio.Event]) -> None:
    for event in events:
        event.set()
