"""The :class:`Store`: the database and one object per concept over it."""

from __future__ import annotations

from pathlib import Path

from .agents import AgentStore
from .beacons import BeaconStore, Inbox
from .cells import CellStore
from .database import Database
from .diff_log import SqliteDiffLog
from .erasure import Erasure
from .export import Snapshot
from .lifecycle import LifecycleStore
from .maintenance import Reembedding
from .members import LayerMembers
from .mesh_gaps import MeshGaps
from .quarantine import Quarantine
from .sessions import SessionStore

__all__ = ["Store", "create_database"]


class Store:
    """Everything the node keeps in SQLite. Writes are jobs: compose the ``tx`` methods of
    these objects in a function of a :class:`~node.store.database.Transaction` and hand it
    to ``db.write`` (or ``db.submit``), so a job that touches several tables is still one
    commit."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self.agents = AgentStore(db)
        self.cells = CellStore(db)
        self.lexical = self.cells.lexical  # BM25 over the cells (node.store.lexical)
        self.members = LayerMembers(db)
        self.beacons = BeaconStore(db)
        self.inbox = Inbox(db)
        self.lifecycle = LifecycleStore(db)  # supersede links, staleness (node.lifecycle)
        self.sessions = SessionStore(db)
        self.quarantine = Quarantine(db)
        self.mesh_gaps = MeshGaps(db, self.quarantine)
        self.reembedding = Reembedding(db)
        self.erasure = Erasure(db)  # what SQLite keeps of a forgotten cell, let go

    @classmethod
    def open(cls, path: Path, *, group_commit_window: float = 0.0) -> Store:
        """Open (creating and migrating as needed) the database at ``path``. Blocking."""
        return cls(Database(path, group_commit_window=group_commit_window))

    def close(self) -> None:
        """Drain the queued writes, then close. Blocking."""
        self.db.close()

    def diff_log(self) -> SqliteDiffLog:
        """The mesh's diff log over this database (loads what it holds: call once per engine)."""
        return SqliteDiffLog(self.db, self.quarantine, self.erasure)

    def snapshot(self) -> Snapshot:
        """A consistent read-only view for an export, on a connection of its own."""
        return Snapshot(self.db.path)


def create_database(path: Path) -> None:
    """Create and migrate the database at ``path`` (nothing happens to one that is current)."""
    Database(path).close()
