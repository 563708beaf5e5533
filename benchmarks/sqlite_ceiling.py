"""The ceiling of durable SQLite inserts on this machine, for reading the store figures.

Runs the same two inserts a store makes (the cell row with its 1.5 KB vector, its layer
membership) in batches of ``--batch`` per transaction, with synchronous OFF and FULL:

    python benchmarks/sqlite_ceiling.py --cells 4000 --batch 40
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.store.schema import migrate  # noqa: E402


def run(sync: str, cells: int, batch: int) -> float:
    path = Path(tempfile.mkdtemp()) / "ceiling.db"
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {sync}")
    migrate(conn)
    vector = np.random.default_rng(1).random(384, dtype=np.float32).tobytes()
    started = time.perf_counter()
    for _ in range(cells // batch):
        conn.execute("BEGIN IMMEDIATE")
        for _ in range(batch):
            rowid = conn.execute(
                "INSERT INTO cells (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, "
                "energy0, metadata, created_at, stored_at, layer, embedding, embedding_space) "
                "VALUES (?, 't', 'a', 'o', 'a memory', 'Fact', 0.5, 0.3, '{}', 1, 1, 'L0', ?, 's')",
                (str(uuid.uuid4()), vector),
            ).lastrowid
            conn.execute("INSERT INTO layer_members (layer, cell_rowid) VALUES ('L0', ?)", (rowid,))
        conn.execute("COMMIT")
    return cells / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cells", type=int, default=4000)
    parser.add_argument("--batch", type=int, default=40)
    args = parser.parse_args()
    for sync in ("OFF", "FULL"):
        print(f"synchronous={sync}: {run(sync, args.cells, args.batch):,.0f} cells/s (batches of {args.batch})")


if __name__ == "__main__":
    main()
