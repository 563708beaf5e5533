"""A second core for a lone embedding: one thread that takes the other half of its work.

A text embedded on its own is a chain of small matrix products that one core runs at the speed its
caches stream the weights; the model's forward pass works in two halves per step (six heads, half
the MLP), so a second core can take one half. BLAS threads would do it too, but a process-wide BLAS
thread count cannot follow the load: two worker threads each spawning BLAS threads on two busy cores
made every embedding 2-4x slower here. This splits only what the caller hands over, at one place.

The hand-over never waits on a core that is not there: :meth:`Partner.pair` offers the second half
to the partner thread, runs the first itself, then takes the second back if the partner has not
started it (a busy machine, or the partner serving another caller). So the worst case is the caller
doing both halves, as it would alone, plus a queue put; the best case is two cores at once.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["PairingChoice", "Partner"]


class _Offer:
    """The second half of one step: claimed once, by the partner or by the caller taking it back."""

    __slots__ = ("claim", "done", "error", "result", "work")

    def __init__(self, work: Callable[[], Any]) -> None:
        self.work = work
        self.claim = threading.Lock()  # acquired by whoever runs the work, never released
        self.done = threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.work()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who raises it
            self.error = exc
        finally:
            self.done.set()


class Partner:
    """One helper thread; :meth:`pair` runs two callables, on two cores when one is free."""

    def __init__(self, name: str = "hyphae-embed-partner") -> None:
        self._offers: queue.SimpleQueue[_Offer | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def pair(self, first: Callable[[], Any], second: Callable[[], Any]) -> tuple[Any, Any]:
        """``(first(), second())``, with ``second`` offered to the partner thread meanwhile."""
        offer = _Offer(second)
        self._offers.put(offer)
        a = first()
        if offer.claim.acquire(blocking=False):  # the partner has not started it: do it here
            return a, second()
        offer.done.wait()
        if offer.error is not None:
            raise offer.error
        return a, offer.result

    def close(self) -> None:
        self._offers.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (offer := self._offers.get()) is not None:
            if offer.claim.acquire(blocking=False):  # else the caller took it back: skip it
                offer.run()


class PairingChoice:
    """Whether pairing pays, learned from the embeddings themselves.

    On an idle machine the partner's core is free and a lone embedding takes about half as long; on
    a machine whose other core is busy the partner is scheduled late, and the caller waits for a
    half it could have run itself. Neither the load average nor the core count says which holds
    now, so each lone batch is timed (per character, a proxy for tokens that costs nothing), a
    moving average is kept for each way, and the faster way is used; every ``explore``-th batch
    goes the other way, so the slower one's average follows the machine too.
    """

    def __init__(self, *, explore: int = 8, weight: float = 0.2) -> None:
        self._cost: dict[bool, float | None] = {
            True: None,
            False: None,
        }  # seconds per character
        self._explore = explore
        self._weight = weight
        self._batches = 0

    def use_partner(self) -> bool:
        self._batches += 1
        paired, alone = self._cost[True], self._cost[False]
        if paired is None or alone is None:
            return paired is None  # try each way once
        faster = paired <= alone
        return not faster if self._batches % self._explore == 0 else faster

    def record(self, paired: bool, seconds: float, characters: int) -> None:
        cost = seconds / max(characters, 1)
        previous = self._cost[paired]
        self._cost[paired] = cost if previous is None else previous + self._weight * (cost - previous)

    @property
    def costs(self) -> dict[str, float | None]:
        """Seconds per character, paired and alone (for tests and the profile)."""
        return {"paired": self._cost[True], "alone": self._cost[False]}
