"""What SQLite keeps of a forgotten cell after its row is erased, and how it is made to let go.

Erasing a row (:meth:`~node.store.cells.CellStore.erase`) is one UPDATE, but the bytes it
replaced live on in three places until something more happens:

- **FTS5's old segments** keep the removed row's words until they are merged: the lexical
  index's ``optimize`` (:meth:`~node.store.lexical.LexicalIndex.purge`) merges them;
- **freed space** inside pages and on the free list: ``PRAGMA secure_delete = ON`` on every
  connection (:mod:`node.store.database`) zeroes it as it is freed;
- **the WAL**: every page written since the last checkpoint, old versions included, sits in
  ``hyphae.db-wal`` until a checkpoint copies the newest ones into the database and a
  ``TRUNCATE`` checkpoint cuts the file to nothing. :meth:`Erasure.checkpoint` does that on
  a connection of its own, with a short busy timeout (it holds writers back while it waits
  for readers), and says when it could not finish, so its caller tries again.

The diff log's copy of a cell (``mesh_log.signed``) is erased with its tombstone
(:mod:`node.store.diff_log`); :meth:`Erasure.sweep_log` erases the copies a data dir
written by an earlier version still keeps beside their tombstones.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING

from mesh.wire import DiffKind

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["Erasure"]

log = logging.getLogger("hyphae.forget")

# How long a checkpoint waits for readers before it lets the writer go again (ms).
CHECKPOINT_BUSY_TIMEOUT_MS = 1000


class Erasure:
    def __init__(self, db: Database) -> None:
        self.db = db
        # Told after every commit that erased something (the node's scrubber listens).
        self.on_erased: Callable[[], None] = lambda: None

    def erased(self) -> None:
        """An erasure committed: what SQLite still keeps of it is to be scrubbed."""
        self.on_erased()

    def sweep_log(self, tx: Transaction) -> int:
        """Erase every logged cell diff whose origin's tombstone is held too; returns how many."""
        cell, tombstone = int(DiffKind.CELL), int(DiffKind.TOMBSTONE)
        erased = tx.execute(
            "UPDATE mesh_log SET signed = x'' WHERE kind = ? AND length(signed) > 0 AND EXISTS "
            "(SELECT 1 FROM mesh_log t WHERE t.kind = ? AND t.cell_id = mesh_log.cell_id AND t.origin = mesh_log.origin)",
            (cell, tombstone),
        ).rowcount
        return erased + tx.execute(
            "UPDATE mesh_quarantine SET signed = NULL WHERE kind = ? AND signed IS NOT NULL AND EXISTS "
            "(SELECT 1 FROM mesh_log t WHERE t.kind = ? AND t.cell_id = mesh_quarantine.cell_id "
            "AND t.origin = mesh_quarantine.origin)",
            (cell, tombstone),
        ).rowcount

    def forgotten_count(self) -> int:
        (count,) = self.db.query_one("SELECT COUNT(*) FROM cells WHERE forgotten_at IS NOT NULL")
        return count

    def checkpoint(self) -> bool:
        """Copy the WAL into the database and truncate it to zero bytes (blocking). False when
        a reader held on past the busy timeout: nothing is lost, the caller tries again."""
        conn = sqlite3.connect(self.db.path, isolation_level=None, timeout=CHECKPOINT_BUSY_TIMEOUT_MS / 1000)
        try:
            conn.execute(f"PRAGMA busy_timeout = {CHECKPOINT_BUSY_TIMEOUT_MS}")
            busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.OperationalError as exc:  # "database is locked": the writer kept it
            log.info("WAL checkpoint after forgets deferred: %s", exc)
            return False
        finally:
            conn.close()
        return not busy
