"""What the maintenance commands need of the database: ``hyphae reindex`` (vectors from
another embedding space, embedded again), ``hyphae doctor`` (read-only probes, beside a
running daemon) and joining a team (the node's rows move into the team's tenant).

The probes open the file read-only and raise :data:`ReadError` when it cannot be read;
the doctor reports that rather than failing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .database import Database

if TYPE_CHECKING:
    from .database import Transaction

__all__ = [
    "Reembedding", "RE_EMBEDDED", "ReadError", "schema_version", "active_agents", "cells_by_space", "quarantined",
    "move_tenant",
]  # fmt: skip

ReadError = sqlite3.Error

# The tables whose rows carry a vector: (key column, text embedded, live-row condition).
_VECTORS = {
    "cells": ("rowid", "content", "forgotten_at IS NULL"),
    "beacons": ("beacon_id", "query", "removed_at IS NULL"),
}
RE_EMBEDDED = tuple(_VECTORS)
_TENANT_TABLES = ("principals", "cells", "scenes", "sessions", "beacons")


class Reembedding:
    """Live rows whose vector is not in the embedder's space, and their new vectors."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def count(self, table: str, space: str) -> int:
        _, _, live = _VECTORS[table]
        (count,) = self.db.query_one(f"SELECT COUNT(*) FROM {table} WHERE {live} AND embedding_space != ?", (space,))
        return count

    def batch(self, table: str, space: str, limit: int) -> list[tuple[object, str]]:
        """The next ``limit`` rows outside ``space``: ``(key, text to embed)``."""
        key, text, live = _VECTORS[table]
        return self.db.query(
            f"SELECT {key}, {text} FROM {table} WHERE {live} AND embedding_space != ? ORDER BY {key} LIMIT ?",
            (space, limit),
        )

    def replace(
        self, tx: Transaction, table: str, keys: Sequence[object], vectors: Sequence[np.ndarray], space: str
    ) -> int:
        """Give each row its vector in ``space`` (rows moved there meanwhile are left alone);
        returns how many changed."""
        key = _VECTORS[table][0]
        changed = 0
        for row_key, vector in zip(keys, vectors):
            changed += tx.execute(
                f"UPDATE {table} SET embedding = ?, embedding_space = ? WHERE {key} = ? AND embedding_space != ?",
                (np.asarray(vector, dtype=np.float32).tobytes(), space, row_key, space),
            ).rowcount
        return changed


# -- read-only probes ------------------------------------------------------------------------


def _read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)


def schema_version(path: Path) -> int:
    """The database's schema version, once its cells were seen to be readable."""
    conn = _read_only(path)
    try:
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        conn.execute("SELECT COUNT(*) FROM cells").fetchone()
    finally:
        conn.close()
    return version


def active_agents(path: Path) -> int:
    conn = _read_only(path)
    try:
        (active,) = conn.execute("SELECT COUNT(*) FROM principals WHERE revoked_at IS NULL").fetchone()
    finally:
        conn.close()
    return active


def cells_by_space(path: Path) -> list[tuple[str, int]]:
    """Live cells per embedding space."""
    conn = _read_only(path)
    try:
        return conn.execute(
            "SELECT embedding_space, COUNT(*) FROM cells WHERE forgotten_at IS NULL GROUP BY embedding_space"
        ).fetchall()
    finally:
        conn.close()


def quarantined(path: Path) -> list[tuple[str, int, str]]:
    """Diffs from the mesh set aside (:mod:`node.store.quarantine`): ``(reason, count, newest
    detail)`` per reason, most first; none from a database that predates the quarantine."""
    conn = _read_only(path)
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'mesh_quarantine'").fetchone():
            return []
        return conn.execute(
            "SELECT reason, COUNT(*), (SELECT detail FROM mesh_quarantine n WHERE n.reason = q.reason "
            "ORDER BY quarantined_at DESC LIMIT 1) FROM mesh_quarantine q GROUP BY reason ORDER BY COUNT(*) DESC, reason"
        ).fetchall()
    finally:
        conn.close()


# -- joining a team ------------------------------------------------------------------------------


def move_tenant(path: Path, tenant_id: str, previous: str) -> None:
    """Move every row of tenant ``previous`` into ``tenant_id``, in one transaction."""
    db = Database(path)
    try:
        def job(tx: Transaction) -> None:
            for table in _TENANT_TABLES:
                tx.execute(f"UPDATE {table} SET tenant_id = ? WHERE tenant_id = ?", (tenant_id, previous))

        db.write_sync(job)
    finally:
        db.close()
