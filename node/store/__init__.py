"""The node's SQLite store: the one package that opens the database and runs SQL.

Every statement on cells, layer members, beacons, the inbox, sessions, scenes, agents
and the mesh's diff log lives here, one module per concept; the rest of the node calls
methods that take and return domain objects (rows are mapped here, shaped for a surface
by the facade). Writes are jobs of the group committer (:mod:`node.store.database`): a
method that writes takes the job's ``Transaction`` first, so a caller composes several
into one job, and one commit.

Names are loaded on first use: ``hyphae mcp`` vets a key through
:func:`~node.store.agents.key_is_active` on every start, and must not pay for trio, numpy
and the mesh's wire format to do it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .agents import AgentRecord, key_is_active
    from .beacons import InboxEntry
    from .cells import StoredCell
    from .database import Database, PendingWrite, Transaction
    from .diff_log import SqliteDiffLog
    from .maintenance import ReadError
    from .schema import SCHEMA_VERSION, migrate
    from .sessions import SCENE_FIELDS, Scene
    from .store import Store, create_database

__all__ = [
    "Store", "create_database", "Database", "PendingWrite", "Transaction", "SqliteDiffLog", "SCHEMA_VERSION",
    "migrate", "StoredCell", "InboxEntry", "Scene", "SCENE_FIELDS", "AgentRecord", "key_is_active", "ReadError",
]  # fmt: skip

_HOMES = {
    "Store": "store", "create_database": "store", "Database": "database", "PendingWrite": "database",
    "Transaction": "database", "SqliteDiffLog": "diff_log", "SCHEMA_VERSION": "schema", "migrate": "schema",
    "StoredCell": "cells", "InboxEntry": "beacons", "Scene": "sessions", "SCENE_FIELDS": "sessions",
    "AgentRecord": "agents", "key_is_active": "agents", "ReadError": "maintenance",
}  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
