"""The 11 MCP tools: their descriptors, and the check of call arguments against them.

The roster and its order are fixed by seed 000; ``store``'s arguments by seed 001; the
rest, the results and the annotations by DESIGN §7. Every descriptor states all four
behaviour hints (MCP's defaults for an absent hint are worst-case) and
``openWorldHint`` is false everywhere: each tool works on this deployment's own memory
store, scoped to the caller's key. No authorization decision reads a hint.

Every ``inputSchema`` says ``additionalProperties: false``, so identity can never ride
in the arguments: ``source_agent`` and ``tenant_id`` are refused with a message that
says identity comes from the API key (seed 000, INV-5).

Arguments are checked by :mod:`mcp_bridge.schema`.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from node.energy import CELL_TYPES

from .errors import reason_error
from .schema import SchemaViolation, conform, expectation
from .jsonrpc import JsonRpcError

__all__ = [
    "Tool",
    "TOOLS",
    "TOOLS_BY_NAME",
    "IDENTITY_ARGUMENTS",
    "MAX_SUPERSEDES",
    "tool_descriptors",
    "get_tool",
    "validate_arguments",
    "validate_result",
    "SchemaViolation",
    "conform",
    "expectation",
]

# ---------------------------------------------------------------------------------------
# The descriptors

IDENTITY_ARGUMENTS = frozenset({"source_agent", "tenant_id"})
MAX_SUPERSEDES = 16  # cells one store may mark superseded


def _obj(properties: dict[str, Any], required: tuple[str, ...] = (), *, closed: bool = False) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": properties, "required": list(required)}
    if closed:
        schema["additionalProperties"] = False
    return schema


def _record(properties: dict[str, Any]) -> dict[str, Any]:
    """An output object whose every field is always present (possibly null)."""
    return _obj(properties, tuple(properties))


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    base = schema["type"]
    return {**schema, "type": [*([base] if isinstance(base, str) else base), "null"]}


_STRING = {"type": "string"}
_INT = {"type": "integer"}
_NUMBER = {"type": "number"}
_MS = {"type": "integer", "minimum": 0, "description": "Milliseconds since the Unix epoch."}
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_CELL_TYPE = {"type": "string", "enum": list(CELL_TYPES)}

# -- input fragments ----------------------------------------------------------------------

_IN_QUERY = {"type": "string", "minLength": 1, "description": "What you are looking for, in natural language."}
_IN_K = {"type": "integer", "minimum": 1, "maximum": 100, "default": 10, "description": "How many results (1-100)."}
_IN_CELL_TYPES = {
    "type": "array",
    "minItems": 1,
    "items": _CELL_TYPE,
    "description": "Only cells of these types.",
}
_IN_PROJECT = {"type": "string", "minLength": 1, "description": "Only cells of this project."}
_IN_LIMIT = {"type": "integer", "minimum": 1, "maximum": 500, "description": "Page size (1-500)."}

_STORE_INPUT = _obj(
    {
        "content": {"type": "string", "minLength": 1, "description": "The cell content: one self-contained idea."},
        "cell_type": {
            **_CELL_TYPE,
            "description": "The cell type; drives energy and promotion. Decision, Constraint, Risk, Pattern, "
            "Lesson, Fact, Preference, Context or Task.",
        },
        "salience": {
            **_UNIT,
            "default": 0.5,
            "description": "Salience hint in [0, 1]; higher reaches further during gossip.",
        },
        "scene_id": {"type": "string", "format": "uuid", "description": "UUID of a scene this cell belongs to."},
        "source_ref": _obj(
            {
                "kind": {"type": "string", "minLength": 1, "description": "e.g. file, url, commit, issue."},
                "locator": {"type": "string", "minLength": 1, "description": "e.g. specs/storage.md:42 or a URL."},
            },
            ("kind", "locator"),
            closed=True,
        )
        | {"description": "Provenance back-reference: {kind, locator}."},
        "metadata": {
            "type": "object",
            "properties": {
                "supersedes": {
                    "type": "array",
                    "items": {"type": "string", "format": "uuid"},
                    "maxItems": MAX_SUPERSEDES,
                    "description": "The node_ids of the cells this one replaces; they stay as history, marked "
                    "superseded.",
                }
            },
            "default": {},
            "description": "Structured metadata (a JSON object; any fields). metadata.supersedes lists the cells "
            "this one replaces.",
        },
        "idempotency_key": {
            "type": "string",
            "minLength": 1,
            "maxLength": 200,
            "description": "A replayed key returns the original node_id instead of creating a duplicate.",
        },
    },
    ("content", "cell_type"),
    closed=True,
)

_RECALL_INPUT = _obj(
    {"query": _IN_QUERY, "k": _IN_K, "cell_types": _IN_CELL_TYPES, "project": _IN_PROJECT}, ("query",), closed=True
)

_QUERY_INPUT = _obj(
    {
        "query": _IN_QUERY,
        "layer": {
            "type": "string",
            "enum": ["L0", "L1", "L2"],
            "description": "L0: every cell. L1: durable knowledge promoted by the energy model. L2: scene summaries.",
        },
        "k": _IN_K,
        "cell_types": _IN_CELL_TYPES,
        "project": _IN_PROJECT,
    },
    ("query", "layer"),
    closed=True,
)

_START_SESSION_INPUT = _obj(
    {
        "project": {"type": "string", "minLength": 1, "description": "The project this work belongs to."},
        "title": {"type": "string", "description": "A short title for the session's scene."},
    },
    ("project",),
    closed=True,
)

_END_SESSION_INPUT = _obj(
    {"session_id": {"type": "string", "minLength": 1, "description": "The id start_session returned."}},
    ("session_id",),
    closed=True,
)

_PLACE_BEACON_INPUT = _obj(
    {
        "query": {**_IN_QUERY, "description": "The standing interest, in natural language."},
        "threshold": {**_UNIT, "description": "Minimum cosine similarity in [0, 1] (the server has a default)."},
        "cell_types": _IN_CELL_TYPES,
        "project": _IN_PROJECT,
        "min_salience": {**_UNIT, "description": "Only cells with at least this salience."},
        "ttl_seconds": {"type": "integer", "minimum": 1, "description": "Expire the beacon after this many seconds."},
    },
    ("query",),
    closed=True,
)

_INBOX_INPUT = _obj(
    {
        "since": {
            "type": ["integer", "string"],
            "minimum": 0,
            "format": "date-time",
            "description": "Only diffs received after this: milliseconds since the epoch, or an RFC 3339 time.",
        },
        "limit": _IN_LIMIT,
    },
    closed=True,
)

_GET_SCENE_INPUT = _obj(
    {"scene_id": {"type": "string", "format": "uuid", "description": "The scene's UUID."}}, ("scene_id",), closed=True
)

_LIST_SCENES_INPUT = _obj(
    {
        "project": {"type": "string", "minLength": 1, "description": "Only scenes of this project."},
        "limit": _IN_LIMIT,
        "cursor": {"type": "string", "description": "next_cursor of the previous page."},
    },
    closed=True,
)

_PULL_INBOX_INPUT = _obj({"limit": _IN_LIMIT}, closed=True)

_NO_INPUT = _obj({}, closed=True)

# -- output fragments ---------------------------------------------------------------------

_HITS = _obj(
    {
        "results": {
            "type": "array",
            "items": _obj({"node_id": _STRING, "distance": _NUMBER}, ("node_id", "distance")),
            "description": "Nearest first; smaller distance is closer.",
        }
    },
    ("results",),
)

_DIFF = _record(
    {
        "inbox_id": {"type": ["string", "integer"]},
        "node_id": _STRING,
        "content": _STRING,
        "cell_type": _CELL_TYPE,
        "salience": _NUMBER,
        "source_agent": _STRING,
        "origin_node": _STRING,
        "project": _nullable(_STRING),
        "scene_id": _nullable(_STRING),
        "source_ref": _nullable(_obj({"kind": _STRING, "locator": _STRING}, ("kind", "locator"))),
        "metadata": {"type": "object"},
        "created_at": _MS,
        "received_at": _MS,
        "beacon_id": _STRING,
        "similarity": _NUMBER,
        "score": _NUMBER,
        "why": _nullable(_STRING),
        "hops": _INT,
        "kind": {"type": "string", "enum": ["match", "supersedes", "possible_conflict"]},
        "related": _nullable(_STRING),
        "supersedes": {"type": "array", "items": _STRING},
        "superseded_by": _nullable(_STRING),
    },
)

_SCENE = _record(
    {
        "scene_id": _STRING,
        "project": _nullable(_STRING),
        "title": _nullable(_STRING),
        "session_id": _nullable(_STRING),
        "agent_id": _STRING,
        "created_at": _MS,
        "ended_at": _nullable(_MS),
        "consolidated_at": _nullable(_MS),
        "summary_node_id": _nullable(_STRING),
        "cell_count": _INT,
        "cell_ids": {"type": "array", "items": _STRING},
    },
)
# A page of list_scenes leaves each scene's cell_ids out (get_scene has them).
_SCENE_IN_LIST = {**_SCENE, "required": [name for name in _SCENE["required"] if name != "cell_ids"]}

_BEACON = _record(
    {
        "beacon_id": _STRING,
        "query": _STRING,
        "threshold": _nullable(_NUMBER),
        "cell_types": _nullable({"type": "array", "items": _CELL_TYPE}),
        "project": _nullable(_STRING),
        "min_salience": _nullable(_NUMBER),
        "ttl_seconds": _nullable(_INT),
        "created_at": _MS,
        "expires_at": _nullable(_MS),
    },
)


@dataclasses.dataclass(frozen=True)
class Tool:
    """One MCP tool; ``name`` is also the facade method it dispatches to."""

    name: str
    title: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    read_only: bool
    destructive: bool
    idempotent: bool

    def descriptor(self) -> dict[str, Any]:
        """The entry ``tools/list`` sends (a fresh copy each time: callers may mutate it)."""
        return {
            "name": self.name,
            "title": self.title,
            "description": self.description,
            "inputSchema": copy.deepcopy(self.input_schema),
            "outputSchema": copy.deepcopy(self.output_schema),
            "annotations": {
                "title": self.title,
                "readOnlyHint": self.read_only,
                "destructiveHint": self.destructive,
                "idempotentHint": self.idempotent,
                "openWorldHint": False,
            },
        }


_DIFFS = {"type": "array", "items": _DIFF}
_OUT_STORE = _obj({"node_id": _STRING}, ("node_id",))
_OUT_START_SESSION = _obj({"session_id": _STRING, "scene_id": _STRING}, ("session_id", "scene_id"))
_OUT_END_SESSION = _obj(
    {"session_id": _STRING, "ended_at": _MS, "cell_count": _INT}, ("session_id", "ended_at", "cell_count")
)
_OUT_PLACE_BEACON = _obj({"beacon_id": _STRING}, ("beacon_id",))
_OUT_LIST_BEACONS = _obj({"beacons": {"type": "array", "items": _BEACON}}, ("beacons",))
_OUT_INBOX = _obj({"diffs": _DIFFS, "next_since": _MS}, ("diffs", "next_since"))
_OUT_LIST_SCENES = _obj(
    {"scenes": {"type": "array", "items": _SCENE_IN_LIST}, "next_cursor": _nullable(_STRING)},
    ("scenes", "next_cursor"),
)
_OUT_PULL_INBOX = _obj(
    {"diffs": _DIFFS, "cursor": _INT, "remaining": {"type": "integer", "minimum": 0}},
    ("diffs", "cursor", "remaining"),
)

# The roster, in seed 000's order, with DESIGN §7's hints:
#  name             title                      inputSchema           outputSchema        readOnly destr. idempotent
_TABLE: tuple[tuple[str, str, dict[str, Any], dict[str, Any], bool, bool, bool], ...] = (
    ("store",         "Store a memory",          _STORE_INPUT,         _OUT_STORE,         False, False, False),
    ("recall",        "Recall similar memories", _RECALL_INPUT,        _HITS,              True,  False, True),
    ("query",         "Query a memory layer",    _QUERY_INPUT,         _HITS,              True,  False, True),
    ("start_session", "Start a session",         _START_SESSION_INPUT, _OUT_START_SESSION, False, False, False),
    ("end_session",   "End a session",           _END_SESSION_INPUT,   _OUT_END_SESSION,   False, False, True),
    ("place_beacon",  "Place a beacon",          _PLACE_BEACON_INPUT,  _OUT_PLACE_BEACON,  False, False, False),
    ("list_beacons",  "List my beacons",         _NO_INPUT,            _OUT_LIST_BEACONS,  True,  False, True),
    ("inbox",         "Read my inbox",           _INBOX_INPUT,         _OUT_INBOX,         True,  False, True),
    ("get_scene",     "Get a scene",             _GET_SCENE_INPUT,     _SCENE,             True,  False, True),
    ("list_scenes",   "List scenes",             _LIST_SCENES_INPUT,   _OUT_LIST_SCENES,   True,  False, True),
    ("pull_inbox",    "Pull my inbox",           _PULL_INBOX_INPUT,    _OUT_PULL_INBOX,    False, False, False),
)  # fmt: skip

_DESCRIPTIONS = {
    "store": (
        "Store one memory cell in your team's shared memory. The server embeds it, stamps your identity from "
        "your API key, and gossips it to every agent whose beacon matches. Store decisions, constraints, risks, "
        "patterns and lessons as you make or learn them: one self-contained idea per cell, naming the project, "
        "file or component it is about. salience (0-1, default 0.5) sets how far it travels: use 0.8 or more "
        "for what other agents must not miss. source_ref points back at the evidence ({kind, locator}, e.g. "
        "file and path:line). When this cell replaces earlier ones (a decision revised), list their node_ids in "
        "metadata.supersedes (at most 16): the cells this one replaces; they stay as history, marked superseded. "
        "Reuse an idempotency_key when retrying, so a replay returns the original node_id "
        "instead of a duplicate. Returns {node_id}."
    ),
    "recall": (
        "Find the k stored cells nearest in meaning to a query, among every cell you may read (layer L0), "
        "optionally only of some cell types or one project. Returns ids, not content: {results: [{node_id, "
        "distance}]}, nearest first (smaller distance is closer), and a resource_link per hit: read a "
        "cell's content with resources/read on hyphae://cells/{node_id}."
    ),
    "query": (
        "Like recall, but against one semantic layer: L0 holds every cell, L1 durable knowledge promoted by use "
        "and salience, L2 summaries of finished scenes. Use L1 for the settled decisions and lessons of a "
        "project, L2 for what past work sessions concluded. Returns {results: [{node_id, distance}]}, nearest "
        "first, and a resource_link per hit (resources/read on hyphae://cells/{node_id} gives the content)."
    ),
    "start_session": (
        "Open a working session in a project, together with a scene that groups what you store during it. Until "
        "the session ends, cells you store default to its project and scene. Returns {session_id, scene_id}; "
        "call end_session with the session_id when the task is done."
    ),
    "end_session": (
        "Close a session you opened, and its scene. Returns {session_id, ended_at (ms since the epoch), "
        "cell_count}. Safe to repeat."
    ),
    "place_beacon": (
        "Place a standing interest. From now on, cells other agents store that match query (cosine similarity "
        "at least threshold, and optionally of the given cell types, project and minimum salience) are "
        "delivered to your inbox without you asking. Place one per topic your work depends on, e.g. 'schema "
        "migrations in project billing'. ttl_seconds makes it expire. Returns {beacon_id}."
    ),
    "list_beacons": (
        "List the beacons you own, with their query, filters, creation time and expiry (times in ms since the "
        "epoch). Returns {beacons: [...]}."
    ),
    "inbox": (
        "Read the diffs gossiped to you (cells from other agents that matched your beacons) received after "
        "since (ms since the epoch, or an RFC 3339 time; omit it to read from the start). Reading does not "
        "consume them: pass next_since back as since to continue. Each diff carries the cell's content, type, "
        "salience and provenance (source_agent, origin_node, source_ref), the beacon_id that matched with "
        "its similarity, the admission score and why (a one-line reason), and the hops it travelled. "
        "kind says what the news is: match (a beacon caught it), supersedes (it replaces related, a cell "
        "you received before; that one is no longer current) or possible_conflict (it may contradict "
        "related, a Decision or Constraint of yours). Superseded cells are left out. Returns {diffs, next_since}."
    ),
    "get_scene": (
        "Fetch one scene (an episode of work) by id: its project, title, session, agent, times (ms since the "
        "epoch), consolidation status, summary cell and the ids of its cells."
    ),
    "list_scenes": (
        "List the scenes you may read, optionally of one project. Page with limit, passing the previous page's "
        "next_cursor as cursor; next_cursor is null on the last page. Returns {scenes, next_cursor}."
    ),
    "pull_inbox": (
        "Take the next page of your inbox and advance the cursor the server keeps for you, so each diff is "
        "returned once. Call it at the start of a task to catch up on what other agents learned, and again "
        "while remaining is above 0. Returns {diffs, cursor, remaining}."
    ),
}

TOOLS: tuple[Tool, ...] = tuple(
    Tool(name, title, _DESCRIPTIONS[name], inputs, outputs, read_only, destructive, idempotent)
    for name, title, inputs, outputs, read_only, destructive, idempotent in _TABLE
)
TOOLS_BY_NAME: dict[str, Tool] = {tool.name: tool for tool in TOOLS}


def tool_descriptors() -> list[dict[str, Any]]:
    """The ``tools`` array of a ``tools/list`` result, in roster order."""
    return [tool.descriptor() for tool in TOOLS]


def get_tool(name: Any) -> Tool:
    """The tool called ``name``, or a -32602 error naming the known tools."""
    tool = TOOLS_BY_NAME.get(name) if isinstance(name, str) else None
    if tool is None:
        shown = name if isinstance(name, str) else type(name).__name__
        raise reason_error(
            "invalid_argument",
            f"unknown tool '{shown}'; the tools are {', '.join(TOOLS_BY_NAME)}",
            field="name",
        )
    return tool


def validate_arguments(tool: Tool, arguments: Any) -> dict[str, Any]:
    """Check call arguments against the tool's inputSchema; return them normalised.

    Raises a -32602 :class:`JsonRpcError` whose message names the argument and says
    what was expected, and whose ``data.field`` is the argument's path.
    """
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise reason_error("invalid_argument", f"{tool.name}: 'arguments' must be an object", field="arguments")
    try:
        return conform(tool.input_schema, arguments)
    except SchemaViolation as violation:
        raise _argument_error(tool, violation) from None


def _argument_error(tool: Tool, violation: SchemaViolation) -> JsonRpcError:
    if violation.kind == "missing" and not violation.path:
        message = f"{tool.name}: missing required argument '{violation.name}'"
        field = violation.name
    elif violation.kind == "unknown" and not violation.path:
        field = violation.name
        if field in IDENTITY_ARGUMENTS:
            message = f"{tool.name}: unknown argument '{field}' (identity comes from your API key)"
        elif tool.input_schema["properties"]:
            message = f"{tool.name}: unknown argument '{field}'; it takes {', '.join(tool.input_schema['properties'])}"
        else:
            message = f"{tool.name}: unknown argument '{field}'; it takes no arguments"
    elif violation.kind == "missing":
        message = f"{tool.name}: argument '{violation.path}' is missing required field '{violation.name}'"
        field = f"{violation.path}.{violation.name}"
    elif violation.kind == "unknown":
        message = f"{tool.name}: argument '{violation.path}' has unknown field '{violation.name}'"
        field = f"{violation.path}.{violation.name}"
    else:
        message = f"{tool.name}: argument '{violation.path}' must be {violation.expected}"
        field = violation.path
    return reason_error("invalid_argument", message, field=field)


def validate_result(tool: Tool, payload: Any) -> None:
    """Check a facade result against the tool's outputSchema (raises :class:`SchemaViolation`)."""
    if not isinstance(payload, dict):
        raise SchemaViolation("invalid", "", "an object")
    conform(tool.output_schema, payload)
