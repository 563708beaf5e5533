"""MCP over stdio: newline-delimited JSON-RPC on stdin/stdout.

Theory of operation: one task reads stdin and splits it into lines; each non-blank line
is handed to ``handle`` in its own task (at most :data:`MAX_IN_FLIGHT` at once, so a
flood of requests is held back by the pipe instead of by memory), and every response is
written whole, as one line of compact JSON, under a lock. Responses may therefore leave
in a different order than their requests arrived, which JSON-RPC allows (ids pair them).

stdout carries protocol messages and nothing else, ever: this module never prints, and
logs go to stderr (where the host shows them). A line longer than ``max_line_bytes`` is
answered with one -32600 error (``data.reason`` ``too_large``, ``id`` null: it was
never parsed) and skipped up to its newline; serving goes on. An exception from
``handle`` is logged and, when the line was a request, answered with -32603.

At EOF the loop stops reading, lets the requests in flight finish and write their
responses, and returns. If stdout is gone (the host closed the pipe) it returns at once.

``handle`` is whatever the caller supplies: ``Dispatcher.bind(principal)`` in-process, or
``HttpRelay`` to a running daemon; it takes one line and returns one encoded message or
None. Unless ``subscriptions`` is off it is wrapped in :class:`~mcp_bridge.subscriptions.InboxWatch`,
which answers ``resources/subscribe`` for the inbox and writes
``notifications/resources/updated`` between responses (stdio can speak first; HTTP here
cannot). At EOF the notifications stop once the last response is written.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from . import jsonrpc
from .errors import internal_error
from .jsonrpc import INVALID_REQUEST, JsonRpcError
from .subscriptions import POLL_SECONDS, InboxWatch

__all__ = ["serve_stdio", "MAX_LINE_BYTES", "MAX_IN_FLIGHT"]

logger = logging.getLogger(__name__)

MAX_LINE_BYTES = 1 << 20
MAX_IN_FLIGHT = 32
_READ_SIZE = 1 << 16

Handle = Callable[[bytes], Awaitable["bytes | None"]]


class LineTooLong:
    """Stands for a line that was longer than the limit (its bytes are dropped)."""


_TOO_LONG = LineTooLong()


class LineReader:
    """Splits a byte stream into lines without ever holding more than ~limit bytes."""

    def __init__(self, stream: Any, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0  # bytes of the buffer known to hold no newline
        self._discarding = False  # inside a too-long line, until its newline
        self._eof = False

    async def next_line(self) -> bytes | LineTooLong | None:
        """The next line (without its newline), ``_TOO_LONG``, or None at EOF."""
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                if self._discarding:
                    self._discarding = False
                    continue
                return _TOO_LONG if len(line) > self._limit else line
            self._scanned = len(self._buffer)
            if self._discarding:
                self._buffer.clear()
                self._scanned = 0
            elif len(self._buffer) > self._limit:
                self._buffer.clear()
                self._scanned = 0
                self._discarding = True
                return _TOO_LONG
            if self._eof:
                if self._buffer and not self._discarding:
                    line = bytes(self._buffer)
                    self._buffer.clear()
                    return line  # a last line without its newline still counts
                return None
            try:
                chunk = await self._stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                chunk = b""  # the host went away: same as EOF
            if chunk:
                self._buffer += chunk
            else:
                self._eof = True


class _ThreadFileStream:
    """A byte stream over a file descriptor trio cannot poll (a file, /dev/null, Windows)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    async def receive_some(self, max_bytes: int = _READ_SIZE) -> bytes:
        return await trio.to_thread.run_sync(os.read, self._fd, max_bytes)

    async def send_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = await trio.to_thread.run_sync(os.write, self._fd, view)
            view = view[written:]

    async def aclose(self) -> None:
        os.close(self._fd)


def _open_std_stream(fd: int) -> Any:
    """A trio stream over a duplicate of ``fd``, so closing it leaves the original alone."""
    duplicate = os.dup(fd)
    mode = os.fstat(duplicate).st_mode
    pollable = stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(duplicate)
    if pollable and hasattr(trio.lowlevel, "FdStream"):
        return trio.lowlevel.FdStream(duplicate)
    return _ThreadFileStream(duplicate)


def _too_long_response(limit: int) -> bytes:
    error = JsonRpcError(INVALID_REQUEST, f"message exceeds {limit} bytes", {"reason": "too_large", "limit": limit})
    return jsonrpc.encode(jsonrpc.failure(None, error))


def _one_line(response: bytes | str) -> bytes | None:
    """The response as exactly one line's worth of bytes (re-encoded if it spans lines)."""
    if isinstance(response, str):
        response = response.encode("utf-8", "surrogatepass")
    response = response.strip()
    if not response:
        return None
    if b"\n" in response or b"\r" in response:
        try:
            response = jsonrpc.encode(json.loads(response))
        except ValueError:
            logger.error("dropping a response that is not JSON and spans several lines")
            return None
    return response


async def serve_stdio(
    handle: Handle,
    *,
    stdin: Any = None,
    stdout: Any = None,
    max_line_bytes: int = MAX_LINE_BYTES,
    subscriptions: bool = True,
    poll_seconds: float = POLL_SECONDS,
) -> None:
    """Serve newline-delimited JSON-RPC until EOF on ``stdin``.

    ``stdin``/``stdout`` are trio streams (``receive_some`` / ``send_all``); by default,
    streams over duplicates of file descriptors 0 and 1, closed again on return.
    ``subscriptions`` adds inbox subscriptions, looked for every ``poll_seconds`` (a ``handle``
    that already is an :class:`InboxWatch` is served as it is).
    """
    if subscriptions and not isinstance(handle, InboxWatch):
        handle = InboxWatch(handle, poll_seconds=poll_seconds)
    watch = handle if isinstance(handle, InboxWatch) else None
    owned = []
    if stdin is None:
        stdin = _open_std_stream(0)
        owned.append(stdin)
    if stdout is None:
        stdout = _open_std_stream(1)
        owned.append(stdout)
    write_lock = trio.Lock()
    in_flight = trio.Semaphore(MAX_IN_FLIGHT)
    reader = LineReader(stdin, max_line_bytes)

    try:
        async with trio.open_nursery() as nursery:

            async def write(message: bytes) -> None:
                async with write_lock:
                    try:
                        await stdout.send_all(message + b"\n")
                    except (trio.BrokenResourceError, trio.ClosedResourceError, BrokenPipeError):
                        logger.info("stdout is closed; stopping")
                        nursery.cancel_scope.cancel()

            async def answer(line: bytes) -> None:
                try:
                    try:
                        response = await handle(line)
                    except Exception:
                        logger.exception("handling a message failed")
                        event = jsonrpc.parse(line)
                        if not isinstance(event, jsonrpc.RequestReceived):
                            return
                        response = jsonrpc.encode(jsonrpc.failure(event.id, internal_error()))
                    if response is not None and (framed := _one_line(response)) is not None:
                        await write(framed)
                finally:
                    in_flight.release()

            notifying = trio.CancelScope()
            if watch is not None:

                async def notify() -> None:
                    with notifying:
                        await watch.serve_notifications(write)

                nursery.start_soon(notify)

            while True:
                line = await reader.next_line()
                if line is None:
                    break
                if line is _TOO_LONG:
                    await write(_too_long_response(max_line_bytes))
                    continue
                assert isinstance(line, bytes)
                if not line.strip():
                    continue
                await in_flight.acquire()
                nursery.start_soon(answer, line)
            for _ in range(MAX_IN_FLIGHT):  # EOF: every answer is written, then notifying stops
                await in_flight.acquire()
            notifying.cancel()
    finally:
        for stream in owned:
            with trio.CancelScope(shield=True):
                await stream.aclose()
