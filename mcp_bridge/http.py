"""MCP over HTTP: an ASGI 3 app for ``POST /mcp`` (MCP "streamable HTTP", stateless).

Each POST carries one JSON-RPC message and its own key (``x-hyphae-key``, or
``Authorization: Bearer``, which every MCP client can send); the key is
authenticated on every request and no session is kept (no ``Mcp-Session-Id``). Requests
are answered with one ``application/json`` response, which the streamable-HTTP
transport allows whatever the client's ``Accept`` says (SDK clients send
``application/json, text/event-stream``); we never open an SSE stream because the
server never speaks first. The mounting router decides which path reaches the app.

Checks, in this order (the first that fails answers; every error body is a JSON-RPC
error response with ``id`` null, since the body has not been read yet):

    check                                           failure
    1 method is POST                                405, Allow: POST          -32600
    2 Origin, when present, is a loopback origin    403 (DNS-rebinding guard) -32003 forbidden
    3 a key (x-hyphae-key, or Authorization:        401, WWW-Authenticate:    -32001 unauthenticated
      Bearer) present and authenticates             Bearer realm="hyphae"
      (the key's rate limit is exhausted: answered  429, Retry-After          -32029 rate_limited
      after step 7 has read the id)
    4 MCP-Protocol-Version, when present, supported 400 (absent: accepted)    -32600
    5 Content-Type is application/json              415                       -32600
    6 body at most 1 MiB (Content-Length, then as   413, reading stops        -32600 reason too_large
      it streams in)
    7 body is one JSON-RPC message                  400                       -32700 / -32600

Then: a notification or a response → 202 with no body; a request → 200 with the
JSON-RPC response (method-level errors such as -32601 or a facade error are 200 too:
HTTP carried the exchange fine). Loopback origins are ``http(s)://`` + ``localhost``,
any 127.0.0.0/8 address or ``[::1]``, on any port.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from node.errors import HyphaeError
from web.asgi import ASGIApp, BodyTooLarge, ClientGone, Receive, Scope, Send, read_body, send_bytes, serve_lifespan
from web.origins import is_loopback_origin

from . import jsonrpc
from .dispatch import SUPPORTED_PROTOCOL_VERSIONS, Dispatcher
from .errors import from_hyphae_error, internal_error, reason_error
from .jsonrpc import INVALID_REQUEST, PARSE_ERROR, JsonRpcError

__all__ = ["MAX_BODY_BYTES", "make_mcp_app"]

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20

# RFC 9110 §11.6.1: a 401 names the scheme that would work, so a client knows to send a Bearer key.
_CHALLENGE = ((b"www-authenticate", b'Bearer realm="hyphae"'),)


def _key(headers: dict[str, str]) -> str | None:
    """The API key: ``x-hyphae-key``, else an ``Authorization: Bearer`` token."""
    key = headers.get("x-hyphae-key")
    if key:
        return key
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None

# The only request headers the checks read; the others are never decoded.
_READ_HEADERS = {name.encode(): name for name in (
    "origin", "x-hyphae-key", "authorization", "mcp-protocol-version", "content-type", "content-length"
)}  # fmt: skip


def _headers(scope: Scope) -> dict[str, str]:
    """The headers the checks read, names lower-cased; repeated ones joined with ", "
    (RFC 9110 §5.3)."""
    joined: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name = _READ_HEADERS.get(raw_name) or _READ_HEADERS.get(bytes(raw_name).lower())
        if name is None:
            continue
        value = raw_value.decode("latin-1").strip()
        joined[name] = f"{joined[name]}, {value}" if name in joined else value
    return joined


async def _send_json(send: Send, status: int, body: bytes, extra: tuple[tuple[bytes, bytes], ...] = ()) -> None:
    await send_bytes(send, status, body, b"application/json", extra)


async def _send_error(
    send: Send, status: int, error: JsonRpcError, extra: tuple[tuple[bytes, bytes], ...] = ()
) -> None:
    await _send_json(send, status, jsonrpc.encode(jsonrpc.failure(None, error)), extra)


def _too_large() -> JsonRpcError:
    return JsonRpcError(
        INVALID_REQUEST,
        f"request body exceeds {MAX_BODY_BYTES} bytes",
        {"reason": "too_large", "limit": MAX_BODY_BYTES},
    )


def make_mcp_app(dispatcher: Dispatcher, authenticate: Callable[[str], Awaitable[Any]]) -> ASGIApp:
    """The ASGI app serving MCP for ``dispatcher``; ``authenticate(key)`` returns a principal
    or raises ``node.errors.Unauthenticated``."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        headers = _headers(scope)

        # 1. method
        if scope["method"] != "POST":
            error = JsonRpcError(INVALID_REQUEST, f"{scope['method']} is not allowed here: POST one JSON-RPC message")
            await _send_error(send, 405, error, ((b"allow", b"POST"),))
            return

        # 2. Origin (DNS rebinding: a web page must not drive a local agent's memory)
        origin = headers.get("origin")
        if origin is not None and not is_loopback_origin(origin):
            error = reason_error("forbidden", f"origin {origin!r} is not allowed: only loopback origins may call /mcp")
            await _send_error(send, 403, error)
            return

        # 3. the key (x-hyphae-key or Authorization: Bearer), authenticated on every request
        key = _key(headers)
        if not key:
            error = reason_error(
                "unauthenticated", "no API key: send your Hyphae API key as Authorization: Bearer KEY (or x-hyphae-key)"
            )
            await _send_error(send, 401, error, _CHALLENGE)
            return
        limited: HyphaeError | None = None
        try:
            principal = await authenticate(key)
        except HyphaeError as exc:
            if exc.reason != "rate_limited":
                challenge = _CHALLENGE if exc.http_status == 401 else ()
                await _send_error(send, exc.http_status, from_hyphae_error(exc), challenge)
                return
            limited = exc  # answered with the request's id once the body is read
        except Exception:
            logger.exception("authenticating an MCP request failed")
            await _send_error(send, 500, internal_error())
            return

        # 4. MCP-Protocol-Version: absent is the pre-2025-06-18 path; present must be supported
        version = headers.get("mcp-protocol-version")
        if version is not None and version not in SUPPORTED_PROTOCOL_VERSIONS:
            error = JsonRpcError(
                INVALID_REQUEST,
                f"unsupported MCP-Protocol-Version {version!r}; supported: {', '.join(SUPPORTED_PROTOCOL_VERSIONS)}",
                {
                    "reason": "invalid_argument",
                    "field": "MCP-Protocol-Version",
                    "supported": list(SUPPORTED_PROTOCOL_VERSIONS),
                },
            )
            await _send_error(send, 400, error)
            return

        # 5. Content-Type
        media_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if media_type != "application/json":
            error = JsonRpcError(
                INVALID_REQUEST,
                "Content-Type must be application/json",
                {"reason": "invalid_argument", "field": "Content-Type"},
            )
            await _send_error(send, 415, error)
            return

        # 6. size: refuse on the declared length, else stop reading at the limit
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            await _send_error(send, 413, _too_large())
            return
        try:
            body = await read_body(receive, MAX_BODY_BYTES)
        except ClientGone:
            return
        except BodyTooLarge:
            await _send_error(send, 413, _too_large())
            return

        # 7. parse and answer
        if limited is not None:
            event = jsonrpc.parse(body)
            request_id = event.id if isinstance(event, jsonrpc.RequestReceived) else None
            retry_after = max(1, -(-int(limited.details.get("retry_after_ms", 1000)) // 1000))
            response = jsonrpc.failure(request_id, from_hyphae_error(limited))
            await _send_json(send, 429, jsonrpc.encode(response), ((b"retry-after", str(retry_after).encode()),))
            return
        response = await dispatcher.handle(body, principal, protocol_version=version)  # None: pre-2025-06-18
        if response is None:
            await send({"type": "http.response.start", "status": 202, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        code = response.get("error", {}).get("code")
        status = 400 if code in (PARSE_ERROR, INVALID_REQUEST) else 200
        await _send_json(send, status, jsonrpc.encode(response))

    return app
