"""Repair: fetch the cells that match my beacons and that a peer holds.

The requester remembers, per peer, how far into that peer's log it has been served
(``mark``, a position local to the peer). A request says "after position p, what
matches my beacons?" plus the requester's own control version; the responder answers
only once it knows the requester's beacons at least that recent (``ready``), so a
beacon placed just before a partition is never skipped. Any holder can answer, so a
partition heals without the origin being online. With each request goes what the
requester already holds (a :class:`~mesh.haves.HaveSet`), so a reply carries only what
it lacks.

Requests go out on (re)connect (a peer heard for the first time, or again after it
was suspect or dead) and once more after that answer, when what the peer was receiving
meanwhile has settled; again when one goes unanswered for ``repair_timeout_ms``, and
every ``repair_interval_ms`` to the next live peer in turn, so any holder is asked
within one cycle through the live peers. The responder scans at most ``repair_scan_limit`` log entries per request and says
``more`` when there is more to scan; decayed cells (energy below the floor) and cells
older than the beacon are not sent.

Repair is the requester's pull; :class:`Owed` is the origin's push. What an origin
failed to hand a peer (dropped as the peer went dead, or given up after every resend)
it keeps, within a bound, and offers again when that peer comes back: a cell stored
for a dead node and held by its origin alone would otherwise wait until that node's
repair happens to ask the origin.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np

from .config import EnergyParams
from .memory import DiffLog
from .routing import IndexedBeacon
from .routing_rule import accepts
from .haves import HaveSet
from .diffs import CellPayload, Diff, TombstonePayload, diff_key

__all__ = ["RepairClient", "RepairAnswer", "Owed", "answer_repair"]


@dataclasses.dataclass(slots=True)
class _Pending:
    request_id: int
    sent_at: int


class RepairClient:
    """The requester's side: marks per peer and at most one request in flight per peer."""

    def __init__(self, timeout_ms: int) -> None:
        self.timeout_ms = timeout_ms
        self.marks: dict[str, int] = {}
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)

    def start(self, peer_id: str, now: int) -> tuple[int, int] | None:
        """(request_id, since) for a new request, or None while one is in flight."""
        pending = self._pending.get(peer_id)
        if pending is not None and now - pending.sent_at < self.timeout_ms:
            return None
        request_id = next(self._ids)
        self._pending[peer_id] = _Pending(request_id, now)
        return request_id, self.marks.get(peer_id, 0)

    def finish(self, peer_id: str, request_id: int, upto: int, ready: bool) -> bool:
        """Record a reply; False if it answers no request of ours."""
        pending = self._pending.get(peer_id)
        if pending is None or pending.request_id != request_id:
            return False
        del self._pending[peer_id]
        if ready:
            self.marks[peer_id] = max(self.marks.get(peer_id, 0), upto)
        return True

    def in_flight(self, now: int) -> bool:
        """Is a request of ours awaiting its reply (one unanswered past the timeout is not)?"""
        return any(now - p.sent_at < self.timeout_ms for p in self._pending.values())

    def sent_at(self, peer_id: str) -> int | None:
        pending = self._pending.get(peer_id)
        return pending.sent_at if pending else None

    def forget(self, peer_id: str) -> None:
        self._pending.pop(peer_id, None)


class Owed:
    """Per peer, the diffs we failed to deliver to it: at most ``limit``, highest energy kept."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._owed: dict[str, dict[bytes, tuple[float, Diff]]] = {}

    def add(self, peer_id: str, diff: Diff, energy: float) -> int:
        """Remember one diff for ``peer_id``; returns how many the bound pushed out (0 or 1)."""
        owed = self._owed.setdefault(peer_id, {})
        owed[diff_key(diff.origin, diff.seq)] = (energy, diff)
        if len(owed) <= self.limit:
            return 0
        del owed[min(owed, key=lambda key: owed[key][0])]
        return 1

    def take(self, peer_id: str) -> list[tuple[float, Diff]]:
        """Everything owed to ``peer_id`` (highest energy first), forgotten here."""
        return sorted(self._owed.pop(peer_id, {}).values(), key=lambda item: -item[0])

    def count(self, peer_id: str) -> int:
        return len(self._owed.get(peer_id, ()))


@dataclasses.dataclass(frozen=True, slots=True)
class RepairAnswer:
    diffs: list[Diff]
    upto: int
    more: bool


def answer_repair(
    store: DiffLog, beacons: list[IndexedBeacon], *, requester: str, since: int, scan_limit: int,
    max_diffs: int, max_bytes: int, grace_ms: int, settle_ms: int, energy: EnergyParams, now: int,
    haves: HaveSet | None = None,
) -> RepairAnswer:  # fmt: skip
    """The diffs after ``since`` in our log that match one of ``beacons``.

    Entries younger than ``settle_ms`` are left for the next request: their push may
    still be in flight, and answering now would only send a duplicate. So are the
    diffs the requester says it holds (``haves``).
    """
    entries = store.scan(since, scan_limit)
    more = len(entries) == scan_limit
    scanned = []
    last_considered = since
    for lsn, received_at, diff in entries:
        if received_at > now - settle_ms:
            more = False
            break
        last_considered = lsn
        if haves and (diff.origin, diff.seq) in haves:
            continue
        scanned.append((lsn, diff))
    if not scanned:
        return RepairAnswer([], last_considered, more)
    wanted = _matching(scanned, store, beacons, requester, grace_ms, energy, now)
    out: list[Diff] = []
    size = 0
    upto = since
    for lsn, diff in scanned:
        if lsn in wanted:
            if len(out) >= max_diffs or size + diff.size > max_bytes:
                return RepairAnswer(out, upto, True)
            out.append(diff.routed(hops=diff.hops + 1, ttl=0))
            size += diff.size
        upto = lsn
    return RepairAnswer(out, last_considered, more)


def _matching(
    scanned: list[tuple[int, Diff]], store: DiffLog, beacons: list[IndexedBeacon], requester: str,
    grace_ms: int, energy: EnergyParams, now: int,
) -> set[int]:  # fmt: skip
    """Log positions whose cell one of the beacons accepts, and every tombstone: the cell
    diff a tombstone forgets is erased from the log with its vector, so no interest is left
    to route it by; it carries no content, and the haves keep it from being sent twice."""
    cells: list[tuple[int, CellPayload]] = []
    wanted: set[int] = set()
    for lsn, diff in scanned:
        if diff.origin == requester:
            continue
        p = diff.payload
        if isinstance(p, TombstonePayload):
            wanted.add(lsn)
        elif isinstance(p, CellPayload):
            cells.append((lsn, p))
    by_shape: dict[tuple[str, int], list[tuple[int, CellPayload]]] = {}
    for lsn, cell in cells:
        by_shape.setdefault((cell.embedding_space, cell.embedding.shape[0]), []).append((lsn, cell))
    for (space, dim), group in by_shape.items():
        relevant = [b for b in beacons if b.beacon.embedding_space == space and b.beacon.embedding.shape == (dim,)]
        if not relevant:
            continue
        matrix = np.stack([c.embedding for _, c in group])
        e0 = np.array([energy.initial(c.salience, c.cell_type) for _, c in group], np.float32)
        for entry in relevant:
            sims = matrix @ entry.beacon.embedding
            floor = energy.route_threshold(entry.beacon.threshold, e0)
            for i in np.flatnonzero(sims >= floor).tolist():
                lsn, cell = group[i]
                if lsn in wanted or cell.created_at < entry.placed_at - grace_ms:
                    continue
                e0_i = float(e0[i])
                if accepts(entry.beacon, cell, e0_i, now, energy) and energy.worth_repairing(
                    e0_i, cell.cell_type, cell.created_at, now
                ):
                    wanted.add(lsn)
    return wanted
