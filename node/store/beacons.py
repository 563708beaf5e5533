"""Beacons, and the inbox their matches land in (with each agent's pull cursor).

A beacon row keeps its query's vector; the node's live beacons are loaded once into the
in-memory :class:`~node.delivery.BeaconBook`, which matches cells as they are written.
A match is an inbox row, written in the same job as its cell; inbox rows come back as
:class:`InboxEntry`, joined with the cell they deliver.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..delivery import Beacon

if TYPE_CHECKING:
    from ..admission_rule import Admission
    from .database import Database, Transaction

__all__ = ["BeaconStore", "Inbox", "InboxEntry"]

_COLUMNS = (
    "beacon_id, tenant_id, agent_id, origin_node, query, threshold, cell_types, project, min_salience, "
    "ttl_seconds, created_at, expires_at, embedding, embedding_space"
)
_JOINED = ", ".join(f"b.{c.strip()}" for c in _COLUMNS.split(","))


def _values(beacon: Beacon) -> tuple:
    return (
        beacon.beacon_id, beacon.tenant_id, beacon.agent_id, beacon.origin_node, beacon.query, beacon.threshold,
        json.dumps(list(beacon.cell_types)) if beacon.cell_types else None, beacon.project, beacon.min_salience,
        beacon.ttl_seconds, beacon.created_at, beacon.expires_at,
        np.asarray(beacon.embedding).astype(np.float32).tobytes(), beacon.embedding_space,
    )  # fmt: skip


def _beacon(row: tuple, owner_projects: tuple[str, ...]) -> Beacon:
    (beacon_id, tenant_id, agent_id, origin_node, query, threshold, cell_types, project, min_salience,
     ttl_seconds, created_at, expires_at, embedding, space) = row  # fmt: skip
    return Beacon(
        beacon_id=beacon_id,
        tenant_id=tenant_id,
        agent_id=agent_id,
        origin_node=origin_node,
        query=query,
        threshold=threshold,
        embedding=np.frombuffer(embedding, dtype=np.float32),
        embedding_space=space,
        created_at=created_at,
        cell_types=tuple(json.loads(cell_types)) if cell_types else None,
        project=project,
        min_salience=min_salience,
        ttl_seconds=ttl_seconds,
        expires_at=expires_at,
        owner_projects=owner_projects,
    )


class BeaconStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def live_local(self, node_id: str) -> list[Beacon]:
        """The live beacons placed on this node by agents not revoked, with their owners' scope."""
        rows = self.db.query(
            f"SELECT {_JOINED}, p.projects FROM beacons b JOIN principals p ON p.agent_id = b.agent_id "
            "WHERE b.removed_at IS NULL AND p.revoked_at IS NULL AND b.origin_node = ?",
            (node_id,),
        )
        return [_beacon(r[:-1], tuple(json.loads(r[-1]))) for r in rows]

    def insert(self, tx: Transaction, beacon: Beacon) -> None:
        tx.execute(f"INSERT INTO beacons ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)", _values(beacon))

    def insert_imported(self, tx: Transaction, beacon: Beacon, removed_at: int | None) -> bool:
        """Write a beacon read from an export file, unless its id is known; True if it was new."""
        return bool(tx.execute(
            f"INSERT OR IGNORE INTO beacons ({_COLUMNS}, removed_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (*_values(beacon), removed_at),
        ).rowcount)  # fmt: skip

    def owner(self, tx: Transaction, beacon_id: str) -> tuple[str, int | None] | None:
        """``(agent_id, removed_at)`` of a beacon, if there is one."""
        return tx.execute("SELECT agent_id, removed_at FROM beacons WHERE beacon_id = ?", (beacon_id,)).fetchone()

    def mark_removed(self, tx: Transaction, beacon_id: str, removed_at: int) -> None:
        tx.execute("UPDATE beacons SET removed_at = ? WHERE beacon_id = ?", (removed_at, beacon_id))


# -- the inbox -------------------------------------------------------------------------------

_ENTRY_COLUMNS = (
    "i.seq, c.node_id, c.content, c.cell_type, c.salience, c.source_agent, c.origin_node, c.project, c.scene_id, "
    "c.source_ref, c.metadata, c.created_at, i.received_at, i.beacon_id, i.similarity, i.hops, c.forgotten_at, "
    "COALESCE(i.score, i.similarity), i.reason, COALESCE(i.kind, 'match'), i.related, c.superseded_by"
)


class InboxEntry(NamedTuple):
    """One delivery and the cell it delivered (JSON columns decoded)."""

    seq: int
    node_id: str
    content: str
    cell_type: str
    salience: float
    source_agent: str
    origin_node: str
    project: str | None
    scene_id: str | None
    source_ref: dict[str, str] | None
    metadata: dict[str, Any]
    created_at: int
    received_at: int
    beacon_id: str
    similarity: float
    hops: int
    forgotten_at: int | None
    score: float  # the admission rule's (the cosine, for deliveries from before it kept one)
    reason: str | None  # why the admission rule let the cell in
    kind: str  # "match" (a beacon caught it), "supersedes" or "possible_conflict" (node.lifecycle)
    related: str | None  # the cell the news is about: the one replaced, or the one it may contradict
    superseded_by: str | None


def _entry(row: tuple) -> InboxEntry:
    source_ref = row[9]
    return InboxEntry(*row[:9], json.loads(source_ref) if source_ref else None, json.loads(row[10]), *row[11:])


class Inbox:
    def __init__(self, db: Database) -> None:
        self.db = db

    def last_received(self) -> int:
        (last,) = self.db.query_one("SELECT COALESCE(MAX(received_at), 0) FROM inbox") or (0,)
        return last

    def deliver(
        self, tx: Transaction, agent_id: str, rowid: int, admission: Admission, received_at: int, hops: int
    ) -> bool:
        """Put a cell in an agent's inbox; False when it was there already."""
        a = admission
        return bool(tx.execute(
            "INSERT OR IGNORE INTO inbox (agent_id, cell_rowid, beacon_id, similarity, score, reason, received_at, hops) "
            "VALUES (?,?,?,?,?,?,?,?)",
            (agent_id, rowid, a.beacon_id, a.similarity, a.score, a.reason, received_at, hops),
        ).rowcount)  # fmt: skip

    def since(self, agent_id: str, since: int, limit: int, *, include_superseded: bool = False) -> list[InboxEntry]:
        """An agent's deliveries received after ``since``, oldest first (those of superseded
        cells left out unless asked: their successor came as news)."""
        current = "" if include_superseded else " AND c.superseded_by IS NULL"
        rows = self.db.query(
            f"SELECT {_ENTRY_COLUMNS} FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid "
            f"WHERE i.agent_id = ? AND i.received_at > ?{current} ORDER BY i.received_at LIMIT ?",
            (agent_id, since, limit),
        )
        return [_entry(r) for r in rows]

    def everyone_since(self, since: int, limit: int) -> list[tuple[str, str, InboxEntry]]:
        """Every agent's deliveries received after ``since``, oldest first: ``(name, agent_id, entry)``."""
        rows = self.db.query(
            f"SELECT p.name, i.agent_id, {_ENTRY_COLUMNS} FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid "
            "JOIN principals p ON p.agent_id = i.agent_id WHERE i.received_at > ? ORDER BY i.received_at LIMIT ?",
            (since, limit),
        )
        return [(r[0], r[1], _entry(r[2:])) for r in rows]

    def pull(
        self, tx: Transaction, agent_id: str, limit: int, *, include_superseded: bool = False
    ) -> tuple[list[InboxEntry], int, int]:
        """The next page after the agent's cursor, which advances past it:
        ``(entries, cursor, how many remain after it)``; superseded cells' entries are passed
        over unless asked for."""
        row = tx.execute("SELECT last_seq FROM pull_cursors WHERE agent_id = ?", (agent_id,)).fetchone()
        cursor = row[0] if row else 0
        rows = tx.execute(
            f"SELECT {_ENTRY_COLUMNS} FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid "
            "WHERE i.agent_id = ? AND i.seq > ? ORDER BY i.seq LIMIT ?",
            (agent_id, cursor, limit),
        ).fetchall()
        if rows:
            cursor = rows[-1][0]
            if not include_superseded:
                rows = [r for r in rows if r[-1] is None]
            tx.execute(
                "INSERT INTO pull_cursors (agent_id, last_seq) VALUES (?, ?) "
                "ON CONFLICT (agent_id) DO UPDATE SET last_seq = excluded.last_seq",
                (agent_id, cursor),
            )
        (remaining,) = tx.execute(
            "SELECT COUNT(*) FROM inbox WHERE agent_id = ? AND seq > ?", (agent_id, cursor)
        ).fetchone()
        return [_entry(r) for r in rows], cursor, remaining
