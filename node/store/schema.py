"""The SQLite schema, versioned with ``PRAGMA user_version``.

SQLite is the source of truth for everything; the HNSW files are caches rebuilt from
it. Each migration is a list of statements applied in one transaction, so a data dir
is always at exactly one version. Add a migration by appending to ``MIGRATIONS``;
never edit one that has shipped.
"""

from __future__ import annotations

import sqlite3

from ..errors import ConfigError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "migrate"]

MIGRATIONS: list[list[str]] = [
    # v1: the node core.
    [
        """CREATE TABLE principals (
            agent_id    TEXT PRIMARY KEY,
            tenant_id   TEXT NOT NULL,
            name        TEXT NOT NULL UNIQUE,
            key_hash    BLOB NOT NULL UNIQUE,
            projects    TEXT NOT NULL DEFAULT '[]',
            created_at  INTEGER NOT NULL,
            revoked_at  INTEGER
        )""",
        """CREATE TABLE cells (
            rowid            INTEGER PRIMARY KEY,
            node_id          TEXT NOT NULL UNIQUE,
            tenant_id        TEXT NOT NULL,
            source_agent     TEXT NOT NULL,
            origin_node      TEXT NOT NULL,
            content          TEXT NOT NULL,
            cell_type        TEXT NOT NULL,
            salience         REAL NOT NULL,
            energy0          REAL NOT NULL,
            scene_id         TEXT,
            session_id       TEXT,
            project          TEXT,
            source_ref       TEXT,
            metadata         TEXT NOT NULL DEFAULT '{}',
            created_at       INTEGER NOT NULL,
            stored_at        INTEGER NOT NULL,
            layer            TEXT NOT NULL,
            embedding        BLOB NOT NULL,
            embedding_space  TEXT NOT NULL,
            hops             INTEGER NOT NULL DEFAULT 0,
            signature        BLOB,
            origin_seq       INTEGER,
            recall_hits      INTEGER NOT NULL DEFAULT 0,
            forgotten_at     INTEGER,
            forgotten_by     TEXT
        )""",
        "CREATE INDEX cells_scene ON cells(scene_id)",
        "CREATE INDEX cells_tenant_created ON cells(tenant_id, created_at)",
        # Which cells each layer's index holds, in the order they joined it: the
        # index files remember the last seq they cover and catch up from there.
        """CREATE TABLE layer_members (
            seq        INTEGER PRIMARY KEY,
            layer      TEXT NOT NULL,
            cell_rowid INTEGER NOT NULL,
            UNIQUE (layer, cell_rowid)
        )""",
        """CREATE TABLE idempotency (
            agent_id   TEXT NOT NULL,
            key        TEXT NOT NULL,
            node_id    TEXT NOT NULL,
            created_at INTEGER NOT NULL,
            PRIMARY KEY (agent_id, key)
        )""",
        """CREATE TABLE scenes (
            scene_id        TEXT PRIMARY KEY,
            tenant_id       TEXT NOT NULL,
            agent_id        TEXT NOT NULL,
            project         TEXT,
            title           TEXT,
            session_id      TEXT,
            origin_node     TEXT NOT NULL,
            created_at      INTEGER NOT NULL,
            ended_at        INTEGER,
            consolidated_at INTEGER,
            summary_node_id TEXT
        )""",
        "CREATE INDEX scenes_tenant_created ON scenes(tenant_id, created_at)",
        """CREATE TABLE sessions (
            session_id TEXT PRIMARY KEY,
            tenant_id  TEXT NOT NULL,
            agent_id   TEXT NOT NULL,
            project    TEXT NOT NULL,
            title      TEXT,
            scene_id   TEXT NOT NULL,
            started_at INTEGER NOT NULL,
            ended_at   INTEGER
        )""",
        "CREATE INDEX sessions_agent_open ON sessions(agent_id, ended_at)",
        """CREATE TABLE beacons (
            beacon_id       TEXT PRIMARY KEY,
            tenant_id       TEXT NOT NULL,
            agent_id        TEXT NOT NULL,
            origin_node     TEXT NOT NULL,
            query           TEXT NOT NULL,
            threshold       REAL NOT NULL,
            cell_types      TEXT,
            project         TEXT,
            min_salience    REAL,
            ttl_seconds     INTEGER,
            created_at      INTEGER NOT NULL,
            expires_at      INTEGER,
            embedding       BLOB NOT NULL,
            embedding_space TEXT NOT NULL,
            removed_at      INTEGER
        )""",
        """CREATE TABLE inbox (
            seq         INTEGER PRIMARY KEY,
            agent_id    TEXT NOT NULL,
            cell_rowid  INTEGER NOT NULL,
            beacon_id   TEXT NOT NULL,
            similarity  REAL NOT NULL,
            received_at INTEGER NOT NULL,
            hops        INTEGER NOT NULL,
            UNIQUE (agent_id, cell_rowid)
        )""",
        "CREATE INDEX inbox_agent_received ON inbox(agent_id, received_at)",
        """CREATE TABLE pull_cursors (
            agent_id TEXT PRIMARY KEY,
            last_seq INTEGER NOT NULL
        )""",
    ],
    # v2: the mesh. Every diff this node originated or accepted, in log order (lsn):
    # de-duplication by (origin, seq), repair answers, and our own seq across restarts.
    [
        """CREATE TABLE mesh_log (
            lsn         INTEGER PRIMARY KEY,
            origin      TEXT NOT NULL,
            seq         INTEGER NOT NULL,
            kind        INTEGER NOT NULL,
            is_data     INTEGER NOT NULL,
            cell_id     TEXT,
            received_at INTEGER NOT NULL,
            signed      BLOB NOT NULL,
            signature   BLOB NOT NULL,
            hops        INTEGER NOT NULL,
            ttl         INTEGER NOT NULL,
            UNIQUE (origin, seq)
        )""",
        "CREATE INDEX mesh_log_cell ON mesh_log(cell_id)",
        "CREATE INDEX mesh_log_data ON mesh_log(is_data, lsn)",
        "CREATE INDEX cells_origin_stored ON cells(origin_node, stored_at)",
    ],
    # v3: members' public keys and membership proofs, verified when first seen, so a restarted
    # node verifies diffs relayed from a member that has not spoken to it since.
    [
        """CREATE TABLE mesh_keys (
            origin     TEXT PRIMARY KEY,
            public_key BLOB NOT NULL,
            proof      BLOB NOT NULL
        )""",
    ],
    # v4: the quarantine (node.store.quarantine): diffs from the mesh set aside, each with why,
    # rather than stored. Keyed as the log is; signed bytes kept for the rows moved out of it.
    [
        """CREATE TABLE mesh_quarantine (
            origin         TEXT NOT NULL,
            seq            INTEGER NOT NULL,
            kind           INTEGER NOT NULL,
            cell_id        TEXT,
            reason         TEXT NOT NULL,
            detail         TEXT NOT NULL,
            quarantined_at INTEGER NOT NULL DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
            signed         BLOB,
            signature      BLOB,
            PRIMARY KEY (origin, seq)
        )""",
    ],
    # v5: the lexical index (node.store.lexical): FTS5 over the live cells' content and source
    # reference, with ``cells`` as its external content (no second copy of the text), filled
    # here for the cells already stored. Tombstones never enter it.
    [
        """CREATE VIRTUAL TABLE cells_fts USING fts5(
            content, source_ref, content = 'cells', content_rowid = 'rowid',
            tokenize = 'unicode61 remove_diacritics 2'
        )""",
        """INSERT INTO cells_fts (rowid, content, source_ref)
           SELECT rowid, content, source_ref FROM cells WHERE forgotten_at IS NULL""",
    ],
    # v6: each inbox delivery keeps the admission rule's score and why it admitted the cell
    # (node.admission_rule); rows from before read as scored by their cosine, with no reason.
    [
        "ALTER TABLE inbox ADD COLUMN score REAL",
        "ALTER TABLE inbox ADD COLUMN reason TEXT",
    ],
    # v7: knowledge that stays true (node.lifecycle). A cell names the cells it replaces
    # (``supersessions``, kept whichever of the two arrives first) and a replaced one records
    # its successor; a cell whose file changed is stale; an inbox entry says what kind of
    # news it is (a match, a successor of a cell the agent received, a possible conflict)
    # and which cell it relates to. Rows from before read as active matches.
    [
        "ALTER TABLE cells ADD COLUMN superseded_by TEXT",
        "ALTER TABLE cells ADD COLUMN superseded_at INTEGER",
        "ALTER TABLE cells ADD COLUMN source_hash TEXT",
        "ALTER TABLE cells ADD COLUMN stale_at INTEGER",
        "ALTER TABLE cells ADD COLUMN stale_reason TEXT",
        """CREATE TABLE supersessions (
            old_id TEXT NOT NULL,
            new_id TEXT NOT NULL,
            PRIMARY KEY (old_id, new_id)
        ) WITHOUT ROWID""",
        "CREATE INDEX supersessions_new ON supersessions(new_id)",
        "ALTER TABLE inbox ADD COLUMN kind TEXT",
        "ALTER TABLE inbox ADD COLUMN related TEXT",
    ],
]

SCHEMA_VERSION = len(MIGRATIONS)


def migrate(conn: sqlite3.Connection) -> int:
    """Bring the database to ``SCHEMA_VERSION``; returns the version it was at."""
    (current,) = conn.execute("PRAGMA user_version").fetchone()
    if current > SCHEMA_VERSION:
        raise ConfigError(
            f"the database is at schema version {current}, newer than this Hyphae "
            f"({SCHEMA_VERSION}); upgrade Hyphae to open it"
        )
    for version in range(current, SCHEMA_VERSION):
        conn.execute("BEGIN IMMEDIATE")
        try:
            for statement in MIGRATIONS[version]:
                conn.execute(statement)
            conn.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    return current
