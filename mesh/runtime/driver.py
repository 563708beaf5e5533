"""The trio runtime: feeds the sans-IO engine and carries out its effects.

Theory of operation
-------------------
One task owns the engine. Every event reaches it through one trio memory channel:
frames from the HTTP endpoint, timer firings, local events from :meth:`MeshRuntime.submit`
and send failures, so :meth:`MeshEngine.handle` is never re-entered and events are
handled in the order they were queued. The clock is read once per event.

The effects of one event are carried out in order:

* ``SendFrame`` goes to the *lane* of its address: a bounded queue and a worker that
  POSTs with at most ``per_peer_concurrency`` requests in flight. A full queue drops
  the frame (counted; the engine retransmits data and gossips again); a failed send
  comes back as ``SendFailed(address)``. Idle lanes retire, so addresses that churn
  leave nothing behind. A data frame the peer's endpoint took comes back as
  ``FrameDelivered(address, batch_id)`` (the engine then only waits for the ack, and
  does not resend a batch the peer is still working on). A ``SendFrame`` marked ``in_reply`` (an ack, a pong, a gossip or
  repair reply) rides back in the response to the frame being handled, when its sender
  is still waiting for one (see below); frames in a response are fed to the engine as
  if they had arrived on their own. One HTTP exchange per data batch instead of two. A
  data batch for the peer whose frame is being handled rides back the same way (the engine
  marks it ``in_reply``), and the ack for it rides on our next data frame to that peer.
* ``SetTimer(name, at_ms)`` replaces the timer of that name. One timer task sleeps
  until the earliest deadline (wall ms converted to ``trio.current_time()``) and
  fires ``TimerFired(name)`` once the clock has reached it: never early, because the
  engine ignores an early firing and would not re-arm that timer. Pending deadlines
  outlive the runtime: a new runtime for the same engine inherits them.
* everything else is awaited in ``sink.apply(effect)``; a sink that raises is logged
  and counted, and the runtime goes on.

Events already queued when the engine task takes one (up to ``coalesce_limit``) are
handled back to back as a group, and the ``StoreRemoteCell`` effects of the whole group
go to ``sink.apply_many`` at once when the sink has it: the cells of several frames share
one durable commit. An acknowledged write must survive a crash, so every ``SendFrame``
(an ack alone, on a data frame, or in a response) and ``SetTimer`` that comes after a
pending cell waits until that cell is applied; any other sink effect first applies the
cells ahead of it, so effects keep their order apart from frames waiting for cells.

Received frames hold one of ``frame_backlog`` slots until the engine has handled
them, so a flood of frames pushes back on the HTTP handlers (and through them on
the senders) while local events from :meth:`submit` are never refused. A caller of
:meth:`receive_frame` may wait up to ``reply_within`` seconds for the replies to its
frame; past that it gets none, and the replies go out as frames of their own.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import trio

from ..engine import MeshEngine
from ..events import (
    Effect, Event, FrameDelivered, FrameReceived, SendFailed, SendFrame, SetTimer, Started, StoreRemoteCell,
    TimerFired,
)  # fmt: skip
from .transport import SendError, Transport

__all__ = ["MeshRuntime", "EffectSink", "wall_clock_ms"]

log = logging.getLogger("hyphae.mesh.runtime")


class EffectSink(Protocol):
    """Receives every effect that is not ``SendFrame``/``SetTimer``, in order.

    A sink may also offer ``async apply_many(effects)`` for a run of ``StoreRemoteCell``
    (the cells of the frames handled together, independent of each other): it returns
    once all are applied, durably, since the acks for them leave right after.
    """

    async def apply(self, effect: Effect) -> None: ...


@dataclasses.dataclass(eq=False)
class _ReplySlot:
    """Replies to one received frame, for a sender that waits for them."""

    frames: list[bytes] = dataclasses.field(default_factory=list)
    done: trio.Event = dataclasses.field(default_factory=trio.Event)
    abandoned: bool = False


# Armed timers belong to the engine, not to one runtime: the engine emits ``SetTimer`` only
# when a deadline changes, so a runtime that takes over an engine (a node restarting its
# mesh side with the same engine and log) must inherit the deadlines still pending.
_PENDING_TIMERS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclasses.dataclass(eq=False)
class _Lane:
    """The outgoing queue of one address."""

    address: str
    tx: trio.MemorySendChannel[tuple[bytes, int]]  # (frame, batch_id or 0)
    rx: trio.MemoryReceiveChannel[tuple[bytes, int]]
    slots: trio.Semaphore
    queued: int = 0
    dropped: int = 0


class MeshRuntime:
    """Runs one :class:`MeshEngine` under trio; see the module docstring."""

    def __init__(
        self, engine: MeshEngine, *, transport: Transport, sink: EffectSink, clock: Callable[[], int] | None = None,
        peer_queue_limit: int = 256, per_peer_concurrency: int = 4, frame_backlog: int = 256,
        lane_idle_timeout: float = 60.0, coalesce_limit: int = 64,
    ) -> None:  # fmt: skip
        self.engine = engine
        self.transport = transport
        self.sink = sink
        self.clock = clock or wall_clock_ms
        self.counters: collections.Counter[str] = collections.Counter()
        # Data frames (batches of cells and tombstones) queued per address: the dashboard's
        # view of where gossip flows. Bounded, because discovery can propose any address.
        self.data_frames_sent: collections.Counter[str] = collections.Counter()
        self._peer_queue_limit = peer_queue_limit
        self._per_peer_concurrency = per_peer_concurrency
        self._lane_idle_timeout = lane_idle_timeout
        self._coalesce_limit = coalesce_limit
        self._events_tx, self._events_rx = trio.open_memory_channel[tuple[Event, _ReplySlot | None]](math.inf)
        self._frame_slots = trio.Semaphore(frame_backlog)
        self._timers = _PENDING_TIMERS.setdefault(engine, {})
        self._timers_changed = trio.Event()
        self._lanes: dict[str, _Lane] = {}
        self._nursery: trio.Nursery | None = None
        self._running = False

    # -- the public surface -------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Feed ``Started()``, then run the engine, timer and send tasks until cancelled."""
        if self._running:
            raise RuntimeError("this MeshRuntime is already running")
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._timer_loop)
                await self._handle_group([(Started(), None)])
                task_status.started()
                await self._engine_loop()
        finally:
            self._nursery = None
            self._lanes.clear()
            self._running = False

    def submit(self, event: Event) -> None:
        """Queue a local event (on the trio thread; never blocks). Handled in order."""
        self._events_tx.send_nowait((event, None))

    async def receive_frame(
        self, address: str, frame: bytes, *, reply_within: float | None = None, in_response: bool = False
    ) -> list[bytes]:
        """Queue a frame from the network; waits while ``frame_backlog`` frames are pending.

        With ``reply_within`` (seconds), also wait that long for the engine to handle it and
        return the frames it sent in reply (``[]`` if it took longer: they go out on their own).
        ``in_response``: the frame came back in the response to one of ours.
        """
        await self._frame_slots.acquire()
        self.counters["frames_queued"] += 1
        slot = _ReplySlot() if reply_within is not None else None
        self._events_tx.send_nowait((FrameReceived(address, frame, slot is not None, in_response), slot))
        if slot is None:
            return []
        with trio.move_on_after(reply_within):
            await slot.done.wait()
        if not slot.done.is_set():
            slot.abandoned = True  # no checkpoint since the check: the engine task sees it
            self.counters["replies_too_late"] += 1
            return []
        return slot.frames

    def status(self) -> dict[str, Any]:
        """``engine.status()`` plus the transport's and the runtime's own counters."""
        status = self.engine.status()
        status["transport"] = self.transport.status()
        status["runtime"] = {
            "running": self._running,
            "lanes": {
                address: {"queued": lane.queued, "dropped": lane.dropped} for address, lane in self._lanes.items()
            },
            "timers": dict(self._timers),
            "data_frames_sent": dict(self.data_frames_sent),
            **self.counters,
        }
        return status

    # -- the engine task ----------------------------------------------------------------

    async def _engine_loop(self) -> None:
        while True:
            group = [await self._events_rx.receive()]
            # Events already queued are handled back to back, so the remote cells of several
            # frames share one durable commit instead of paying one each.
            while len(group) < self._coalesce_limit:
                try:
                    group.append(self._events_rx.receive_nowait())
                except trio.WouldBlock:
                    break
            try:
                await self._handle_group(group)
            finally:
                for event, slot in group:
                    if isinstance(event, FrameReceived):
                        self._frame_slots.release()
                    if slot is not None:
                        slot.done.set()

    async def _handle_group(self, group: list[tuple[Event, _ReplySlot | None]]) -> None:
        """Handle queued events in order; their ``StoreRemoteCell`` effects are applied in one
        ``apply_many``, and every frame or timer that follows such a cell waits for it.

        An acknowledged write must survive a crash: the engine emits the ack for a cell (alone,
        on a data frame, or in a response) after the cell's ``StoreRemoteCell``, so no frame
        leaves before the stores ahead of it have committed. Other sink effects keep their
        place: the stores ahead of one are committed first.
        """
        stores: list[StoreRemoteCell] = []
        held: list[tuple[SendFrame | SetTimer, _ReplySlot | None]] = []  # waiting for ``stores``
        for n, (event, slot) in enumerate(group):
            if n:
                # Let the other tasks (the REST API, the HTTP handlers) run between events: a
                # group handled without a pause held up local stores several-fold under load.
                await trio.lowlevel.checkpoint()
            for effect in self._engine_effects(event):
                if isinstance(effect, StoreRemoteCell):
                    stores.append(effect)
                elif isinstance(effect, (SendFrame, SetTimer)):
                    if stores:
                        held.append((effect, slot))
                    else:
                        self._carry_out(effect, slot)
                else:
                    await self._commit(stores, held)
                    await self._apply(effect)
        await self._commit(stores, held)

    def _engine_effects(self, event: Event) -> list[Effect]:
        try:
            effects = self.engine.handle(event, self.clock())
        except Exception:
            # A bug in the engine, not bad input (that is counted inside): keep serving.
            self.counters["engine_errors"] += 1
            log.exception("the mesh engine failed on %s", type(event).__name__)
            return []
        self.counters["events"] += 1
        return effects

    async def _commit(
        self, stores: list[StoreRemoteCell], held: list[tuple[SendFrame | SetTimer, _ReplySlot | None]]
    ) -> None:
        """Apply the pending cells (one ``apply_many`` when the sink has it), then carry out
        what waited for them, in order. Empties both lists."""
        if len(stores) > 1 and hasattr(self.sink, "apply_many"):
            self.counters["store_runs"] += 1
            await self._apply_many(list(stores))
        else:
            for effect in stores:
                await self._apply(effect)
        stores.clear()
        for effect, slot in held:
            self._carry_out(effect, slot)
        held.clear()

    def _carry_out(self, effect: SendFrame | SetTimer, slot: _ReplySlot | None) -> None:
        if isinstance(effect, SetTimer):
            self._timers[effect.name] = effect.at_ms
            self._timers_changed.set()
        elif effect.in_reply and slot is not None and not slot.abandoned:
            slot.frames.append(effect.frame)
            self.counters["replies_in_response"] += 1
            if effect.data_bytes:
                self.counters["data_frames_in_response"] += 1
        else:
            self._enqueue_frame(effect)

    async def _apply(self, effect: Effect) -> None:
        try:
            await self.sink.apply(effect)
        except Exception:
            self.counters["sink_errors"] += 1
            log.exception("the effect sink failed on %s", type(effect).__name__)
        else:
            self.counters["effects_applied"] += 1

    async def _apply_many(self, effects: list[Effect]) -> None:
        try:
            await self.sink.apply_many(effects)  # type: ignore[attr-defined]
        except Exception:
            self.counters["sink_errors"] += 1
            log.exception("the effect sink failed on a run of %d %s", len(effects), type(effects[0]).__name__)
        else:
            self.counters["effects_applied"] += len(effects)

    # -- timers -------------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        while True:
            self._timers_changed = trio.Event()
            if not self._timers:
                await self._timers_changed.wait()
                continue
            now = self.clock()
            due_at = min(self._timers.values())
            if due_at > now:
                with trio.move_on_at(trio.current_time() + (due_at - now) / 1000):
                    await self._timers_changed.wait()
                continue
            for name, at in list(self._timers.items()):
                if at <= now:
                    del self._timers[name]
                    self._events_tx.send_nowait((TimerFired(name), None))
            await trio.lowlevel.checkpoint()

    # -- sending ------------------------------------------------------------------------

    def _enqueue_frame(self, effect: SendFrame) -> None:
        lane = self._lanes.get(effect.address)
        if lane is None:
            tx, rx = trio.open_memory_channel[tuple[bytes, int]](self._peer_queue_limit)
            slots = trio.Semaphore(self._per_peer_concurrency)
            lane = self._lanes[effect.address] = _Lane(effect.address, tx, rx, slots)
            assert self._nursery is not None
            self._nursery.start_soon(self._lane_worker, lane)
        try:
            lane.tx.send_nowait((effect.frame, effect.batch_id))
        except trio.WouldBlock:
            lane.dropped += 1
            self.counters["frames_dropped_queue_full"] += 1
            return
        lane.queued += 1
        if effect.data_bytes and (effect.address in self.data_frames_sent or len(self.data_frames_sent) < 1024):
            self.data_frames_sent[effect.address] += 1

    async def _lane_worker(self, lane: _Lane) -> None:
        async with trio.open_nursery() as sends:
            while True:
                item: tuple[bytes, int] | None = None
                with trio.move_on_after(self._lane_idle_timeout):
                    item = await lane.rx.receive()
                if item is None:
                    # Idle: retire if nothing is queued or in flight. No checkpoint between the
                    # check and the removal, so _enqueue_frame cannot slip a frame in between.
                    if lane.queued == 0 and not sends.child_tasks and self._lanes.get(lane.address) is lane:
                        del self._lanes[lane.address]
                        return
                    continue
                lane.queued -= 1
                await lane.slots.acquire()
                sends.start_soon(self._post, lane, *item)

    async def _post(self, lane: _Lane, frame: bytes, batch_id: int = 0) -> None:
        try:
            replies = await self.transport.send(lane.address, frame)
        except SendError as exc:
            self.counters["send_failures"] += 1
            log.debug("%s", exc)
            self._events_tx.send_nowait((SendFailed(lane.address), None))
            lane.slots.release()
            return
        except Exception:  # a transport bug: report the failure, keep the runtime
            self.counters["send_failures"] += 1
            self.counters["transport_errors"] += 1
            log.exception("sending to %s failed unexpectedly", lane.address)
            self._events_tx.send_nowait((SendFailed(lane.address), None))
            lane.slots.release()
            return
        lane.slots.release()
        if batch_id:
            self._events_tx.send_nowait((FrameDelivered(lane.address, batch_id), None))
        for reply in replies or ():
            self.counters["replies_received"] += 1
            await self.receive_frame(lane.address, reply, in_response=True)
