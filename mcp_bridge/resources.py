"""MCP resources: what an agent recalls, readable where it recalled it.

``recall`` and ``query`` return ``{node_id, distance}`` pairs (seed 000); the content is
read back through MCP's own hydrating surface, the resources:

    uri                          what resources/read returns (JSON text, application/json)
    hyphae://cells/{node_id}     the cell, as the facade's get_cell renders it
    hyphae://scenes/{scene_id}   the scene, as get_scene renders it
    hyphae://inbox               the caller's inbox, oldest first (as the inbox tool, no since)
    hyphae://beacons             the caller's beacons (as list_beacons)

Every read goes through the same facade call, and so the same read scope, as the tools.
A cell or scene outside the caller's scope reads exactly as one that does not exist:
-32002 "resource not found" (MCP's code), ``data.reason`` ``not_found``, never a
forbidden error that would confirm it exists. Whatever fields the facade's rendering
carries (status, supersession, ...) pass through unchanged.

``resources/list`` names the inbox and the beacons, then the cells in scope, newest
first, a page at a time (``nextCursor`` is the facade's cursor). Forgotten cells and
superseded ones are left out of the listing; they still read by their uri.

The links: a ``resource_link`` content block per hit is built from the same rendering,
with a one-line description that is the start of the cell's content.
"""

from __future__ import annotations

import re
from typing import Any

from node.errors import Forbidden, HyphaeError, NotFound

from .jsonrpc import COMPACT, JsonRpcError

__all__ = [
    "BEACONS_URI",
    "INBOX_URI",
    "MIME_TYPE",
    "RESOURCE_NOT_FOUND",
    "SCHEME",
    "TEMPLATES",
    "cell_link",
    "cell_uri",
    "list_resources",
    "one_line",
    "read_resource",
    "scene_uri",
]

SCHEME = "hyphae"
MIME_TYPE = "application/json"
INBOX_URI = "hyphae://inbox"
BEACONS_URI = "hyphae://beacons"
RESOURCE_NOT_FOUND = -32002  # MCP's code for a uri that names nothing readable
DESCRIPTION_CHARS = 120

_CELL = re.compile(r"^hyphae://cells/([^/?#]+)$")
_SCENE = re.compile(r"^hyphae://scenes/([^/?#]+)$")

TEMPLATES: tuple[dict[str, Any], ...] = (
    {
        "uriTemplate": "hyphae://cells/{node_id}",
        "name": "cell",
        "title": "A memory cell",
        "description": "One cell by node_id (as recall and query return it): content, type, salience, project, "
        "provenance, metadata.",
        "mimeType": MIME_TYPE,
    },
    {
        "uriTemplate": "hyphae://scenes/{scene_id}",
        "name": "scene",
        "title": "A scene",
        "description": "One scene (an episode of work) by scene_id, with the ids of its cells.",
        "mimeType": MIME_TYPE,
    },
)

_FIXED: tuple[dict[str, Any], ...] = (
    {
        "uri": INBOX_URI,
        "name": "inbox",
        "title": "My inbox",
        "description": "The diffs gossiped to you (cells that matched your beacons), oldest first.",
        "mimeType": MIME_TYPE,
    },
    {
        "uri": BEACONS_URI,
        "name": "beacons",
        "title": "My beacons",
        "description": "Your standing interests.",
        "mimeType": MIME_TYPE,
    },
)


def cell_uri(node_id: str) -> str:
    return f"hyphae://cells/{node_id}"


def scene_uri(scene_id: str) -> str:
    return f"hyphae://scenes/{scene_id}"


def one_line(text: Any, limit: int = DESCRIPTION_CHARS) -> str:
    """The start of ``text`` on one line, cut at a word with an ellipsis when longer than ``limit``."""
    flat = " ".join(str(text or "").split())
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut) + "…"


def not_found(uri: str) -> JsonRpcError:
    message = f"no resource {uri}"
    return JsonRpcError(RESOURCE_NOT_FOUND, message, {"reason": "not_found", "message": message, "uri": uri})


def _invalid_uri(uri: Any) -> JsonRpcError:
    shown = uri if isinstance(uri, str) else type(uri).__name__
    message = (
        f"resources/read: params.uri must be a hyphae:// resource uri (hyphae://cells/{{node_id}}, "
        f"hyphae://scenes/{{scene_id}}, {INBOX_URI} or {BEACONS_URI}); got {shown!r}"
    )
    return JsonRpcError(-32602, message, {"reason": "invalid_argument", "message": message, "field": "uri"})


async def _read_payload(service: Any, principal: Any, uri: str) -> dict[str, Any]:
    if uri == INBOX_URI:
        return await service.inbox(principal)
    if uri == BEACONS_URI:
        return await service.list_beacons(principal)
    if match := _CELL.match(uri):
        call, argument = service.get_cell, {"node_id": match.group(1)}
    elif match := _SCENE.match(uri):
        call, argument = service.get_scene, {"scene_id": match.group(1)}
    else:
        raise not_found(uri) if uri.startswith(f"{SCHEME}://") else _invalid_uri(uri)
    try:
        return await call(principal, **argument)
    except (NotFound, Forbidden):
        raise not_found(uri) from None  # out of scope reads as absent, never as forbidden
    except HyphaeError as exc:
        if exc.reason == "invalid_argument":  # not a UUID: nothing can have that uri
            raise not_found(uri) from None
        raise


async def read_resource(service: Any, principal: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The ``resources/read`` result for ``params.uri``."""
    uri = params.get("uri")
    if not isinstance(uri, str) or not uri:
        raise _invalid_uri(uri)
    payload = await _read_payload(service, principal, uri)
    return {"contents": [{"uri": uri, "mimeType": MIME_TYPE, "text": COMPACT.encode(payload)}]}


def _listed(cell: dict[str, Any]) -> bool:
    return not cell.get("forgotten_at") and cell.get("status", "active") != "superseded"


def _cell_entry(cell: dict[str, Any]) -> dict[str, Any]:
    return {
        "uri": cell_uri(cell["node_id"]),
        "name": cell["node_id"],
        "title": f"{cell.get('cell_type', 'Cell')}: {one_line(cell.get('content'), 60)}",
        "description": one_line(cell.get("content")),
        "mimeType": MIME_TYPE,
    }


async def list_resources(service: Any, principal: Any, params: dict[str, Any]) -> dict[str, Any]:
    """One page of ``resources/list``: the fixed resources first, then cells newest first."""
    cursor = params.get("cursor")
    if cursor is not None and not isinstance(cursor, str):
        message = "resources/list: cursor must be the nextCursor of an earlier page"
        raise JsonRpcError(-32602, message, {"reason": "invalid_argument", "message": message, "field": "cursor"})
    page = await service.list_cells(principal, cursor=cursor)
    cells = [_cell_entry(cell) for cell in page["cells"] if _listed(cell)]
    result: dict[str, Any] = {"resources": ([dict(entry) for entry in _FIXED] if cursor is None else []) + cells}
    if page.get("next_cursor") is not None:
        result["nextCursor"] = page["next_cursor"]
    return result


def cell_link(node_id: str, cell: dict[str, Any] | None) -> dict[str, Any]:
    """A ``resource_link`` content block for one hit (``cell`` None: the link alone)."""
    link: dict[str, Any] = {"type": "resource_link", "uri": cell_uri(node_id), "name": node_id, "mimeType": MIME_TYPE}
    if cell is not None:
        link["title"] = f"{cell.get('cell_type', 'Cell')} cell"
        link["description"] = one_line(cell.get("content"))
    return link
