"""Sessions and scenes. A session is local to the node that opened it; its scene (the
episode of work its cells belong to) is shared with the team, so a teammate's scene
rows arrive from the mesh and are kept up to date by :meth:`SessionStore.upsert_scene`."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from .database import Database, Transaction

__all__ = ["SessionStore", "Scene", "SCENE_FIELDS"]

SCENE_FIELDS = (
    "scene_id", "tenant_id", "agent_id", "project", "title", "session_id", "origin_node", "created_at", "ended_at",
    "consolidated_at", "summary_node_id",
)  # fmt: skip
_SCENE_COLUMNS = ", ".join(SCENE_FIELDS)


class Scene(NamedTuple):
    scene_id: str
    tenant_id: str
    agent_id: str
    project: str | None
    title: str | None
    session_id: str | None
    origin_node: str
    created_at: int
    ended_at: int | None
    consolidated_at: int | None
    summary_node_id: str | None


class SessionStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- sessions ---------------------------------------------------------------------------

    def open_sessions(self) -> list[tuple[str, tuple[str, str, str]]]:
        """Every open session, oldest first: ``(agent_id, (session_id, scene_id, project))``."""
        rows = self.db.query(
            "SELECT session_id, scene_id, project, agent_id FROM sessions WHERE ended_at IS NULL ORDER BY started_at"
        )
        return [(agent_id, (session_id, scene_id, project)) for session_id, scene_id, project, agent_id in rows]

    def latest_open(self, agent_id: str) -> tuple[str, str, str] | None:
        """``(session_id, scene_id, project)`` of the agent's newest open session."""
        row = self.db.reader().execute(
            "SELECT session_id, scene_id, project FROM sessions WHERE agent_id = ? AND ended_at IS NULL "
            "ORDER BY started_at DESC LIMIT 1",
            (agent_id,),
        ).fetchone()
        return None if row is None else tuple(row)

    def start(
        self, tx: Transaction, *, session_id: str, scene_id: str, tenant_id: str, agent_id: str, project: str,
        title: str | None, origin_node: str, started_at: int,
    ) -> None:  # fmt: skip
        """Open a session and its scene."""
        tx.execute(
            f"INSERT INTO scenes ({_SCENE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,NULL,NULL,NULL)",
            (scene_id, tenant_id, agent_id, project, title, session_id, origin_node, started_at),
        )
        tx.execute(
            "INSERT INTO sessions (session_id, tenant_id, agent_id, project, title, scene_id, started_at) "
            "VALUES (?,?,?,?,?,?,?)",
            (session_id, tenant_id, agent_id, project, title, scene_id, started_at),
        )

    def session(self, session_id: str) -> tuple[str, str, str] | None:
        """``(tenant_id, agent_id, scene_id)`` of a session."""
        return self.db.query_one(
            "SELECT tenant_id, agent_id, scene_id FROM sessions WHERE session_id = ?", (session_id,)
        )

    def end(self, tx: Transaction, session_id: str, scene_id: str, ended_at: int) -> int | None:
        """Close a session and its scene at ``ended_at``; returns when it had ended already,
        or None when this call ended it."""
        (earlier,) = tx.execute("SELECT ended_at FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
        if earlier is None:
            tx.execute("UPDATE sessions SET ended_at = ? WHERE session_id = ?", (ended_at, session_id))
            tx.execute("UPDATE scenes SET ended_at = ? WHERE scene_id = ? AND ended_at IS NULL", (ended_at, scene_id))
        return earlier

    # -- scenes -------------------------------------------------------------------------------

    def scene(self, scene_id: str) -> Scene | None:
        row = self.db.query_one(f"SELECT {_SCENE_COLUMNS} FROM scenes WHERE scene_id = ?", (scene_id,))
        return None if row is None else Scene(*row)

    def scenes(
        self, tenant_id: str, *, project: str | None, projects: tuple[str, ...], after: tuple[int, str] | None,
        limit: int,
    ) -> list[tuple[Scene, int]]:  # fmt: skip
        """A tenant's scenes, newest first, with their cell counts: those of ``project``, or
        (without one) tenant-wide ones and those of ``projects`` (every one when empty);
        ``after`` is the ``(created_at, scene_id)`` of the last scene of the page before."""
        where, params = ["s.tenant_id = ?"], [tenant_id]
        if project is not None:
            where.append("s.project = ?")
            params.append(project)
        elif projects:
            where.append(f"(s.project IS NULL OR s.project IN ({','.join('?' * len(projects))}))")
            params.extend(projects)
        if after is not None:
            created_at, scene_id = after
            where.append("(s.created_at < ? OR (s.created_at = ? AND s.scene_id < ?))")
            params.extend([created_at, created_at, scene_id])
        columns = ", ".join(f"s.{c}" for c in SCENE_FIELDS)
        rows = self.db.query(
            f"SELECT {columns}, (SELECT COUNT(*) FROM cells c WHERE c.scene_id = s.scene_id AND c.layer != 'L2') "
            f"FROM scenes s WHERE {' AND '.join(where)} ORDER BY s.created_at DESC, s.scene_id DESC LIMIT ?",
            [*params, limit],
        )
        return [(Scene(*r[:-1]), r[-1]) for r in rows]

    def consolidated_at(self, tx: Transaction, scene_id: str) -> int | None:
        (done,) = tx.execute("SELECT consolidated_at FROM scenes WHERE scene_id = ?", (scene_id,)).fetchone()
        return done

    def mark_consolidated(self, tx: Transaction, scene_id: str, consolidated_at: int, summary_node_id: str) -> None:
        tx.execute(
            "UPDATE scenes SET consolidated_at = ?, summary_node_id = ? WHERE scene_id = ?",
            (consolidated_at, summary_node_id, scene_id),
        )

    def upsert_scene(self, tx: Transaction, scene: Scene) -> None:
        """Record a scene from elsewhere (a teammate's, or an export's); a newer copy from the
        same origin updates how it ended and whether it was consolidated."""
        tx.execute(
            f"INSERT INTO scenes ({_SCENE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
            "ON CONFLICT (scene_id) DO UPDATE SET ended_at = excluded.ended_at, "
            "consolidated_at = excluded.consolidated_at, summary_node_id = excluded.summary_node_id "
            "WHERE scenes.origin_node = excluded.origin_node",
            scene,
        )
