"""The HTTP transport: the client against mocks and closed ports, the mesh endpoint over a real socket."""

from __future__ import annotations

import functools
import json
import socket

import httpx
import pytest
import trio
import trio.testing

from mesh.errors import Reason
from mesh.identity import NodeIdentity
from mesh.runtime import (
    FRAMES_PATH, HELLO_PATH, PROTOCOL_VERSION, FaultPlan, HttpTransport, MeshApp, MeshRuntime, SendError,
    bind_mesh_socket, make_mesh_app, pack_frames, serve_mesh, unpack_frames, watch_fault_file,
)  # fmt: skip
from mesh.team import AUTH_SIGNED, FRAME_VERSION, FrameAuth, Team
from mesh.testing import make_engine
from mesh.wire import Envelope, MsgType, decode_envelope, encode_envelope
from node.energy import EnergyModel

ENERGY = EnergyModel()
MAX_FRAME = 64 * 1024


class Discard:
    async def apply(self, effect) -> None:
        pass


def mock_client(handler) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(handler))


async def call_asgi(
    app, method: str, path: str, chunks: list[bytes] = (), headers=(), timeout: float = 2
) -> tuple[int, dict, bytes]:
    """Drive an ASGI app directly: the body arrives in ``chunks``; returns (status, headers, body)."""
    pending = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    pending = pending or [{"type": "http.request", "body": b"", "more_body": False}]
    sent: list[dict] = []

    async def receive():
        return pending.pop(0) if pending else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "method": method, "path": path, "headers": [(k.encode(), v.encode()) for k, v in headers],
        "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 7979), "scheme": "http", "query_string": b"",
    }  # fmt: skip
    with trio.fail_after(timeout):
        await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], {k.decode(): v.decode() for k, v in start["headers"]}, body


@pytest.fixture
def team() -> Team:
    return Team.create()


@pytest.fixture
def runtime(team) -> MeshRuntime:
    engine = make_engine("127.0.0.1:1", team, ENERGY)
    return MeshRuntime(engine, transport=HttpTransport(faults=FaultPlan()), sink=Discard())


# -- the client ---------------------------------------------------------------------------


async def test_a_frame_is_posted_as_octet_stream_to_the_frames_path():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202)

    transport = HttpTransport(client=mock_client(handler))
    with trio.fail_after(2):
        await transport.send("10.0.0.7:7979", b"\x01sealed")
    (request,) = seen
    assert request.method == "POST" and str(request.url) == f"http://10.0.0.7:7979{FRAMES_PATH}"
    assert request.headers["content-type"] == "application/octet-stream" and request.content == b"\x01sealed"
    assert transport.status()["peers"]["10.0.0.7:7979"]["sent"] == 1


@pytest.mark.parametrize(
    "raise_or_status, reason",
    [
        (httpx.ReadTimeout("slow"), SendError.TIMEOUT),
        (httpx.ConnectError("refused"), SendError.CONNECT_FAILED),
        (httpx.RemoteProtocolError("garbled"), SendError.BAD_RESPONSE),
        (404, SendError.HTTP_STATUS),
        (503, SendError.HTTP_STATUS),
    ],
)
async def test_every_failure_becomes_one_send_error(raise_or_status, reason):
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(raise_or_status, Exception):
            raise raise_or_status
        return httpx.Response(raise_or_status)

    transport = HttpTransport(client=mock_client(handler))
    with trio.fail_after(2), pytest.raises(SendError) as caught:
        await transport.send("10.0.0.7:7979", b"frame")
    assert caught.value.reason == reason
    peer = transport.status()["peers"]["10.0.0.7:7979"]
    assert (peer["sent"], peer["failed"], peer["last_error"]) == (0, 1, reason)


@pytest.mark.parametrize("address", ["no-port", "host:99999", "evil.example/x:80", "a@b:80", ""])
async def test_a_bad_address_is_refused_without_a_request(address):
    transport = HttpTransport(client=mock_client(lambda request: pytest.fail("no request expected")))
    with trio.fail_after(2), pytest.raises(SendError) as caught:
        await transport.send(address, b"frame")
    assert caught.value.reason == SendError.BAD_ADDRESS


async def test_sending_to_a_port_nobody_listens_on_is_refused_not_timed_out():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # ours for the whole test, and never listening: connections are refused
        transport = HttpTransport(timeout=600.0)  # a refusal, not a timeout, must end the send
        try:
            with trio.fail_after(60), pytest.raises(SendError) as caught:  # a hang guard only
                await transport.send(f"127.0.0.1:{held.getsockname()[1]}", b"frame")
            assert caught.value.reason == SendError.CONNECT_FAILED
        finally:
            await transport.aclose()
    assert transport.client.is_closed  # it made the client, so it closed it


async def test_a_client_passed_in_stays_open_and_a_closed_transport_refuses():
    client = mock_client(lambda request: httpx.Response(202))
    transport = HttpTransport(client=client)
    await transport.aclose()
    assert not client.is_closed
    with pytest.raises(SendError) as caught:
        await transport.send("10.0.0.7:7979", b"frame")
    assert caught.value.reason == SendError.CLOSED
    await client.aclose()


async def test_no_more_than_the_per_peer_limit_is_in_flight():
    release = trio.Event()
    in_flight = peak = 0

    async def handler(request: httpx.Request) -> httpx.Response:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await release.wait()
        in_flight -= 1
        return httpx.Response(202)

    transport = HttpTransport(client=mock_client(handler), per_peer_concurrency=3)
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(transport.send, "10.0.0.7:7979", b"frame")
            nursery.start_soon(transport.send, "10.0.0.8:7979", b"frame")  # another peer is not held up
            await trio.testing.wait_all_tasks_blocked()  # every send is as far as it can get
            assert peak == 4 and transport.status()["peers"]["10.0.0.7:7979"]["in_flight"] == 3
            release.set()
    assert transport.status()["sent"] == 11 and transport.status()["in_flight"] == 0


async def test_a_fault_plan_partitions_delays_and_loses_frames(autojump_clock):
    calls = []
    faults = FaultPlan(seed=7)
    transport = HttpTransport(client=mock_client(lambda r: calls.append(r) or httpx.Response(202)), faults=faults)
    faults.partition("10.0.0.7")  # every port of that host
    with trio.fail_after(2), pytest.raises(SendError) as caught:
        await transport.send("10.0.0.7:7979", b"frame")
    assert caught.value.reason == SendError.PARTITIONED and calls == []
    faults.heal()
    faults.delay(0.2, "10.0.0.7:7979")
    started = trio.current_time()
    with trio.fail_after(2):
        await transport.send("10.0.0.7:7979", b"frame")
    assert trio.current_time() == started + 0.2 and len(calls) == 1  # virtual time: exactly the delay
    faults.clear()
    faults.lose(0.5)
    with trio.fail_after(2):
        for _ in range(200):
            await transport.send("10.0.0.8:7979", b"frame")
    lost = transport.status()["peers"]["10.0.0.8:7979"]["lost"]
    assert 60 < lost < 140 and len(calls) == 1 + 200 - lost
    assert faults.counters["lost"] == lost and faults.counters["blocked_out"] == 1


# -- the mesh endpoint, driven directly ---------------------------------------------------


@pytest.mark.parametrize("path", ["/", "/v1/cells", "/mesh/v1", "/mesh/v1/frame", "/mesh/v2/frames", "/mcp"])
async def test_everything_but_the_mesh_paths_is_404(runtime, path):
    app = make_mesh_app(runtime, max_frame_bytes=MAX_FRAME)
    for method in ("GET", "POST"):
        status, _, _ = await call_asgi(app, method, path, [b"x"])
        assert status == 404


async def test_frames_wants_post_and_hello_wants_get(runtime):
    app = make_mesh_app(runtime, max_frame_bytes=MAX_FRAME)
    status, headers, _ = await call_asgi(app, "GET", FRAMES_PATH)
    assert (status, headers["allow"]) == (405, "POST")
    status, _, _ = await call_asgi(app, "POST", HELLO_PATH)
    assert status == 405


async def test_hello_is_public_and_holds_no_secret(runtime, team):
    app = make_mesh_app(runtime, max_frame_bytes=MAX_FRAME)
    status, headers, body = await call_asgi(app, "GET", HELLO_PATH)
    assert status == 200 and headers["content-type"] == "application/json"
    assert json.loads(body) == {
        "protocol": PROTOCOL_VERSION, "team_hash": team.id_hash, "node_id": runtime.engine.node_id,
    }  # fmt: skip
    assert team.team_key.hex() not in body.decode() and team.team_id not in body.decode()


async def test_an_oversized_frame_is_413_whether_declared_or_streamed(runtime):
    app = MeshApp(runtime, max_frame_bytes=1000, reply_within=None)  # the runtime is not running: no replies
    status, _, _ = await call_asgi(app, "POST", FRAMES_PATH, [b"x" * 10], headers=[("content-length", "1001")])
    assert status == 413
    status, _, _ = await call_asgi(app, "POST", FRAMES_PATH, [b"x" * 600, b"x" * 600])  # no content-length
    assert status == 413
    assert runtime.counters["http_oversized"] == 2 and runtime.counters["frames_queued"] == 0
    status, _, _ = await call_asgi(app, "POST", FRAMES_PATH, [b"x" * 500, b"x" * 500])  # exactly the limit
    assert status == 202 and runtime.counters["frames_queued"] == 1


async def test_a_partitioned_sender_gets_503(runtime):
    runtime.transport.faults.partition("127.0.0.1")
    status, _, _ = await call_asgi(make_mesh_app(runtime, max_frame_bytes=MAX_FRAME), "POST", FRAMES_PATH, [b"f"])
    assert status == 503 and runtime.counters["frames_queued"] == 0


# -- the mesh endpoint on a real socket ---------------------------------------------------


async def test_over_a_real_socket_garbage_is_accepted_and_counted_by_the_engine(runtime):
    sock = bind_mesh_socket("127.0.0.1", 0)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    engine = runtime.engine
    with trio.fail_after(60):  # a hang guard only
        async with trio.open_nursery() as nursery, httpx.AsyncClient(base_url=base, trust_env=False) as client:
            await nursery.start(runtime.run)
            await nursery.start(serve_mesh, make_mesh_app(runtime, max_frame_bytes=MAX_FRAME), sock)

            hello = await client.get(HELLO_PATH)
            assert hello.json()["node_id"] == engine.node_id
            assert (await client.get("/v1/cells")).status_code == 404
            assert (await client.post(FRAMES_PATH, content=b"\x00" * (MAX_FRAME + 1))).status_code == 413

            garbage = [b"short", b"\x09" + b"\x00" * 100, bytes([FRAME_VERSION]) + bytes(29) + bytes(range(256)) * 2]
            for body in garbage:
                response = await client.post(FRAMES_PATH, content=body)
                assert response.status_code == 202
            while engine.counters.frames_received < len(garbage):
                await trio.sleep(0.01)
            drops = engine.counters.drops
            assert (drops[Reason.MALFORMED], drops[Reason.BAD_VERSION], drops[Reason.DECRYPT_FAILED]) == (1, 1, 1)
            assert (await client.get(HELLO_PATH)).status_code == 200  # still serving
            nursery.cancel_scope.cancel()
    await runtime.transport.aclose()


# -- replies in the response --------------------------------------------------------------


def test_reply_bodies_round_trip_and_garbage_is_refused():
    frames = [b"", b"a", b"x" * 70_000]
    assert unpack_frames(pack_frames(frames), 100_000) == frames
    assert unpack_frames(b"", 100) == []
    for bad in (b"\x00\x00", b"\x00\x00\x00\x05abc", pack_frames([b"x" * 200])):
        with pytest.raises(ValueError):
            unpack_frames(bad, 100)


def ping_frame(team: Team, nonce: int) -> bytes:
    who = NodeIdentity.generate()
    env = Envelope(MsgType.PING, wall_ms(), "127.0.0.1:2", {who.node_id: (who.public_key, team.membership_proof(who.public_key))},
                   nonce=nonce)  # fmt: skip
    return team.sealer().seal(who.node_id, encode_envelope(env), FrameAuth(AUTH_SIGNED, who.sign))


def wall_ms() -> int:
    import time

    return time.time_ns() // 1_000_000


async def test_the_answer_to_a_frame_rides_back_in_the_response(runtime, team):
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            patient = MeshApp(runtime, max_frame_bytes=MAX_FRAME, reply_within=8)  # a loaded machine is slow
            status, headers, body = await call_asgi(patient, "POST", FRAMES_PATH, [ping_frame(team, 7)], timeout=9)
            assert status == 200 and headers["content-type"] == "application/x-hyphae-frames"
            (reply,) = unpack_frames(body, MAX_FRAME)
            _, _, plaintext = team.sealer().open(reply)
            pong = decode_envelope(plaintext)
            assert pong.type is MsgType.PONG and pong.nonce == 7
            assert runtime.counters["replies_in_response"] == 1

            # An endpoint that does not wait for replies answers 202; the pong goes out as a request.
            app = MeshApp(runtime, max_frame_bytes=MAX_FRAME, reply_within=None)
            status, _, body = await call_asgi(app, "POST", FRAMES_PATH, [ping_frame(team, 8)])
            assert status == 202 and body == b""
            while runtime.counters["events"] < 3:  # Started, two frames: the pong went to a send lane
                await trio.sleep(0.01)
            assert runtime.counters["replies_in_response"] == 1
            nursery.cancel_scope.cancel()
    await runtime.transport.aclose()


async def test_the_client_hands_back_the_frames_of_a_200():
    transport = HttpTransport(
        client=mock_client(lambda request: httpx.Response(200, content=pack_frames([b"one", b"two"]))),
        max_frame_bytes=100,
    )  # fmt: skip
    assert await transport.send("127.0.0.1:9", b"frame") == [b"one", b"two"]
    broken = HttpTransport(client=mock_client(lambda request: httpx.Response(200, content=b"\x00\x00\x00\xffno")))
    assert await broken.send("127.0.0.1:9", b"frame") == []  # delivered; the replies are lost, not the frame
    assert broken.status()["failed"] == 0


# -- the fault file (the daemon's test hook) ----------------------------------------------


def test_a_fault_spec_replaces_the_plan_and_a_bad_one_changes_nothing():
    plan = FaultPlan(seed=1)
    plan.apply_spec({"partition": ["127.0.0.1:9"], "delay": {"*": 0.25}, "loss": {"127.0.0.1:8": 1.0}})
    assert plan.outgoing("127.0.0.1:9").blocked
    assert plan.outgoing("127.0.0.1:7").delay == 0.25 and plan.outgoing("127.0.0.1:8").lost
    for bad in ({"partition": "127.0.0.1:9"}, {"delay": {"*": -1}}, {"loss": {"*": 2}}, {"chaos": True}, []):
        with pytest.raises(ValueError):
            plan.apply_spec(bad)
    assert plan.describe() == {"partition": ["127.0.0.1:9"], "delay": {"*": 0.25}, "loss": {"127.0.0.1:8": 1.0}}
    plan.apply_spec({})
    assert plan.describe() == {"partition": [], "delay": {}, "loss": {}}


async def test_a_running_plan_follows_its_file(tmp_path, caplog):
    path = tmp_path / "faults.json"
    plan = FaultPlan()

    async def until(predicate) -> None:
        while not predicate():
            await trio.sleep(0.01)

    with trio.fail_after(60):  # a hang guard only
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(watch_fault_file, plan, str(path), interval=0.01))
            path.write_text(json.dumps({"partition": ["127.0.0.1:9"]}))
            await until(lambda: plan.is_blocked("127.0.0.1:9"))
            path.write_text("{not json")  # a half-written file: ignored, the plan stays
            await until(lambda: any("ignored" in record.getMessage() for record in caplog.records))
            assert plan.is_blocked("127.0.0.1:9") and plan.counters["specs_loaded"] == 1
            path.write_text(json.dumps({"delay": {"127.0.0.1:9": 0.5}}))  # healed, and slow
            await until(lambda: not plan.is_blocked("127.0.0.1:9"))
            assert plan.outgoing("127.0.0.1:9").delay == 0.5
            path.unlink()  # no file: no faults
            await until(lambda: plan.describe()["delay"] == {})
            nursery.cancel_scope.cancel()
