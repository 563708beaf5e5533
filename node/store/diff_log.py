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
"""

from __future__ import annotations

import functools
import threading

from mesh.control import control_key
from mesh.wire import DATA_KINDS, CellPayload, Diff, DiffKind

from .database import Database, Transaction
from .quarantine import Quarantine

__all__ = ["SqliteDiffLog"]


class SqliteDiffLog:
    def __init__(self, db: Database, quarantine: Quarantine | None = None) -> None:
        self.db = db
        self.quarantine = quarantine if quarantine is not None else Quarantine(db)
        self._decode = self.quarantine.decode_logged
        self._held: set[tuple[str, int]] = set()
        self._max_seq: dict[str, int] = {}
        for origin, seq in [*db.query("SELECT origin, seq FROM mesh_log"), *self.quarantine.held()]:
            self._held.add((origin, seq))
            if seq > self._max_seq.get(origin, 0):
                self._max_seq[origin] = seq
        self._forgotten: set[tuple[str, str]] = {
            (cell_id, origin) for cell_id, origin in db.query(
                "SELECT cell_id, origin FROM mesh_log WHERE kind = ?", (int(DiffKind.TOMBSTONE),))
        }  # fmt: skip
        self._pending_cells: dict[str, Diff] = {}
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
        cell_id = None
        if isinstance(diff.payload, CellPayload):
            cell_id = diff.payload.node_id
            self._pending_cells[cell_id] = diff
        elif diff.kind in DATA_KINDS:
            cell_id = getattr(diff.payload, "cell_id", None)
            if diff.kind is DiffKind.TOMBSTONE:
                self._forgotten.add((cell_id, diff.origin))
        else:  # a control diff: its key, so the entries it supersedes can go
            kind, name = control_key(diff)
            cell_id = f"~{kind}:{name}"
        row = (
            diff.origin, diff.seq, int(diff.kind), int(diff.kind in DATA_KINDS), cell_id, received_at,
            diff.signed, diff.signature, diff.hops, diff.ttl,
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
        pending = self._pending_cells.get(cell_id)
        if pending is not None:
            return pending
        row = self.db.query_one(
            "SELECT origin, seq, signed, signature, hops, ttl FROM mesh_log WHERE cell_id = ? AND kind = ? "
            "ORDER BY lsn LIMIT 1",
            (cell_id, int(DiffKind.CELL)),
        )
        return self._decode(*row) if row else None

    def forgotten(self, cell_id: str, origin: str) -> bool:
        return (cell_id, origin) in self._forgotten

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
                "WHERE is_data = 1 AND lsn > ? ORDER BY lsn LIMIT ?",
                (after, wanted),
            )
            for lsn, received_at, *rest in rows:
                diff = self._decode(*rest)
                if diff is not None:
                    out.append((lsn, received_at, diff))
            if len(rows) < wanted or len(out) >= limit:
                return out
            after = rows[-1][0]
