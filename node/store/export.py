"""A read-only snapshot of a tenant's scenes, beacons and cells, for ``hyphae export``.

One read transaction on a connection of its own: the rows are one consistent state even
while a daemon keeps writing. Rows are read a page at a time in (created_at, id) order
(keyset pagination), so memory stays flat however large a table is, and the order is
fixed, so an export of the same data is the same file.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .sessions import SCENE_FIELDS

__all__ = ["Snapshot", "EXPORTED_TABLES"]

_CELL_FIELDS = (
    "node_id", "source_agent", "origin_node", "content", "cell_type", "salience", "scene_id", "session_id", "project",
    "source_ref", "metadata", "created_at", "layer", "embedding", "embedding_space", "hops", "signature",
    "forgotten_at", "source_hash", "stale_at", "stale_reason",
)  # fmt: skip
_BEACON_FIELDS = (
    "beacon_id", "agent_id", "origin_node", "query", "threshold", "cell_types", "project", "min_salience",
    "ttl_seconds", "created_at", "expires_at", "embedding", "embedding_space", "removed_at",
)  # fmt: skip


def _cell(row: dict[str, Any]) -> dict[str, Any]:
    row["source_ref"] = json.loads(row["source_ref"]) if row["source_ref"] else None
    row["metadata"] = json.loads(row["metadata"])
    return row


def _beacon(row: dict[str, Any]) -> dict[str, Any]:
    row["cell_types"] = json.loads(row["cell_types"]) if row["cell_types"] else None
    return row


_TABLES = {  # table: (fields, key, decoder)
    "scenes": (SCENE_FIELDS, "scene_id", None),
    "beacons": (_BEACON_FIELDS, "beacon_id", _beacon),
    "cells": (_CELL_FIELDS, "node_id", _cell),
}
EXPORTED_TABLES = tuple(_TABLES)


class Snapshot:
    """Use as a context manager; :meth:`rows` gives one table's rows as dicts keyed by
    column (JSON columns decoded; vectors and signatures as bytes)."""

    def __init__(self, path: Path) -> None:
        self._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30, isolation_level=None)
        try:
            self._conn.execute("BEGIN")
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def counts(self, tenant_id: str) -> dict[str, int]:
        """Rows of the tenant in each exported table."""
        return {
            table: self._conn.execute(f"SELECT COUNT(*) FROM {table} WHERE tenant_id = ?", (tenant_id,)).fetchone()[0]
            for table in _TABLES
        }

    def rows(self, table: str, tenant_id: str, *, page: int) -> Iterator[dict[str, Any]]:
        """The tenant's rows of ``table`` in (created_at, id) order, read ``page`` at a time."""
        fields, key, decode = _TABLES[table]
        sql = (
            f"SELECT {', '.join(fields)}, created_at, {key} FROM {table} WHERE tenant_id = ? AND {{after}} "
            f"ORDER BY created_at, {key} LIMIT ?"
        )
        after: tuple | None = None
        while True:
            if after is None:
                rows = self._conn.execute(sql.format(after="1"), (tenant_id, page)).fetchall()
            else:
                rows = self._conn.execute(
                    sql.format(after=f"(created_at, {key}) > (?, ?)"), (tenant_id, *after, page)
                ).fetchall()
            if not rows:
                return
            for row in rows:
                record = dict(zip(fields, row[:-2]))
                yield decode(record) if decode is not None else record
            after = rows[-1][-2:]
