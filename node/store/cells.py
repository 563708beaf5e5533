"""The ``cells`` table: the one insert path of a cell, and every read and update of one.

A cell row is written once, whole, by :meth:`CellStore.insert` (a local store, a cell from
the mesh, an imported cell or an imported tombstone alike); afterwards only its layer,
its recall count and, when it is forgotten, its erasure change. Rows come back as
:class:`StoredCell` with their JSON columns decoded; shaping them for a surface is the
facade's business.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..cells import Cell
from .lexical import LexicalIndex

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["CellStore", "StoredCell"]

_WRITTEN = (
    "node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, energy0, scene_id, session_id, "
    "project, source_ref, metadata, created_at, stored_at, layer, embedding, embedding_space, hops, signature"
)
# Two statements, one row encoding: a live cell (every store) binds only the twenty columns it
# has, forgotten_at and forgotten_by keeping their NULL defaults; a tombstone adds those two.
_INSERT = f"INSERT INTO cells ({_WRITTEN}) VALUES ({','.join('?' * 20)})"
_INSERT_TOMBSTONE = f"INSERT INTO cells ({_WRITTEN}, forgotten_at, forgotten_by) VALUES ({','.join('?' * 22)})"
_COLUMNS = (
    "rowid, node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, energy0, "
    "scene_id, session_id, project, source_ref, metadata, created_at, layer, embedding_space, hops, "
    "signature IS NOT NULL, forgotten_at, forgotten_by, superseded_by, stale_at, stale_reason"
)
# What a tombstone keeps of its metadata: links to other cells, never words of its own.
_KEPT_METADATA = ("supersedes",)
_RECORD_COLUMNS = (
    "node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, created_at, layer, "
    "embedding, embedding_space, scene_id, session_id, project, source_ref, metadata, hops, signature"
)


class StoredCell(NamedTuple):
    """A cell row as the facade reads it (no vector; ``signed`` says a signature is kept)."""

    rowid: int
    node_id: str
    tenant_id: str
    source_agent: str
    origin_node: str
    content: str
    cell_type: str
    salience: float
    energy0: float
    scene_id: str | None
    session_id: str | None
    project: str | None
    source_ref: dict[str, str] | None
    metadata: dict[str, Any]
    created_at: int
    layer: str
    embedding_space: str
    hops: int
    signed: bool
    forgotten_at: int | None
    forgotten_by: str | None
    superseded_by: str | None = None  # node.lifecycle: the cell that replaced this one
    stale_at: int | None = None  # when `hyphae validate` found its source file changed or gone
    stale_reason: str | None = None


def _stored(row: tuple) -> StoredCell:
    source_ref, metadata = row[12], row[13]
    return StoredCell(
        *row[:12], json.loads(source_ref) if source_ref else None, json.loads(metadata), *row[14:18], bool(row[18]),
        *row[19:24],
    )  # fmt: skip


class CellStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.lexical = LexicalIndex(db)  # kept in step here: on insert and on erasure, same transaction

    def _conn(self, tx: Transaction | None) -> Any:
        """The job's transaction when there is one, else this thread's reader."""
        return tx if tx is not None else self.db.reader()

    # -- the one insert path ---------------------------------------------------------

    def insert(self, tx: Transaction, cell: Cell, *, energy0: float, layer: str, stored_at: int) -> int:
        """Write ``cell`` as a new row (a live one joins the lexical index in the same
        transaction); returns its rowid. A cell with ``forgotten_at`` set is written as a
        tombstone: no content, no vector, no index entry, forgotten by its author."""
        live = cell.forgotten_at is None
        source_ref = json.dumps(cell.source_ref) if cell.source_ref else None
        values = (
            cell.node_id, cell.tenant_id, cell.source_agent, cell.origin_node, cell.content if live else "",
            cell.cell_type, cell.salience, energy0, cell.scene_id, cell.session_id, cell.project, source_ref,
            json.dumps(cell.metadata, separators=(",", ":")) if cell.metadata else "{}", cell.created_at, stored_at,
            layer, np.asarray(cell.embedding, dtype=np.float32).tobytes() if live else b"", cell.embedding_space,
            cell.hops, cell.signature,
        )  # fmt: skip
        if live:
            rowid = tx.execute(_INSERT, values).lastrowid
            self.lexical.add(tx, rowid, cell.content, source_ref)
            return rowid
        return tx.execute(_INSERT_TOMBSTONE, (*values, cell.forgotten_at, cell.source_agent)).lastrowid

    def exists(self, node_id: str, tx: Transaction | None = None) -> bool:
        return self._conn(tx).execute("SELECT 1 FROM cells WHERE node_id = ?", (node_id,)).fetchone() is not None

    # -- idempotency keys ----------------------------------------------------------------

    def idempotent(self, agent_id: str, key: str, tx: Transaction | None = None) -> str | None:
        """The cell an agent already stored under ``key``, if any."""
        row = self._conn(tx).execute(
            "SELECT node_id FROM idempotency WHERE agent_id = ? AND key = ?", (agent_id, key)
        ).fetchone()
        return row[0] if row else None

    def remember_idempotency(self, tx: Transaction, agent_id: str, key: str, node_id: str, created_at: int) -> None:
        tx.execute(
            "INSERT INTO idempotency (agent_id, key, node_id, created_at) VALUES (?,?,?,?)",
            (agent_id, key, node_id, created_at),
        )

    # -- reads -------------------------------------------------------------------------

    def by_node_id(self, node_id: str) -> StoredCell | None:
        row = self.db.query_one(f"SELECT {_COLUMNS} FROM cells WHERE node_id = ?", (node_id,))
        return None if row is None else _stored(row)

    def by_rowids(self, rowids: list[int]) -> dict[int, StoredCell]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self.db.query(f"SELECT {_COLUMNS} FROM cells WHERE rowid IN ({marks})", rowids)
        return {r[0]: _stored(r) for r in rows}

    def page(
        self, tenant_id: str, projects: tuple[str, ...], before: int, limit: int, *, include_superseded: bool = True
    ) -> list[StoredCell]:
        """The tenant's cells below rowid ``before``, newest first; with ``projects``, only
        tenant-wide cells and those of the projects."""
        scope, projects = "", list(projects)
        if projects:
            scope = f" AND (project IS NULL OR project IN ({','.join('?' * len(projects))}))"
        if not include_superseded:
            scope += " AND superseded_by IS NULL"
        rows = self.db.query(
            f"SELECT {_COLUMNS} FROM cells WHERE tenant_id = ? AND rowid < ?{scope} ORDER BY rowid DESC LIMIT ?",
            (tenant_id, before, *projects, limit),
        )
        return [_stored(r) for r in rows]

    def record(self, node_id: str) -> Cell | None:
        """A stored cell as the immutable record, vector and signature included."""
        row = self.db.query_one(f"SELECT {_RECORD_COLUMNS} FROM cells WHERE node_id = ?", (node_id,))
        if row is None:
            return None
        (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, created_at, layer, embedding,
         space, scene_id, session_id, project, source_ref, metadata, hops, signature) = row
        return Cell(
            node_id=node_id, tenant_id=tenant_id, source_agent=source_agent, origin_node=origin_node,
            content=content, cell_type=cell_type, salience=salience, created_at=created_at, layer=layer,
            embedding=np.frombuffer(embedding, dtype=np.float32), embedding_space=space, scene_id=scene_id,
            session_id=session_id, project=project, source_ref=json.loads(source_ref) if source_ref else None,
            metadata=json.loads(metadata), hops=hops, signature=signature,
        )  # fmt: skip

    def vectors(self, rowids: list[int]) -> dict[int, np.ndarray]:
        """The vectors of the live cells among ``rowids`` (a lexical hit's dense distance)."""
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self.db.query(
            f"SELECT rowid, embedding FROM cells WHERE rowid IN ({marks}) AND forgotten_at IS NULL", rowids
        )
        return {rowid: np.frombuffer(blob, dtype=np.float32) for rowid, blob in rows if blob}

    def recent(self, space: str, limit: int) -> list[tuple[str, bytes]]:
        """``(content, embedding bytes)`` of the newest ``limit`` live cells of one embedding
        space, oldest first (the admission judge's background at start-up)."""
        rows = self.db.query(
            "SELECT content, embedding FROM cells WHERE forgotten_at IS NULL AND layer != 'L2' "
            "AND embedding_space = ? ORDER BY rowid DESC LIMIT ?",
            (space, limit),
        )
        return rows[::-1]

    def live_count(self) -> int:
        (count,) = self.db.query_one("SELECT COUNT(*) FROM cells WHERE forgotten_at IS NULL")
        return count

    # -- scenes and sessions ---------------------------------------------------------------

    def in_session(self, tx: Transaction, session_id: str) -> int:
        """How many cells a session holds (its summary aside)."""
        (count,) = tx.execute(
            "SELECT COUNT(*) FROM cells WHERE session_id = ? AND layer != 'L2'", (session_id,)
        ).fetchone()
        return count

    def in_scene(self, scene_id: str) -> list[str]:
        """The ids of a scene's cells (its summary aside), oldest first."""
        rows = self.db.query(
            "SELECT node_id FROM cells WHERE scene_id = ? AND layer != 'L2' ORDER BY rowid", (scene_id,)
        )
        return [r[0] for r in rows]

    def summary_sources(self, scene_id: str, space: str) -> list[tuple]:
        """A scene's live cells in ``space`` as :func:`node.scenes.consolidate` takes them:
        ``(node_id, content, cell_type, salience, energy0, created_at, embedding bytes)``."""
        return self.db.query(
            "SELECT node_id, content, cell_type, salience, energy0, created_at, embedding FROM cells "
            "WHERE scene_id = ? AND forgotten_at IS NULL AND layer != 'L2' AND embedding_space = ? ORDER BY rowid",
            (scene_id, space),
        )

    # -- updates -----------------------------------------------------------------------------

    def forgotten_at(self, tx: Transaction, rowid: int) -> int | None:
        (forgotten_at,) = tx.execute("SELECT forgotten_at FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        return forgotten_at

    def tombstone_target(self, tx: Transaction, node_id: str) -> tuple[int, str, int | None] | None:
        """``(rowid, origin_node, forgotten_at)`` of a cell, if it is stored here."""
        return tx.execute("SELECT rowid, origin_node, forgotten_at FROM cells WHERE node_id = ?", (node_id,)).fetchone()

    def erase(self, tx: Transaction, rowid: int, forgotten_at: int, forgotten_by: str | None = None) -> None:
        """Make a cell a tombstone: content, vector, lexical index entry and metadata (which
        may repeat the content: an imported graph's observations) gone, the record and its
        links (``metadata.supersedes``) kept. Forgotten by ``forgotten_by``, or by its author
        when that is not given (a tombstone from the mesh)."""
        self.lexical.remove(tx, rowid)  # first: it reads the words to remove from the row
        (metadata,) = tx.execute("SELECT metadata FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        links = {k: v for k, v in json.loads(metadata or "{}").items() if k in _KEPT_METADATA}
        tx.execute(
            "UPDATE cells SET content = '', embedding = x'', metadata = ?, forgotten_at = ?, "
            "forgotten_by = COALESCE(?, source_agent) WHERE rowid = ?",
            (json.dumps(links, separators=(",", ":")), forgotten_at, forgotten_by, rowid),
        )

    def forgettable(
        self, tenant_id: str, origin_node: str, *, agent_id: str | None, project: str | None
    ) -> tuple[list[str], int]:
        """The live cells of ``tenant_id`` stored by ``agent_id`` and/or in ``project`` (both
        when both are given): the ids of those this node originated, oldest first, and how
        many came from other nodes (only their origin may forget them)."""
        where, args = ["tenant_id = ?", "forgotten_at IS NULL"], [tenant_id]
        if agent_id is not None:
            where.append("source_agent = ?")
            args.append(agent_id)
        if project is not None:
            where.append("project = ?")
            args.append(project)
        rows = self.db.query(f"SELECT node_id, origin_node FROM cells WHERE {' AND '.join(where)} ORDER BY rowid", args)
        own = [node_id for node_id, origin in rows if origin == origin_node]
        return own, len(rows) - len(own)

    def add_recall_hits(self, tx: Transaction, rowid: int, count: int) -> int:
        """Count ``count`` more top-ranked recalls of a cell; returns its total."""
        tx.execute("UPDATE cells SET recall_hits = recall_hits + ? WHERE rowid = ?", (count, rowid))
        (total,) = tx.execute("SELECT recall_hits FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        return total

    def promotable(self, tx: Transaction, rowid: int) -> np.ndarray | None:
        """The vector of a live L0 cell (one that may be promoted), else None."""
        row = tx.execute("SELECT layer, embedding, forgotten_at FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        if row is None or row[0] != "L0" or row[2] is not None:
            return None
        return np.frombuffer(row[1], dtype=np.float32)

    def set_layer(self, tx: Transaction, rowid: int, layer: str) -> None:
        tx.execute("UPDATE cells SET layer = ? WHERE rowid = ?", (layer, rowid))
