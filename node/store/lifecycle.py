"""The SQL of a cell's lifecycle after it is written: supersede links, staleness, and the
inbox news they make (:mod:`node.lifecycle` decides; this module reads and writes rows).

A link ``old -> new`` is kept in ``supersessions`` whichever of the two cells arrives first,
so the order in which the mesh brings them does not matter; the old cell's row records its
successor once both are here and the rule allows it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["LifecycleStore", "CellFacts"]

_FACTS = (
    "rowid, node_id, tenant_id, source_agent, origin_node, project, cell_type, created_at, "
    "superseded_by, forgotten_at"
)


class CellFacts(NamedTuple):
    """What the supersede rule reads of a cell row."""

    rowid: int
    node_id: str
    tenant_id: str
    source_agent: str
    origin_node: str
    project: str | None
    cell_type: str
    created_at: int
    superseded_by: str | None
    forgotten_at: int | None


class FileRef(NamedTuple):
    """A cell whose source is a file, as ``hyphae validate`` re-checks it."""

    rowid: int
    node_id: str
    locator: str
    source_hash: str | None
    stale_at: int | None


class LifecycleStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- supersede links -------------------------------------------------------------------

    def facts(self, tx: Transaction, node_id: str) -> CellFacts | None:
        row = tx.execute(f"SELECT {_FACTS} FROM cells WHERE node_id = ?", (node_id,)).fetchone()
        return None if row is None else CellFacts(*row)

    def node_id_of(self, tx: Transaction, rowid: int) -> str | None:
        row = tx.execute("SELECT node_id FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        return row[0] if row else None

    def link(self, tx: Transaction, old_id: str, new_id: str) -> None:
        tx.execute("INSERT OR IGNORE INTO supersessions (old_id, new_id) VALUES (?, ?)", (old_id, new_id))

    def successors(self, tx: Transaction, old_id: str) -> list[str]:
        """The cells that name ``old_id`` as replaced (held here or not yet)."""
        return [r[0] for r in tx.execute("SELECT new_id FROM supersessions WHERE old_id = ?", (old_id,))]

    def replaced_by(self, tx: Transaction, new_id: str) -> list[str]:
        return [r[0] for r in tx.execute("SELECT old_id FROM supersessions WHERE new_id = ?", (new_id,))]

    def mark_superseded(self, tx: Transaction, rowid: int, successor: str | None, at: int | None) -> None:
        tx.execute("UPDATE cells SET superseded_by = ?, superseded_at = ? WHERE rowid = ?", (successor, at, rowid))

    def superseded_rowids(self) -> list[int]:
        """Every superseded cell (the catalogue's filter, loaded when the node opens)."""
        return [r[0] for r in self.db.query("SELECT rowid FROM cells WHERE superseded_by IS NOT NULL")]

    # -- the inbox's news ----------------------------------------------------------------------

    def receivers(self, tx: Transaction, rowid: int) -> list[tuple[str, str, float, float, int]]:
        """Who received a cell in their inbox: ``(agent_id, beacon_id, similarity, score, hops)``."""
        return tx.execute(
            "SELECT agent_id, beacon_id, similarity, COALESCE(score, similarity), hops FROM inbox "
            "WHERE cell_rowid = ? ORDER BY seq",
            (rowid,),
        ).fetchall()

    def local_author(self, tx: Transaction, agent_id: str) -> bool:
        """Is ``agent_id`` an agent of this node (an inbox of ours to tell)?"""
        return tx.execute("SELECT 1 FROM principals WHERE agent_id = ?", (agent_id,)).fetchone() is not None

    def tell(
        self, tx: Transaction, agent_id: str, rowid: int, *, kind: str, related: str, reason: str,
        beacon_id: str, similarity: float, score: float, received_at: int, hops: int,
    ) -> None:  # fmt: skip
        """An inbox entry that is news about a cell: it replaces any entry the agent had for
        the same cell, so the news shows as new (a later seq and time) and only once."""
        tx.execute("DELETE FROM inbox WHERE agent_id = ? AND cell_rowid = ?", (agent_id, rowid))
        tx.execute(
            "INSERT INTO inbox (agent_id, cell_rowid, beacon_id, similarity, score, reason, received_at, hops, "
            "kind, related) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (agent_id, rowid, beacon_id, similarity, score, reason, received_at, hops, kind, related),
        )

    # -- conflicts -----------------------------------------------------------------------------

    def active_rulings(self, tx: Transaction, tenant_id: str, project: str | None, space: str) -> list[tuple]:
        """Live, current Decisions and Constraints of one project (tenant-wide ones for
        None): ``(rowid, node_id, source_agent, origin_node, embedding bytes)``."""
        return tx.execute(
            "SELECT rowid, node_id, source_agent, origin_node, embedding FROM cells "
            "WHERE tenant_id = ? AND project IS ? AND cell_type IN ('Decision', 'Constraint') "
            "AND forgotten_at IS NULL AND superseded_by IS NULL AND embedding_space = ? AND layer != 'L2'",
            (tenant_id, project, space),
        ).fetchall()

    # -- staleness -----------------------------------------------------------------------------

    def record_source(
        self, tx: Transaction, rowid: int, digest: str | None, stale_at: int | None, stale_reason: str | None
    ) -> None:
        """A cell's source file hash (and stale mark, for an imported cell), as it is written."""
        tx.execute(
            "UPDATE cells SET source_hash = ?, stale_at = ?, stale_reason = ? WHERE rowid = ?",
            (digest, stale_at, stale_reason, rowid),
        )

    def file_refs(self, tenant_id: str, project: str | None, origin_node: str) -> list[FileRef]:
        """The live cells stored on this node whose source is a file (one project's, or all)."""
        scope, args = "", [tenant_id, origin_node]
        if project is not None:
            scope, args = " AND project = ?", [*args, project]
        rows = self.db.query(
            "SELECT rowid, node_id, json_extract(source_ref, '$.locator'), source_hash, stale_at FROM cells "
            "WHERE tenant_id = ? AND origin_node = ? AND forgotten_at IS NULL "
            f"AND json_extract(source_ref, '$.kind') = 'file'{scope} ORDER BY rowid",
            args,
        )
        return [FileRef(*r) for r in rows]

    def mark_stale(self, tx: Transaction, rowid: int, at: int | None, reason: str | None) -> None:
        """Set (or, with ``at`` None, clear) a cell's stale mark."""
        tx.execute("UPDATE cells SET stale_at = ?, stale_reason = ? WHERE rowid = ?", (at, reason, rowid))
