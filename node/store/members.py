"""What the layer indexes are built from: ``layer_members`` and the cells' catalogue.

``layer_members`` records which cells each layer holds, in the order they joined it. The
index files remember the last ``seq`` they cover; opening a node reads what they lack
from here (with the cells' vectors), and a stored or promoted cell joins a layer with
:meth:`LayerMembers.join` in the job that writes it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["LayerMembers"]


class LayerMembers:
    def __init__(self, db: Database) -> None:
        self.db = db

    def join(self, tx: Transaction, layer: str, rowid: int) -> int:
        """Add a cell to a layer; its member seq. Only for a cell not in the layer yet: when the
        insert is ignored, sqlite3 reports the connection's last rowid, not 0."""
        return tx.execute(
            "INSERT OR IGNORE INTO layer_members (layer, cell_rowid) VALUES (?, ?)", (layer, rowid)
        ).lastrowid

    def extent(self, layer: str) -> tuple[int, int]:
        """``(members, last seq)`` of a layer."""
        return self.db.reader().execute(
            "SELECT COUNT(*), COALESCE(MAX(seq), 0) FROM layer_members WHERE layer = ?", (layer,)
        ).fetchone()

    def count_after(self, layer: str, seq: int) -> int:
        (count,) = self.db.reader().execute(
            "SELECT COUNT(*) FROM layer_members WHERE layer = ? AND seq > ?", (layer, seq)
        ).fetchone()
        return count

    def last_seq(self, layer: str) -> int:
        (last_seq,) = self.db.reader().execute(
            "SELECT COALESCE(MAX(seq), 0) FROM layer_members WHERE layer = ?", (layer,)
        ).fetchone()
        return last_seq

    def after(self, layer: str, seq: int, limit: int) -> list[tuple[int, int, bytes, str, int | None]]:
        """The next ``limit`` members after ``seq``: ``(seq, rowid, vector bytes, space, forgotten_at)``."""
        return self.db.reader().execute(
            """SELECT m.seq, m.cell_rowid, c.embedding, c.embedding_space, c.forgotten_at
               FROM layer_members m JOIN cells c ON c.rowid = m.cell_rowid
               WHERE m.layer = ? AND m.seq > ? ORDER BY m.seq LIMIT ?""",
            (layer, seq, limit),
        ).fetchall()

    def catalog_entries(self) -> Iterator[tuple[int, str, str, str | None, str, str, bool]]:
        """Every cell as the catalogue holds it: (rowid, node_id, tenant, project, type, agent, alive)."""
        rows = self.db.reader().execute(
            "SELECT rowid, node_id, tenant_id, project, cell_type, source_agent, forgotten_at IS NULL FROM cells"
        )
        return ((*r[:6], bool(r[6])) for r in rows)
