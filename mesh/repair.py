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

Tombstones are offered to every requester, whatever its beacons: they carry no content
(about 240 bytes with the signature), and once the forgotten cell's vector is erased no
beacon could be matched against it, yet a node that was away when the cell was forgotten may
hold it. A team is one tenant (:mod:`mesh.team`), so every requester is of the tombstone's
tenant. The marks and the requester's have-set send each one at most once per requester and
holder asked (about 1.7 per node per forget under 10 % loss, BENCHMARKS.md). A cell whose
tombstone by its origin we hold is never sent. A cell that supersedes others
(:mod:`mesh.lifecycle`) is sent to a requester whose beacons accept it or any of the cells
it supersedes that we hold: the holders of an old cell are those its beacons took it to.

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
from .lifecycle import supersedes

__all__ = ["RepairClient", "RepairAnswer", "Owed", "answer_repair"]

_CHAIN_CELLS = 64  # superseded cells looked at per superseding cell (mesh.data_plane's bound)


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
    wanted = _matching(scanned, store, beacons, requester, grace_ms, energy, now) if beacons else set()
    wanted.update(lsn for lsn, diff in scanned if diff.origin != requester and isinstance(diff.payload, TombstonePayload))
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
    """Log positions whose cell one of the beacons accepts (or one of the cells it supersedes
    that we hold). A forgotten cell is none of them."""
    cells: list[tuple[int, CellPayload]] = []
    for lsn, diff in scanned:
        p = diff.payload
        if diff.origin == requester or not isinstance(p, CellPayload) or store.forgotten(p.node_id, diff.origin):
            continue
        cells.append((lsn, p))
        todo, seen = list(supersedes(p.metadata, p.node_id) or ()), {p.node_id}
        while todo and len(seen) <= _CHAIN_CELLS:  # and down the chain of revisions, as routing goes
            old_id = todo.pop(0)
            ref = store.cell(old_id) if old_id not in seen else None
            seen.add(old_id)
            if ref is not None and isinstance(ref.payload, CellPayload):
                cells.append((lsn, ref.payload))
                todo += supersedes(ref.payload.metadata, old_id) or ()
    wanted: set[int] = set()
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
