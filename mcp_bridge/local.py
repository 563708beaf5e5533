"""MCP between ``hyphae mcp`` and its daemon over a Unix socket in the data dir.

An editor's stdio session is relayed to the daemon that owns the data dir. HTTP works
for that (``HttpRelay``) but costs each call an HTTP request on both ends, which is most
of a recall's round trip. On one machine the relay instead speaks to the daemon over
``$HYPHAE_HOME/mcp.sock`` (mode 0600 inside the 0700 data dir: only the data dir's owner
can connect), with the simplest framing that keeps requests and answers paired:

    relay -> daemon   {"hyphae_mcp": 1, "key": "<api key>",          once, on connect
                       "protocol_version": "<revision>"}\\n       (the revision, once negotiated)
    relay -> daemon   <one JSON-RPC message>\\n                     then, repeatedly
    daemon -> relay   <the JSON-RPC response>\\n                    one line per line
                      or an empty line when no response is owed (a notification)

A connection carries one exchange at a time; the relay keeps a small pool of them so
concurrent calls from the host run concurrently. The revision the host's ``initialize``
negotiated rides in the hello (the daemon answers by it, as over HTTP by the
``MCP-Protocol-Version`` header): once the relay has seen it, connections opened
before it are closed and new ones carry it. The daemon authenticates the key on
*every* line, exactly as it does an HTTP request's ``x-hyphae-key``, so a key revoked
mid-session is refused on its next call; the relay never holds a principal.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from node.errors import HyphaeError

from . import jsonrpc
from .dispatch import Dispatcher, negotiated_version
from .errors import from_hyphae_error, internal_error, reason_error
from .jsonrpc import INVALID_REQUEST, JsonRpcError
from .relay import relay_failure
from .stdio import MAX_LINE_BYTES, LineReader, LineTooLong

__all__ = ["SOCKET_NAME", "LOCAL_PROTOCOL", "serve_local_socket", "SocketRelay"]

logger = logging.getLogger(__name__)

SOCKET_NAME = "mcp.sock"
LOCAL_PROTOCOL = 1
# sockaddr_un.sun_path is 108 bytes on Linux, 104 on macOS; longer paths cannot be bound.
MAX_SOCKET_PATH = 100
# A Unix socket's connect fails at once (EAGAIN) when the accept backlog is full, instead of
# waiting as TCP does: keep it deep (several relays open a pool each) and retry briefly.
LISTEN_BACKLOG = 1024
SEND_TIMEOUT = 60.0  # seconds an answer may wait for a relay that stopped reading (bounds a shutdown)
CONNECT_ATTEMPTS = 50

Authenticate = Callable[[str], Awaitable[Any]]


def _hello(api_key: str, protocol_version: str | None = None) -> bytes:
    hello: dict[str, Any] = {"hyphae_mcp": LOCAL_PROTOCOL, "key": api_key}
    if protocol_version is not None:
        hello["protocol_version"] = protocol_version
    return json.dumps(hello, separators=(",", ":")).encode() + b"\n"


def _read_hello(hello: bytes) -> tuple[str, str | None] | None:
    """The key and negotiated revision of a hello line (None: not a hello)."""
    try:
        message = json.loads(hello)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("hyphae_mcp") != LOCAL_PROTOCOL:
        return None
    key, version = message.get("key"), message.get("protocol_version")
    if not isinstance(key, str):
        return None
    return key, version if isinstance(version, str) else None


def bind_local_socket(path: Path) -> trio.socket.SocketType | None:
    """A listening Unix socket at ``path`` (0600), or None when this system or path can't have one."""
    if not hasattr(socket, "AF_UNIX") or len(os.fsencode(path)) > MAX_SOCKET_PATH:
        logger.info("no local MCP socket (path too long or no AF_UNIX); hyphae mcp relays over HTTP")
        return None
    path.unlink(missing_ok=True)  # a stale socket of a daemon that died; we hold the data-dir lock
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # born 0600: no window in which another user could connect
    try:
        sock.bind(os.fspath(path))
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        logger.warning("cannot listen on %s (%s); hyphae mcp relays over HTTP", path, exc.strerror or exc)
        return None
    finally:
        os.umask(old_umask)
    return trio.socket.from_stdlib_socket(sock)


async def serve_local_socket(
    sock: trio.socket.SocketType,
    dispatcher: Dispatcher,
    authenticate: Authenticate,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the local protocol on a socket from :func:`bind_local_socket` until cancelled."""
    listener = trio.SocketListener(sock)

    async def connection(stream: trio.SocketStream) -> None:
        async with stream:
            try:
                await _serve_connection(stream, dispatcher, authenticate)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # the relay went away mid-answer; nothing is owed to anyone

    await trio.serve_listeners(connection, [listener], task_status=task_status)


async def _serve_connection(stream: trio.SocketStream, dispatcher: Dispatcher, authenticate: Authenticate) -> None:
    reader = LineReader(stream, MAX_LINE_BYTES)
    hello = await reader.next_line()
    if not isinstance(hello, bytes):
        return
    greeting = _read_hello(hello)
    if greeting is None:
        error = JsonRpcError(INVALID_REQUEST, "expected the hyphae local MCP hello line", {"reason": "invalid_argument"})
        await stream.send_all(jsonrpc.encode(jsonrpc.failure(None, error)) + b"\n")
        return
    api_key, version = greeting
    while True:
        line = await reader.next_line()
        if line is None:
            return
        if isinstance(line, LineTooLong):
            error = JsonRpcError(
                INVALID_REQUEST, f"message exceeds {MAX_LINE_BYTES} bytes",
                {"reason": "too_large", "limit": MAX_LINE_BYTES},
            )
            await stream.send_all(jsonrpc.encode(jsonrpc.failure(None, error)) + b"\n")
            continue
        # A line that was read is answered even when the daemon is shutting down: the store it
        # carries may already be committed, and an answer lost here is a retry (or a duplicate)
        # there. Cancellation waits at the next read instead.
        with trio.CancelScope(shield=True):
            answer = await _answer(line, api_key, version, dispatcher, authenticate)
            with trio.move_on_after(SEND_TIMEOUT) as send_scope:
                await stream.send_all(answer + b"\n")
        if send_scope.cancelled_caught:
            return  # a relay that stopped reading: hang up rather than lose the pairing


async def _answer(
    line: bytes, api_key: str, version: str | None, dispatcher: Dispatcher, authenticate: Authenticate
) -> bytes:
    """The response line for one message (empty when none is owed); never raises."""
    try:
        principal = await authenticate(api_key)
    except HyphaeError as exc:
        event = jsonrpc.parse(line)
        if not isinstance(event, jsonrpc.RequestReceived):
            return b""
        return jsonrpc.encode(jsonrpc.failure(event.id, from_hyphae_error(exc)))
    try:
        response = await dispatcher.handle(line, principal, protocol_version=version)
    except Exception:  # the dispatcher's own boundary failed: still answer, keep serving
        logger.exception("handling a local MCP message failed")
        event = jsonrpc.parse(line)
        if not isinstance(event, jsonrpc.RequestReceived):
            return b""
        return jsonrpc.encode(jsonrpc.failure(event.id, internal_error()))
    return b"" if response is None else jsonrpc.encode(response)


class _Connection:
    def __init__(self, stream: trio.SocketStream, protocol_version: str | None) -> None:
        self.stream = stream
        self.protocol_version = protocol_version
        self.reader = LineReader(stream, MAX_LINE_BYTES * 2)  # answers may be longer than requests


class SocketRelay:
    """``await relay(line) -> bytes | None``: one stdio line through the daemon's local socket."""

    def __init__(self, path: Path | str, api_key: str) -> None:
        self._path = os.fspath(path)
        self._api_key = api_key
        self._idle: list[_Connection] = []
        self._version: str | None = None  # what the host's initialize negotiated

    async def __call__(self, line: bytes) -> bytes | None:
        connection = self._idle.pop() if self._idle else None
        if connection is not None and connection.protocol_version != self._version:
            await self._discard(connection)  # opened before initialize: its hello lacks the revision
            connection = None
        try:
            if connection is None:
                connection = await self._connect()
            await connection.stream.send_all(line + b"\n")
            answer = await connection.reader.next_line()
        except OSError as exc:
            # connect: ENOENT / ECONNREFUSED when no daemon listens; later: the daemon died.
            await self._discard(connection)
            gone = "is not running" if exc.errno in (errno.ENOENT, errno.ECONNREFUSED) else "went away"
            return relay_failure(line, reason_error("unavailable", f"the hyphae daemon ({self._path}) {gone}"))
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            await self._discard(connection)
            return relay_failure(line, reason_error("unavailable", f"the hyphae daemon ({self._path}) went away"))
        if not isinstance(answer, bytes):  # EOF or an impossible line: the daemon went away
            await self._discard(connection)
            return relay_failure(line, reason_error("unavailable", f"the hyphae daemon ({self._path}) went away"))
        self._idle.append(connection)
        if b'"initialize"' in line and answer:
            self._learn_version(answer)
        return answer or None

    def _learn_version(self, answer: bytes) -> None:
        try:
            response = json.loads(answer)
        except ValueError:
            return
        if isinstance(response, dict) and (version := negotiated_version(response)) is not None:
            self._version = version

    async def _connect(self) -> _Connection:
        # Not trio.open_unix_socket: it takes a Unix socket's EAGAIN for TCP's "in progress" and
        # returns a stream that was never connected. A Unix connect is immediate or refused.
        for attempt in range(CONNECT_ATTEMPTS):
            raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            raw.setblocking(False)
            try:
                raw.connect(self._path)
            except BlockingIOError:  # the daemon's backlog is full for a moment
                raw.close()
                if attempt == CONNECT_ATTEMPTS - 1:
                    raise
                await trio.sleep(0.01 * (attempt + 1))
                continue
            except OSError:
                raw.close()
                raise
            break
        stream = trio.SocketStream(trio.socket.from_stdlib_socket(raw))
        await stream.send_all(_hello(self._api_key, self._version))
        return _Connection(stream, self._version)

    @staticmethod
    async def _discard(connection: _Connection | None) -> None:
        if connection is not None:
            with trio.CancelScope(shield=True):
                await connection.stream.aclose()

    async def aclose(self) -> None:
        while self._idle:
            await self._discard(self._idle.pop())
