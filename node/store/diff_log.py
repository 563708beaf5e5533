"""The mesh's diff log over SQLite (the :class:`mesh.memory.DiffLog` protocol).

The engine calls the log synchronously on the trio thread, so reads of what it just
wrote must not wait for a commit: membership of ``(origin, seq)`` and our own highest
seq live in memory (loaded at open), and diffs not yet committed sit in a small
overlay until their write lands. Writes go through the node's group committer like
every other write, the rows put in a row sharing one job (a received batch is one job,
not one per diff). Control diffs keep one row per key (origin, beacon/scene/peer): a
newer one deletes the rows it supersedes, so restarts and re-announced beacons do not
grow the log. Members' keys (verified by the engine before it hands them over) keep
one row per origin.

Tombstones held are known in memory too, by (cell id, origin), loaded at open: a cell that
arrives after its tombstone is asked about on the hot path, and must stay forgotten after its
own row's body is erased.

Every row read back is decoded by today's rules: one an older version logged and they now
refuse goes to the quarantine (:mod:`node.store.quarantine`), is skipped, and still counts
as held.

A forgotten cell leaves no content or vector here either: when its origin's tombstone is
put, the cell diff's signed bytes are erased in the tombstone row's own write (the row
stays, so the diff still counts as held and is never taken again), and a cell diff that
arrives after its tombstone is logged already erased. An erased row is never read back
(``cell`` and ``scan`` skip it): what repair carries for that cell is the tombstone. The
engine routes a tombstone by the cell diff it replaces within the step that puts it, so
that diff stays readable from memory until the next ``put`` (``_fading``).
"""

from __future__ import annotations

import functools
import threading

from mesh.control import control_key
from mesh.errors import WireError
from mesh.wire import DATA_KINDS, CellPayload, Diff, DiffKind, TombstonePayload, decode_signed

from .database import Database, Transaction
from .erasure import Erasure
from .quarantine import Quarantine

__all__ = ["SqliteDiffLog", "erase_cell_diffs", "tombstones_of"]


class SqliteDiffLog:
    def __init__(self, db: Database, quarantine: Quarantine | None = None, erasure: Erasure | None = None) -> None:
        self.db = db
        self._erasure = erasure
        self.quarantine = quarantine if quarantine is not None else Quarantine(db)
        self._decode = self.quarantine.decode_logged
        self._held: set[tuple[str, int]] = set()
        self._max_seq: dict[str, int] = {}
        for origin, seq in [*db.query("SELECT origin, seq FROM mesh_log"), *self.quarantine.held()]:
            self._held.add((origin, seq))
            if seq > self._max_seq.get(origin, 0):
                self._max_seq[origin] = seq
        self._pending_cells: dict[str, Diff] = {}
        # cell id -> the origins whose tombstone for it is held (a cell diff from one of them is erased)
        self._tombstoned: dict[str, set[str]] = {}
        for cell_id, origin in db.query("SELECT cell_id, origin FROM mesh_log WHERE kind = ?", (int(DiffKind.TOMBSTONE),)):
            self._tombstoned.setdefault(cell_id, set()).add(origin)
        self._fading: dict[str, Diff] = {}  # cell diffs erased by the last put, still routable within its step
        self._rows: list[tuple[tuple, Diff]] = []  # put, not yet taken by a write job
        self._rows_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._held)

    def has(self, origin: str, seq: int) -> bool:
        return (origin, seq) in self._held

    def max_seq(self, origin: str) -> int:
        return self._max_seq.get(origin, 0)

    def put(self, diff: Diff, received_at: int) -> bool:
        key = (diff.origin, diff.seq)
        if key in self._held:
            return False
        self._held.add(key)
        if diff.seq > self._max_seq.get(diff.origin, 0):
            self._max_seq[diff.origin] = diff.seq
        self._fading.clear()
        cell_id = None
        signed = diff.signed
        if isinstance(diff.payload, CellPayload):
            cell_id = diff.payload.node_id
            if diff.origin in self._tombstoned.get(cell_id, ()):
                signed = b""  # forgotten before it got here: held, never written with its content
            else:
                self._pending_cells[cell_id] = diff
        elif isinstance(diff.payload, TombstonePayload):
            cell_id = diff.payload.cell_id
            held = self.cell(cell_id)
            if held is not None and held.origin == diff.origin:
                self._fading[cell_id] = held
            self._tombstoned.setdefault(cell_id, set()).add(diff.origin)
        else:  # a control diff: its key, so the entries it supersedes can go
            kind, name = control_key(diff)
            cell_id = f"~{kind}:{name}"
        row = (
            diff.origin, diff.seq, int(diff.kind), int(diff.kind in DATA_KINDS), cell_id, received_at,
            signed, diff.signature, diff.hops, diff.ttl,
        )  # fmt: skip
        with self._rows_lock:
            self._rows.append((row, diff))
            first = len(self._rows) == 1
        if first:  # otherwise the job already queued takes this row too
            self.db.submit(self._write_rows())
        return True

    def _write_rows(self):
        """One write job for every row put until it runs: a frame of 50 diffs is one job, not 50."""
        taken: list[tuple[tuple, Diff]] | None = None

        def job(tx: Transaction) -> None:
            nonlocal taken
            if taken is None:  # a batch that fails is run again: it must write the same rows
                with self._rows_lock:
                    taken, self._rows = self._rows, []
            for row, diff in taken:
                tx.execute(
                    "INSERT OR IGNORE INTO mesh_log (origin, seq, kind, is_data, cell_id, received_at, signed, "
                    "signature, hops, ttl) VALUES (?,?,?,?,?,?,?,?,?,?)",
                    row,
                )
                if isinstance(diff.payload, CellPayload):
                    tx.after_commit(functools.partial(self._pending_cells.pop, diff.payload.node_id, None))
                elif isinstance(diff.payload, TombstonePayload):
                    if erase_cell_diffs(tx, diff.payload.cell_id, diff.origin) and self._erasure is not None:
                        tx.after_commit(self._erasure.erased)
                elif diff.kind not in DATA_KINDS:  # one row per control key: every restart re-announces
                    tx.execute(
                        "DELETE FROM mesh_log WHERE origin = ? AND cell_id = ? AND is_data = 0 AND seq < ?",
                        (diff.origin, row[4], diff.seq),
                    )

        return job

    def signature(self, origin: str, seq: int) -> bytes | None:
        """Asked only of a diff we hold a copy of (a duplicate), to tell a fork from it."""
        if (origin, seq) not in self._held:
            return None
        with self._rows_lock:
            for row, diff in self._rows:
                if diff.origin == origin and diff.seq == seq:
                    return diff.signature
        row = self.db.query_one("SELECT signature FROM mesh_log WHERE origin = ? AND seq = ?", (origin, seq))
        return bytes(row[0]) if row else None

    def cell(self, cell_id: str) -> Diff | None:
        pending = self._fading.get(cell_id) or self._pending_cells.get(cell_id)
        if pending is not None:
            return pending
        row = self.db.query_one(
            "SELECT origin, seq, signed, signature, hops, ttl FROM mesh_log WHERE cell_id = ? AND kind = ? "
            "AND length(signed) > 0 ORDER BY lsn LIMIT 1",
            (cell_id, int(DiffKind.CELL)),
        )
        return self._decode(*row) if row else None

    def forgotten(self, cell_id: str, origin: str) -> bool:
        return origin in self._tombstoned.get(cell_id, ())

    def control_diffs(self) -> list[Diff]:
        """Every control diff in the log, in log order (read once, when the engine starts)."""
        rows = self.db.query(
            "SELECT origin, seq, signed, signature, hops, ttl FROM mesh_log WHERE is_data = 0 ORDER BY lsn",
        )
        decoded = (self._decode(*row) for row in rows)
        return [diff for diff in decoded if diff is not None]

    def put_key(self, origin: str, public_key: bytes, proof: bytes) -> None:
        row = (origin, public_key, proof)
        self.db.submit(lambda tx: tx.execute(
            "INSERT INTO mesh_keys (origin, public_key, proof) VALUES (?,?,?) "
            "ON CONFLICT (origin) DO UPDATE SET public_key = excluded.public_key, proof = excluded.proof",
            row,
        ))  # fmt: skip

    def keys(self) -> list[tuple[str, bytes, bytes]]:
        return [(origin, bytes(key), bytes(proof)) for origin, key, proof in
                self.db.query("SELECT origin, public_key, proof FROM mesh_keys")]  # fmt: skip

    def scan(self, after: int, limit: int) -> list[tuple[int, int, Diff]]:
        out: list[tuple[int, int, Diff]] = []
        while True:  # a row refused on the way is made up for: a short page means the log ended
            wanted = limit - len(out)
            rows = self.db.query(
                "SELECT lsn, received_at, origin, seq, signed, signature, hops, ttl FROM mesh_log "
                "WHERE is_data = 1 AND lsn > ? AND length(signed) > 0 ORDER BY lsn LIMIT ?",
                (after, wanted),
            )
            for lsn, received_at, *rest in rows:
                diff = self._decode(*rest)
                if diff is not None:
                    out.append((lsn, received_at, diff))
            if len(rows) < wanted or len(out) >= limit:
                return out
            after = rows[-1][0]


# -- forgetting ------------------------------------------------------------------------


def erase_cell_diffs(tx: Transaction, cell_id: str, origin: str) -> int:
    """Erase the signed bytes (content, vector, metadata) of every diff of ``cell_id`` from
    ``origin`` that this node logged or set aside; the rows stay, so they still count as
    held. Returns how many rows were erased."""
    kind = int(DiffKind.CELL)
    erased = tx.execute(
        "UPDATE mesh_log SET signed = x'' WHERE cell_id = ? AND kind = ? AND origin = ? AND length(signed) > 0",
        (cell_id, kind, origin),
    ).rowcount
    return erased + tx.execute(
        "UPDATE mesh_quarantine SET signed = NULL WHERE cell_id = ? AND kind = ? AND origin = ? AND signed IS NOT NULL",
        (cell_id, kind, origin),
    ).rowcount


def tombstones_of(tx: Transaction, cell_ids: list[str]) -> dict[str, dict[str, int]]:
    """The tombstones this node's log holds for ``cell_ids``: cell id -> {origin: forgotten_at}
    (a cell that arrives after its tombstone is written as a tombstone, never with content)."""
    found: dict[str, dict[str, int]] = {}
    for start in range(0, len(cell_ids), 500):
        chunk = cell_ids[start : start + 500]
        rows = tx.execute(
            f"SELECT origin, seq, signed, signature, hops, ttl FROM mesh_log WHERE kind = ? "
            f"AND cell_id IN ({','.join('?' * len(chunk))})",
            (int(DiffKind.TOMBSTONE), *chunk),
        ).fetchall()
        for origin, _, signed, signature, hops, ttl in rows:
            try:
                diff = decode_signed(bytes(signed), bytes(signature), hops, ttl)
            except WireError:
                continue
            if isinstance(diff.payload, TombstonePayload):
                found.setdefault(diff.payload.cell_id, {})[origin] = diff.payload.forgotten_at
    return found
