"""How node-core errors look on the wire: one table, used by every MCP transport.

A facade error (:class:`node.errors.HyphaeError`) is answered as a JSON-RPC *error
object*, never as an ``isError: true`` tool result (seed 000), so a client can branch on
a stable ``code`` and on ``data.reason``::

    reason             code     JSON-RPC meaning             HTTP status (transport-level only)
    invalid_argument   -32602   invalid params               -
    too_large          -32013   server error: too large      413
    unauthenticated    -32001   server error: no valid key   401
    forbidden          -32003   server error: out of scope   403
    not_found          -32004   server error: no such id     404
    conflict           -32009   server error: wrong state    -
    unavailable        -32050   server error: try later      503
    disk_full          -32050   server error: try later      507
    rate_limited       -32029   server error: slow down      429, Retry-After
    internal           -32603   internal error               500

The server codes sit in the JSON-RPC range reserved for implementations
(-32000..-32099) and echo HTTP status numbers where one exists, so they are easy to
remember. Schema violations found by the bridge itself (unknown tool, unknown or
ill-typed argument) are ``invalid_argument``/-32602 too, with ``data.field`` naming the
argument. ``data`` is :meth:`HyphaeError.to_dict`: ``reason``, ``message``, and
``field``/details when the facade gave them.

Two answers depend on the method rather than this table: ``resources/read`` answers a uri it
cannot read (absent, or outside the key's scope) with MCP's -32002, reason ``not_found``
(:mod:`mcp_bridge.resources`); and under revision 2025-11-25 an argument that fails a tool's
inputSchema is an ``isError: true`` tool result, not -32602 (:mod:`mcp_bridge.dispatch`).
"""

from __future__ import annotations

from typing import Any

from node.errors import HyphaeError

from .jsonrpc import INTERNAL_ERROR, INVALID_PARAMS, JsonRpcError

__all__ = [
    "REASON_CODES",
    "UNAUTHENTICATED",
    "FORBIDDEN",
    "NOT_FOUND",
    "CONFLICT",
    "TOO_LARGE",
    "UNAVAILABLE",
    "RATE_LIMITED",
    "code_for_reason",
    "from_hyphae_error",
    "reason_error",
    "internal_error",
]

UNAUTHENTICATED = -32001
FORBIDDEN = -32003
NOT_FOUND = -32004
CONFLICT = -32009
TOO_LARGE = -32013
UNAVAILABLE = -32050
RATE_LIMITED = -32029

REASON_CODES: dict[str, int] = {
    "invalid_argument": INVALID_PARAMS,
    "too_large": TOO_LARGE,
    "unauthenticated": UNAUTHENTICATED,
    "forbidden": FORBIDDEN,
    "not_found": NOT_FOUND,
    "conflict": CONFLICT,
    "unavailable": UNAVAILABLE,
    "disk_full": UNAVAILABLE,
    "rate_limited": RATE_LIMITED,
    "internal": INTERNAL_ERROR,
}


def code_for_reason(reason: str) -> int:
    """The JSON-RPC code of a reason; an unknown reason is an internal error."""
    return REASON_CODES.get(reason, INTERNAL_ERROR)


def from_hyphae_error(exc: HyphaeError) -> JsonRpcError:
    """Translate a facade error, keeping its message, reason, field and details."""
    return JsonRpcError(code_for_reason(exc.reason), exc.message, exc.to_dict())


def reason_error(reason: str, message: str, **data: Any) -> JsonRpcError:
    """An error raised by the bridge itself, shaped like a facade error."""
    return JsonRpcError(code_for_reason(reason), message, {"reason": reason, "message": message, **data})


def internal_error() -> JsonRpcError:
    """What an unexpected exception becomes: no type, text or traceback leaks."""
    return reason_error("internal", "internal error")
