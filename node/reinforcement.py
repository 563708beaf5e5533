"""When recall reinforcement is written: counts gather in memory, drains are paced.

A recall ranks cells; the top few of each count towards promotion (the third such hit
moves a cell to L1, DESIGN §6). Writing each count would be a commit per recall, so they
gather here and one writer job drains whatever has gathered by the time it runs. A
drain within ``interval`` of the last one waits out the rest of it, so a stream of
recalls costs a few commits a second, not one per writer batch. Counts not yet written
when the node crashes are lost (they are bookkeeping, not an acknowledged write); a
clean close drains them.

Time and timers come from outside: ``clock`` (seconds, monotonic) and a
:class:`Scheduler`. The node passes the real ones (:func:`time.monotonic`,
:class:`ThreadScheduler`); tests pass :class:`FakeScheduler`, whose clock they move.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Protocol

__all__ = ["RecallReinforcement", "Scheduler", "Scheduled", "ThreadScheduler", "FakeScheduler"]


class Scheduled(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """Runs an action once, ``delay`` seconds from now, on a thread of its own choosing."""

    def call_later(self, delay: float, action: Callable[[], None]) -> Scheduled: ...


class ThreadScheduler:
    """The real scheduler: a daemon :class:`threading.Timer` per call (a drain is
    scheduled at most once per interval, so one short-lived thread each is cheap)."""

    def call_later(self, delay: float, action: Callable[[], None]) -> Scheduled:
        timer = threading.Timer(delay, action)
        timer.daemon = True
        timer.start()
        return timer


class _FakeCall:
    def __init__(self, due: float, action: Callable[[], None]) -> None:
        self.due, self.action, self.cancelled = due, action, False

    def cancel(self) -> None:
        self.cancelled = True


class FakeScheduler:
    """A scheduler on virtual time: :meth:`now` is its clock, :meth:`advance` moves it and
    runs, in the caller's thread and in due order, every action that came due."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self.calls: list[_FakeCall] = []

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, action: Callable[[], None]) -> Scheduled:
        call = _FakeCall(self._now + delay, action)
        self.calls.append(call)
        return call

    def pending(self) -> int:
        return sum(not call.cancelled for call in self.calls)

    def advance(self, seconds: float) -> None:
        until = self._now + seconds
        while True:
            due = [c for c in self.calls if not c.cancelled and c.due <= until]
            if not due:
                break
            call = min(due, key=lambda c: c.due)
            self.calls.remove(call)
            self._now = max(self._now, call.due)
            call.action()
        self.calls = [c for c in self.calls if not c.cancelled]
        self._now = until


class RecallReinforcement:
    """Recall hits by cell rowid, and the decision of when to drain them.

    ``drain`` queues the writer job; that job calls :meth:`take` for the counts to write.
    Thread-safe: recalls count on the trio thread, the scheduler fires on its own, the job
    takes on the writer's.
    """

    def __init__(
        self, *, interval: float, clock: Callable[[], float], scheduler: Scheduler, drain: Callable[[], None]
    ) -> None:
        self.interval = interval
        self._clock = clock
        self._scheduler = scheduler
        self._drain = drain
        self._hits: Counter[int] = Counter()
        self._lock = threading.Lock()
        self._drained_at: float | None = None  # the clock at the last take; None: never
        self._scheduled: Scheduled | None = None  # a drain scheduled for later

    def count(self, rowids: list[int]) -> None:
        """Count one recall hit for each of ``rowids``; drain now, or once the interval is up."""
        if not rowids:
            return
        with self._lock:
            first = not self._hits  # otherwise a drain is queued or scheduled already
            self._hits.update(rowids)
            if not first:
                return
            if self._drained_at is not None:
                wait = self._drained_at + self.interval - self._clock()
                if wait > 0:  # drained moments ago: gather until the interval is up
                    self._scheduled = self._scheduler.call_later(wait, self.flush)
                    return
        self._drain()

    def flush(self) -> None:
        """Drain what has gathered now (the scheduled drain; also at close, and by tests
        that read the counts)."""
        with self._lock:
            if self._scheduled is not None:
                self._scheduled.cancel()
                self._scheduled = None
            if not self._hits:
                return
        self._drain()

    def take(self) -> Counter[int]:
        """The counts gathered so far, which start again from zero (the drain job's part)."""
        with self._lock:
            hits, self._hits = self._hits, Counter()
            self._drained_at = self._clock()
        return hits
