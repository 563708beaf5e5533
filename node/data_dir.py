"""What a data dir must hold before a node opens it: the database, wherever the key is.

A node is its key (``node.key``, its id) and its database (``hyphae.db``: memories, agents'
keys, and the diff log whose seqs its peers know it by). SQLite takes a missing or zero-length
file for a new database, so a node whose database was lost while its key stayed used to come
back as a brand-new node under its old identity: agents' keys, memories and index gone, its
diff log empty. That is a lost database, not a new node: every command that opens the data
dir refuses it (exit 3), names the file and says what to do, and leaves the file as it is.
"""

from __future__ import annotations

from .config import NodeConfig
from .errors import ConfigError

__all__ = ["require_database"]


def require_database(config: NodeConfig) -> None:
    """Raise :class:`ConfigError` when the node key exists and the database is missing or empty."""
    key, db = config.key_path, config.db_path
    if not key.exists():
        return  # no node yet: ``hyphae init`` makes both
    try:
        size = db.stat().st_size
    except FileNotFoundError:
        size = None
    if size:
        return
    what = "is missing" if size is None else "is empty (0 bytes)"
    raise ConfigError(
        f"{db} {what}, but this node's key {key} is there: this node lost its database. Restore "
        "hyphae.db from a backup; or, to start over as a new node (a new node id), move node.key away "
        "and run `hyphae init`"
    )
