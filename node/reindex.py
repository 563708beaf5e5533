"""``hyphae reindex``: bring every vector into the configured embedder's space.

One index never mixes embedding spaces (DESIGN §5): after ``[embedder]`` changes, cells
and beacons written under the old embedder are left out of the indexes until they are
embedded again. Reindexing does that from their content, in batches, then rebuilds the
HNSW indexes from SQLite.

Safe to interrupt. The index files are deleted *before* the first vector changes, so
whatever happens next, the node rebuilds its indexes from the database when it opens.
Each batch of new vectors is one transaction, and only rows still in another space are
picked up, so running ``hyphae reindex`` again continues where it stopped.

It needs the data dir to itself (the data-dir lock): the CLI refuses while a daemon runs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import trio

from .config import load_config
from .store.database import Database, Transaction
from .embedding import Embedder, load_embedder
from .errors import ConfigError
from .lock import DataDirLock
from .service import MemoryService

__all__ = ["reindex"]

BATCH = 64
Progress = Callable[[str, int, int], None]  # (what, done, total)

_TABLES = {
    # table: (key column, text column, live-row condition)
    "cells": ("rowid", "content", "forgotten_at IS NULL"),
    "beacons": ("beacon_id", "query", "removed_at IS NULL"),
}


def _stale(db: Database, table: str, space: str) -> int:
    _, _, live = _TABLES[table]
    (count,) = db.query_one(f"SELECT COUNT(*) FROM {table} WHERE {live} AND embedding_space != ?", (space,))
    return count


async def _re_embed(db: Database, table: str, embedder: Embedder, total: int, progress: Progress | None) -> int:
    key, text, live = _TABLES[table]
    space, done = embedder.space, 0
    while True:
        rows = db.query(
            f"SELECT {key}, {text} FROM {table} WHERE {live} AND embedding_space != ? ORDER BY {key} LIMIT ?",
            (space, BATCH),
        )
        if not rows:
            return done
        vectors = await trio.to_thread.run_sync(embedder.embed, [row[1] for row in rows])

        def job(tx: Transaction, rows=rows, vectors=vectors) -> int:
            changed = 0
            for (row_key, _), vector in zip(rows, vectors):
                changed += tx.execute(
                    f"UPDATE {table} SET embedding = ?, embedding_space = ? WHERE {key} = ? AND embedding_space != ?",
                    (np.asarray(vector, dtype=np.float32).tobytes(), space, row_key, space),
                ).rowcount
            return changed

        changed = await db.write(job)
        if not changed:  # nothing moved: do not spin
            return done
        done += len(rows)
        if progress is not None:
            progress(f"re-embedding {table}", done, total)


def _drop_index_files(index_dir: Path) -> None:
    if index_dir.is_dir():
        for path in index_dir.iterdir():
            if path.is_file():
                path.unlink()


async def reindex(
    home: Path, *, embedder: Embedder | None = None, rebuild: bool = False, progress: Progress | None = None
) -> dict[str, Any]:
    """Re-embed what is not in the embedder's space and rebuild the indexes (when anything
    changed, or always with ``rebuild``). Returns what was done."""
    config = load_config(home)
    lock = DataDirLock(config.lock_path)
    await trio.to_thread.run_sync(lock.acquire, 0)
    try:
        if embedder is None:
            try:
                embedder = await trio.to_thread.run_sync(load_embedder, config.embedder)
            except ValueError as exc:
                raise ConfigError(f"{home / 'config.toml'} [embedder]: {exc}") from None
        space = await trio.to_thread.run_sync(lambda: embedder.space)
        db = await trio.to_thread.run_sync(Database, config.db_path)
        try:
            stale = {table: _stale(db, table, space) for table in _TABLES}
            rebuild = rebuild or any(stale.values())
            if rebuild:
                await trio.to_thread.run_sync(_drop_index_files, config.index_dir)
            done = {table: await _re_embed(db, table, embedder, stale[table], progress) for table in _TABLES}
        finally:
            await trio.to_thread.run_sync(db.close)
        layers: dict[str, str] = {}
        if rebuild:

            def rebuilt(layer: str, done_rows: int, total: int) -> None:
                if progress is not None:
                    progress(f"rebuilding {layer}", done_rows, total)

            service = await MemoryService.open(config, embedder=embedder, progress=rebuilt)
            layers = dict(service.layers.open_report)
            await service.aclose()
        return {"embedding_space": space, "cells": done["cells"], "beacons": done["beacons"], "rebuilt": rebuild, "layers": layers}
    finally:
        lock.release()
