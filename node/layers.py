"""The three layer indexes (L0, L1, L2), kept in step with the database.

``layer_members`` records, in order, every cell that joined a layer. Each index file
remembers the last ``seq`` it covers, so opening a node loads the files and adds only
the newer members (their vectors are read from SQLite: nothing is re-embedded). When
a file is missing, corrupt or stale, that layer is rebuilt from SQLite and the reason
is logged. Cells stored in another embedding space stay out of the indexes until the
node is re-indexed: one index never mixes fingerprints.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .catalog import CellCatalog
from .cells import LAYERS
from .database import Database
from .index import LayerIndex

__all__ = ["LayerSet"]

log = logging.getLogger("hyphae.layers")

Progress = Callable[[str, int, int], None]
_CHUNK = 20_000


class LayerSet:
    def __init__(self, db: Database, index_dir: Path, dim: int, space: str) -> None:
        self.db = db
        self.dim = dim
        self.space = space
        self.catalog = CellCatalog()
        index_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir = index_dir
        self.indexes = {layer: self._fresh(layer) for layer in LAYERS}
        self.open_report: dict[str, str] = {}

    def _fresh(self, layer: str) -> LayerIndex:
        return LayerIndex(self.index_dir, layer, self.dim, self.space)

    def open(self, progress: Progress | None = None) -> dict[str, str]:
        """Load the catalogue and each index, catching up or rebuilding. Blocking."""
        conn = self.db.reader()
        rows = conn.execute(
            "SELECT rowid, node_id, tenant_id, project, cell_type, forgotten_at IS NULL FROM cells"
        )
        self.catalog.add_many((r[0], r[1], r[2], r[3], r[4], bool(r[5])) for r in rows)
        for layer, index in self.indexes.items():
            outcome = index.load()
            if not outcome.loaded and outcome.reason != "missing":
                log.warning("rebuilding the %s index from the database: %s", layer, outcome.reason)
            added = self._catch_up(layer, index, progress)
            state = "loaded" if outcome.loaded else f"rebuilt ({outcome.reason})"
            self.open_report[layer] = f"{state}, {added} rows added, {len(index)} live"
            if added or not outcome.loaded:
                index.save()
        return self.open_report

    def _catch_up(self, layer: str, index: LayerIndex, progress: Progress | None) -> int:
        conn = self.db.reader()
        (last_seq,) = conn.execute(
            "SELECT COALESCE(MAX(seq), 0) FROM layer_members WHERE layer = ?", (layer,)
        ).fetchone()
        if last_seq < index.covered_seq:
            # The files cover members this database never had: not ours.
            log.warning("the %s index is ahead of the database; rebuilding", layer)
            index = self.indexes[layer] = self._fresh(layer)
        start = index.covered_seq
        (total,) = conn.execute(
            "SELECT COUNT(*) FROM layer_members WHERE layer = ? AND seq > ?", (layer, start)
        ).fetchone()
        added = 0
        while True:
            rows = conn.execute(
                """SELECT m.seq, m.cell_rowid, c.embedding, c.embedding_space, c.forgotten_at
                   FROM layer_members m JOIN cells c ON c.rowid = m.cell_rowid
                   WHERE m.layer = ? AND m.seq > ? ORDER BY m.seq LIMIT ?""",
                (layer, start, _CHUNK),
            ).fetchall()
            if not rows:
                break
            start = rows[-1][0]
            usable = [r for r in rows if r[4] is None and r[3] == self.space]
            if usable:
                labels = np.array([r[1] for r in usable], dtype=np.int64)
                vectors = np.frombuffer(b"".join(r[2] for r in usable), dtype=np.float32).reshape(-1, self.dim)
                index.add(labels, vectors, covered_seq=start)
                added += len(usable)
            else:
                index.covered_seq = max(index.covered_seq, start)
            if progress:
                progress(layer, min(added, total), total)
        index.covered_seq = max(index.covered_seq, last_seq)
        return added

    # -- called after commit, from the writer thread ------------------------------

    def add(self, layer: str, seq: int, rowid: int, vector: np.ndarray) -> None:
        self.indexes[layer].add(np.array([rowid], dtype=np.int64), vector.reshape(1, -1), covered_seq=seq)

    def remove(self, rowid: int) -> None:
        self.catalog.kill(rowid)
        for index in self.indexes.values():
            index.remove(np.array([rowid], dtype=np.int64))

    # -- reads --------------------------------------------------------------------

    def search(self, layer: str, vector: np.ndarray, k: int, allowed) -> list[tuple[int, float]]:
        return self.indexes[layer].search(vector, k, allowed=allowed)

    def save(self, min_dirty: int = 1) -> None:
        """Persist every index with at least ``min_dirty`` unsaved changes. Blocking."""
        for index in self.indexes.values():
            if index.dirty >= min_dirty:
                index.save()

    def sizes(self) -> dict[str, int]:
        return {layer: len(index) for layer, index in self.indexes.items()}

