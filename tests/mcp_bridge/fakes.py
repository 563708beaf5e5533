"""Fakes for the MCP bridge tests: an in-memory memory service, and a tiny ASGI driver.

``FakeService`` follows the facade contract of ``node/service.py`` (same method names,
keyword-only arguments, JSON-ready results, ``HyphaeError``s) with toy semantics: the
"distance" of a cell to a query is the share of query words missing from its content,
and a beacon matches a cell when at least ``threshold`` of its words appear in it.
Every call is recorded in ``calls`` so tests can see which principal reached it.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import uuid
from typing import Any

from node import errors
from node.principals import Principal

ALICE = Principal(tenant_id="team", agent_id="alice", name="Alice")
BOB = Principal(tenant_id="team", agent_id="bob", name="Bob")
KEYS = {"key-alice": ALICE, "key-bob": BOB}
MAX_CONTENT_BYTES = 64 * 1024


def _words(text: str) -> set[str]:
    return {w.strip(".,;:!?").lower() for w in text.split() if w.strip(".,;:!?")}


def _ms(since: int | str | None) -> int:
    if since is None:
        return -1
    if isinstance(since, int):
        return since
    when = datetime.datetime.fromisoformat(since.replace("Z", "+00:00"))
    return int(when.timestamp() * 1000)


class FakeService:
    """The memory-service facade, in memory (see the module docstring)."""

    def __init__(self, *, start_ms: int = 1_700_000_000_000) -> None:
        self._clock = itertools.count(start_ms)
        self.calls: list[tuple[str, Principal, dict[str, Any]]] = []
        self.cells: dict[str, dict[str, Any]] = {}
        self.idempotency: dict[tuple[str, str], str] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.scenes: dict[str, dict[str, Any]] = {}
        self.beacons: dict[str, dict[str, Any]] = {}
        self.inboxes: dict[str, list[dict[str, Any]]] = {}
        self.pull_cursors: dict[str, int] = {}
        self.open_session: dict[str, str] = {}

    def now(self) -> int:
        return next(self._clock)

    def _record(self, method: str, principal: Principal, **arguments: Any) -> None:
        self.calls.append((method, principal, arguments))

    # -- identity --------------------------------------------------------------------

    async def authenticate(self, api_key: str) -> Principal:
        principal = KEYS.get(api_key)
        if principal is None:
            raise errors.Unauthenticated("unknown API key")
        return principal

    # -- cells -----------------------------------------------------------------------

    async def store(
        self,
        principal: Principal,
        *,
        content: str,
        cell_type: str,
        salience: float = 0.5,
        scene_id: str | None = None,
        source_ref: dict[str, str] | None = None,
        metadata: dict[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> dict[str, Any]:
        self._record("store", principal, content=content, cell_type=cell_type, salience=salience,
                     scene_id=scene_id, source_ref=source_ref, metadata=metadata, idempotency_key=idempotency_key)
        if len(content.encode()) > MAX_CONTENT_BYTES:
            raise errors.TooLarge("content exceeds 64 KiB", field="content", limit=MAX_CONTENT_BYTES)
        if idempotency_key is not None and (principal.agent_id, idempotency_key) in self.idempotency:
            return {"node_id": self.idempotency[(principal.agent_id, idempotency_key)]}
        session_id = self.open_session.get(principal.agent_id)
        project = self.sessions[session_id]["project"] if session_id else None
        if scene_id is None and session_id:
            scene_id = self.sessions[session_id]["scene_id"]
        if scene_id is not None and scene_id not in self.scenes:
            raise errors.NotFound(f"no scene {scene_id}", field="scene_id")
        node_id = str(uuid.uuid4())
        cell = {
            "node_id": node_id, "content": content, "cell_type": cell_type, "salience": salience,
            "source_agent": principal.agent_id, "origin_node": "node-1", "project": project,
            "scene_id": scene_id, "source_ref": source_ref, "metadata": metadata or {}, "created_at": self.now(),
        }
        self.cells[node_id] = cell
        if scene_id is not None:
            self.scenes[scene_id]["cell_ids"].append(node_id)
        if idempotency_key is not None:
            self.idempotency[(principal.agent_id, idempotency_key)] = node_id
        self._gossip(cell)
        return {"node_id": node_id}

    def _gossip(self, cell: dict[str, Any]) -> None:
        for beacon in self.beacons.values():
            if beacon["owner"] == cell["source_agent"]:
                continue
            wanted = _words(beacon["query"])
            similarity = len(wanted & _words(cell["content"])) / len(wanted)
            if similarity < beacon["threshold"]:
                continue
            if beacon["cell_types"] and cell["cell_type"] not in beacon["cell_types"]:
                continue
            diff = {
                **cell, "inbox_id": str(uuid.uuid4()), "received_at": self.now(),
                "beacon_id": beacon["beacon_id"], "similarity": similarity, "score": similarity,
                "why": f"word overlap {similarity:.2f}", "hops": 0, "kind": "match", "related": None,
                "supersedes": list(cell.get("metadata", {}).get("supersedes", [])), "superseded_by": None,
            }
            self.inboxes.setdefault(beacon["owner"], []).append(diff)

    def _hits(self, query: str, k: int, cell_types: list[str] | None, project: str | None,
              layer: str = "L0") -> dict[str, Any]:
        wanted = _words(query)
        hits = []
        for cell in self.cells.values():
            if cell_types and cell["cell_type"] not in cell_types:
                continue
            if project is not None and cell["project"] != project:
                continue
            if layer == "L1" and cell["salience"] < 0.8:
                continue
            if layer == "L2":
                continue
            distance = 1 - len(wanted & _words(cell["content"])) / max(len(wanted), 1)
            hits.append({"node_id": cell["node_id"], "distance": distance})
        hits.sort(key=lambda hit: hit["distance"])
        return {"results": hits[:k]}

    async def recall(self, principal: Principal, *, query: str, k: int = 10,
                     cell_types: list[str] | None = None, project: str | None = None) -> dict[str, Any]:
        self._record("recall", principal, query=query, k=k, cell_types=cell_types, project=project)
        return self._hits(query, k, cell_types, project)

    async def query(self, principal: Principal, *, query: str, layer: str, k: int = 10,
                    cell_types: list[str] | None = None, project: str | None = None) -> dict[str, Any]:
        self._record("query", principal, query=query, layer=layer, k=k, cell_types=cell_types, project=project)
        return self._hits(query, k, cell_types, project, layer)

    async def get_cell(self, principal: Principal, *, node_id: str) -> dict[str, Any]:
        self._record("get_cell", principal, node_id=node_id)
        cell = self.cells.get(node_id)
        if cell is None:
            raise errors.NotFound(f"no cell {node_id}", field="node_id")
        return dict(cell)

    async def list_cells(self, principal: Principal, *, limit: int | None = None,
                         cursor: str | None = None) -> dict[str, Any]:
        """Newest first; the cursor is how many cells the pages before held."""
        self._record("list_cells", principal, limit=limit, cursor=cursor)
        newest_first = list(reversed(self.cells.values()))
        start = int(cursor) if cursor else 0
        limit = limit or 50
        page = newest_first[start:start + limit]
        more = start + limit < len(newest_first)
        return {"cells": [dict(cell) for cell in page], "next_cursor": str(start + limit) if more else None}

    # -- sessions and scenes ---------------------------------------------------------

    async def start_session(self, principal: Principal, *, project: str, title: str | None = None) -> dict[str, Any]:
        self._record("start_session", principal, project=project, title=title)
        session_id, scene_id = str(uuid.uuid4()), str(uuid.uuid4())
        self.sessions[session_id] = {"owner": principal.agent_id, "project": project, "scene_id": scene_id,
                                     "ended_at": None}
        self.scenes[scene_id] = {
            "scene_id": scene_id, "project": project, "title": title, "session_id": session_id,
            "agent_id": principal.agent_id, "created_at": self.now(), "ended_at": None, "consolidated_at": None,
            "summary_node_id": None, "cell_ids": [],
        }
        self.open_session[principal.agent_id] = session_id
        return {"session_id": session_id, "scene_id": scene_id}

    async def end_session(self, principal: Principal, *, session_id: str) -> dict[str, Any]:
        self._record("end_session", principal, session_id=session_id)
        session = self.sessions.get(session_id)
        if session is None:
            raise errors.NotFound(f"no session {session_id}", field="session_id")
        if session["owner"] != principal.agent_id:
            raise errors.Forbidden("not your session", field="session_id")
        scene = self.scenes[session["scene_id"]]
        if session["ended_at"] is None:
            session["ended_at"] = scene["ended_at"] = self.now()
            self.open_session.pop(principal.agent_id, None)
        return {"session_id": session_id, "ended_at": session["ended_at"], "cell_count": len(scene["cell_ids"])}

    def _scene_view(self, scene: dict[str, Any]) -> dict[str, Any]:
        return {**scene, "cell_count": len(scene["cell_ids"]), "cell_ids": list(scene["cell_ids"])}

    async def get_scene(self, principal: Principal, *, scene_id: str) -> dict[str, Any]:
        self._record("get_scene", principal, scene_id=scene_id)
        scene = self.scenes.get(scene_id)
        if scene is None:
            raise errors.NotFound(f"no scene {scene_id}", field="scene_id")
        return self._scene_view(scene)

    async def list_scenes(self, principal: Principal, *, project: str | None = None, limit: int | None = None,
                          cursor: str | None = None) -> dict[str, Any]:
        self._record("list_scenes", principal, project=project, limit=limit, cursor=cursor)
        scenes = [s for s in self.scenes.values() if project is None or s["project"] == project]
        start = int(cursor) if cursor else 0
        limit = limit or 50
        page = scenes[start:start + limit]
        more = start + limit < len(scenes)
        listed = [{k: v for k, v in self._scene_view(s).items() if k != "cell_ids"} for s in page]  # as node.service
        return {"scenes": listed, "next_cursor": str(start + limit) if more else None}

    # -- beacons and inbox -----------------------------------------------------------

    async def place_beacon(self, principal: Principal, *, query: str, threshold: float | None = None,
                           cell_types: list[str] | None = None, project: str | None = None,
                           min_salience: float | None = None, ttl_seconds: int | None = None) -> dict[str, Any]:
        self._record("place_beacon", principal, query=query, threshold=threshold, cell_types=cell_types,
                     project=project, min_salience=min_salience, ttl_seconds=ttl_seconds)
        beacon_id = str(uuid.uuid4())
        created_at = self.now()
        self.beacons[beacon_id] = {
            "beacon_id": beacon_id, "owner": principal.agent_id, "query": query,
            "threshold": 0.5 if threshold is None else threshold, "cell_types": cell_types, "project": project,
            "min_salience": min_salience, "ttl_seconds": ttl_seconds, "created_at": created_at,
            "expires_at": created_at + ttl_seconds * 1000 if ttl_seconds else None,
        }
        return {"beacon_id": beacon_id}

    async def list_beacons(self, principal: Principal) -> dict[str, Any]:
        self._record("list_beacons", principal)
        mine = [{k: v for k, v in b.items() if k != "owner"} for b in self.beacons.values()
                if b["owner"] == principal.agent_id]
        return {"beacons": mine}

    async def inbox(self, principal: Principal, *, since: int | str | None = None,
                    limit: int | None = None) -> dict[str, Any]:
        self._record("inbox", principal, since=since, limit=limit)
        after = _ms(since)
        diffs = [d for d in self.inboxes.get(principal.agent_id, []) if d["received_at"] > after][: limit or 100]
        next_since = diffs[-1]["received_at"] if diffs else max(after, 0)
        return {"diffs": diffs, "next_since": next_since}

    async def pull_inbox(self, principal: Principal, *, limit: int | None = None) -> dict[str, Any]:
        self._record("pull_inbox", principal, limit=limit)
        items = self.inboxes.get(principal.agent_id, [])
        cursor = self.pull_cursors.get(principal.agent_id, 0)
        page = items[cursor: cursor + (limit or 100)]
        cursor += len(page)
        self.pull_cursors[principal.agent_id] = cursor
        return {"diffs": page, "cursor": cursor, "remaining": len(items) - cursor}


# -- a tiny ASGI driver (trio-friendly: no event-loop assumptions) -------------------------


@dataclasses.dataclass
class AsgiResult:
    status: int
    headers: dict[str, str]
    body: bytes
    chunks_read: int

    def json(self) -> Any:
        import json

        return json.loads(self.body)


async def asgi_request(
    app: Any,
    *,
    method: str = "POST",
    headers: dict[str, str] | list[tuple[str, str]] | None = None,
    body: bytes = b"",
    chunk_size: int | None = None,
    disconnect_after: int | None = None,
    path: str = "/mcp",
) -> AsgiResult:
    """Drive one HTTP exchange through ``app``; ``body`` is sent in ``chunk_size`` pieces."""
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in pairs],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 7777),
    }
    size = chunk_size or max(len(body), 1)
    chunks = [body[i:i + size] for i in range(0, len(body), size)] or [b""]
    read = 0
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        nonlocal read
        if disconnect_after is not None and read >= disconnect_after:
            return {"type": "http.disconnect"}
        if read < len(chunks):
            read += 1
            return {"type": "http.request", "body": chunks[read - 1], "more_body": read < len(chunks)}
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    if not sent:
        return AsgiResult(0, {}, b"", read)
    start = sent[0]
    assert start["type"] == "http.response.start"
    response_headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in start.get("headers", [])}
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return AsgiResult(start["status"], response_headers, payload, read)
