"""The REST surface (``/v1``): the same facade as MCP, with full cells.

Each route is one row of ``ROUTES``: method, path, the facade call, and what the
OpenAPI document says about it; the router and ``/openapi.json`` are both derived
from the table, so they cannot drift apart. Keys come in ``x-hyphae-key`` (or
``Authorization: Bearer``); admin routes (agents) take the data dir's admin token in
``x-hyphae-admin``, which only the user who owns the data dir can read.
"""

from __future__ import annotations

import dataclasses
import hmac
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from node.errors import HyphaeError, InvalidArgument, Unauthenticated
from node.principals import Principal
from node.service import MemoryService
from node.version import package_version

from .http import HttpError, Request

__all__ = ["Route", "ROUTES", "RestApi"]

Handler = Callable[[MemoryService, Principal | None, Request], Awaitable[Any]]


@dataclasses.dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    summary: str
    auth: str = "key"  # "key", "admin" or "none"
    status: int = 200
    body: tuple[str, ...] = ()  # JSON body fields, documented in OpenAPI
    query: tuple[str, ...] = ()  # query-string parameters
    tag: str = "memory"

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.path) + "$")


def _body(request: Request, allowed: tuple[str, ...]) -> dict[str, Any]:
    data = request.json()
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        hint = " (identity comes from your API key)" if {"source_agent", "tenant_id"} & set(unknown) else ""
        raise InvalidArgument(f"unknown field(s): {', '.join(unknown)}{hint}", field=unknown[0])
    return data


def _int(request: Request, name: str) -> int | None:
    value = request.query.get(name)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"'{name}' must be an integer", field=name) from None


def _since(request: Request) -> int | str | None:
    value = request.query.get("since")
    if value in (None, ""):
        return None
    return int(value) if value.isascii() and value.isdigit() else value  # '²' is a digit to str.isdigit


STORE_FIELDS = ("content", "cell_type", "salience", "scene_id", "source_ref", "metadata", "idempotency_key", "project")
SEARCH_FIELDS = ("query", "k", "layer", "cell_types", "project", "include_superseded")
RECALL_FIELDS = ("query", "k", "cell_types", "project", "include_superseded")
BEACON_FIELDS = ("query", "threshold", "cell_types", "project", "min_salience", "ttl_seconds")


async def _health(service, _principal, _request):
    return {"status": "ok", "node_id": service.node_id, "version": package_version()}


async def _whoami(service, principal, _request):
    return {"agent_id": principal.agent_id, "name": principal.name, "tenant_id": principal.tenant_id,
            "projects": list(principal.projects), "node_id": service.node_id}


async def _store(service, principal, request):
    return await service.store(principal, **_body(request, STORE_FIELDS))


async def _get_cell(service, principal, request):
    return await service.get_cell(principal, node_id=request.path_params["node_id"])


async def _forget(service, principal, request):
    return await service.forget(principal, node_id=request.path_params["node_id"])


async def _admin_forget_one(service, _principal, request):
    node_id = request.path_params["node_id"]
    result = await service.admin_forget([node_id])
    if result["refused"]:
        raise _refusal(result["refused"][0])
    return result["forgotten"][0]


def _refusal(refused: dict[str, str]) -> HttpError:
    status = 404 if refused["reason"] == "not_found" else 403
    return HttpError(status, refused["reason"], refused["message"], field="node_id")


async def _admin_forget(service, _principal, request):
    return await service.admin_forget(_body(request, ("node_ids",)).get("node_ids"))


async def _forgettable(service, _principal, request):
    return await service.forgettable(**_body(request, ("agent", "project")))


async def _search(service, principal, request):
    return await service.search(principal, **_body(request, SEARCH_FIELDS))


async def _recall(service, principal, request):
    return await service.recall(principal, **_body(request, RECALL_FIELDS))


async def _place_beacon(service, principal, request):
    return await service.place_beacon(principal, **_body(request, BEACON_FIELDS))


async def _list_beacons(service, principal, _request):
    return await service.list_beacons(principal)


async def _remove_beacon(service, principal, request):
    return await service.remove_beacon(principal, beacon_id=request.path_params["beacon_id"])


async def _start_session(service, principal, request):
    return await service.start_session(principal, **_body(request, ("project", "title")))


async def _end_session(service, principal, request):
    return await service.end_session(principal, session_id=request.path_params["session_id"])


async def _list_scenes(service, principal, request):
    return await service.list_scenes(
        principal, project=request.query.get("project") or None, limit=_int(request, "limit"),
        cursor=request.query.get("cursor") or None,
    )


async def _get_scene(service, principal, request):
    return await service.get_scene(principal, scene_id=request.path_params["scene_id"])


async def _consolidate(service, principal, request):
    return await service.consolidate_scene(principal, scene_id=request.path_params["scene_id"])


async def _inbox(service, principal, request):
    return await service.inbox(
        principal, since=_since(request), limit=_int(request, "limit"),
        include_superseded=request.query.get("include_superseded") or False,
    )  # fmt: skip


async def _pull(service, principal, request):
    return await service.pull_inbox(principal, **_body(request, ("limit", "include_superseded")))


async def _list_cells(service, principal, request):
    return await service.list_cells(
        principal, limit=_int(request, "limit"), cursor=request.query.get("cursor") or None,
        include_superseded=request.query.get("include_superseded") or False,
    )  # fmt: skip


async def _validate(service, _principal, request):
    return await service.validate_sources(**_body(request, ("project",)))


async def _node_inbox(service, _principal, request):
    return await service.node_inbox(since=_since(request), limit=_int(request, "limit"))


async def _stats(service, _principal, _request):
    return await service.stats()


async def _peers(service, _principal, _request):
    status = service.mesh_status
    return status() if status is not None else {"enabled": False}


async def _add_agent(service, _principal, request):
    data = _body(request, ("name", "projects"))
    principal, api_key = await service.add_agent(data.get("name"), data.get("projects"))
    return {"name": principal.name, "agent_id": principal.agent_id, "projects": list(principal.projects), "api_key": api_key}


async def _list_agents(service, _principal, _request):
    return {"agents": await service.list_agents()}


async def _revoke_agent(service, _principal, request):
    return await service.revoke_agent(request.path_params["name"])


def _local_file(request: Request, *, must_exist: bool) -> Path:
    """The ``path`` of an export/import: a file on this machine, named absolutely (the
    daemon's working directory is nobody's business)."""
    value = _body(request, ("path",)).get("path")
    if not isinstance(value, str) or not value or not Path(value).is_absolute():
        raise InvalidArgument("'path' must be an absolute file path on this machine", field="path")
    path = Path(value)
    if must_exist and not path.is_file():
        raise InvalidArgument(f"no such file: {path}", field="path")
    if not must_exist and not path.parent.is_dir():
        raise InvalidArgument(f"no such directory: {path.parent}", field="path")
    return path


async def _export(service, _principal, request):
    from node.transfer import export_file

    path = _local_file(request, must_exist=False)
    return {"file": str(path), **await export_file(service, path)}


async def _import(service, _principal, request):
    from node.transfer import import_file

    return dict(await import_file(service, _local_file(request, must_exist=True)))


ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", _health, "Liveness and the node id", auth="none", tag="node"),
    Route("GET", "/v1/whoami", _whoami, "The principal behind the key", tag="node"),
    Route("GET", "/v1/stats", _stats, "Node counters", tag="node"),
    Route("POST", "/v1/cells", _store, "Store a memory cell", status=201, body=STORE_FIELDS),
    Route("GET", "/v1/cells", _list_cells, "The newest cells in your read scope, newest first",
          query=("limit", "cursor", "include_superseded")),
    Route("GET", "/v1/cells/{node_id}", _get_cell, "Hydrate a cell with content and provenance"),
    Route("DELETE", "/v1/cells/{node_id}", _forget, "Forget a cell (it becomes a tombstone)"),
    Route("POST", "/v1/search", _search, "Nearest cells to a query, with content", body=SEARCH_FIELDS),
    Route("POST", "/v1/recall", _recall, "Nearest cells at L0, ids and distances only", body=RECALL_FIELDS),
    Route("POST", "/v1/beacons", _place_beacon, "Place a standing interest", status=201, body=BEACON_FIELDS),
    Route("GET", "/v1/beacons", _list_beacons, "Your live beacons"),
    Route("DELETE", "/v1/beacons/{beacon_id}", _remove_beacon, "Remove one of your beacons"),
    Route("POST", "/v1/sessions", _start_session, "Open a session and its scene", status=201, body=("project", "title")),
    Route("POST", "/v1/sessions/{session_id}/end", _end_session, "Close a session"),
    Route("GET", "/v1/scenes", _list_scenes, "Scenes in your read scope", query=("project", "limit", "cursor")),
    Route("GET", "/v1/scenes/{scene_id}", _get_scene, "One scene with its cell ids"),
    Route("POST", "/v1/scenes/{scene_id}/consolidate", _consolidate, "Summarise a scene into an L2 cell", status=201),
    Route("GET", "/v1/inbox", _inbox, "Diffs received after a time (non-destructive)",
          query=("since", "limit", "include_superseded")),
    Route("POST", "/v1/inbox/pull", _pull, "The next page after your server-kept cursor", body=("limit", "include_superseded")),
    Route("POST", "/v1/admin/agents", _add_agent, "Create an agent; its key is returned once", auth="admin", status=201, body=("name", "projects"), tag="admin"),
    Route("GET", "/v1/admin/agents", _list_agents, "List agents", auth="admin", tag="admin"),
    Route("DELETE", "/v1/admin/agents/{name}", _revoke_agent, "Revoke an agent's key", auth="admin", tag="admin"),
    Route("POST", "/v1/admin/export", _export, "Write the node's cells, beacons and scenes to a JSONL file on this machine",
          auth="admin", body=("path",), tag="admin"),
    Route("POST", "/v1/admin/import", _import, "Import a JSONL export file on this machine (idempotent, resumable)",
          auth="admin", body=("path",), tag="admin"),
    Route("POST", "/v1/admin/validate", _validate, "Hash this node's file-sourced cells again; mark changed ones stale",
          auth="admin", body=("project",), tag="admin"),
    Route("GET", "/v1/peers", _peers, "The mesh: peers, states, queues, drop counters", tag="node"),
    Route("GET", "/v1/admin/peers", _peers, "The mesh, for the data dir's owner", auth="admin", tag="admin"),
    Route("DELETE", "/v1/admin/cells/{node_id}", _admin_forget_one, "Forget a cell of any agent of this node",
          auth="admin", tag="admin"),
    Route("POST", "/v1/admin/forget", _admin_forget,
          "Forget cells of any agent of this node; ids that are unknown or came from another node are listed in 'refused'",
          auth="admin", body=("node_ids",), tag="admin"),
    Route("POST", "/v1/admin/forget/matching", _forgettable,
          "This node's live cells of an agent (by name) and/or a project: what a bulk forget would take",
          auth="admin", body=("agent", "project"), tag="admin"),
    Route("GET", "/v1/admin/inbox", _node_inbox, "Every agent's inbox on this node, by arrival", auth="admin",
          query=("since", "limit"), tag="admin"),
)




class RestApi:
    """Routes a request to its facade call and turns facade errors into HTTP ones."""

    def __init__(self, service: MemoryService, admin_token: str) -> None:
        self.service = service
        self._admin_token = admin_token
        self._compiled = [(route, route.pattern) for route in ROUTES]

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        allowed = []
        for route, pattern in self._compiled:
            found = pattern.match(path)
            if found:
                if route.method == method:
                    return route, found.groupdict()
                allowed.append(route.method)
        if allowed:
            raise HttpError(405, "method_not_allowed", f"{method} is not allowed on {path}; use {', '.join(allowed)}")
        raise HttpError(404, "not_found", f"no route {path}")

    async def handle(self, request: Request) -> tuple[int, Any]:
        route, params = self.match(request.method, request.path)
        request.path_params = params
        try:
            principal = await self._authorise(route, request)
            return route.status, await route.handler(self.service, principal, request)
        except HyphaeError as exc:
            raise HttpError(exc.http_status, exc.reason, exc.message, **_extra(exc)) from None

    async def _authorise(self, route: Route, request: Request) -> Principal | None:
        if route.auth == "none":
            return None
        if route.auth == "admin":
            token = request.headers.get("x-hyphae-admin", "")
            if not token or not hmac.compare_digest(token, self._admin_token):
                raise HttpError(401, "unauthenticated", "admin routes need the data dir's admin token (x-hyphae-admin)")
            return None
        key = request.headers.get("x-hyphae-key")
        if key is None:
            auth = request.headers.get("authorization", "")
            key = auth[7:].strip() if auth.lower().startswith("bearer ") else None
        if not key:
            raise Unauthenticated("no API key: send it as Authorization: Bearer KEY (or in the x-hyphae-key header)")
        return await self.service.authenticate(key)


def _extra(exc: HyphaeError) -> dict[str, Any]:
    extra = dict(exc.details)
    if exc.field is not None:
        extra["field"] = exc.field
    return extra
