"""The small ASGI toolkit every HTTP app of ours shares: bodies, lifespan, responses, headers.

The REST surface, MCP over HTTP, the metrics endpoint and the mesh port each answer a
handful of routes; a framework would add more than it saves. What they all need is here
once: a body read with a size cap (stopping as soon as the cap is passed, so an oversized
body is never buffered), the lifespan handshake, a whole response in two messages, and
header and query look-ups. Each surface turns :class:`BodyTooLarge` and
:class:`ClientGone` into its own error shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

__all__ = [
    "Scope", "Message", "Receive", "Send", "ASGIApp",
    "WebError", "BodyTooLarge", "ClientGone",
    "read_body", "serve_lifespan", "send_bytes", "header", "headers_of", "query_of",
    "drain_unread_bodies", "DRAIN_LIMIT",
]  # fmt: skip

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class WebError(Exception):
    """Base of what this package raises while reading a request."""


class BodyTooLarge(WebError):
    """The request body passed the reader's limit; the rest was not read."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body is larger than {limit} bytes")
        self.limit = limit


class ClientGone(WebError):
    """The client disconnected before its request body was read whole."""


async def read_body(receive: Receive, limit: int) -> bytes:
    """The whole request body; :class:`BodyTooLarge` as soon as it passes ``limit``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone("the client went away")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def serve_lifespan(receive: Receive, send: Send) -> None:
    """Answer the ``lifespan`` scope: nothing to start or stop, so say so at once."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def send_bytes(
    send: Send, status: int, body: bytes, content_type: bytes, headers: tuple[tuple[bytes, bytes], ...] | list = ()
) -> None:
    """A whole response: its head (with Content-Length) and its one body message."""
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *headers],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: str) -> str | None:
    """One request header's value (the first, if repeated), or None."""
    wanted = name.lower().encode()
    for key, value in scope.get("headers", ()):
        if key.lower() == wanted:
            return value.decode("latin-1")
    return None


def headers_of(scope: Scope) -> dict[str, str]:
    """Every request header, names lower-cased (a repeated one keeps its last value)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


def query_of(scope: Scope) -> dict[str, str]:
    """The query string's parameters (a repeated one keeps its last value)."""
    raw = scope.get("query_string", b"").decode("latin-1")
    return {k: v[-1] for k, v in parse_qs(raw, keep_blank_values=True).items()}


DRAIN_LIMIT = 16 * 1024 * 1024


def drain_unread_bodies(app: ASGIApp, limit: int = DRAIN_LIMIT) -> ASGIApp:
    """Read and drop what is left of a request body before the response starts.

    The apps answer some requests without reading the whole body (413, 401, ...), and
    hypercorn then closes the connection with the client's bytes still unread: the
    kernel answers with a TCP reset, which can destroy the response before the client
    reads it ("server disconnected"), and the client's pooled connection is dead without
    a word. Draining (up to ``limit`` bytes, kept nowhere) lets the answer arrive and the
    connection be reused; past the limit the response says ``Connection: close``.
    """

    async def wrapped(scope, receive, send):
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        body_done = False

        async def tracked_receive():
            nonlocal body_done
            message = await receive()
            if message["type"] == "http.disconnect" or not message.get("more_body", False):
                body_done = True
            return message

        async def draining_send(message):
            if message["type"] == "http.response.start" and not body_done:
                drained = 0
                while not body_done and drained <= limit:
                    drained += len((await tracked_receive()).get("body", b""))
                if not body_done:
                    message = {**message, "headers": [*message.get("headers", ()), (b"connection", b"close")]}
            await send(message)

        await app(scope, tracked_receive, draining_send)

    return wrapped
