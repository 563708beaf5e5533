"""Slots of the lean server (``web.server``) cannot be held without a key (issue "Trust no
member", bug 6): total deadlines per request head and body, a short wait for a connection's
first byte, a limit per client address, and slots kept for preferred (known) addresses.

Real sockets on loopback; clients pick their source address among 127.0.0.0/8 (one address
stands for one host). Time is trio's virtual clock (``autojump_clock``): it jumps ahead
whenever every task waits, so a 30 s dribble takes no real time, and the assertions about
time are about the server's virtual deadlines. ``trio.fail_after`` only guards against hangs.
"""

from __future__ import annotations

import collections
import socket
from contextlib import asynccontextmanager

import pytest
import trio

from web.server import HttpLimits, serve_http

STRANGER, OTHER_STRANGER, MEMBER = "127.0.0.2", "127.0.0.3", "127.0.0.4"
HANG_GUARD = 1000  # virtual seconds: under autojump a hang fails at once, not after this


async def echo_app(scope, receive, send) -> None:
    """Reads the whole body and answers its length."""
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        size += len(message["body"])
        if not message["more_body"]:
            break
    body = b"%d" % size
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def running(limits: HttpLimits, *, is_preferred=None):
    """A server on 127.0.0.1 (bound to port 0 and handed over, never closed and re-bound);
    yields its port and the counters it keeps."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    counters: collections.Counter[str] = collections.Counter()
    async with trio.open_nursery() as nursery:
        await nursery.start(
            lambda task_status: serve_http(echo_app, sock, limits=limits, is_preferred=is_preferred,
                                           counters=counters, task_status=task_status)
        )  # fmt: skip
        yield port, counters
        nursery.cancel_scope.cancel()


async def connect(port: int, source: str = STRANGER) -> trio.SocketStream:
    """A connection from ``source`` (no name lookup, so no thread the virtual clock would outrun)."""
    sock = trio.socket.socket()
    await sock.bind((source, 0))
    await sock.connect(("127.0.0.1", port))
    return trio.SocketStream(sock)


async def closed_by_server(stream: trio.SocketStream, within: float = HANG_GUARD) -> bool:
    """Whether the server closes ``stream`` within ``within`` seconds without answering."""
    with trio.move_on_after(within):
        try:
            return await stream.receive_some(65536) == b""
        except trio.BrokenResourceError:  # a reset: closed too
            return True
    return False


async def exchange(stream: trio.SocketStream, body: bytes = b"") -> int:
    """POST ``body``; the response's status."""
    await stream.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    response = b""
    while b"\r\n\r\n" not in response:
        chunk = await stream.receive_some(65536)
        assert chunk, f"closed instead of answering (after {response!r})"
        response += chunk
    return int(response.split(b" ", 2)[1])


async def test_a_connection_that_sends_nothing_is_closed_after_the_first_byte_timeout(autojump_clock) -> None:
    limits = HttpLimits(first_byte_timeout=5, keep_alive_timeout=75, reap_interval=0.5)
    with trio.fail_after(HANG_GUARD):
        async with running(limits) as (port, counters):
            silent = await connect(port)
            opened_at = trio.current_time()
            assert await closed_by_server(silent)
            assert 5 <= trio.current_time() - opened_at <= 5 + limits.reap_interval
            assert counters["http_timeout_first_byte"] == 1
            # Once a request went through, the wait for the next one is the keep-alive timeout.
            talker = await connect(port)
            assert await exchange(talker) == 200
            with trio.move_on_after(60):
                await talker.receive_some(1)
                pytest.fail("a kept-alive connection was closed before keep_alive_timeout")


async def test_a_dribbled_body_is_cut_off_at_the_body_timeout_however_steadily_it_comes(autojump_clock) -> None:
    limits = HttpLimits(read_timeout=2, body_timeout=10, reap_interval=0.5)
    with trio.fail_after(HANG_GUARD):
        async with running(limits) as (port, counters):
            dribbler = await connect(port)
            await dribbler.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 100\r\n\r\n")
            started = trio.current_time()
            sent = 0
            with pytest.raises(trio.BrokenResourceError):
                while sent < 100:
                    await dribbler.send_all(b"x")  # one byte a second: every read well within read_timeout
                    sent += 1
                    await trio.sleep(1)
                    with trio.move_on_after(0):
                        if await dribbler.receive_some(1) == b"":
                            raise trio.BrokenResourceError
            assert sent < 100
            assert 10 <= trio.current_time() - started <= 10 + limits.reap_interval + 1
            assert counters["http_timeout_body"] == 1


async def test_one_address_gets_at_most_its_share_of_connections(autojump_clock) -> None:
    limits = HttpLimits(max_connections_per_address=2, first_byte_timeout=60, reap_interval=0.5)
    with trio.fail_after(HANG_GUARD):
        async with running(limits) as (port, counters):
            first, second = await connect(port), await connect(port)
            third = await connect(port)  # the kernel completes the handshake; the server closes it at once
            assert await closed_by_server(third, within=0.1)
            assert counters["http_refused_per_address"] == 1
            assert await exchange(await connect(port, OTHER_STRANGER)) == 200  # another address
            # One of the two leaves (served, then closed by the server: its slot is free by then)...
            await first.send_all(b"GET / HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
            while await first.receive_some(65536):
                pass
            # ... and the address may come again, while the second one is still open.
            assert await exchange(await connect(port)) == 200
            assert await exchange(second) == 200
            assert counters["http_refused_per_address"] == 1


async def test_the_reserved_slots_are_left_to_preferred_addresses(autojump_clock) -> None:
    limits = HttpLimits(max_connections=4, reserved_slots=2, max_connections_per_address=None,
                        read_timeout=30, body_timeout=600, first_byte_timeout=60, reap_interval=0.5)  # fmt: skip
    asked: list[str] = []

    def is_member(host: str) -> bool:
        asked.append(host)
        return host == MEMBER

    with trio.fail_after(HANG_GUARD):
        async with running(limits, is_preferred=is_member) as (port, counters):
            dribblers = [await connect(port) for _ in range(2)]  # the two slots anyone may use
            for dribbler in dribblers:
                await dribbler.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 1000\r\n\r\nx")
            stranger = await connect(port, OTHER_STRANGER)
            assert await closed_by_server(stranger, within=0.1)
            assert counters["http_refused_no_slot"] == 1
            member = await connect(port, MEMBER)
            assert await exchange(member, b"hello") == 200
            assert await exchange(await connect(port, MEMBER)) == 200  # the last slot: a member's too
            assert asked == [OTHER_STRANGER, MEMBER, MEMBER]  # asked only when the answer decides
            assert counters["http_refused_no_slot"] == 1


async def test_a_head_begun_in_the_last_requests_bytes_gets_the_header_timeout_not_a_keep_alive(
    autojump_clock,
) -> None:
    limits = HttpLimits(header_timeout=10, keep_alive_timeout=75, reap_interval=0.5)
    with trio.fail_after(HANG_GUARD):
        async with running(limits) as (port, counters):
            stream = await connect(port)
            await stream.send_all(b"POST / HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\nGET / HT")
            answered_at = trio.current_time()
            response = await stream.receive_some(65536)
            assert response.startswith(b"HTTP/1.1 200 ")
            assert await closed_by_server(stream)
            assert trio.current_time() - answered_at <= 10 + limits.reap_interval
            assert counters["http_timeout_head"] == 1
