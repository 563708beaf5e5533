"""The lean HTTP/1.1 server (``web.server``) against a real loopback socket.

Each story starts ``serve_http`` on an ephemeral port with a small test app and talks to it
with a raw socket (so pipelining, malformed heads and slow clients can be written byte by
byte) or httpx (a real client's keep-alive pool). Timeouts are shrunk so the slow-client
stories take a fraction of a second; every test runs under ``trio.fail_after``.
"""

from __future__ import annotations

import socket
from contextlib import asynccontextmanager

import httpx
import pytest
import trio
import trio.testing

from web.server import SERVER_ENV, HttpLimits, serve_asgi, serve_http, server_choice

FAST = HttpLimits(keep_alive_timeout=5, header_timeout=0.5, read_timeout=0.5, write_timeout=1,
                  graceful_timeout=2, linger_timeout=0.5, reap_interval=0.05, max_body_bytes=4096)  # fmt: skip


class EchoApp:
    """Reads the whole body, answers ``<method> <path> <query> <body length>``; counts calls and
    remembers each request's client address (one address: one connection)."""

    def __init__(self) -> None:
        self.calls = 0
        self.clients: list[tuple[str, int]] = []

    async def __call__(self, scope, receive, send) -> None:
        self.calls += 1
        self.clients.append(scope["client"])
        size = 0
        while True:
            message = await receive()
            assert message["type"] == "http.request"
            size += len(message["body"])
            if not message["more_body"]:
                break
        text = f"{scope['method']} {scope['path']} {scope['query_string'].decode()} {size}".encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(text))]})
        await send({"type": "http.response.body", "body": text})


@asynccontextmanager
async def running(app, limits: HttpLimits = FAST, shutdown: trio.Event | None = None):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    async with trio.open_nursery() as nursery:
        stopped = trio.Event()

        async def serve(task_status=trio.TASK_STATUS_IGNORED):
            try:
                await serve_http(app, sock, limits=limits, task_status=task_status,
                                 shutdown_trigger=shutdown.wait if shutdown is not None else None)
            finally:
                stopped.set()

        [url] = await nursery.start(serve)
        yield url, stopped
        nursery.cancel_scope.cancel()


async def connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    data = b""
    while chunk := await stream.receive_some(65536):
        data += chunk
    return data


async def read_responses(stream: trio.SocketStream, count: int) -> list[tuple[int, dict[bytes, bytes], bytes]]:
    """``count`` Content-Length-framed responses: (status, headers, body)."""
    buffer, responses = b"", []
    while len(responses) < count:
        while b"\r\n\r\n" not in buffer:
            chunk = await stream.receive_some(65536)
            assert chunk, f"closed after {len(responses)} responses"
            buffer += chunk
        head, _, buffer = buffer.partition(b"\r\n\r\n")
        status_line, *lines = head.split(b"\r\n")
        headers = {name.lower(): value.strip() for name, _, value in (line.partition(b":") for line in lines)}
        length = int(headers[b"content-length"])
        while len(buffer) < length:
            buffer += await stream.receive_some(65536)
        responses.append((int(status_line.split()[1]), headers, buffer[:length]))
        buffer = buffer[length:]
    return responses


async def chunks(*parts: bytes):
    for part in parts:
        yield part


def post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    return b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n%s\r\n%s" % (path.encode(), len(body), extra, body)


async def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app) as (url, _), httpx.AsyncClient(base_url=url, trust_env=False) as client:
            for i in range(5):
                response = await client.post(f"/echo/{i}?q=%20x", content=b"a" * i)
                assert response.status_code == 200
                assert response.text == f"POST /echo/{i} q=%20x {i}"
                assert response.headers["date"].endswith("GMT")
    assert app.calls == 5 and len(set(app.clients)) == 1


async def test_pipelined_requests_are_answered_in_order() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app) as (url, _):
            stream = await connect(url)
            await stream.send_all(post("/one", b"1") + post("/two", b"22") + b"GET /three HTTP/1.1\r\nhost: t\r\n\r\n")
            bodies = [body for _, _, body in await read_responses(stream, 3)]
            assert bodies == [b"POST /one  1", b"POST /two  2", b"GET /three  0"]
            await stream.aclose()


async def test_a_chunked_body_streams_in_and_a_response_without_length_streams_out() -> None:
    seen: list[bytes] = []

    async def app(scope, receive, send) -> None:
        while True:
            message = await receive()
            seen.append(message["body"])
            if not message["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"first ", b"", b"second"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    with trio.fail_after(10):
        async with running(app) as (url, _), httpx.AsyncClient(base_url=url, trust_env=False) as client:
            response = await client.post("/", content=chunks(b"ab", b"cd", b"ef"))
            assert response.headers["transfer-encoding"] == "chunked"
            assert response.text == "first second"
    assert b"".join(seen) == b"abcdef"


async def test_a_declared_body_over_the_limit_is_413_without_calling_the_app() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app) as (url, _):
            stream = await connect(url)
            await stream.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 4097\r\n\r\n" + b"x" * 100)
            [(status, headers, body)] = await read_responses(stream, 1)
            assert status == 413 and headers[b"connection"] == b"close" and b"4096" in body
            assert await read_until_closed(stream) == b""
    assert app.calls == 0


async def test_a_streamed_body_over_the_limit_is_413_and_the_app_hears_a_disconnect() -> None:
    heard: list[str] = []

    async def app(scope, receive, send) -> None:
        while True:
            message = await receive()
            heard.append(message["type"])
            if message["type"] == "http.disconnect" or not message["more_body"]:
                return

    with trio.fail_after(10):
        async with running(app) as (url, _), httpx.AsyncClient(base_url=url, trust_env=False) as client:
            response = await client.post("/", content=chunks(b"y" * 3000, b"y" * 3000))
            assert response.status_code == 413
    assert heard[-1] == "http.disconnect"


async def test_an_answer_before_the_body_is_read_keeps_the_connection_usable() -> None:
    """What /mcp does for a body over 1 MiB: it stops reading and answers 413; the server
    drains the rest, so the response arrives and the next request reuses the connection."""
    clients = []

    async def app(scope, receive, send) -> None:
        clients.append(scope["client"])
        if scope["path"] == "/early":
            await receive()  # one chunk at most, then refuse
            await send({"type": "http.response.start", "status": 413, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        await EchoApp()(scope, receive, send)

    with trio.fail_after(10):
        async with running(app) as (url, _), httpx.AsyncClient(base_url=url, trust_env=False) as client:
            for _ in range(3):
                assert (await client.post("/early", content=b"z" * 4000)).status_code == 413
                assert (await client.post("/early", content=chunks(*[b"z" * 1000] * 4))).status_code == 413
                assert (await client.post("/after", content=b"ok")).text == "POST /after  2"
    assert len(set(clients)) == 1


async def test_a_malformed_request_is_400_and_closed() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app) as (url, _):
            for garbage in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nbad header line\r\n\r\n",
                            b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: nope\r\n\r\n"):
                stream = await connect(url)
                await stream.send_all(garbage)
                answer = await read_until_closed(stream)
                assert answer.startswith(b"HTTP/1.1 400 "), answer
                assert b"connection: close" in answer.lower()
    assert app.calls == 0


async def test_a_head_too_large_is_refused() -> None:
    with trio.fail_after(10):
        async with running(EchoApp()) as (url, _):
            stream = await connect(url)
            await stream.send_all(b"GET / HTTP/1.1\r\nhost: t\r\nx-big: " + b"b" * 20_000)  # 16 KiB and no end
            assert (await read_until_closed(stream)).startswith(b"HTTP/1.1 431 ")


async def test_a_slow_client_is_cut_off_at_the_header_timeout_however_it_trickles() -> None:
    head = b"GET / HTTP/1.1\r\nhost: t\r\nx-slow: " + b"s" * 300  # 30 s of trickle against a 0.5 s header timeout
    sent = 0
    with trio.fail_after(60):  # a hang guard only
        async with running(EchoApp()) as (url, _):
            stream = await connect(url)
            with pytest.raises((trio.BrokenResourceError, trio.ClosedResourceError)):
                for byte in head:
                    await stream.send_all(bytes([byte]))  # one byte per 0.1 s: every read makes progress
                    sent += 1
                    await trio.sleep(0.1)  # the trickle's pace, not a wait for something to happen
                    if await _closed(stream):
                        raise trio.BrokenResourceError
    assert sent < len(head)  # cut off with the head unfinished, though no single read ever stalled


async def _closed(stream: trio.SocketStream) -> bool:
    with trio.move_on_after(0):
        return await stream.receive_some(1) == b""
    return False


async def _readable(stream: trio.SocketStream) -> bool:
    """Is a byte (or the end) waiting to be read? Tries once, without waiting."""
    with trio.move_on_after(0):
        await stream.receive_some(1)
        return True
    return False


async def test_a_stalled_body_is_cut_off_at_the_read_timeout_and_idle_connections_close() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app, FAST) as (url, _):
            stream = await connect(url)
            await stream.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 10\r\n\r\nabc")
            assert await read_until_closed(stream) == b""  # 0.5 s without a byte: closed
        idle = HttpLimits(keep_alive_timeout=0.3, reap_interval=0.05)
        async with running(app, idle) as (url, _):
            stream = await connect(url)
            await stream.send_all(post("/", b""))
            await read_responses(stream, 1)
            assert await read_until_closed(stream) == b""  # idle past keep_alive_timeout: closed


async def test_an_app_exception_is_500_and_the_connection_survives() -> None:
    async def app(scope, receive, send) -> None:
        if scope["path"] == "/boom":
            raise ValueError("boom")
        if scope["path"] == "/silent":
            return
        if scope["path"] == "/half":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"10")]})
            await send({"type": "http.response.body", "body": b"12345", "more_body": True})
            raise ValueError("half way")
        await EchoApp()(scope, receive, send)

    with trio.fail_after(10):
        async with running(app) as (url, _):
            stream = await connect(url)
            await stream.send_all(post("/boom", b"body") + post("/silent", b"") + post("/fine", b"x"))
            statuses = [(status, body) for status, _, body in await read_responses(stream, 3)]
            assert statuses == [(500, b"internal server error\n"), (500, b"internal server error\n"), (200, b"POST /fine  1")]
            await stream.send_all(post("/half", b""))
            answer = await read_until_closed(stream)  # a response cut short: closing is the only way to say so
            assert answer.endswith(b"12345") and b"HTTP/1.1 200" in answer


async def test_a_failure_inside_the_server_costs_one_connection_not_the_server(monkeypatch) -> None:
    from web import server as http_server

    original = http_server._Connection._scope

    def failing(self, request):
        if request.target == b"/bug":
            raise LookupError("a bug in the server")
        return original(self, request)

    monkeypatch.setattr(http_server._Connection, "_scope", failing)
    with trio.fail_after(10):
        async with running(EchoApp()) as (url, _):
            stream = await connect(url)
            await stream.send_all(post("/bug", b""))
            assert await read_until_closed(stream) == b""
            stream = await connect(url)
            await stream.send_all(post("/fine", b""))
            assert [body for _, _, body in await read_responses(stream, 1)] == [b"POST /fine  0"]


async def test_graceful_shutdown_finishes_the_request_in_flight_and_closes_idle_ones() -> None:
    entered, release = trio.Event(), trio.Event()

    async def app(scope, receive, send) -> None:
        if scope["path"] == "/slow":
            entered.set()
            await release.wait()
        await EchoApp()(scope, receive, send)

    shutdown = trio.Event()
    with trio.fail_after(10):
        async with running(app, shutdown=shutdown) as (url, stopped):
            idle = await connect(url)
            await idle.send_all(post("/warm", b""))
            await read_responses(idle, 1)
            busy = await connect(url)
            await busy.send_all(post("/slow", b"in flight"))
            await entered.wait()
            shutdown.set()
            assert await read_until_closed(idle) == b""  # idle: closed at once
            with pytest.raises(OSError):
                await connect(url)  # no longer accepting
            assert not stopped.is_set()
            release.set()
            [(status, headers, body)] = await read_responses(busy, 1)
            assert (status, body, headers[b"connection"]) == (200, b"POST /slow  9", b"close")
            await stopped.wait()


async def test_graceful_shutdown_gives_up_on_a_request_after_the_grace_timeout() -> None:
    called = trio.Event()

    async def app(scope, receive, send) -> None:
        called.set()
        await trio.sleep_forever()

    shutdown = trio.Event()
    limits = HttpLimits(graceful_timeout=0.3, reap_interval=0.05)
    with trio.fail_after(60):  # a hang guard only: the server must stop although the request never ends
        async with running(app, limits, shutdown) as (url, stopped):
            stream = await connect(url)
            await stream.send_all(post("/", b""))
            await called.wait()
            shutdown.set()
            await stopped.wait()
            assert await read_until_closed(stream) == b""


async def test_connections_beyond_the_bound_wait_for_a_free_slot() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app, HttpLimits(max_connections=1, reap_interval=0.05)) as (url, _):
            first = await connect(url)
            await first.send_all(post("/first", b""))
            await read_responses(first, 1)
            second = await connect(url)  # the kernel's backlog takes it; we do not accept yet
            await second.send_all(post("/second", b""))
            # Loopback has handed both the connection and its request to the server's side: a
            # server that took it would have answered by the time every task is blocked.
            await trio.testing.wait_all_tasks_blocked(cushion=0.01)  # shorter than the 0.05 s reap interval
            assert app.calls == 1 and not await _readable(second), "served beyond max_connections=1"
            await first.aclose()
            [(status, _, body)] = await read_responses(second, 1)
            assert (status, body) == (200, b"POST /second  0")


async def test_a_streaming_response_hears_the_client_leave() -> None:
    gone = trio.Event()

    async def app(scope, receive, send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"event: hello\n\n", "more_body": True})
        assert (await receive())["type"] == "http.disconnect"  # blocks until the client leaves
        gone.set()

    with trio.fail_after(10):
        async with running(app) as (url, _):
            stream = await connect(url)
            await stream.send_all(b"GET /events HTTP/1.1\r\nhost: t\r\n\r\n")
            assert b"event: hello" in await stream.receive_some(65536)
            await stream.aclose()
            await gone.wait()


async def test_head_answers_carry_no_body_and_expect_100_continue_is_honoured() -> None:
    app = EchoApp()
    with trio.fail_after(10):
        async with running(app) as (url, _):
            stream = await connect(url)
            await stream.send_all(b"HEAD /h HTTP/1.1\r\nhost: t\r\n\r\n")
            head = await stream.receive_some(65536)
            assert head.startswith(b"HTTP/1.1 200 ") and head.endswith(b"\r\n\r\n")  # Content-Length, no body
            await stream.send_all(b"POST /c HTTP/1.1\r\nhost: t\r\ncontent-length: 3\r\nexpect: 100-continue\r\n\r\n")
            assert (await stream.receive_some(65536)).startswith(b"HTTP/1.1 100 ")
            await stream.send_all(b"abc")
            [(status, _, body)] = await read_responses(stream, 1)
            assert (status, body) == (200, b"POST /c  3")


async def test_serve_asgi_picks_the_server_from_the_environment(monkeypatch) -> None:
    monkeypatch.delenv(SERVER_ENV, raising=False)
    assert server_choice() == "lean"
    monkeypatch.setenv(SERVER_ENV, "nginx")
    with pytest.raises(ValueError, match="lean, hypercorn"):
        server_choice()
    for name in ("hypercorn", "lean"):
        monkeypatch.setenv(SERVER_ENV, name)
        app = EchoApp()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                [url] = await nursery.start(serve_asgi, app, sock)
                async with httpx.AsyncClient(base_url=url, trust_env=False) as client:
                    response = await client.post("/x", content=b"abc")
                assert response.text == "POST /x  3"
                nursery.cancel_scope.cancel()
