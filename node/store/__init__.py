"""The node's SQLite store: the one package that opens the database and runs SQL.

Every statement on cells, layer members, beacons, the inbox, sessions, scenes, agents
and the mesh's diff log lives here, one module per concept; the rest of the node calls
methods that take and return domain objects. Writes are jobs of the group committer
(:mod:`node.store.database`): a method that writes takes the job's ``Transaction`` as
its first argument, so a caller composes several into one job, and one commit.
"""

from __future__ import annotations

from .database import Database, PendingWrite, Transaction
from .diff_log import SqliteDiffLog
from .schema import SCHEMA_VERSION, migrate

__all__ = ["Database", "PendingWrite", "Transaction", "SqliteDiffLog", "SCHEMA_VERSION", "migrate"]
