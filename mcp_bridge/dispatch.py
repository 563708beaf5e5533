"""The MCP dispatch core: a method table, and the one place exceptions become errors.

Theory of operation: a transport resolves the caller's principal (the launch key over
stdio, ``x-hyphae-key`` over HTTP) and hands each incoming message to
:meth:`Dispatcher.handle` with it. The principal never comes from the message.

    message ──jsonrpc.parse──▶ event
      MessageRejected        → its error response
      ResponseReceived       → None (we never send requests, so nothing waits for it)
      NotificationReceived   → run the notification handler, if any; None, always
      RequestReceived        → METHODS[method](params, principal) ─▶ result | error

Requests are answered through one boundary, :meth:`Dispatcher._answer`:

    raised                    becomes
    JsonRpcError              itself (unknown tool, bad arguments: -32602, ...)
    node.errors.HyphaeError   its reason's code (see :mod:`mcp_bridge.errors`), data = to_dict()
    any other Exception       -32603 "internal error"; logged here, never sent

A facade error is a JSON-RPC error object, never an ``isError: true`` tool result
(seed 000), so its code and ``data.reason`` survive. Unknown methods get -32601 at once
(newer SDK clients probe with ``server/discover``). Lifecycle state is not enforced:
over HTTP every POST stands alone, so a ``tools/call`` before ``initialize`` is served.

Every successful ``tools/call`` returns the seed's envelope: a text block with the
payload as compact JSON, ``structuredContent`` with the payload itself, ``isError:
false`` (encoded once: see :func:`_envelope`). ``recall`` and ``query`` add one
``resource_link`` block per hit after the text block (revisions that have the block
type: 2025-06-18 and later), so a host reads each hit with ``resources/read``
(:mod:`mcp_bridge.resources`); ``structuredContent`` stays ``{results: [{node_id, distance}]}``.

Arguments that fail the tool's ``inputSchema`` are answered by the negotiated revision
(SEP-1303): from 2025-11-25 on, a tool execution error (``isError: true``, one text
block naming the argument and why) that the model sees and can correct; before it,
-32602 as ever. The revision is what the transport knows: the ``MCP-Protocol-Version``
header over HTTP (absent: pre-2025-06-18), what ``initialize`` answered over stdio. An
unknown tool and every facade error stay JSON-RPC errors with their codes. With ``check_results``, payloads are
checked against the tool's ``outputSchema`` before they leave, so a facade that drifts
from the contract fails loudly here (-32603, logged with the violation) rather than in
a client's validator.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from node.errors import HyphaeError

from . import jsonrpc
from .errors import from_hyphae_error, internal_error, reason_error
from .jsonrpc import JsonRpcError
from .prompts import get_prompt, prompt_descriptors
from .resources import TEMPLATES, cell_link, list_resources, read_resource
from .tools import SchemaViolation, get_tool, tool_descriptors, validate_arguments, validate_result

__all__ = [
    "SUPPORTED_PROTOCOL_VERSIONS",
    "LATEST_PROTOCOL_VERSION",
    "SERVER_NAME",
    "INSTRUCTIONS",
    "MemoryService",
    "Dispatcher",
    "negotiate_protocol_version",
    "negotiated_version",
]

logger = logging.getLogger(__name__)

# Newest first; the first is what an unknown or absent request gets.
SUPPORTED_PROTOCOL_VERSIONS: tuple[str, ...] = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST_PROTOCOL_VERSION = SUPPORTED_PROTOCOL_VERSIONS[0]
TOOL_ERRORS_SINCE = "2025-11-25"  # SEP-1303: a bad argument is a tool execution error from here on
RESOURCE_LINKS_SINCE = "2025-06-18"  # the first revision with resource_link content blocks
_LINKED_TOOLS = frozenset({"recall", "query"})
SERVER_NAME = "hyphae"

INSTRUCTIONS = (
    "Hyphae is memory shared by a team of agents: what one agent stores reaches the others whose interests "
    "match, with no query in between. At the start of a task, call pull_inbox (or inbox) to catch up on what "
    "other agents learned. Use place_beacon for your standing interests (topics, projects, cell types) so "
    "matching memories are delivered to your inbox; list_beacons shows them. As you work, store decisions, "
    "constraints, risks and lessons, one self-contained idea per call, with a salience from 0 to 1 (higher "
    "travels further). recall and query find related cells by meaning and return ids with distances, each "
    "with a link to read the cell (resources/read on hyphae://cells/{node_id}). Wrap a "
    "longer piece of work in start_session / end_session so its cells are grouped into a scene."
)


class MemoryService(Protocol):
    """What the dispatcher needs of ``node.service`` (duck-typed; tests use a fake).

    Every method takes the principal first and the tool's arguments as keywords, and
    returns the tool's JSON-ready payload or raises a ``HyphaeError``.
    """

    async def store(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def recall(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def query(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def start_session(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def end_session(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def place_beacon(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def list_beacons(self, principal: Any) -> dict[str, Any]: ...
    async def inbox(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def get_scene(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def list_scenes(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def pull_inbox(self, principal: Any, **arguments: Any) -> dict[str, Any]: ...
    async def get_cell(self, principal: Any, *, node_id: Any) -> dict[str, Any]: ...
    async def list_cells(self, principal: Any, *, limit: Any = None, cursor: Any = None) -> dict[str, Any]: ...


def negotiate_protocol_version(requested: Any) -> str:
    """Echo a supported revision; answer anything else (or nothing) with the newest."""
    return requested if requested in SUPPORTED_PROTOCOL_VERSIONS else LATEST_PROTOCOL_VERSION


def _at_least(version: str | None, since: str) -> bool:
    """Whether a negotiated revision is ``since`` or newer (revisions are dates: they sort as text)."""
    return version is not None and version >= since


def _object_params(method: str, params: dict[str, Any] | list[Any] | None) -> dict[str, Any]:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise reason_error("invalid_argument", f"{method}: params must be an object", field="params")
    return params


class Dispatcher:
    """Answers MCP messages for one memory service; knows nothing of transports."""

    def __init__(self, service: MemoryService, *, server_version: str, check_results: bool = False) -> None:
        """``check_results`` checks every payload against its tool's outputSchema before it leaves.

        Off in the daemon: the check costs about as much as the recall it guards, and the
        contract tests (and SDK clients, which validate structuredContent) already hold every
        tool to its schema. Tests and debugging turn it on to catch drift at the source.
        """
        self._service = service
        self._server_version = server_version
        self._check_results = check_results
        self._methods: dict[str, Callable[[dict[str, Any], Any, str | None], Awaitable[Any]]] = {
            "initialize": self._initialize,
            "ping": self._ping,
            "tools/list": self._tools_list,
            "tools/call": self._tools_call,
            "resources/list": self._resources_list,
            "resources/templates/list": self._resource_templates_list,
            "resources/read": self._resources_read,
            "prompts/list": self._prompts_list,
            "prompts/get": self._prompts_get,
        }
        # Notifications we understand; every other one is dropped silently, as JSON-RPC asks.
        self._notifications: dict[str, Callable[[dict[str, Any]], None]] = {
            "notifications/initialized": lambda params: None,
            "notifications/cancelled": lambda params: None,  # each HTTP call / stdio task ends on its own
        }

    async def handle(
        self, message: bytes | str | dict[str, Any], principal: Any, *, protocol_version: str | None = None
    ) -> dict[str, Any] | None:
        """Answer one message: the response object, or None when none is owed.

        ``protocol_version`` is the revision the transport knows was negotiated (None: not
        known, answered as a pre-2025-06-18 client)."""
        event = jsonrpc.parse(message)
        if isinstance(event, jsonrpc.MessageRejected):
            return event.response()
        if isinstance(event, jsonrpc.ResponseReceived):
            return None
        if isinstance(event, jsonrpc.NotificationReceived):
            self._notify(event)
            return None
        return await self._answer(event, principal, protocol_version)

    def bind(self, principal: Any) -> Callable[[bytes], Awaitable[bytes | None]]:
        """A bytes-in, bytes-out handler for one fixed principal (what ``serve_stdio`` takes);
        it remembers the revision its ``initialize`` negotiated."""
        negotiated: list[str] = []

        async def handle_line(line: bytes) -> bytes | None:
            response = await self.handle(line, principal, protocol_version=negotiated[-1] if negotiated else None)
            if response is None:
                return None
            if (version := negotiated_version(response)) is not None:
                negotiated.append(version)
            return jsonrpc.encode(response)

        return handle_line

    def _notify(self, event: jsonrpc.NotificationReceived) -> None:
        handler = self._notifications.get(event.method)
        if handler is None:
            return
        try:
            handler(event.params if isinstance(event.params, dict) else {})
        except Exception:  # a notification has no one to tell
            logger.exception("notification %s failed", event.method)

    async def _answer(
        self, request: jsonrpc.RequestReceived, principal: Any, version: str | None = None
    ) -> dict[str, Any]:
        """The boundary: the only place an exception becomes a JSON-RPC error object."""
        method = self._methods.get(request.method)
        if method is None:
            error = JsonRpcError(jsonrpc.METHOD_NOT_FOUND, f"method not found: {request.method}")
            return jsonrpc.failure(request.id, error)
        try:
            result = await method(_object_params(request.method, request.params), principal, version)
        except JsonRpcError as exc:
            return jsonrpc.failure(request.id, exc)
        except HyphaeError as exc:
            return jsonrpc.failure(request.id, from_hyphae_error(exc))
        except Exception:
            logger.exception("%s (id %r) failed", request.method, request.id)
            return jsonrpc.failure(request.id, internal_error())
        return jsonrpc.success(request.id, result)

    # -- methods ----------------------------------------------------------------------

    async def _initialize(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return {
            "protocolVersion": negotiate_protocol_version(params.get("protocolVersion")),
            "capabilities": {
                "tools": {"listChanged": False},
                "resources": {"subscribe": False, "listChanged": False},
                "prompts": {"listChanged": False},
            },
            "serverInfo": {"name": SERVER_NAME, "title": "Hyphae", "version": self._server_version},
            "instructions": INSTRUCTIONS,
        }

    async def _ping(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return {}

    async def _tools_list(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return {"tools": tool_descriptors()}  # one page: no nextCursor

    async def _tools_call(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        if "name" not in params:
            message = "tools/call: params.name (the tool to call) is required"
            raise reason_error("invalid_argument", message, field="name")
        tool = get_tool(params["name"])
        try:
            arguments = validate_arguments(tool, params.get("arguments"))
        except JsonRpcError as exc:
            if _at_least(version, TOOL_ERRORS_SINCE):
                return _tool_error(exc.message)
            raise
        payload = await getattr(self._service, tool.name)(principal, **arguments)
        if not isinstance(payload, dict):
            logger.error("%s returned %s, not an object", tool.name, type(payload).__name__)
            raise internal_error()
        if self._check_results:
            try:
                validate_result(tool, payload)
            except SchemaViolation as violation:
                logger.error("%s returned a result outside its outputSchema: %s", tool.name, violation)
                raise internal_error() from None
        if tool.name in _LINKED_TOOLS and _at_least(version, RESOURCE_LINKS_SINCE):
            return _envelope(payload, await self._links(principal, payload))
        return _envelope(payload)

    async def _links(self, principal: Any, payload: dict[str, Any]) -> list[dict[str, Any]]:
        """One resource_link per hit, described by the start of its content (read through the
        facade, in the caller's scope; a hit that cannot be read now still gets a bare link)."""
        links = []
        for hit in payload.get("results", ()):
            try:
                cell = await self._service.get_cell(principal, node_id=hit["node_id"])
            except HyphaeError:
                cell = None
            links.append(cell_link(hit["node_id"], cell))
        return links

    async def _resources_list(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return await list_resources(self._service, principal, params)

    async def _resource_templates_list(
        self, params: dict[str, Any], principal: Any, version: str | None
    ) -> dict[str, Any]:
        return {"resourceTemplates": [dict(template) for template in TEMPLATES]}

    async def _resources_read(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return await read_resource(self._service, principal, params)

    async def _prompts_list(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return {"prompts": prompt_descriptors()}

    async def _prompts_get(self, params: dict[str, Any], principal: Any, version: str | None) -> dict[str, Any]:
        return get_prompt(params)


def negotiated_version(response: dict[str, Any]) -> str | None:
    """The revision an ``initialize`` response agreed on (None for any other response)."""
    result = response.get("result")
    if isinstance(result, dict) and "serverInfo" in result and isinstance(result.get("protocolVersion"), str):
        return result["protocolVersion"]
    return None


def _tool_error(message: str) -> dict[str, Any]:
    """A tool execution error (SEP-1303): the model reads the text and corrects its call."""
    return {"content": [{"type": "text", "text": message}], "isError": True}


def _envelope(payload: dict[str, Any], links: list[dict[str, Any]] = ()) -> jsonrpc.EncodedResult:
    """The seed's tool-result envelope. The payload appears twice (as the text block, and
    as structuredContent) but is encoded once: its JSON is the text and is spliced into the
    envelope's own encoding. ``links`` follow the text block."""
    text = jsonrpc.COMPACT.encode(payload)
    quoted = jsonrpc.COMPACT.encode(text)
    blocks = [{"type": "text", "text": text}, *links]
    envelope = {"content": blocks, "structuredContent": payload, "isError": False}
    extra = "".join("," + jsonrpc.COMPACT.encode(link) for link in links)
    return jsonrpc.EncodedResult(
        envelope,
        f'{{"content":[{{"type":"text","text":{quoted}}}{extra}],"structuredContent":{text},"isError":false}}',
    )
