"""The facade's sessions and scenes: opening and ending sessions, reading scenes in scope,
and consolidating a scene into one L2 summary cell.

A session is an agent's working period in a project; while it is open, the agent's
stores land in its scene unless they say otherwise (:meth:`Sessions.placement`). Open
sessions are local, so they are mirrored in memory exactly and a store never reads them
from the database. Scenes are shared with the team: every change is told to the mesh.
The facade (:mod:`node.service`) holds one :class:`Sessions` and hands it the principal.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import cells as v
from .embedding import Embedder
from .energy import EnergyModel
from .errors import Conflict, Forbidden, InvalidArgument, NotFound
from .ids import new_id
from .ingest import CellWrites
from .principals import Principal
from .scenes import consolidate, decode_cursor, encode_cursor
from .shaping import scene_dict
from .store import Store, Transaction

if TYPE_CHECKING:
    from .service import MeshHooks

__all__ = ["Sessions"]


class Sessions:
    def __init__(
        self,
        *,
        node_id: str,
        store: Store,
        writes: CellWrites,
        embedder: Embedder,
        embed: Callable[[list[str]], Awaitable[np.ndarray]],
        energy: EnergyModel,
        clock: Callable[[], int],
        mesh: Callable[[], MeshHooks | None],
    ) -> None:
        self.node_id = node_id
        self._store = store
        self._sessions = store.sessions
        self._writes = writes
        self._embedder = embedder
        self._embed = embed
        self._energy = energy
        self._clock = clock
        self._mesh = mesh  # the node's mesh hooks, once it is in a team
        # Open sessions by agent: sessions are local, so this mirror of the table is exact.
        self._open: dict[str, tuple[str, str, str]] = dict(store.sessions.open_sessions())

    def placement(
        self, principal: Principal, scene_id: str | None, project: str | None
    ) -> tuple[str | None, str | None, str | None]:
        """Where a new cell belongs: its session, scene and project."""
        if scene_id is not None:
            scene = self.scene_in_scope(principal, scene_id)
            if project is not None and project != scene["project"]:
                raise InvalidArgument(
                    f"scene {scene_id} belongs to project {scene['project']!r}, not {project!r}", field="project"
                )
            return scene["session_id"], scene_id, scene["project"]
        session = self._open.get(principal.agent_id)
        if session is not None and project in (None, session[2]):
            return session
        if project is None:
            if len(principal.projects) == 1:
                project = principal.projects[0]
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not write to project {project!r}", field="project")
        return None, None, project

    # -- sessions -------------------------------------------------------------------------

    async def start(self, principal: Principal, *, project: Any = None, title: Any = None) -> dict[str, Any]:
        """Open a session (and its scene) in a project; stores default to them until it ends."""
        project = v.check_text(project, "project")
        title = None if title is None else v.check_text(title, "title", max_chars=500)
        if not principal.may_read_project(project):
            raise Forbidden(f"this key may not work in project {project!r}", field="project")
        session_id, scene_id, now = new_id(), new_id(), self._clock()

        def job(tx: Transaction) -> None:
            tx.after_commit(lambda: self._open.__setitem__(principal.agent_id, (session_id, scene_id, project)))
            self._sessions.start(
                tx, session_id=session_id, scene_id=scene_id, tenant_id=principal.tenant_id,
                agent_id=principal.agent_id, project=project, title=title, origin_node=self.node_id, started_at=now,
            )  # fmt: skip

        await self._store.db.write(job)
        self._scene_changed(scene_id)
        return {"session_id": session_id, "scene_id": scene_id}

    async def end(self, principal: Principal, *, session_id: Any = None) -> dict[str, Any]:
        """Close a session and its scene. Ending it again answers the same."""
        session_id = v.check_uuid(session_id, "session_id")
        row = self._sessions.session(session_id)
        if row is None or row[0] != principal.tenant_id:
            raise NotFound(f"no session {session_id}", field="session_id")
        if row[1] != principal.agent_id:
            raise Forbidden("only the agent that started a session may end it", field="session_id")
        scene_id, now = row[2], self._clock()

        def job(tx: Transaction) -> dict[str, Any]:
            ended_at = self._sessions.end(tx, session_id, scene_id, now)
            if ended_at is None:
                ended_at = now
                tx.after_commit(lambda: self._forget_open_session(principal.agent_id, session_id))
            count = self._store.cells.in_session(tx, session_id)
            return {"session_id": session_id, "ended_at": ended_at, "cell_count": count}

        result = await self._store.db.write(job)
        if result["ended_at"] == now:
            self._scene_changed(scene_id)
        return result

    def _forget_open_session(self, agent_id: str, session_id: str) -> None:
        if self._open.get(agent_id, ("",))[0] == session_id:
            newest = self._sessions.latest_open(agent_id)
            if newest is None:
                del self._open[agent_id]
            else:
                self._open[agent_id] = newest

    # -- scenes ---------------------------------------------------------------------------

    def scene_in_scope(self, principal: Principal, scene_id: str) -> dict[str, Any]:
        scene = self._sessions.scene(scene_id)
        if scene is None or scene.tenant_id != principal.tenant_id:
            raise NotFound(f"no scene {scene_id}", field="scene_id")
        if not principal.may_read_project(scene.project):
            raise Forbidden(f"scene {scene_id} is outside this key's projects", field="scene_id")
        return scene_dict(scene)

    async def get_scene(self, principal: Principal, *, scene_id: Any) -> dict[str, Any]:
        """One scene with the ids of its cells."""
        scene = self.scene_in_scope(principal, v.check_uuid(scene_id, "scene_id"))
        ids = self._store.cells.in_scene(scene["scene_id"])
        return {**scene, "cell_count": len(ids), "cell_ids": ids}

    async def list_scenes(
        self, principal: Principal, *, project: Any = None, limit: Any = None, cursor: Any = None
    ) -> dict[str, Any]:
        """Scenes in the principal's read scope, newest first, a page at a time."""
        project = v.check_project(project)
        limit = v.check_int(limit, "limit", low=1, high=v.MAX_PAGE, default=v.DEFAULT_PAGE)
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not read project {project!r}", field="project")
        after = decode_cursor(cursor) if cursor is not None else None
        rows = self._sessions.scenes(
            principal.tenant_id, project=project, projects=principal.projects, after=after, limit=limit + 1
        )
        page = rows[:limit]
        scenes = [{**scene_dict(scene), "cell_count": count} for scene, count in page]
        next_cursor = encode_cursor(page[-1][0].created_at, page[-1][0].scene_id) if len(rows) > limit else None
        return {"scenes": scenes, "next_cursor": next_cursor}

    async def consolidate(self, principal: Principal, *, scene_id: Any) -> dict[str, Any]:
        """Write an extractive summary of a scene as one L2 cell (REST and CLI only)."""
        scene = self.scene_in_scope(principal, v.check_uuid(scene_id, "scene_id"))
        if scene["consolidated_at"] is not None:
            raise Conflict(
                f"scene {scene['scene_id']} was already consolidated into {scene['summary_node_id']}",
                field="scene_id",
                summary_node_id=scene["summary_node_id"],
            )
        rows = self._store.cells.summary_sources(scene["scene_id"], self._embedder.space)
        if not rows:
            raise Conflict(f"scene {scene['scene_id']} has no cells to consolidate", field="scene_id")
        summary = consolidate(rows, self._energy, self._clock(), dim=self._embedder.dim)
        vector = (await self._embed([summary.content]))[0]
        now = self._clock()
        cell = v.Cell(
            node_id=new_id(),
            tenant_id=principal.tenant_id,
            source_agent=principal.agent_id,
            origin_node=self.node_id,
            content=summary.content,
            cell_type=summary.cell_type,
            salience=summary.salience,
            created_at=now,
            layer="L2",
            embedding=vector,
            embedding_space=self._embedder.space,
            scene_id=scene["scene_id"],
            session_id=scene["session_id"],
            project=scene["project"],
            source_ref={"kind": "scene", "locator": scene["scene_id"]},
            metadata={"consolidates_scene": scene["scene_id"], "source_cells": summary.source_ids},
        )

        def job(tx: Transaction) -> str:
            if self._sessions.consolidated_at(tx, scene["scene_id"]) is not None:
                raise Conflict(f"scene {scene['scene_id']} was already consolidated", field="scene_id")
            node_id = self._writes.write(tx, cell)
            self._sessions.mark_consolidated(tx, scene["scene_id"], now, node_id)
            return node_id

        node_id = await self._store.db.write(job)
        mesh = self._mesh()
        if mesh is not None:
            mesh.cell_stored(cell)
        self._scene_changed(scene["scene_id"])
        return {
            "scene_id": scene["scene_id"],
            "node_id": node_id,
            "cell_count": len(summary.source_ids),
            "source_count": len(rows),
        }

    def _scene_changed(self, scene_id: str) -> None:
        mesh = self._mesh()
        if mesh is None:
            return
        scene = self._sessions.scene(scene_id)
        if scene is not None:
            mesh.scene_changed({**scene_dict(scene), "tenant_id": scene.tenant_id})
