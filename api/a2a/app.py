"""The A2A surface as ASGI apps for the API port: the card, and JSON-RPC behind the node's keys.

The SDK's routes are Starlette apps, which run on any ASGI server through anyio, so on
our h11 + trio server as they are. In front of the JSON-RPC route sits the one thing the
SDK leaves to its host: who is calling. The key (``x-hyphae-key``, or ``Authorization:
Bearer``) is resolved by ``service.authenticate`` on every request, as for REST and MCP
(that is also where the per-key rate limit is taken); a missing, unknown or revoked key
is a 401 and a spent limit a 429 with Retry-After, before any JSON-RPC is read. The
principal rides in the ASGI scope to the skills; nothing in a message can name it.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

from a2a.server.context import ServerCallContext
from a2a.server.routes import (
    ServerCallContextBuilder,
    create_agent_card_routes,
    create_jsonrpc_routes,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.requests import Request

from node.errors import HyphaeError
from node.principals import Principal
from node.ratelimit import RateLimited
from web.asgi import ASGIApp, Receive, Scope, Send, headers_of, send_bytes
from web.origins import is_loopback_origin

from .card import agent_card
from .skills import PRINCIPAL_KEY, MemorySkills

__all__ = ["A2A_PATH", "CARD_PATH", "make_a2a_mounts"]

A2A_PATH = "/a2a"
CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH

_SECRET_HEADERS = frozenset({"x-hyphae-key", "authorization"})

Authenticate = Callable[[str | None], Awaitable[Principal]]


class _PrincipalContext(ServerCallContextBuilder):
    """The call context: the authenticated principal, and the headers (the SDK reads A2A-Version) without the key."""

    def build(self, request: Request) -> ServerCallContext:
        headers = {k: v for k, v in request.headers.items() if k not in _SECRET_HEADERS}
        return ServerCallContext(state={PRINCIPAL_KEY: request.scope[PRINCIPAL_KEY], "headers": headers})


def make_a2a_mounts(service, base_url: str, version: str, node_name: str) -> dict[str, ASGIApp]:
    """Exact path -> app, for the API app's mounts: the card and the JSON-RPC endpoint."""
    card = agent_card(base_url + A2A_PATH, version, node_name)
    rpc = Starlette(routes=create_jsonrpc_routes(
        MemorySkills(service), A2A_PATH, context_builder=_PrincipalContext(), enable_v0_3_compat=True,
    ))  # fmt: skip
    card_app = Starlette(routes=create_agent_card_routes(card, card_url=CARD_PATH))
    return {A2A_PATH: _authenticated(rpc, service.authenticate), CARD_PATH: _loopback_origins(card_app)}


def _loopback_origins(app: ASGIApp) -> ASGIApp:
    """A browser page from elsewhere gets nothing (the DNS-rebinding guard REST and MCP keep too)."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        origin = headers_of(scope).get("origin")
        if origin is not None and not is_loopback_origin(origin):
            await _refuse(send, 403, "forbidden", f"origin {origin!r} is not allowed: only loopback origins may call A2A")
            return
        await app(scope, receive, send)

    return guarded


def _authenticated(app: ASGIApp, authenticate: Authenticate) -> ASGIApp:
    async def with_principal(scope: Scope, receive: Receive, send: Send) -> None:
        headers = headers_of(scope)
        key = headers.get("x-hyphae-key")
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if key is None and scheme.lower() == "bearer":
            key = token.strip()
        try:
            principal = await authenticate(key)
        except RateLimited as exc:
            await _refuse(send, 429, exc.reason, exc.message, exc.details, ((b"retry-after", str(exc.retry_after_s).encode()),))
            return
        except HyphaeError as exc:  # unauthenticated: no key, or an unknown or revoked one
            challenge = ((b"www-authenticate", b'Bearer realm="hyphae"'),)
            await _refuse(send, exc.http_status, exc.reason, exc.message, exc.details, challenge)
            return
        await app({**scope, PRINCIPAL_KEY: principal}, receive, send)

    return _loopback_origins(with_principal)


async def _refuse(send: Send, status: int, reason: str, message: str, details: dict | None = None, headers=()) -> None:
    body = json.dumps({"error": {"reason": reason, "message": message, **(details or {})}}).encode()
    await send_bytes(send, status, body, b"application/json", headers)
