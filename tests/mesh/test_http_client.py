"""The mesh's own HTTP client against a scripted raw server: reuse, stale connections, framing, failures."""

from __future__ import annotations

import functools

import httpx
import pytest
import trio

from mesh.runtime import FRAMES_PATH, HttpTransport, SendError, pack_frames
from mesh.runtime.http_client import BadResponse, ConnectFailed, FrameClient, ResponseTimeout


class ScriptedServer:
    """Reads each request whole; answers with ``respond(request_index, body)`` raw bytes (None: say nothing).
    ``close_after`` closes a connection after that many requests on it."""

    def __init__(self, respond, close_after: int | None = None) -> None:
        self.respond = respond
        self.close_after = close_after
        self.requests: list[tuple[bytes, bytes]] = []  # (head, body)
        self.connections = 0
        self.closed = 0  # connections this server has closed

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        buffer = bytearray()
        served = 0
        try:
            while self.close_after is None or served < self.close_after:
                while b"\r\n\r\n" not in buffer:
                    chunk = await stream.receive_some(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, rest = bytes(buffer).partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
                )  # fmt: skip
                while len(rest) < length:
                    rest += await stream.receive_some(65536)
                buffer = bytearray(rest[length:])
                self.requests.append((head, rest[:length]))
                answer = self.respond(len(self.requests) - 1, rest[:length])
                if answer is None:
                    await trio.sleep_forever()
                await stream.send_all(answer)
                served += 1
        finally:
            await stream.aclose()
            self.closed += 1


@pytest.fixture
async def serve(nursery):
    async def start(server: ScriptedServer) -> int:
        listeners = await nursery.start(functools.partial(trio.serve_tcp, server.handle, 0, host="127.0.0.1"))
        return listeners[0].socket.getsockname()[1]

    return start


def ok(body: bytes = b"", status: bytes = b"200 OK", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 %b\r\nContent-Length: %d\r\n%b\r\n%b" % (status, len(body), extra, body)


def client() -> FrameClient:
    return FrameClient(path=FRAMES_PATH, content_type="application/octet-stream", max_body_bytes=1 << 20)


async def test_requests_share_one_kept_alive_connection(serve):
    server = ScriptedServer(lambda i, body: ok(b"reply to " + body))
    port = await serve(server)
    frames = client()
    with trio.fail_after(5):
        for i in range(3):
            assert await frames.post("127.0.0.1", port, b"frame %d" % i, 2.0) == (200, b"reply to frame %d" % i)
    assert server.connections == 1 and frames.connections_opened == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST " + FRAMES_PATH.encode() + b" HTTP/1.1\r\n")
    assert b"Host: 127.0.0.1:%d" % port in head and b"Content-Type: application/octet-stream" in head
    assert body == b"frame 0"


async def test_a_connection_the_server_closed_while_idle_is_replaced_and_the_frame_sent_once(serve):
    server = ScriptedServer(lambda i, body: ok(), close_after=1)  # closes each connection after one answer
    port = await serve(server)
    frames = client()
    with trio.fail_after(5):
        for i in range(3):
            while server.closed < i:  # the server has closed the last connection (its FIN is ours on loopback)
                await trio.sleep(0.01)
            assert await frames.post("127.0.0.1", port, b"frame %d" % i, 2.0) == (200, b"")
    assert [body for _, body in server.requests] == [b"frame 0", b"frame 1", b"frame 2"]
    assert server.connections == 3


async def test_connection_close_is_honoured(serve):
    server = ScriptedServer(lambda i, body: ok(b"x", extra=b"Connection: close\r\n"))
    port = await serve(server)
    frames = client()
    with trio.fail_after(5):
        for _ in range(2):
            assert await frames.post("127.0.0.1", port, b"f", 2.0) == (200, b"x")
    assert frames.connections_opened == 2


async def test_chunked_and_close_delimited_bodies_are_read_whole(serve):
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=1\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
    answers = [chunked, b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"after interim"), b"HTTP/1.0 200 OK\r\n\r\nto the end"]
    server = ScriptedServer(lambda i, body: answers[i], close_after=3)
    port = await serve(server)
    frames = client()
    with trio.fail_after(5):
        assert await frames.post("127.0.0.1", port, b"a", 2.0) == (200, b"hello world")
        assert await frames.post("127.0.0.1", port, b"b", 2.0) == (200, b"after interim")
        assert await frames.post("127.0.0.1", port, b"c", 2.0) == (200, b"to the end")
    assert frames.connections_opened == 1


@pytest.mark.parametrize(
    "answer, error",
    [
        (None, ResponseTimeout),  # says nothing
        (b"SSH-2.0-OpenSSH\r\n\r\n", BadResponse),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", ConnectFailed),  # then the server closes
        (ok(b"x" * 100, extra=b"Content-Length: 2000000\r\n"), BadResponse),  # larger than allowed
    ],
)
async def test_a_bad_or_missing_answer_is_one_error(serve, answer, error):
    server = ScriptedServer(lambda i, body: answer, close_after=1)
    port = await serve(server)
    frames = client()
    with trio.fail_after(5), pytest.raises(error):
        await frames.post("127.0.0.1", port, b"f", 0.5)
    assert not frames._idle.get(("127.0.0.1", port))  # a connection in an unknown state is not kept


async def test_the_transport_maps_the_lean_client_onto_send_errors(serve):
    answers = {0: ok(pack_frames([b"ack"])), 1: ok(b"busy", status=b"503 Service Unavailable"), 2: None}
    server = ScriptedServer(lambda i, body: answers[i])
    port = await serve(server)
    transport = HttpTransport(timeout=0.5)
    address = f"127.0.0.1:{port}"
    with trio.fail_after(5):
        assert await transport.send(address, b"frame") == [b"ack"]
        for reason in (SendError.HTTP_STATUS, SendError.TIMEOUT):
            with pytest.raises(SendError) as caught:
                await transport.send(address, b"frame")
            assert caught.value.reason == reason
    await transport.aclose()
    assert transport.client.is_closed
    with pytest.raises(SendError) as caught:
        await transport.send(address, b"frame")
    assert caught.value.reason == SendError.CLOSED


async def test_a_peer_that_does_not_speak_http_is_a_bad_response_not_a_connect_failure(serve):
    server = ScriptedServer(lambda i, body: b"SSH-2.0-OpenSSH_9.2\r\n\r\n")
    port = await serve(server)
    for transport in (HttpTransport(timeout=0.5), HttpTransport(client=httpx.AsyncClient(), timeout=0.5)):
        with trio.fail_after(5), pytest.raises(SendError) as caught:
            await transport.send(f"127.0.0.1:{port}", b"frame")
        assert caught.value.reason == SendError.BAD_RESPONSE
        assert transport.status()["peers"][f"127.0.0.1:{port}"]["last_error"]
        await transport.client.aclose()
