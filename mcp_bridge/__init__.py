"""Hyphae's MCP surface: hand-rolled JSON-RPC 2.0 over stdio and HTTP (seeds 000, 001).

A transport adapter with no memory logic of its own:

    jsonrpc       pure parsing and serialisation of JSON-RPC 2.0 messages (no I/O)
    tools         the 11 tool descriptors and the check of arguments against them
    resources     the hyphae:// resources (cells, scenes, inbox, beacons) and recall's links to them
    prompts       the prompts (catch_up, check_team_history, record_decision)
    dispatch      the method table, and the one boundary where exceptions become errors
    errors        the reason -> JSON-RPC code table
    http          an ASGI app for POST /mcp (x-hyphae-key per request)
    stdio         the newline-delimited stdin/stdout loop
    subscriptions inbox subscriptions over stdio (notifications/resources/updated)
    relay         stdio lines relayed to a running daemon's /mcp

Typical wiring::

    dispatcher = Dispatcher(service, server_version=__version__)
    app = make_mcp_app(dispatcher, service.authenticate)           # in the daemon
    await serve_stdio(dispatcher.bind(principal))                   # in-process stdio
    await serve_stdio(HttpRelay(base_url, api_key, httpx_client))   # hyphae mcp
"""

from __future__ import annotations

from .dispatch import (
    INSTRUCTIONS,
    LATEST_PROTOCOL_VERSION,
    SUPPORTED_PROTOCOL_VERSIONS,
    Dispatcher,
    MemoryService,
    negotiate_protocol_version,
)
from .errors import REASON_CODES
from .http import MAX_BODY_BYTES, make_mcp_app
from .jsonrpc import JsonRpcError
from .relay import HttpRelay
from .stdio import MAX_LINE_BYTES, serve_stdio
from .tools import TOOLS, Tool, tool_descriptors

__all__ = [
    "Dispatcher",
    "MemoryService",
    "SUPPORTED_PROTOCOL_VERSIONS",
    "LATEST_PROTOCOL_VERSION",
    "INSTRUCTIONS",
    "negotiate_protocol_version",
    "REASON_CODES",
    "JsonRpcError",
    "TOOLS",
    "Tool",
    "tool_descriptors",
    "make_mcp_app",
    "MAX_BODY_BYTES",
    "serve_stdio",
    "MAX_LINE_BYTES",
    "HttpRelay",
]
