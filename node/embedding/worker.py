"""Embedding on dedicated threads, with concurrent requests merged into batches.

Stores arrive one text at a time from many tasks. Embedding each in its own thread hop
wastes the model's batch speed-up (about 1.7× for MiniLM) and pays a thread round trip
per text. Here every request joins one queue; each worker thread takes whatever is
waiting (up to ``max_batch`` texts), embeds it as one batch and wakes all its callers
at once. One worker per core: numpy releases the GIL inside the matrix products.

A batch that finds the other workers idle may also use a second core for its own matrix
products, through a :class:`~node.embedding.pairing.Partner` (for an embedder that works in
halves, like MiniLM), when :class:`~node.embedding.pairing.PairingChoice` has seen that it pays on
this machine now. Each half-step asks again, so a batch that another worker joins mid-way (or
that sees requests waiting for one) stops handing halves over at once, and concurrent calls
keep one core each.

A caller whose next step is another thread's work (a store: embed, then commit) passes
that step as ``then``: the worker runs it with the vectors and the caller's waker, so the
work goes from this thread to the next without a round trip through the trio loop, and
the caller is woken once, when all of it is done.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..waking import Waker, current_waker, wake_all
from .base import Embedder
from .pairing import PairingChoice, Partner

__all__ = ["EmbeddingWorker"]


@dataclasses.dataclass(eq=False)
class _Request:
    texts: list[str]
    waker: Waker
    then: Callable[[np.ndarray, Waker], Any] | None = None
    result: Any = None
    error: BaseException | None = None


class EmbeddingWorker:
    def __init__(
        self,
        embedder: Embedder,
        *,
        threads: int = 2,
        max_batch: int = 64,
        pairing: bool | None = None,
    ) -> None:
        """``pairing``: lend lone batches a second core (default: when the embedder works in
        halves and this machine has more than one core)."""
        self.embedder = embedder
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._max_batch = max_batch
        if pairing is None:
            pairing = bool(getattr(embedder, "works_in_halves", False)) and (os.cpu_count() or 1) > 1
        self._partner = Partner() if pairing else None
        self.pairing = PairingChoice()
        self._busy = 0  # workers embedding right now; read without the lock (a stale read only mis-times one step)
        self._busy_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, name=f"hyphae-embed-{i}", daemon=True) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Vectors for ``texts`` (float32, L2-normalised rows), computed off the trio loop."""
        request = _Request(list(texts), current_waker())
        self._queue.put(request)
        await request.waker[1].wait()
        if request.error is not None:
            raise request.error
        assert request.result is not None
        return request.result

    async def embed_then(self, texts: Sequence[str], then: Callable[[np.ndarray, Waker], None]) -> None:
        """Embed ``texts``, then call ``then(vectors, waker)`` on the worker thread; return
        once the caller is woken.

        ``then`` takes over the waker: it must hand it to whatever finishes the work (the
        database writer, for a store), which wakes the caller, and keep its results where
        the caller finds them *before* it hands the waker on (the next thread may wake the
        caller before ``then`` returns). If it raises, the caller gets that error instead.
        """
        request = _Request(list(texts), current_waker(), then)
        self._queue.put(request)
        await request.waker[1].wait()
        if request.error is not None:
            raise request.error

    def close(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()
        if self._partner is not None:
            self._partner.close()

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch, size, stop = [first], len(first.texts), False
            while size < self._max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    stop = True
                    break
                batch.append(item)
                size += len(item.texts)
            self._embed(batch)
            if stop:
                return

    def _pair(self, first: Callable[[], np.ndarray], second: Callable[[], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        assert self._partner is not None
        if self._busy > 1 or not self._queue.empty():  # the other core has, or is about to have, a batch
            return first(), second()
        return self._partner.pair(first, second)

    def _vectors(self, texts: list[str]) -> np.ndarray:
        with self._busy_lock:
            self._busy += 1
            alone = self._busy == 1 and self._queue.empty()
        try:
            if self._partner is None or not alone:
                return self.embedder.embed(texts)
            paired = self.pairing.use_partner()
            began = time.perf_counter()
            vectors = self.embedder.embed(texts, pair=self._pair) if paired else self.embedder.embed(texts)  # type: ignore[call-arg]
            self.pairing.record(paired, time.perf_counter() - began, sum(map(len, texts)))
            return vectors
        finally:
            with self._busy_lock:
                self._busy -= 1

    def _embed(self, batch: list[_Request]) -> None:
        try:
            vectors = self._vectors([text for request in batch for text in request.texts])
        except Exception as exc:
            # One bad request must not fail its neighbours: retry them one by one.
            if len(batch) > 1:
                for request in batch:
                    self._embed([request])
                return
            batch[0].error = exc
        else:
            start, done = 0, []
            for request in batch:
                request.result = vectors[start : start + len(request.texts)]
                start += len(request.texts)
                if request.then is None:
                    done.append(request)
                    continue
                try:
                    request.then(request.result, request.waker)
                except Exception as exc:
                    request.error = exc
                    done.append(request)
            batch = done  # the others' wakers were handed on
        wake_all(request.waker for request in batch)
