"""The diff log the engine needs, and an in-memory implementation of it.

The engine keeps every diff it originates or accepts in a :class:`DiffLog`: the log
de-duplicates by ``(origin, seq)``, answers repair requests in log order, finds a
cell's diff for its tombstone, remembers our own highest seq across restarts, and
hands back the control diffs (members, beacons, scenes) so a restarted node routes
from its first store instead of after a round of anti-entropy, and keeps the members'
public keys (with their membership proofs) so a restarted node verifies a member's
diffs before that member has spoken to it again.
A log position (``lsn``) is local to one node and only ever grows; repair asks "what
matches my beacons after position p in *your* log?". The production node implements
the same protocol over SQLite.
"""

from __future__ import annotations

import bisect
from typing import Protocol

from .diffs import DATA_KINDS, CellPayload, Diff, TombstonePayload

__all__ = ["DiffLog", "MemoryDiffLog"]


class DiffLog(Protocol):
    """Every method is required: the engine calls each of them (none is probed for).

    Membership (``has``, ``put``'s answer) and ``max_seq`` reflect a ``put`` at once; the
    reads of the log itself (``scan``, ``control_diffs``, ``keys``) may lag a ``put`` until
    its write lands (the SQLite log's group commit), never longer.
    """

    def has(self, origin: str, seq: int) -> bool:
        """Is this diff already held?"""

    def put(self, diff: Diff, received_at: int) -> bool:
        """Append a diff (with its routing fields as received); False if already held."""

    def signature(self, origin: str, seq: int) -> bytes | None:
        """The signature of the diff held as ``(origin, seq)`` (None if none is held, or if it
        was a control diff since superseded): another one is a fork (:mod:`mesh.identity_guard`)."""

    def cell(self, cell_id: str) -> Diff | None:
        """The diff that carried the cell with this id, if held and not forgotten: once its
        origin's tombstone is put, the cell diff is erased (still held, never returned again),
        though a ``cell`` asked before the next ``put`` still gets it, to route the tombstone."""

    def forgotten(self, cell_id: str, origin: str) -> bool:
        """Is a tombstone for this cell id, signed by ``origin``, held? True at once after the
        tombstone's ``put``, and still when the cell's own diff is gone."""

    def scan(self, after: int, limit: int) -> list[tuple[int, int, Diff]]:
        """Up to ``limit`` data diffs (cell, tombstone) with lsn > ``after``, in log order,
        as ``(lsn, received_at, diff)``; erased cell diffs are left out. Positions only grow."""

    def max_seq(self, origin: str) -> int:
        """The highest seq held from ``origin`` (0 if none): a restart signs in a later
        incarnation than this one's (:mod:`mesh.incarnation`)."""

    def control_diffs(self) -> list[Diff]:
        """The control diffs held (peer, beacon, unbeacon, scene), in log order: at least the
        newest for each of an origin's keys (a log may let the ones it supersedes go)."""

    def put_key(self, origin: str, public_key: bytes, proof: bytes) -> None:
        """Remember a member's verified key and membership proof (the newest per origin)."""

    def keys(self) -> list[tuple[str, bytes, bytes]]:
        """Every remembered ``(origin, public_key, proof)``, one per origin."""


class MemoryDiffLog:
    """A :class:`DiffLog` in dictionaries; diffs are shared, never copied."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, int], bytes] = {}  # (origin, seq) -> signature
        self._cells: dict[str, tuple[Diff, int]] = {}  # cell id -> (its diff, lsn)
        self._lsns: list[int] = []
        self._received: list[int] = []
        self._data: list[Diff] = []
        self._max_seq: dict[str, int] = {}
        self._control: list[Diff] = []
        self._keys: dict[str, tuple[bytes, bytes]] = {}
        self._next_lsn = 1
        self._tombstoned: set[tuple[str, str]] = set()  # (cell id, origin) of the tombstones held
        self._fading: dict[str, Diff] = {}  # erased by the last put, routable until the next

    def __len__(self) -> int:
        return len(self._held)

    def has(self, origin: str, seq: int) -> bool:
        return (origin, seq) in self._held

    def put(self, diff: Diff, received_at: int) -> bool:
        key = (diff.origin, diff.seq)
        if key in self._held:
            return False
        self._held[key] = diff.signature
        if diff.seq > self._max_seq.get(diff.origin, 0):
            self._max_seq[diff.origin] = diff.seq
        self._fading.clear()
        lsn = self._next_lsn
        self._next_lsn += 1
        p = diff.payload
        if isinstance(p, CellPayload) and (p.node_id, diff.origin) in self._tombstoned:
            return True  # forgotten before it got here: held, never kept
        if diff.kind in DATA_KINDS:
            self._lsns.append(lsn)
            self._received.append(received_at)
            self._data.append(diff)
            if isinstance(p, CellPayload):
                self._cells.setdefault(p.node_id, (diff, lsn))
            elif isinstance(p, TombstonePayload):
                self._tombstoned.add((p.cell_id, diff.origin))
                self._erase(p.cell_id, diff.origin)
        else:
            self._control.append(diff)
        return True

    def _erase(self, cell_id: str, origin: str) -> None:
        """Drop the cell diff a tombstone forgets (its position stays held, its content goes)."""
        held, lsn = self._cells.get(cell_id, (None, 0))
        if held is None or held.origin != origin:
            return
        del self._cells[cell_id]
        self._fading[cell_id] = held
        at = bisect.bisect_left(self._lsns, lsn)
        del self._lsns[at], self._received[at], self._data[at]

    def signature(self, origin: str, seq: int) -> bytes | None:
        return self._held.get((origin, seq))

    def cell(self, cell_id: str) -> Diff | None:
        return self._fading.get(cell_id) or self._cells.get(cell_id, (None, 0))[0]

    def forgotten(self, cell_id: str, origin: str) -> bool:
        return (cell_id, origin) in self._tombstoned

    def scan(self, after: int, limit: int) -> list[tuple[int, int, Diff]]:
        start = bisect.bisect_right(self._lsns, after)
        end = start + limit
        return list(zip(self._lsns[start:end], self._received[start:end], self._data[start:end]))

    def max_seq(self, origin: str) -> int:
        return self._max_seq.get(origin, 0)

    def control_diffs(self) -> list[Diff]:
        return list(self._control)

    def put_key(self, origin: str, public_key: bytes, proof: bytes) -> None:
        self._keys[origin] = (public_key, proof)

    def keys(self) -> list[tuple[str, bytes, bytes]]:
        return [(origin, key, proof) for origin, (key, proof) in self._keys.items()]
