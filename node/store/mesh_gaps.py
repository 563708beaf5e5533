"""The gaps a crash can open between the cells and the mesh's diff log.

A cell and its diff are written by separate jobs, so a crash can commit one and not the
other. A node that starts again asks for both kinds of gap and closes them: a remote
cell whose diff was logged is stored, a local cell whose diff was lost is announced.
A logged cell in quarantine (:mod:`node.store.quarantine`) is no gap: it was set aside.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mesh.wire import Diff, DiffKind

if TYPE_CHECKING:
    from .database import Database
    from .quarantine import Quarantine

__all__ = ["MeshGaps"]


class MeshGaps:
    def __init__(self, db: Database, quarantine: Quarantine) -> None:
        self.db = db
        self.quarantine = quarantine

    def logged_not_stored(self, node_id: str) -> list[Diff]:
        """Cell diffs from other origins in the log whose cell is neither stored here nor set
        aside; a row that no longer decodes goes to the quarantine instead."""
        rows = self.db.query(
            "SELECT l.origin, l.seq, l.signed, l.signature, l.hops, l.ttl FROM mesh_log l WHERE l.kind = ? "
            "AND l.origin != ? AND length(l.signed) > 0 AND NOT EXISTS (SELECT 1 FROM cells c WHERE c.node_id = l.cell_id) "
            "AND NOT EXISTS (SELECT 1 FROM mesh_quarantine q WHERE q.origin = l.origin AND q.seq = l.seq)",
            (int(DiffKind.CELL), node_id),
        )
        decoded = (self.quarantine.decode_logged(*row) for row in rows)
        return [diff for diff in decoded if diff is not None]

    def stored_not_logged(self, node_id: str, window_ms: int) -> list[str]:
        """Live cells of this node stored within ``window_ms`` before its last logged diff
        whose own diff is not in the log."""
        row = self.db.query_one(
            "SELECT MAX(ts) FROM (SELECT received_at AS ts FROM mesh_log WHERE origin = ?)", (node_id,)
        )
        if not row or not row[0]:
            return []
        rows = self.db.query(
            "SELECT node_id FROM cells c WHERE c.origin_node = ? AND c.stored_at > ? AND c.forgotten_at IS NULL "
            "AND NOT EXISTS (SELECT 1 FROM mesh_log l WHERE l.cell_id = c.node_id)",
            (node_id, row[0] - window_ms),
        )
        return [cell_id for (cell_id,) in rows]

    def forgotten_not_logged(self, node_id: str) -> list[tuple[str, int]]:
        """``(id, forgotten_at)`` of this node's forgotten cells whose diff is in the log (the
        mesh was told of them) but whose tombstone is not."""
        return self.db.query(
            "SELECT c.node_id, c.forgotten_at FROM cells c WHERE c.origin_node = ? AND c.forgotten_at IS NOT NULL "
            "AND EXISTS (SELECT 1 FROM mesh_log l WHERE l.cell_id = c.node_id AND l.kind = ?) "
            "AND NOT EXISTS (SELECT 1 FROM mesh_log t WHERE t.cell_id = c.node_id AND t.kind = ?) ORDER BY c.rowid",
            (node_id, int(DiffKind.CELL), int(DiffKind.TOMBSTONE)),
        )
