"""The API port's ASGI app: REST under ``/v1``, ``/healthz``, ``/openapi.json``, and
mounted apps (MCP at ``/mcp``) handed in by the daemon, which composes the surfaces.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from node.version import package_version
from web.asgi import serve_lifespan

from .http import HttpError, Request, headers_of, is_loopback_origin, query_of, read_body, send_bytes, send_json
from .openapi import openapi_document
from .rest import RestApi

__all__ = ["make_api_app"]

log = logging.getLogger("hyphae.api")

ASGIApp = Callable[[dict[str, Any], Callable, Callable], Awaitable[None]]


def make_api_app(rest: RestApi, mounts: Mapping[str, ASGIApp], pages: Mapping[str, tuple[bytes, bytes]] | None = None) -> ASGIApp:
    """``mounts`` maps an exact path to an app; ``pages`` maps a path to (content type, bytes)."""
    spec = openapi_document(package_version())
    pages = dict(pages or {})

    async def app(scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path = scope["path"]
        mounted = mounts.get(path)
        if mounted is not None:
            await mounted(scope, receive, send)
            return
        headers = headers_of(scope)
        try:
            origin = headers.get("origin")
            if origin is not None and not is_loopback_origin(origin):
                raise HttpError(403, "forbidden", f"origin {origin!r} is not a loopback origin")
            if scope["method"] == "GET" and path == "/openapi.json":
                await send_json(send, 200, spec)
                return
            if scope["method"] == "GET" and path in pages:
                content_type, body = pages[path]
                await send_bytes(send, 200, body, content_type)
                return
            body = await read_body(receive)
            request = Request(scope["method"], path, headers, query_of(scope), body)
            status, result = await rest.handle(request)
            await send_json(send, status, result)
        except HttpError as exc:
            await send_json(send, exc.status, exc.body, _response_headers(exc))
        except Exception:
            log.exception("unexpected error on %s %s", scope["method"], path)
            await send_json(send, 500, {"error": {"reason": "internal", "message": "internal error; see the node log"}})

    return app


def _response_headers(exc: HttpError) -> tuple[tuple[bytes, bytes], ...]:
    """A 401 names the scheme a client can answer with (RFC 9110 §11.6.1), as /mcp's does; a
    429 (a key's rate limit) says when to come back, in whole seconds (RFC 9110 §10.2.3)."""
    if exc.status == 401:
        return ((b"www-authenticate", b'Bearer realm="hyphae"'),)
    retry_ms = exc.body["error"].get("retry_after_ms") if exc.status == 429 else None
    return () if retry_ms is None else ((b"retry-after", str(max(1, -(-int(retry_ms) // 1000))).encode()),)
