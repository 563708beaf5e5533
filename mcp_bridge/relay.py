"""Relay stdio lines to a running daemon's ``POST /mcp`` (the ``handle`` of ``hyphae mcp``).

The daemon does all the work; the relay only carries bytes, and turns what HTTP can go
wrong into JSON-RPC the host understands, so the stdio loop never crashes:

    daemon answers                         relay returns
    202                                    None (a notification or a response)
    a JSON-RPC body (any status)           the body; an error body with id null gets the
                                           request's id, so the host can pair it
    another body (a proxy's HTML, ...)     -32603 for a request, None otherwise
    no connection / timeout / broken I/O   -32050 reason unavailable for a request,
                                           None otherwise

The daemon authenticates the ``x-hyphae-key`` on every line, as it would for any HTTP
client; the relay never sees a principal. Once the host's ``initialize`` is answered, every
later line carries the negotiated ``MCP-Protocol-Version``, as an HTTP client's would.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from . import jsonrpc
from .dispatch import negotiated_version
from .errors import internal_error, reason_error
from .jsonrpc import JsonRpcError

if TYPE_CHECKING:
    import httpx

__all__ = ["HttpRelay", "relay_failure"]

logger = logging.getLogger(__name__)


class HttpRelay:
    """``await relay(line) -> bytes | None``: one stdio line through ``{base_url}/mcp``."""

    def __init__(self, base_url: str, api_key: str, client: httpx.AsyncClient) -> None:
        import httpx  # here, not at module level: a relay over the Unix socket never pays its import

        self._unreachable, self._broken = httpx.ConnectError, httpx.TransportError
        self._base_url = base_url.rstrip("/")
        self._url = f"{self._base_url}/mcp"
        self._client = client
        self._headers = {
            "x-hyphae-key": api_key,
            "content-type": "application/json",
            "accept": "application/json, text/event-stream",
        }

    async def __call__(self, line: bytes) -> bytes | None:
        event = jsonrpc.parse(line)
        request_id = event.id if isinstance(event, jsonrpc.RequestReceived) else None
        try:
            response = await self._client.post(self._url, content=line, headers=self._headers)
        except self._unreachable:
            message = f"hyphae daemon at {self._base_url} is not reachable"
            return self._error(event, reason_error("unavailable", message))
        except self._broken as exc:
            logger.warning("relaying to %s failed: %r", self._url, exc)
            message = f"hyphae daemon at {self._base_url} is not reachable ({type(exc).__name__})"
            return self._error(event, reason_error("unavailable", message))

        if response.status_code == 202 or not response.content.strip():
            return None
        try:
            body: Any = json.loads(response.content)
        except ValueError:
            logger.error("daemon answered %s with a body that is not JSON", response.status_code)
            return self._error(event, internal_error())
        if not isinstance(body, dict) or not ("result" in body or "error" in body):
            logger.error("daemon answered %s with JSON that is not a JSON-RPC response", response.status_code)
            return self._error(event, internal_error())
        initialize = isinstance(event, jsonrpc.RequestReceived) and event.method == "initialize"
        if initialize and (version := negotiated_version(body)) is not None:
            self._headers["mcp-protocol-version"] = version
        if body.get("id") is None and request_id is not None:
            # An HTTP-level refusal (401, 403, 413, ...) is sent before the daemon reads the id.
            body["id"] = request_id
            return jsonrpc.encode(body)
        return response.content.strip()

    @staticmethod
    def _error(event: jsonrpc.Event, error: JsonRpcError) -> bytes | None:
        return _failure(event, error)


def relay_failure(line: bytes, error: JsonRpcError) -> bytes | None:
    """What the host gets for ``line`` when the relay could not carry it to the daemon."""
    return _failure(jsonrpc.parse(line), error)


def _failure(event: jsonrpc.Event, error: JsonRpcError) -> bytes | None:
    if isinstance(event, jsonrpc.RequestReceived):
        return jsonrpc.encode(jsonrpc.failure(event.id, error))
    if isinstance(event, jsonrpc.MessageRejected):
        return jsonrpc.encode(event.response())
    return None
