"""``principals``: the node's agents, their key hashes, projects and revocations.

:func:`key_is_active` reads a key straight from the database file, read-only, without
opening the store: ``hyphae mcp`` vets a key that way before it starts a daemon, and it
must stay cheap to import (no writer thread, no schema migration).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from ..principals import Principal

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["AgentStore", "AgentRecord", "key_is_active"]


class AgentRecord(NamedTuple):
    agent_id: str
    tenant_id: str
    name: str
    projects: list[str]
    created_at: int
    revoked_at: int | None


class AgentStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def by_key(self, key_hash: bytes) -> Principal | None:
        """The principal of a key that is known and not revoked."""
        row = self.db.query_one(
            "SELECT tenant_id, agent_id, name, projects FROM principals WHERE key_hash = ? AND revoked_at IS NULL",
            (key_hash,),
        )
        return None if row is None else Principal(row[0], row[1], row[2], tuple(json.loads(row[3])))

    def name_taken(self, tx: Transaction, name: str) -> bool:
        return tx.execute("SELECT 1 FROM principals WHERE name = ?", (name,)).fetchone() is not None

    def insert(self, tx: Transaction, principal: Principal, key_hash: bytes, created_at: int) -> None:
        tx.execute(
            "INSERT INTO principals (agent_id, tenant_id, name, key_hash, projects, created_at) VALUES (?,?,?,?,?,?)",
            (principal.agent_id, principal.tenant_id, principal.name, key_hash, json.dumps(list(principal.projects)),
             created_at),
        )  # fmt: skip

    def all(self) -> list[AgentRecord]:
        rows = self.db.query(
            "SELECT agent_id, tenant_id, name, projects, created_at, revoked_at FROM principals "
            "ORDER BY created_at, name"
        )
        return [AgentRecord(r[0], r[1], r[2], json.loads(r[3]), r[4], r[5]) for r in rows]

    def revocation(self, tx: Transaction, name: str) -> tuple[str, int | None] | None:
        """``(agent_id, revoked_at)`` of the agent called ``name``, if there is one."""
        return tx.execute("SELECT agent_id, revoked_at FROM principals WHERE name = ?", (name,)).fetchone()

    def revoke(self, tx: Transaction, agent_id: str, revoked_at: int) -> None:
        tx.execute("UPDATE principals SET revoked_at = ? WHERE agent_id = ?", (revoked_at, agent_id))


def key_is_active(db_path: Path, key_hash: bytes) -> bool:
    """Is a key with this hash known and not revoked? Read-only (WAL readers never block
    the writer of a running daemon); False when there is no database yet."""
    if not db_path.exists():
        return False
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=10)
    try:
        row = conn.execute(
            "SELECT 1 FROM principals WHERE key_hash = ? AND revoked_at IS NULL", (key_hash,)
        ).fetchone()
    finally:
        conn.close()
    return row is not None
