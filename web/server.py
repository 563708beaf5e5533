"""A lean HTTP/1.1 server for our ASGI apps: h11 parses and frames, trio moves the bytes.

Why not hypercorn (still selectable, ``HYPHAE_HTTP_SERVER=hypercorn``): per request its trio
worker starts a task and a memory channel for the app, restarts an idle-timeout task, and
writes the head and the body in two ``send()`` calls; on a no-op app that is more than half
of what a whole MCP recall costs our daemon. Here the app is awaited inline in the
connection's own task, and a response's head and (first) body chunk leave in one write.

Theory of operation. One task per connection loops: pull h11 events until a ``Request``,
build the ASGI ``http`` scope, ``await app(scope, receive, send)``, then start the next
cycle (keep-alive; a pipelined request may already sit in h11's buffer; h11 takes one
request at a time) or close. ``receive()`` pulls body bytes through h11 only when the app
asks; ``send()`` frames through h11 (Content-Length or chunked, as the app's headers say).

Timeouts cost no timer per read: a connection holds one ``deadline`` and one cancel scope,
and one reaper task per server cancels the connections whose deadline has passed, every
``reap_interval`` seconds (and counts ``http_timeout_<what it waited for>``). Each wait sets
the deadline it needs; the totals are never extended, however steadily bytes trickle in:

    waiting for                              deadline
    the first byte on a new connection       accept + first_byte_timeout
    the first byte of a next request         start of the wait + keep_alive_timeout
    the rest of a request head               first byte + header_timeout
    a chunk of a request body                start of the read + read_timeout, and at most
                                             the first body read + body_timeout
    the client to take a response write      start of the write + write_timeout
    the app                                  none

Slots: a connection holds one of ``max_connections`` from accept to close. When none is
free the server stops accepting (the kernel's backlog holds the clients). At accept,
:class:`~.limits.Admission` closes at once a connection over the limit per client address,
or one that would take a slot reserved for the addresses ``is_preferred()`` names (the mesh
port: known members), counting ``http_refused_<reason>`` (see :mod:`.limits`).

What the server answers itself: 400 (or h11's hint, e.g. 431) for a malformed head; 413 for
a body larger than ``max_body_bytes`` (declared: before the app runs; streamed: ``receive()``
reports a disconnect to the app); 500 when the app raises or returns before answering (the
connection then survives if the request was read whole). A body the app left unread is
drained (up to ``max_body_bytes``) so the connection can be reused, or, past that, the
response says ``Connection: close`` and the close lingers (our write side shut, the rest
read and dropped for up to ``linger_timeout``) so the client's unread bytes cannot turn
into a TCP reset that destroys the answer before it is read.

Shutdown: stop accepting; idle connections close at once; a request in flight finishes
(its response says ``Connection: close``) within ``graceful_timeout``; then everything left
is cancelled. Only what our apps use of ASGI 3 is served: the ``http`` scope (no lifespan,
no websockets; ``Upgrade`` is not honoured).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

import h11
import trio

from .limits import Admission, HttpLimits, host_key

__all__ = ["HttpLimits", "ClientDisconnected", "serve_http", "serve_asgi", "server_choice", "SERVER_ENV"]

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]]

RECEIVE_SIZE = 65536
_ASGI = {"version": "3.0", "spec_version": "2.3"}
_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus}
_DISCONNECT = {"type": "http.disconnect"}
_CLOSE = (b"connection", b"close")
_INF = math.inf


class ClientDisconnected(OSError):
    """``send()`` after the client went away (ASGI asks servers for an OSError here)."""


_date_second = -1
_date_value = b""


def _date() -> bytes:
    """The ``Date`` header (RFC 9110 §6.6.1), formatted once a second."""
    global _date_second, _date_value
    now = time.time()
    if int(now) != _date_second:
        _date_second, _date_value = int(now), formatdate(now, usegmt=True).encode()
    return _date_value


class _Server:
    def __init__(self, app: ASGIApp, limits: HttpLimits, local: tuple[str, int], admission: Admission) -> None:
        self.app = app
        self.limits = limits
        self.local = local
        self.admission = admission
        self.counters = admission.counters
        self.connections: set[_Connection] = set()
        self.slots = trio.Semaphore(limits.max_connections)
        self.closing = False
        self.all_closed = trio.Event()

    async def accept(self, listener: trio.SocketListener, nursery: trio.Nursery) -> None:
        while True:
            await self.slots.acquire()
            try:
                stream = await listener.accept()
            except OSError as exc:  # EMFILE and friends: back off rather than spin
                self.slots.release()
                log.warning("accept failed: %s", exc)
                await trio.sleep(0.1)
                continue
            except BaseException:
                self.slots.release()
                raise
            client = _peer(stream)
            host = host_key(client[0]) if client else ""
            if self.admission.admit(host) is not None:
                self.slots.release()
                with trio.CancelScope(shield=True):
                    await stream.aclose()  # at once: no answer, no read, no slot
                continue
            nursery.start_soon(self.serve_connection, stream, client, host)

    async def serve_connection(self, stream: trio.SocketStream, client: tuple[str, int] | None, host: str) -> None:
        connection = _Connection(self, stream, client)
        self.connections.add(connection)
        try:
            with connection.cancel_scope:
                await connection.run()
        except Exception:  # a bug of ours must cost one connection, never the server
            log.exception("HTTP connection from %s failed", connection.client)
            connection.broken = True
        except BaseException:
            connection.broken = True  # cancelled from outside (a shutdown past its grace): no lingering
            raise
        finally:
            self.connections.discard(connection)
            self.admission.release(host)
            self.slots.release()
            with trio.CancelScope(shield=True):
                await connection.close()
            if self.closing and not self.connections:
                self.all_closed.set()

    async def reap(self) -> None:
        """Cancel the connections whose deadline has passed (see the module docstring)."""
        while True:
            await trio.sleep(self.limits.reap_interval)
            now = trio.current_time()
            for connection in self.connections:
                if connection.deadline <= now and not connection.cancel_scope.cancel_called:
                    self.counters[f"http_timeout_{connection.waiting_for}"] += 1
                    connection.cancel_scope.cancel()

    def close_idle(self) -> None:
        self.closing = True
        for connection in self.connections:
            if connection.idle:
                connection.cancel_scope.cancel()
        if not self.connections:
            self.all_closed.set()


class _Connection:
    """One client connection: the request loop, and the ASGI ``receive``/``send`` of its
    current request (state reset per request, the bound methods made once)."""

    def __init__(self, server: _Server, stream: trio.SocketStream, client: tuple[str, int] | None) -> None:
        self.server = server
        self.limits = limits = server.limits
        self.stream = stream
        self.client = client
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.cancel_scope = trio.CancelScope()
        self.deadline = _INF
        self.waiting_for = ""  # what, when ``deadline`` passes: first_byte, keep_alive, head, body, write
        self.first_byte_deadline = trio.current_time() + limits.first_byte_timeout  # until a request arrives
        self.idle = False
        self.broken = False  # the socket failed or the peer closed: nothing more to read or write
        self.receive = self._receive
        self.send = self._send
        self._reset()

    def _reset(self) -> None:
        self.body_deadline = _INF  # set by the first read of the body
        self.body_done = False
        self.body_read = 0
        self.body_too_large = False
        self.head_only = False
        self.started = False
        self.finished = False
        self.head: bytes | None = None
        self.finished_event: trio.Event | None = None

    # -- the request loop -------------------------------------------------------------

    async def run(self) -> None:
        conn = self.h11
        while True:
            request = await self._next_request()
            if request is None:
                return
            if not await self._exchange(request):
                return
            if self.server.closing or conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                return
            conn.start_next_cycle()
            self._reset()

    async def _next_request(self) -> h11.Request | None:
        conn = self.h11
        head_deadline = None
        if conn.trailing_data[0]:  # pipelined bytes: this request's head began with the last one's
            head_deadline = trio.current_time() + self.limits.header_timeout
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    if head_deadline is None:  # nothing of this request yet: an idle wait
                        if self.server.closing:
                            return None
                        self.idle = True
                        if self.first_byte_deadline is not None:
                            data = await self._read(self.first_byte_deadline, "first_byte")
                        else:
                            data = await self._read(trio.current_time() + self.limits.keep_alive_timeout, "keep_alive")
                        self.idle = False
                        head_deadline = trio.current_time() + self.limits.header_timeout
                    else:
                        data = await self._read(head_deadline, "head")
                    conn.receive_data(data)
                elif type(event) is h11.Request:
                    self.first_byte_deadline = None  # from now on, idle waits are keep-alive ones
                    return event
                else:  # ConnectionClosed (or PAUSED, which a fresh cycle never is)
                    return None
        except h11.RemoteProtocolError as exc:
            await self._refuse(exc.error_status_hint, f"malformed request: {exc}\n")
            return None

    async def _exchange(self, request: h11.Request) -> bool:
        """Serve one request; False when the connection must close."""
        try:
            scope = self._scope(request)
        except UnicodeDecodeError:
            await self._refuse(400, "the request target is not ASCII\n")
            return False
        self.head_only = request.method == b"HEAD"
        declared = _content_length(scope["headers"])
        if declared is not None and declared > self.limits.max_body_bytes:
            await self._refuse(413, f"the request body is larger than {self.limits.max_body_bytes} bytes\n")
            return False
        try:
            await self.server.app(scope, self.receive, self.send)
        except ClientDisconnected:
            return False
        except Exception:
            if self.broken:
                return False
            log.exception("the app failed on %s %s", scope["method"], scope["path"])
            if self.started:
                return False  # a response is half sent: only closing says it is broken
            await self._answer(500, b"internal server error\n")
        if not self.started and not self.broken:
            if self.body_too_large:
                await self._refuse(413, f"the request body is larger than {self.limits.max_body_bytes} bytes\n")
                return False
            log.error("the app returned without answering %s %s", scope["method"], scope["path"])
            await self._answer(500, b"internal server error\n")
        conn = self.h11
        if not self.finished or self.broken or conn.our_state is not h11.DONE:
            return False  # unfinished, failed, or the response said Connection: close
        if conn.their_state is h11.SEND_BODY:
            return await self._drain()  # the app answered before reading it all
        return True

    def _scope(self, request: h11.Request) -> Scope:
        target = request.target
        raw_path, _, query = target.partition(b"?")
        path = raw_path.decode("ascii")
        if "%" in path:
            path = unquote(path)
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": "1.1" if request.http_version == b"1.1" else "1.0",
            "method": request.method.decode("ascii"),
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": query,
            "root_path": "",
            "headers": list(request.headers),
            "client": self.client,
            "server": self.server.local,
        }

    # -- ASGI receive -----------------------------------------------------------------

    async def _receive(self) -> Message:
        if self.body_done or self.broken or self.body_too_large:
            return await self._wait_for_disconnect()
        conn = self.h11
        chunks: list[bytes] = []
        more = True
        try:
            while True:
                event = conn.next_event()
                if type(event) is h11.Data:
                    chunks.append(event.data)
                elif type(event) is h11.EndOfMessage:
                    self.body_done, more = True, False
                    break
                elif event is h11.NEED_DATA:
                    if chunks:
                        break
                    if conn.they_are_waiting_for_100_continue:
                        await self._write(conn.send(h11.InformationalResponse(status_code=100, headers=())))
                    conn.receive_data(await self._read_body())
                else:
                    self.broken = True
                    return _DISCONNECT
        except h11.RemoteProtocolError:  # cut off mid-body, or a bad chunk
            self.broken = True
            return _DISCONNECT
        body = bytes(chunks[0]) if len(chunks) == 1 else b"".join(chunks)
        self.body_read += len(body)
        if self.body_read > self.limits.max_body_bytes:
            self.body_too_large = True
            return _DISCONNECT
        return {"type": "http.request", "body": body, "more_body": more}

    async def _wait_for_disconnect(self) -> Message:
        """After the body, ``receive()`` waits until the client leaves or the response ends."""
        if self.finished or self.broken or self.body_too_large:
            return _DISCONNECT
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        if not data:
            self.broken = True
            return _DISCONNECT
        self.h11.receive_data(data)  # a pipelined request: kept for the next cycle
        if not self.finished:
            self.finished_event = trio.Event()
            await self.finished_event.wait()
        return _DISCONNECT

    # -- ASGI send --------------------------------------------------------------------

    async def _send(self, message: Message) -> None:
        if self.broken:
            raise ClientDisconnected("the client went away")
        kind = message["type"]
        if kind == "http.response.body":
            if not self.started or self.finished:
                raise RuntimeError("http.response.body outside a response")
            conn = self.h11
            body = message.get("body", b"")
            out = [self.head] if self.head is not None else []
            self.head = None
            if body and not self.head_only:
                out += conn.send_with_data_passthrough(h11.Data(data=body))
            if not message.get("more_body", False):
                out.append(conn.send(h11.EndOfMessage()))
                self.finished = True
            if out:
                await self._write(out[0] if len(out) == 1 else b"".join(out))
            if self.finished and self.finished_event is not None:
                self.finished_event.set()
        elif kind == "http.response.start":
            if self.started:
                raise RuntimeError("http.response.start sent twice")
            self.started = True
            self.head = self._head(message["status"], message.get("headers", ()))
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")

    def _head(self, status: int, headers) -> bytes:
        headers = [*headers, (b"date", _date())]
        # A shutdown, or a body that will not be drained (too large, or a client that waits
        # for "100 Continue" before sending it): say we close.
        if self.server.closing or (
            not self.body_done and (self.body_too_large or self.h11.they_are_waiting_for_100_continue)
        ):
            headers.append(_CLOSE)
        return self.h11.send(h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b"")))

    # -- what the server answers itself -----------------------------------------------

    async def _answer(self, status: int, body: bytes) -> None:
        """A plain-text response of the server's own, when the app gave none."""
        self.started = True
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body))]
        try:
            self.head = self._head(status, headers)
            await self._send({"type": "http.response.body", "body": body})
        except (h11.LocalProtocolError, ClientDisconnected):
            self.broken = True

    async def _refuse(self, status: int, text: str) -> None:
        """Answer ``status`` and close: the request cannot be read on."""
        conn = self.h11
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE) or self.broken:
            return
        body = text.encode()
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"%d" % len(body)),
                   (b"date", _date()), _CLOSE]  # fmt: skip
        try:
            data = conn.send(h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, b"")))
            if not self.head_only:
                data += conn.send(h11.Data(data=body))
            data += conn.send(h11.EndOfMessage())
            await self._write(data)
        except (h11.LocalProtocolError, ClientDisconnected):
            self.broken = True

    async def _drain(self) -> bool:
        """Read and drop the rest of a body the app did not read; False: close instead."""
        conn = self.h11
        try:
            while True:
                event = conn.next_event()
                if type(event) is h11.Data:
                    self.body_read += len(event.data)
                    if self.body_read > self.limits.max_body_bytes:
                        return False
                elif type(event) is h11.EndOfMessage:
                    return True
                elif event is h11.NEED_DATA:
                    conn.receive_data(await self._read_body())
                else:
                    return False
        except h11.RemoteProtocolError:
            return False

    # -- bytes ------------------------------------------------------------------------

    async def _read_body(self) -> bytes:
        """Body bytes: each read within read_timeout, all of them within body_timeout."""
        now = trio.current_time()
        if self.body_deadline == _INF:
            self.body_deadline = now + self.limits.body_timeout
        return await self._read(min(now + self.limits.read_timeout, self.body_deadline), "body")

    async def _read(self, deadline: float, waiting_for: str) -> bytes:
        """Up to RECEIVE_SIZE bytes; b"" at EOF. The reaper ends the wait at ``deadline``."""
        self.deadline, self.waiting_for = deadline, waiting_for
        try:
            data = await self.stream.receive_some(RECEIVE_SIZE)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        finally:
            self.deadline = _INF
        if not data:
            self.broken = True
        return data

    async def _write(self, data: bytes) -> None:
        self.deadline, self.waiting_for = trio.current_time() + self.limits.write_timeout, "write"
        try:
            await self.stream.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.broken = True
            raise ClientDisconnected("the client went away") from None
        finally:
            self.deadline = _INF

    async def close(self) -> None:
        """Close; if the client may still be sending, linger so its bytes cannot reset our answer."""
        stream = self.stream
        try:
            lingering = not (self.broken or self.cancel_scope.cancel_called)  # not after a timeout or the grace
            if lingering and self.h11.their_state in (h11.SEND_BODY, h11.ERROR):
                with trio.move_on_after(self.limits.linger_timeout):
                    await stream.send_eof()
                    dropped = 0
                    while dropped <= self.limits.max_body_bytes:
                        data = await stream.receive_some(RECEIVE_SIZE)
                        if not data:
                            break
                        dropped += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        finally:
            await stream.aclose()


def _peer(stream: trio.SocketStream) -> tuple[str, int] | None:
    try:
        peer = stream.socket.getpeername()
        return (peer[0], peer[1])
    except (OSError, IndexError, TypeError):
        return None


def _content_length(headers) -> int | None:
    for name, value in headers:
        if name == b"content-length":
            return int(value)  # h11 has checked it is digits
    return None


async def serve_http(
    app: ASGIApp, sock: socket.socket, *, shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    limits: HttpLimits = HttpLimits(), is_preferred: Callable[[str], bool] | None = None,
    counters: MutableMapping[str, int] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve ``app`` on the bound ``sock`` (which this takes over and closes) until cancelled,
    or until ``shutdown_trigger()`` returns: then shut down gracefully (module docstring).
    ``is_preferred(host)`` says whether a client may take ``limits.reserved_slots`` and pass
    the limit per address; refusals and timeouts are counted in ``counters`` (e.g. a
    ``collections.Counter``). Reports ``["http://host:port"]`` to ``task_status``."""
    sock.listen(limits.backlog)
    host, port = sock.getsockname()[:2]
    listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
    server = _Server(app, limits, (host, port), Admission(limits, is_preferred, counters))
    url_host = f"[{host}]" if ":" in host else host
    async with trio.open_nursery() as connections:
        connections.start_soon(server.reap)
        try:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(server.accept, listener, connections)
                task_status.started([f"http://{url_host}:{port}"])
                if shutdown_trigger is None:
                    await trio.sleep_forever()
                await shutdown_trigger()
                accepting.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await listener.aclose()
        server.close_idle()
        with trio.move_on_after(limits.graceful_timeout):
            await server.all_closed.wait()
        connections.cancel_scope.cancel()


SERVER_ENV = "HYPHAE_HTTP_SERVER"
SERVERS = ("lean", "hypercorn")


def server_choice() -> str:
    """Which server ``serve_asgi`` runs: ``lean`` (this module; the default) or ``hypercorn``,
    from ``$HYPHAE_HTTP_SERVER``, so the A/B of the benchmarks stays one variable away."""
    name = os.environ.get(SERVER_ENV, "").strip().lower() or "lean"
    if name not in SERVERS:
        raise ValueError(f"{SERVER_ENV} must be one of {', '.join(SERVERS)}, not {name!r}")
    return name


async def serve_asgi(
    app: ASGIApp, sock: socket.socket, *, shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    limits: HttpLimits = HttpLimits(), is_preferred: Callable[[str], bool] | None = None,
    counters: MutableMapping[str, int] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """:func:`serve_http`, or hypercorn's trio worker when :func:`server_choice` says so
    (same socket hand-over, same shutdown; hypercorn honours only the keep-alive and graceful
    timeouts of ``limits``: no slot limits, no reserve, no counters)."""
    if server_choice() == "lean":
        await serve_http(app, sock, shutdown_trigger=shutdown_trigger, limits=limits, is_preferred=is_preferred,
                         counters=counters, task_status=task_status)  # fmt: skip
        return
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = [f"fd://{sock.detach()}"]  # hypercorn adopts the descriptor and closes it
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.keep_alive_timeout = limits.keep_alive_timeout
    config.graceful_timeout = limits.graceful_timeout
    config.backlog = limits.backlog
    await serve(app, config, shutdown_trigger=shutdown_trigger, task_status=task_status)
