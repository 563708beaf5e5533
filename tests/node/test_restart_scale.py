"""A node with 100,000 cells restarts from its saved indexes: no rebuild, no re-embedding.

The vectors are 16-dimensional and the graph is built with small HNSW parameters, so the
test builds its 100k-row index in seconds; what it checks (the files are loaded, only
rows newer than the saved watermark are added, nothing is embedded) does not depend on
the dimension. Cold-start time at 100k with real 384-d vectors is a benchmark
(benchmarks/store_bench.py), not an assertion.
"""

from __future__ import annotations

import json

import numpy as np
import trio

from app.home import open_node

N = 100_000
DIM = 16
FAST_INDEX = {"m": 8, "ef_construction": 16, "ef_search": 32}


class RefusingEmbedder:
    """Proves nothing is re-embedded: any call fails the test."""

    dim = DIM
    space = "test-frozen/16/v1"

    def embed(self, texts):
        raise AssertionError(f"re-embedding {len(texts)} texts on restart")


def bulk_insert(service, vectors: np.ndarray, start: int = 0) -> None:
    def job(tx):
        tx.conn.executemany(
            "INSERT INTO cells (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, energy0, "
            "metadata, created_at, stored_at, layer, embedding, embedding_space) "
            "VALUES (?, ?, 'bulk-agent', ?, ?, 'Fact', 0.5, 0.3, '{}', 1, 1, 'L0', ?, ?)",
            (
                (f"00000000-0000-4000-8000-{start + i:012d}", service.config.tenant_id, service.node_id,
                 f"cell {start + i}", vectors[i].tobytes(), RefusingEmbedder.space)
                for i in range(len(vectors))
            ),
        )
        tx.execute(
            "INSERT INTO layer_members (layer, cell_rowid) SELECT 'L0', rowid FROM cells WHERE rowid > "
            "COALESCE((SELECT MAX(cell_rowid) FROM layer_members), 0) ORDER BY rowid"
        )

    service.db.write_sync(job)


async def test_restart_with_100k_cells_loads_the_index_without_rebuild_or_re_embedding(home):
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((N + 10, DIM)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    options = {"embedder": RefusingEmbedder(), "index_options": FAST_INDEX}
    with trio.fail_after(240):
        async with open_node(home, **options) as service:
            await trio.to_thread.run_sync(bulk_insert, service, vectors[:N])
        # First open after the bulk load builds the index from SQLite and saves it.
        async with open_node(home, **options) as service:
            assert service.layers.open_report["L0"].startswith("loaded, 100000 rows added")
        meta = json.loads((home / "index" / "L0.meta.json").read_text())
        assert meta["count"] == N

        # Restart: the files are loaded as they are.
        async with open_node(home, **options) as service:
            assert service.layers.open_report["L0"] == f"loaded, 0 rows added, {N} live"
            probe = vectors[12_345]
            hits = service.layers.search("L0", probe, 1, None)
            assert service.layers.catalog.node_id(hits[0][0]) == "00000000-0000-4000-8000-000000012345"
            # Ten rows land in SQLite behind the index's back (as after a crash before a save).
            await trio.to_thread.run_sync(bulk_insert, service, vectors[N:], N)
            service.layers.indexes["L0"]._dirty = 0  # pretend the close-time save has nothing to write
            service.layers.save = lambda min_dirty=1: None  # and skip it: only the old files remain

        async with open_node(home, **options) as service:
            assert service.layers.open_report["L0"] == f"loaded, 10 rows added, {N + 10} live"
