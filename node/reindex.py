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

import trio

from .config import load_config
from .data_dir import require_database
from .embedding import Embedder, load_embedder
from .errors import ConfigError
from .lock import DataDirLock
from .service import MemoryService
from .store import Store
from .store.maintenance import RE_EMBEDDED

__all__ = ["reindex"]

BATCH = 64
Progress = Callable[[str, int, int], None]  # (what, done, total)

async def _re_embed(store: Store, table: str, embedder: Embedder, total: int, progress: Progress | None) -> int:
    space, done = embedder.space, 0
    while True:
        rows = store.reembedding.batch(table, space, BATCH)
        if not rows:
            return done
        vectors = await trio.to_thread.run_sync(embedder.embed, [row[1] for row in rows])
        keys = [row[0] for row in rows]
        changed = await store.db.write(lambda tx: store.reembedding.replace(tx, table, keys, vectors, space))
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
    require_database(config)
    lock = DataDirLock(config.lock_path)
    await trio.to_thread.run_sync(lock.acquire, 0)
    try:
        if embedder is None:
            try:
                embedder = await trio.to_thread.run_sync(load_embedder, config.embedder)
            except ValueError as exc:
                raise ConfigError(f"{home / 'config.toml'} [embedder]: {exc}") from None
        space = await trio.to_thread.run_sync(lambda: embedder.space)
        store = await trio.to_thread.run_sync(Store.open, config.db_path)
        try:
            stale = {table: store.reembedding.count(table, space) for table in RE_EMBEDDED}
            rebuild = rebuild or any(stale.values())
            if rebuild:
                await trio.to_thread.run_sync(_drop_index_files, config.index_dir)
            done = {table: await _re_embed(store, table, embedder, stale[table], progress) for table in RE_EMBEDDED}
        finally:
            await trio.to_thread.run_sync(store.close)
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
