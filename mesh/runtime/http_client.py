"""A keep-alive HTTP/1.1 client for the mesh's one request: POST a frame, read the reply.

Why not httpx: the mesh sends a single request shape (``POST`` of an octet-stream body
to a fixed path) to a handful of peers, many times a second. httpx builds a Request,
URL and Headers object per call, walks its auth and redirect layers and httpcore's pool,
and drives h11 for both directions: at 200 stores/s that was a fifth of a daemon's main
thread (mesh.md, 3 Dec). Here the request head is a template per address, and the
response is read with one parser for what servers send (``Content-Length``, chunked,
or until the connection closes).

Connections are kept per address (at most ``max_idle`` idle ones, each for at most
``keepalive_expiry`` seconds) and reused. A request on a reused connection that the
server had already closed (nothing came back) is sent once more on a fresh connection,
as browsers and httpcore do: the server never read it.

Exceptions (all :class:`FrameClientError`)::

    FrameClientError (a MeshError)
    ├── ConnectFailed     no connection, or it broke before a whole response arrived
    ├── ResponseTimeout   no whole response within the timeout
    └── BadResponse       the peer answered with something that is not HTTP/1.x
"""

from __future__ import annotations

import dataclasses
import errno

import trio

from ..errors import MeshError

__all__ = ["FrameClient", "FrameClientError", "ConnectFailed", "ResponseTimeout", "BadResponse"]

_MAX_HEAD_BYTES = 64 * 1024
_READ_BYTES = 256 * 1024


class FrameClientError(MeshError):
    reason = "http_error"

    def __init__(self, message: str) -> None:
        super().__init__(self.reason, message)


class ConnectFailed(FrameClientError):
    reason = "connect_failed"


class ResponseTimeout(FrameClientError):
    reason = "response_timeout"


class BadResponse(FrameClientError):
    reason = "bad_response"


class _Closed(Exception):
    """The server closed the connection; ``got`` says whether any response bytes came first."""

    def __init__(self, got: bool) -> None:
        self.got = got


@dataclasses.dataclass(eq=False, slots=True)
class _Connection:
    stream: trio.SocketStream
    buffer: bytearray = dataclasses.field(default_factory=bytearray)
    idle_since: float = 0.0
    received: bool = False  # any byte of the current response

    def close(self) -> None:
        try:
            self.stream.socket.close()
        except OSError:
            pass

    async def _more(self) -> None:
        try:
            chunk = await self.stream.receive_some(_READ_BYTES)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            chunk = b""
        if not chunk:
            raise _Closed(self.received or bool(self.buffer))
        self.received = True
        self.buffer += chunk

    async def read_head(self) -> bytes:
        start = 0
        while (end := self.buffer.find(b"\r\n\r\n", start)) < 0:
            if len(self.buffer) > _MAX_HEAD_BYTES:
                raise BadResponse("response head too large")
            start = max(0, len(self.buffer) - 3)
            await self._more()
        head = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        return head

    async def read_exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            await self._more()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data

    async def read_line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > _MAX_HEAD_BYTES:
                raise BadResponse("chunk line too long")
            await self._more()
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 2]
        return line

    async def read_to_end(self, limit: int) -> bytes:
        while True:
            if len(self.buffer) > limit:
                raise BadResponse("response body too large")
            try:
                await self._more()
            except _Closed:
                data = bytes(self.buffer)
                self.buffer.clear()
                return data


class FrameClient:
    """POSTs bodies to ``path`` on ``host:port`` peers over kept-alive connections."""

    def __init__(
        self, *, path: str, content_type: str, max_body_bytes: int, max_idle: int = 8, keepalive_expiry: float = 30.0,
    ) -> None:  # fmt: skip
        self.path = path
        self.content_type = content_type
        self.max_body_bytes = max_body_bytes
        self.max_idle = max_idle
        self.keepalive_expiry = keepalive_expiry
        self.is_closed = False
        self.connections_opened = 0
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._heads: dict[tuple[str, int], bytes] = {}
        self._swept_at = 0.0

    async def post(self, host: str, port: int, body: bytes, timeout: float) -> tuple[int, bytes]:
        """Send ``body``; the response's status and body. Raises :class:`FrameClientError`."""
        if self.is_closed:
            raise ConnectFailed("the client is closed")
        key = (host, port)
        head = self._heads.get(key)
        if head is None:
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            head = self._heads[key] = (
                f"POST {self.path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: {self.content_type}\r\n"
                "Content-Length: "
            ).encode("ascii")
        request = b"%b%d\r\n\r\n%b" % (head, len(body), body)
        with trio.move_on_after(timeout) as scope:
            while True:
                conn, reused = self._take(key)
                if conn is None:
                    conn = await self._connect(host, port)
                try:
                    status, reply, keep = await self._exchange(conn, request)
                except _Closed as exc:
                    conn.close()
                    if reused and not exc.got:
                        continue  # the server had closed it while idle: it never read the request
                    raise ConnectFailed("the connection closed before a whole response") from None
                except BaseException:
                    conn.close()
                    raise
                break
        if scope.cancelled_caught:
            raise ResponseTimeout(f"no response within {timeout} s")
        if keep and not self.is_closed:
            self._keep(key, conn)
        else:
            conn.close()
        return status, reply

    def _take(self, key: tuple[str, int]) -> tuple[_Connection | None, bool]:
        now = trio.current_time()
        if now - self._swept_at > self.keepalive_expiry:
            self._sweep(now)
        idle = self._idle.get(key)
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < self.keepalive_expiry:
                return conn, True
            conn.close()
        return None, False

    def _keep(self, key: tuple[str, int], conn: _Connection) -> None:
        idle = self._idle.setdefault(key, [])
        if len(idle) >= self.max_idle or conn.buffer:  # bytes beyond the response: not a clean connection
            conn.close()
            return
        conn.idle_since = trio.current_time()
        conn.received = False
        idle.append(conn)

    def _sweep(self, now: float) -> None:
        """Close connections idle too long, so addresses that are gone keep no sockets."""
        self._swept_at = now
        for key in list(self._idle):
            fresh = []
            for conn in self._idle[key]:
                if now - conn.idle_since < self.keepalive_expiry:
                    fresh.append(conn)
                else:
                    conn.close()
            if fresh:
                self._idle[key] = fresh
            else:
                del self._idle[key]

    async def _connect(self, host: str, port: int) -> _Connection:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise ConnectFailed(f"{type(exc).__name__}: {exc.strerror or errno.errorcode.get(exc.errno, exc)}") from None
        self.connections_opened += 1
        return _Connection(stream)

    async def _exchange(self, conn: _Connection, request: bytes) -> tuple[int, bytes, bool]:
        try:
            await conn.stream.send_all(request)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            raise _Closed(False) from None
        while True:
            head = await conn.read_head()
            status, headers, version = _parse_head(head)
            if status >= 200:
                break  # 1xx: an interim response, the real one follows
        keep = version == b"HTTP/1.1" and headers.get(b"connection", b"").lower() != b"close"
        if status in (204, 304):
            return status, b"", keep
        if b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            return status, await self._read_chunked(conn), keep
        length = headers.get(b"content-length")
        if length is None:
            return status, await conn.read_to_end(self.max_body_bytes), False
        try:
            size = int(length)
        except ValueError:
            raise BadResponse("bad content-length") from None
        if size < 0 or size > self.max_body_bytes:
            raise BadResponse(f"response body of {size} bytes")
        return status, await conn.read_exactly(size), keep

    async def _read_chunked(self, conn: _Connection) -> bytes:
        parts: list[bytes] = []
        total = 0
        while True:
            line = await conn.read_line()
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadResponse("bad chunk size") from None
            if size == 0:
                while await conn.read_line():  # trailers, up to the empty line
                    pass
                return b"".join(parts)
            total += size
            if total > self.max_body_bytes:
                raise BadResponse("response body too large")
            parts.append(await conn.read_exactly(size))
            await conn.read_exactly(2)  # the CRLF after the chunk

    async def aclose(self) -> None:
        self.is_closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _parse_head(head: bytes) -> tuple[int, dict[bytes, bytes], bytes]:
    """Status code, headers (lower-cased names) and version of a response head."""
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or len(parts[1]) != 3 or not parts[1].isdigit():
        raise BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers: dict[bytes, bytes] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(b":")
        if not sep:
            raise BadResponse("malformed header line")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, parts[0]
