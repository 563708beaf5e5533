"""The local socket between ``hyphae mcp`` and its daemon (mcp_bridge/local.py)."""

from __future__ import annotations

import json
import socket
import stat

import pytest
import trio
import trio.testing

from mcp_bridge import Dispatcher, local
from mcp_bridge.local import SocketRelay, bind_local_socket, serve_local_socket
from node.errors import Unauthenticated

from .fakes import ALICE, FakeService


def rpc(request_id, method="tools/call", params=None) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


@pytest.fixture
async def daemon(tmp_path, nursery):
    """A served socket over a fake facade whose keys can be revoked mid-test."""
    service = FakeService()
    revoked: set[str] = set()

    async def authenticate(key: str):
        if key in revoked:
            raise Unauthenticated("the API key is not valid (unknown or revoked)")
        return await service.authenticate(key)

    path = tmp_path / "mcp.sock"
    sock = bind_local_socket(path)
    assert sock is not None
    await nursery.start(serve_local_socket, sock, Dispatcher(service, server_version="0"), authenticate)
    yield path, service, revoked


async def test_calls_are_answered_with_the_keys_principal_and_the_socket_is_private(daemon) -> None:
    path, service, _ = daemon
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    relay = SocketRelay(path, "key-alice")
    stored = json.loads(await relay(rpc(1, params={"name": "store", "arguments": {
        "content": "Use SQLite in WAL mode.", "cell_type": "Decision"}})))
    assert stored["id"] == 1 and stored["result"]["isError"] is False
    assert service.calls[-1][1] == ALICE
    await relay.aclose()


async def test_a_notification_gets_no_answer_and_the_connection_stays_usable(daemon) -> None:
    path, _, _ = daemon
    relay = SocketRelay(path, "key-alice")
    assert await relay(b'{"jsonrpc":"2.0","method":"notifications/initialized"}') is None
    assert json.loads(await relay(rpc(7, "ping")))["result"] == {}
    await relay.aclose()


async def test_concurrent_calls_each_get_their_own_answer(daemon) -> None:
    path, _, _ = daemon
    relay = SocketRelay(path, "key-alice")
    answers: dict[int, dict] = {}

    async def call(i: int) -> None:
        answers[i] = json.loads(await relay(rpc(i, "ping")))

    async with trio.open_nursery() as nursery:
        for i in range(20):
            nursery.start_soon(call, i)
    assert {i: a["id"] for i, a in answers.items()} == {i: i for i in range(20)}
    await relay.aclose()


async def test_a_key_revoked_mid_session_is_refused_on_its_next_call(daemon) -> None:
    path, _, revoked = daemon
    relay = SocketRelay(path, "key-alice")
    assert "result" in json.loads(await relay(rpc(1, "ping")))
    revoked.add("key-alice")
    refused = json.loads(await relay(rpc(2, "ping")))
    assert refused["id"] == 2
    assert refused["error"]["code"] == -32001 and refused["error"]["data"]["reason"] == "unauthenticated"
    await relay.aclose()


async def test_an_unknown_key_is_refused_and_a_bad_hello_closes_the_connection(daemon) -> None:
    path, _, _ = daemon
    relay = SocketRelay(path, "key-mallory")
    assert json.loads(await relay(rpc(3, "ping")))["error"]["data"]["reason"] == "unauthenticated"
    await relay.aclose()
    stream = await trio.open_unix_socket(str(path))
    await stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"ping"}\n')
    answer = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some():
            answer += chunk
    assert json.loads(answer)["error"]["code"] == -32600  # then EOF: the daemon hung up
    await stream.aclose()


async def test_no_daemon_is_an_unavailable_error_with_the_requests_id(tmp_path) -> None:
    relay = SocketRelay(tmp_path / "mcp.sock", "key-alice")
    answer = json.loads(await relay(rpc(5, "ping")))
    assert answer["id"] == 5
    assert answer["error"]["code"] == -32050 and answer["error"]["data"]["reason"] == "unavailable"
    assert await relay(b'{"jsonrpc":"2.0","method":"notifications/initialized"}') is None


async def test_a_daemon_that_goes_away_is_an_unavailable_error_then_reconnects(tmp_path) -> None:
    path = tmp_path / "mcp.sock"
    relay = SocketRelay(path, "key-alice")
    dispatcher = Dispatcher(FakeService(), server_version="0")
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_local_socket, bind_local_socket(path), dispatcher, FakeService().authenticate)
        assert "result" in json.loads(await relay(rpc(1, "ping")))
        nursery.cancel_scope.cancel()  # the daemon stops; the relay's pooled connection dies
    gone = json.loads(await relay(rpc(2, "ping")))
    assert gone["id"] == 2 and gone["error"]["data"]["reason"] == "unavailable"
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_local_socket, bind_local_socket(path), dispatcher, FakeService().authenticate)
        assert "result" in json.loads(await relay(rpc(3, "ping")))  # a daemon restart is picked up
        nursery.cancel_scope.cancel()
    await relay.aclose()


def test_a_path_too_long_for_a_unix_socket_means_no_socket(tmp_path) -> None:
    deep = tmp_path / ("d" * 120)
    deep.mkdir()
    assert bind_local_socket(deep / "mcp.sock") is None


async def test_a_full_accept_backlog_is_waited_out_not_reported_as_a_dead_daemon(tmp_path, monkeypatch, nursery) -> None:
    """A Unix socket refuses a connect at once (EAGAIN) while the daemon's backlog is full,
    as when several relays open their pools together; the relay retries instead of failing."""
    monkeypatch.setattr(local, "LISTEN_BACKLOG", 1)
    path = tmp_path / "mcp.sock"
    sock = bind_local_socket(path)
    fillers = []
    while True:  # fill the backlog: nobody accepts yet
        filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        filler.setblocking(False)
        try:
            filler.connect(str(path))
        except BlockingIOError:
            filler.close()
            break
        fillers.append(filler)
    service = FakeService()

    async def serve_soon() -> None:
        await trio.testing.wait_all_tasks_blocked()  # the relay is already waiting for a way in
        await serve_local_socket(sock, Dispatcher(service, server_version="0"), service.authenticate)

    nursery.start_soon(serve_soon)
    relay = SocketRelay(path, "key-alice")
    assert json.loads(await relay(rpc(1, "ping")))["result"] == {}
    await relay.aclose()
    for filler in fillers:
        filler.close()


async def test_a_call_in_flight_when_the_daemon_stops_still_gets_its_answer(tmp_path) -> None:
    """Shutdown cancels the socket server; a store already being handled is answered first,
    so the agent is not told "unavailable" about a write that was made."""
    service = FakeService()
    started, release = trio.Event(), trio.Event()
    original_store = service.store

    async def slow_store(principal, **arguments):
        started.set()
        await release.wait()
        return await original_store(principal, **arguments)

    service.store = slow_store
    path = tmp_path / "mcp.sock"
    relay = SocketRelay(path, "key-alice")
    answers = []
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as daemon:
            await daemon.start(serve_local_socket, bind_local_socket(path), Dispatcher(service, server_version="0"),
                               service.authenticate)

            async def call() -> None:
                answers.append(json.loads(await relay(rpc(1, params={"name": "store", "arguments": {
                    "content": "Ship on Fridays only with a rollback plan.", "cell_type": "Decision"}}))))

            async def finish_the_store_later() -> None:
                await trio.testing.wait_all_tasks_blocked()  # the shutdown is under way, stuck on the store
                release.set()

            outer.start_soon(call)
            await started.wait()
            daemon.cancel_scope.cancel()  # the daemon shuts down with the store in flight
            outer.start_soon(finish_the_store_later)
    assert answers[0]["id"] == 1 and answers[0]["result"]["isError"] is False
    assert len(service.cells) == 1
    await relay.aclose()
