"""The CLI's client to a running daemon (``app.client.DaemonClient``), against a real socket."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.client import DaemonClient
from node.errors import NotFound, Unavailable


@pytest.fixture
def closing_server() -> Iterator[tuple[str, list[str]]]:
    """An HTTP server that answers one request per connection and then closes it without
    saying so (as a daemon does with a kept-alive connection once it has been idle too long)."""
    listener = socket.create_server(("127.0.0.1", 0))
    seen: list[str] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                request = b""
                while b"\r\n\r\n" not in request:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    request += chunk
                if not request:
                    continue
                line = request.split(b"\r\n", 1)[0].decode()
                seen.append(line)
                found = "/missing" not in line
                body = json.dumps({"line": line} if found else {"error": {"reason": "not_found", "message": "no such cell"}})
                status = "200 OK" if found else "404 Not Found"
                conn.sendall(f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n{body}".encode())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    host, port = listener.getsockname()
    yield f"http://{host}:{port}", seen
    listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept(); close() alone does not
    listener.close()
    thread.join(timeout=5)


def test_a_connection_the_daemon_closed_is_replaced_and_the_call_goes_through(closing_server, tmp_path: Path) -> None:
    url, seen = closing_server
    client = DaemonClient(tmp_path, {"api_url": url}, "key")
    try:
        assert client.call("GET", "/v1/whoami")["line"] == "GET /v1/whoami HTTP/1.1"
        answer = client.call("GET", "/v1/cells", params={"q": "a b", "k": 3, "skip": None})
        assert answer["line"] == "GET /v1/cells?q=a+b&k=3 HTTP/1.1"
    finally:
        client.close()
    assert len(seen) == 2  # each request reached the server exactly once


def test_a_daemon_error_comes_back_as_its_hyphae_error(closing_server, tmp_path: Path) -> None:
    url, _ = closing_server
    client = DaemonClient(tmp_path, {"api_url": url}, "key")
    with pytest.raises(NotFound, match="no such cell"):
        client.call("GET", "/v1/cells/missing")
    client.close()


def test_no_daemon_listening_is_unavailable_with_the_address(tmp_path: Path) -> None:
    with socket.socket() as held:  # bound by this test and never listening: the port is ours, and refuses
        held.bind(("127.0.0.1", 0))
        port = held.getsockname()[1]
        client = DaemonClient(tmp_path, {"api_url": f"http://127.0.0.1:{port}"}, "key")
        with pytest.raises(Unavailable, match=f"127.0.0.1:{port} is not reachable"):
            client.call("GET", "/v1/whoami")
