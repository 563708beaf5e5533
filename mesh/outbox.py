"""Per-peer send queues with energy priority, pacing and acknowledged batches.

Each peer has a bounded queue ordered by energy, highest first. A flush takes the
front of the queue into one DATA batch when the peer has a free in-flight slot and
its pacing gap has passed, so a burst of stores becomes a few large batches instead
of many small frames. The gap depends on the lane (Nagle's rule, bounded): with
nothing of ours unacknowledged at the peer it is ``pacing_ms``, so a lone diff leaves
at once; while a batch is out it is ``busy_pacing_ms``, unless a full batch is
waiting, so under load the diffs that arrive meanwhile leave together when its ack
returns (or the gap ends) instead of one exchange each. An exchange costs the two
daemons ~3.5 CPU-ms whatever it carries (mesh.md). A full queue drops its
lowest-energy diff (repair recovers it later). A batch that can ride back in the
response to a frame from its peer (``take(free_ride=True)``) skips the gap: that exchange
happens anyway. A batch not acknowledged in time is put
back in the queue, up to ``max_attempts`` sends per diff; then it is given up, and the
peer is reported as failing.

"In time" adapts to each peer as TCP's retransmission timer does (RFC 6298): a
smoothed round trip plus four deviations, never below ``ack_timeout_ms``, doubled for
each resend of the same diffs, and sampled only from batches sent once (Karn). A
fixed timeout turns an overloaded peer's slow acks into retransmissions, which feed
the overload. And once the runtime reports a batch *delivered* (the peer's endpoint
took the frame; only its ack is outstanding), the batch waits up to
``delivered_timeout_ms`` for that ack: sending it again could only help if the peer
lost it after taking it (a crash, which liveness and repair handle), while a busy peer
would be handed the same diffs again. A runtime that reports deliveries (the HTTP one
does, after every data POST) also says when a frame is still on its way: so once the
first delivery is reported, a batch not yet delivered waits at least
``pending_timeout_ms`` (longer than the transport's own timeout, which ends in a
delivery or a failure) before it is sent again.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import itertools
from collections.abc import Callable

from .diffs import Diff

__all__ = ["Outbox", "Batch", "MAX_ACK_TIMEOUT_MS", "DELIVERED_ACK_TIMEOUT_MS"]

MAX_ACK_TIMEOUT_MS = 30_000
# A peer that took the frame acks it once its engine gets to it; on a starved machine that
# took over 15 s, and resending then tripled the diffs sent per delivery (mesh.md, 2026-12-02).
DELIVERED_ACK_TIMEOUT_MS = 60_000
PENDING_TIMEOUT_MS = 6_000  # the HTTP transport gives up on a request after 5 s


@dataclasses.dataclass(slots=True)
class Batch:
    batch_id: int
    peer_id: str
    items: list[tuple[float, int, Diff]]  # (energy, attempts, diff)
    deadline: int
    sent_at: int = 0


@dataclasses.dataclass(slots=True)
class _Lane:
    queue: list[tuple[float, int, int, Diff]] = dataclasses.field(default_factory=list)  # (-energy, order, attempts, diff)
    inflight: dict[int, Batch] = dataclasses.field(default_factory=dict)
    sent_at: int | None = None  # when the last batch left
    held_until: int = 0  # nothing leaves before (a relay's hold, see enqueue)
    srtt: float | None = None  # smoothed ack round trip, ms
    rttvar: float = 0.0

    def timeout(self, floor_ms: int) -> float:
        if self.srtt is None:
            return float(floor_ms)
        return max(float(floor_ms), self.srtt + 4.0 * self.rttvar)


class Outbox:
    def __init__(
        self, *, queue_limit: int, max_inflight: int, max_diffs: int, max_bytes: int,
        pacing_ms: int, ack_timeout_ms: int, max_attempts: int, delivered_timeout_ms: int = DELIVERED_ACK_TIMEOUT_MS,
        pending_timeout_ms: int = PENDING_TIMEOUT_MS, busy_pacing_ms: int | None = None,
    ) -> None:  # fmt: skip
        self.queue_limit = queue_limit
        self.max_inflight = max_inflight
        self.max_diffs = max_diffs
        self.max_bytes = max_bytes
        self.pacing_ms = pacing_ms
        self.busy_pacing_ms = pacing_ms if busy_pacing_ms is None else max(pacing_ms, busy_pacing_ms)
        self.ack_timeout_ms = ack_timeout_ms
        self.max_attempts = max_attempts
        self.delivered_timeout_ms = delivered_timeout_ms
        self.pending_timeout_ms = pending_timeout_ms
        self.confirms_delivery = False  # set by the first delivered(): the runtime reports deliveries
        self._lanes: dict[str, _Lane] = {}
        self._batches: dict[int, Batch] = {}
        # (deadline, batch id) per batch in flight, a min-heap: next_deadline runs after every
        # event, and a busy node has hundreds in flight. An entry whose batch is gone, or whose
        # deadline moved (delivered), is stale and skipped when it comes to the top.
        self._deadlines: list[tuple[int, int]] = []
        self._order = itertools.count()
        self._batch_ids = itertools.count(1)
        self.ready: set[str] = set()  # peers with queued diffs
        self._held: dict[tuple[str, str, int], int] = {}  # (peer, origin, seq) -> end of its hold

    @property
    def idle(self) -> bool:
        """Nothing queued, nothing awaiting its ack."""
        lanes = self._lanes
        return not self._batches and not any((lane := lanes.get(p)) is not None and lane.queue for p in self.ready)

    def enqueue(self, peer_id: str, diff: Diff, energy: float, attempts: int = 0, hold_until: int = 0) -> int:
        """Queue a diff; returns how many diffs overflow dropped (0 or 1). ``hold_until``: the
        peer's queue waits until then (a relay's copy, held while copies from others may show
        the peer has it: see ``withdraw``)."""
        lane = self._lanes.get(peer_id)
        if lane is None:
            lane = self._lanes[peer_id] = _Lane()
        if hold_until:
            lane.held_until = max(lane.held_until, hold_until)
            self._held[(peer_id, diff.origin, diff.seq)] = hold_until
        bisect.insort(lane.queue, (-energy, next(self._order), attempts, diff))
        self.ready.add(peer_id)
        if len(lane.queue) > self.queue_limit:
            lane.queue.pop()  # lowest energy, newest among equals
            return 1
        return 0

    def take(self, peer_id: str, now: int, *, free_ride: bool = False) -> Batch | None:
        """The next batch for ``peer_id``, if its window and pacing allow one now.

        ``free_ride``: the batch would travel in the response to a frame from that peer, an
        exchange that happens anyway, so the pacing gap does not apply (the window does)."""
        lane = self._lanes.get(peer_id)
        if lane is None or not lane.queue:
            self.ready.discard(peer_id)
            return None
        if len(lane.inflight) >= self.max_inflight or now < lane.held_until:
            return None  # a hold applies even to a free ride: it waits for evidence, not for pacing
        if not free_ride and now < self._send_at(lane):
            return None
        count, size = 0, 0
        for _, _, _, diff in lane.queue:
            if count >= self.max_diffs or (count and size + diff.size > self.max_bytes):
                break
            count += 1
            size += diff.size
        taken, lane.queue = lane.queue[:count], lane.queue[count:]
        if self._held:
            for _, _, _, diff in taken:
                self._held.pop((peer_id, diff.origin, diff.seq), None)
        if not lane.queue:
            self.ready.discard(peer_id)
        items = [(-neg, att + 1, d) for neg, _, att, d in taken]
        backoff = 2 ** (max(att for _, att, _ in items) - 1)
        timeout = min(lane.timeout(self.ack_timeout_ms) * backoff, MAX_ACK_TIMEOUT_MS)
        if self.confirms_delivery:
            timeout = max(timeout, self.pending_timeout_ms)
        batch = Batch(next(self._batch_ids), peer_id, items, now + int(timeout), sent_at=now)
        lane.inflight[batch.batch_id] = batch
        self._batches[batch.batch_id] = batch
        heapq.heappush(self._deadlines, (batch.deadline, batch.batch_id))
        lane.sent_at = now
        return batch

    def _send_at(self, lane: _Lane) -> int:
        """When the lane's next batch may leave (see the module docstring)."""
        if lane.sent_at is None:
            return lane.held_until
        busy = lane.inflight and len(lane.queue) < self.max_diffs
        return max(lane.held_until, lane.sent_at + (self.busy_pacing_ms if busy else self.pacing_ms))

    def acked(self, peer_id: str, batch_id: int, now: int | None = None) -> bool:
        batch = self._batches.get(batch_id)
        if batch is None or batch.peer_id != peer_id:
            return False
        del self._batches[batch_id]
        lane = self._lanes[peer_id]
        lane.inflight.pop(batch_id, None)
        if now is not None and all(attempts == 1 for _, attempts, _ in batch.items):
            sample = float(max(0, now - batch.sent_at))
            if lane.srtt is None:
                lane.srtt, lane.rttvar = sample, sample / 2
            else:
                lane.rttvar = 0.75 * lane.rttvar + 0.25 * abs(lane.srtt - sample)
                lane.srtt = 0.875 * lane.srtt + 0.125 * sample
        return True

    def delivered(self, peer_id: str, batch_id: int, now: int) -> bool:
        """The peer took the batch's frame: wait longer for its ack (see the module docstring)."""
        self.confirms_delivery = True
        batch = self._batches.get(batch_id)
        if batch is None or batch.peer_id != peer_id:
            return False
        if now + self.delivered_timeout_ms > batch.deadline:
            batch.deadline = now + self.delivered_timeout_ms
            heapq.heappush(self._deadlines, (batch.deadline, batch_id))
        return True

    def expire(self, now: int, gave_up_on: Callable[[str, Diff, float], None] | None = None) -> tuple[list[str], int]:
        """Requeue unacknowledged batches; returns (peers whose batches gave up, diffs given up).
        ``gave_up_on(peer_id, diff, energy)`` hears of each diff given up."""
        failing: list[str] = []
        gave_up = 0
        expired = [batch for batch in self._batches.values() if batch.deadline <= now]
        for batch in expired:
            del self._batches[batch.batch_id]
            self._lanes[batch.peer_id].inflight.pop(batch.batch_id, None)
            for energy, attempts, diff in batch.items:
                if attempts >= self.max_attempts:
                    gave_up += 1
                    if gave_up_on is not None:
                        gave_up_on(batch.peer_id, diff, energy)
                    if batch.peer_id not in failing:
                        failing.append(batch.peer_id)
                else:
                    self.enqueue(batch.peer_id, diff, energy, attempts)
        return failing, gave_up

    def withdraw(self, peer_id: str, origin: str, seq: int, held_at: int | None = None) -> bool:
        """Take a queued diff (not one in flight) off a peer's queue: the peer has it already.
        ``held_at``: only if the copy is still in its hold at that time (see ``enqueue``)."""
        lane = self._lanes.get(peer_id)
        if lane is None:
            return False
        if held_at is not None and self._held.get((peer_id, origin, seq), 0) <= held_at:
            return False
        self._held.pop((peer_id, origin, seq), None)
        for k, (_, _, _, diff) in enumerate(lane.queue):
            if diff.seq == seq and diff.origin == origin:
                del lane.queue[k]
                if not lane.queue:
                    self.ready.discard(peer_id)
                return True
        return False

    def held(self, peer_id: str) -> list[tuple[float, Diff]]:
        """(energy, diff) of everything queued or in flight for a peer."""
        lane = self._lanes.get(peer_id)
        if lane is None:
            return []
        queued = [(-neg, diff) for neg, _, _, diff in lane.queue]
        return queued + [(energy, diff) for batch in lane.inflight.values() for energy, _, diff in batch.items]

    def drop_peer(self, peer_id: str) -> int:
        """Forget everything queued or in flight for a peer; returns the diff count."""
        lane = self._lanes.pop(peer_id, None)
        self.ready.discard(peer_id)
        for key in [k for k in self._held if k[0] == peer_id]:
            del self._held[key]
        if lane is None:
            return 0
        for batch_id in lane.inflight:
            self._batches.pop(batch_id, None)
        return len(lane.queue) + sum(len(b.items) for b in lane.inflight.values())

    def depth(self, peer_id: str) -> int:
        lane = self._lanes.get(peer_id)
        return len(lane.queue) if lane else 0

    def inflight(self, peer_id: str) -> int:
        lane = self._lanes.get(peer_id)
        return len(lane.inflight) if lane else 0

    def next_deadline(self) -> int | None:
        """When the outbox next needs the engine: a pacing gap ends or an ack times out."""
        heap, batches = self._deadlines, self._batches
        while heap:
            deadline, batch_id = heap[0]
            batch = batches.get(batch_id)
            if batch is not None and batch.deadline == deadline:
                break
            heapq.heappop(heap)
        at = heap[0][0] if heap else None
        for peer_id in self.ready:
            lane = self._lanes[peer_id]
            if lane.queue and len(lane.inflight) < self.max_inflight:
                send_at = self._send_at(lane)
                at = send_at if at is None or send_at < at else at
        return at
