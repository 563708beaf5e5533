"""MCP over stdio: the line loop with in-memory streams and real pipes, and the HTTP relay."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import httpx
import pytest
import trio

from mcp_bridge import Dispatcher, HttpRelay, jsonrpc, make_mcp_app, serve_stdio
from mcp_bridge.stdio import MAX_IN_FLIGHT, MAX_LINE_BYTES
from tests.mcp_bridge.fakes import ALICE, FakeService, asgi_request

ROOT = Path(__file__).resolve().parents[2]


def rpc(request_id, method="ping", params=None) -> bytes:
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode()


INITIALIZED = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'


class ScriptedStdin:
    """Hands out the given chunks one at a time, then EOF (or blocks forever)."""

    def __init__(self, chunks, *, eof: bool = True) -> None:
        self._chunks = list(chunks)
        self._eof = eof

    async def receive_some(self, max_bytes=None) -> bytes:
        await trio.lowlevel.checkpoint()
        if self._chunks:
            return self._chunks.pop(0)
        if not self._eof:
            await trio.sleep_forever()
        return b""


class CollectingStdout:
    """Collects what is written, a few bytes at a time, yielding in between (like a slow pipe)."""

    def __init__(self, piece: int = 1 << 20) -> None:
        self.data = bytearray()
        self._piece = piece

    async def send_all(self, data: bytes) -> None:
        for start in range(0, len(data), self._piece):
            self.data += data[start:start + self._piece]
            await trio.lowlevel.checkpoint()

    def lines(self) -> list[dict]:
        raw = bytes(self.data)
        assert raw == b"" or raw.endswith(b"\n")
        return [json.loads(line) for line in raw.splitlines()]


async def serve(handle, chunks, **kwargs) -> CollectingStdout:
    stdout = kwargs.pop("stdout", None) or CollectingStdout()
    with trio.fail_after(5):
        await serve_stdio(handle, stdin=ScriptedStdin(chunks), stdout=stdout, **kwargs)
    return stdout


@pytest.fixture
def dispatcher() -> Dispatcher:
    return Dispatcher(FakeService(), server_version="0.1.0")


async def echo(line: bytes) -> bytes | None:
    message = json.loads(line)
    if "id" not in message:
        return None
    return json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": {"echo": message["method"]}}).encode()


# -- the line loop --------------------------------------------------------------------


async def test_each_request_gets_one_compact_line_and_notifications_none(dispatcher) -> None:
    chunks = [rpc(1, "initialize", {"protocolVersion": "2025-06-18"}) + b"\n", INITIALIZED + b"\n",
              rpc(2, "tools/list") + b"\n"]
    out = await serve(dispatcher.bind(ALICE), chunks)
    lines = out.lines()
    assert sorted(line["id"] for line in lines) == [1, 2]
    assert all(line == jsonrpc.encode(json.loads(line)) for line in out.data.splitlines())  # compact
    assert {line["id"]: line for line in lines}[1]["result"]["protocolVersion"] == "2025-06-18"


async def test_lines_may_arrive_split_across_reads_or_several_to_a_read() -> None:
    data = b"\n".join(rpc(i) for i in range(5)) + b"\n"
    chunks = [data[i:i + 7] for i in range(0, len(data), 7)]
    assert sorted(line["id"] for line in (await serve(echo, chunks)).lines()) == list(range(5))
    assert sorted(line["id"] for line in (await serve(echo, [data])).lines()) == list(range(5))


async def test_blank_lines_and_crlf_are_tolerated() -> None:
    out = await serve(echo, [b"\n\n   \n" + rpc(1) + b"\r\n\r\n" + rpc(2) + b"\n"])
    assert sorted(line["id"] for line in out.lines()) == [1, 2]


async def test_a_last_line_without_newline_is_still_served() -> None:
    assert [line["id"] for line in (await serve(echo, [rpc(1)])).lines()] == [1]


async def test_requests_run_concurrently_and_answers_may_overtake() -> None:
    second_done = trio.Event()

    async def handle(line):
        request_id = json.loads(line)["id"]
        if request_id == 1:
            await second_done.wait()
        else:
            second_done.set()
        return await echo(line)

    out = await serve(handle, [rpc(1) + b"\n" + rpc(2) + b"\n"])
    assert [line["id"] for line in out.lines()] == [2, 1]


async def test_at_eof_requests_in_flight_finish_before_returning() -> None:
    async def slow(line):
        await trio.sleep(0.05)
        return await echo(line)

    out = await serve(slow, [b"".join(rpc(i) + b"\n" for i in range(3))])
    assert sorted(line["id"] for line in out.lines()) == [0, 1, 2]


async def test_concurrent_responses_are_written_whole() -> None:
    async def jittery(line):
        await trio.sleep(0.001 * (json.loads(line)["id"] % 3))
        return json.dumps({"jsonrpc": "2.0", "id": json.loads(line)["id"], "result": {"pad": "x" * 500}}).encode()

    requests = b"".join(rpc(i) + b"\n" for i in range(100))
    out = await serve(jittery, [requests], stdout=CollectingStdout(piece=7))
    assert sorted(line["id"] for line in out.lines()) == list(range(100))


async def test_in_flight_requests_are_bounded() -> None:
    running = peak = 0
    full = trio.Event()  # no handler finishes before the bound is reached: no timing involved

    async def handle(line):
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == MAX_IN_FLIGHT:
            full.set()
        await full.wait()
        await trio.sleep(0)
        running -= 1
        return await echo(line)

    out = await serve(handle, [b"".join(rpc(i) + b"\n" for i in range(MAX_IN_FLIGHT * 2))])
    assert len(out.lines()) == MAX_IN_FLIGHT * 2 and peak == MAX_IN_FLIGHT


@pytest.mark.parametrize(
    "chunks",
    [
        [b"x" * 150 + b"\n" + rpc(1) + b"\n"],  # whole in one read
        [b"y" * 60, b"y" * 60, b"y" * 60, b"y" * 60 + b"\n" + rpc(1) + b"\n"],  # spread over reads
    ],
)
async def test_an_over_long_line_is_answered_once_and_serving_goes_on(chunks) -> None:
    lines = (await serve(echo, chunks, max_line_bytes=100)).lines()
    assert lines[0] == {"jsonrpc": "2.0", "id": None, "error": {
        "code": -32600, "message": "message exceeds 100 bytes", "data": {"reason": "too_large", "limit": 100}}}
    assert lines[1]["id"] == 1 and len(lines) == 2


async def test_an_over_long_last_line_without_newline_is_answered_once() -> None:
    lines = (await serve(echo, [b"z" * 80, b"z" * 80], max_line_bytes=100)).lines()
    assert [line["error"]["data"]["reason"] for line in lines] == ["too_large"]


async def test_the_default_limit_is_one_mebibyte(dispatcher) -> None:
    assert MAX_LINE_BYTES == 1 << 20
    fits = rpc(1, "tools/call", {"name": "store", "arguments": {"content": "x" * 60_000, "cell_type": "Fact"}})
    huge = b'{"jsonrpc":"2.0","id":2,"method":"ping","params":{"pad":"' + b"p" * MAX_LINE_BYTES + b'"}}'
    lines = (await serve(dispatcher.bind(ALICE), [fits + b"\n", huge + b"\n", rpc(3) + b"\n"])).lines()
    by_id = {line["id"]: line for line in lines}
    assert by_id[1]["result"]["isError"] is False and by_id[3]["result"] == {}
    assert by_id[None]["error"]["code"] == -32600


async def test_a_failing_handler_answers_requests_with_internal_error_and_keeps_serving(caplog) -> None:
    async def flaky(line):
        if b"boom" in line:
            raise RuntimeError("boom")
        return await echo(line)

    chunks = [rpc(1, "boom") + b"\n", b'{"jsonrpc":"2.0","method":"boom"}\n', rpc(2) + b"\n"]
    with caplog.at_level(logging.ERROR, logger="mcp_bridge.stdio"):
        lines = (await serve(flaky, chunks)).lines()
    by_id = {line["id"]: line for line in lines}
    assert set(by_id) == {1, 2}
    assert by_id[1]["error"]["code"] == -32603 and "boom" not in json.dumps(by_id[1])
    assert "boom" in caplog.text


async def test_a_multi_line_response_is_reframed_onto_one_line() -> None:
    async def pretty(line):
        return json.dumps({"jsonrpc": "2.0", "id": json.loads(line)["id"], "result": {"a": [1, 2]}}, indent=2).encode()

    out = await serve(pretty, [rpc(1) + b"\n"])
    assert out.data.count(b"\n") == 1 and out.lines()[0]["result"] == {"a": [1, 2]}


async def test_a_closed_stdout_ends_serving_cleanly() -> None:
    class ClosedStdout:
        async def send_all(self, data):
            raise trio.BrokenResourceError

    stdin = ScriptedStdin([rpc(1) + b"\n"], eof=False)
    with trio.fail_after(5):
        await serve_stdio(echo, stdin=stdin, stdout=ClosedStdout())


# -- real file descriptors --------------------------------------------------------------

CHILD = f"""
import logging, sys
sys.path.insert(0, {str(ROOT)!r})
import trio
from mcp_bridge import Dispatcher, serve_stdio
from tests.mcp_bridge.fakes import ALICE, FakeService
logging.basicConfig(stream=sys.stderr, level=logging.DEBUG)
service = FakeService()
async def broken(principal, **arguments):
    raise RuntimeError("this goes to stderr only")
service.recall = broken
trio.run(serve_stdio, Dispatcher(service, server_version="0").bind(ALICE))
"""

CHILD_INPUT = b"".join([
    rpc(1, "initialize", {"protocolVersion": "2025-11-25"}) + b"\n",
    INITIALIZED + b"\n",
    rpc(2, "tools/call", {"name": "store", "arguments": {"content": "hello", "cell_type": "Fact"}}) + b"\n",
    rpc(3, "tools/call", {"name": "recall", "arguments": {"query": "hello"}}) + b"\n",
    b"{oops\n",
])


def check_child_stdout(stdout: bytes) -> None:
    lines = stdout.splitlines()
    assert stdout.endswith(b"\n") and len(lines) == 4
    by_id = {}
    for line in lines:
        message = json.loads(line)  # nothing but JSON-RPC on stdout
        assert message["jsonrpc"] == "2.0"
        by_id[message["id"]] = message
    assert by_id[1]["result"]["serverInfo"]["name"] == "hyphae"
    assert by_id[2]["result"]["isError"] is False
    assert by_id[3]["error"]["code"] == -32603
    assert by_id[None]["error"]["code"] == -32700


@pytest.mark.skipif(sys.platform == "win32", reason="pipes and fds as on POSIX")
async def test_serving_real_pipes_writes_only_protocol_to_stdout() -> None:
    with trio.fail_after(15):
        done = await trio.run_process([sys.executable, "-c", CHILD], stdin=CHILD_INPUT, capture_stdout=True,
                                      capture_stderr=True, cwd=ROOT)
    check_child_stdout(done.stdout)
    assert b"this goes to stderr only" in done.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="pipes and fds as on POSIX")
async def test_stdin_may_be_a_regular_file(tmp_path) -> None:
    source = tmp_path / "input.jsonl"
    source.write_bytes(CHILD_INPUT)
    with open(source, "rb") as stdin, trio.fail_after(15):
        done = await trio.run_process([sys.executable, "-c", CHILD], stdin=stdin, capture_stdout=True,
                                      capture_stderr=True, cwd=ROOT)
    check_child_stdout(done.stdout)


# -- the HTTP relay -------------------------------------------------------------------

BASE = "http://127.0.0.1:7777"


def relay_with(handler) -> HttpRelay:
    return HttpRelay(BASE, "key-alice", httpx.AsyncClient(transport=httpx.MockTransport(handler)))


async def relayed(relay, line):
    with trio.fail_after(5):
        return await relay(line)


async def test_the_relay_posts_the_line_to_mcp_with_the_key_and_returns_the_body() -> None:
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, content=b'{"jsonrpc":"2.0","id":1,"result":{}}\n',
                              headers={"content-type": "application/json"})

    assert await relayed(relay_with(handler), rpc(1)) == b'{"jsonrpc":"2.0","id":1,"result":{}}'
    request = seen[0]
    assert (request.method, str(request.url)) == ("POST", f"{BASE}/mcp")
    assert request.headers["x-hyphae-key"] == "key-alice"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["accept"] == "application/json, text/event-stream"
    assert request.content == rpc(1)


async def test_the_relay_returns_none_for_202() -> None:
    assert await relayed(relay_with(lambda request: httpx.Response(202)), INITIALIZED) is None


@pytest.mark.parametrize("failure", [httpx.ConnectError("refused"), httpx.ReadTimeout("slow"),
                                     httpx.RemoteProtocolError("eof")])
async def test_an_unreachable_daemon_is_a_json_rpc_error_not_a_crash(failure) -> None:
    def handler(request):
        raise failure

    relay = relay_with(handler)
    answer = json.loads(await relayed(relay, rpc(7)))
    assert answer["id"] == 7
    assert answer["error"]["code"] == -32050 and answer["error"]["data"]["reason"] == "unavailable"
    assert answer["error"]["message"].startswith(f"hyphae daemon at {BASE} is not reachable")
    assert await relayed(relay, INITIALIZED) is None  # a notification is still never answered


async def test_an_http_level_refusal_gets_the_requests_id() -> None:
    body = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32001,"message":"unknown API key"}}'
    answer = json.loads(await relayed(relay_with(lambda request: httpx.Response(401, content=body)), rpc("r1")))
    assert answer["id"] == "r1" and answer["error"]["code"] == -32001


async def test_a_body_that_is_not_json_rpc_becomes_an_internal_error() -> None:
    relay = relay_with(lambda request: httpx.Response(502, content=b"<html>Bad gateway</html>"))
    answer = json.loads(await relayed(relay, rpc(5)))
    assert answer["id"] == 5 and answer["error"]["code"] == -32603
    assert await relayed(relay, INITIALIZED) is None


@pytest.mark.parametrize("revision", ["2025-11-25", "2025-06-18"])
async def test_stdio_through_the_relay_to_the_daemons_app(revision) -> None:
    """The whole chain: stdio lines -> relay -> POST /mcp -> dispatcher -> facade, and back. The
    revision initialize negotiated travels with every later line, so a bad argument is a tool
    execution error from 2025-11-25 on (SEP-1303) and -32602 before."""
    service = FakeService()
    app = make_mcp_app(Dispatcher(service, server_version="0"), service.authenticate)

    async def daemon(request: httpx.Request) -> httpx.Response:
        result = await asgi_request(app, method=request.method, headers=list(request.headers.items()),
                                    body=request.content, path=request.url.path)
        return httpx.Response(result.status, headers=result.headers, content=result.body)

    relay = HttpRelay(BASE, "key-alice", httpx.AsyncClient(transport=httpx.MockTransport(daemon)))
    # A host waits for initialize's answer before it sends anything else.
    initialized = json.loads(await relay(rpc(1, "initialize", {"protocolVersion": revision})))
    assert initialized["result"]["protocolVersion"] == revision
    chunks = [INITIALIZED + b"\n",
              rpc(2, "tools/call", {"name": "store", "arguments": {"content": "hi", "cell_type": "Lesson"}}) + b"\n",
              rpc(3, "tools/call", {"name": "store", "arguments": {"content": "hi", "cell_type": "Lesson",
                                                                   "tenant_id": "other"}}) + b"\n"]
    by_id = {line["id"]: line for line in (await serve(relay, chunks)).lines()}
    assert set(by_id) == {2, 3}
    assert by_id[2]["result"]["structuredContent"]["node_id"]
    if revision == "2025-11-25":
        assert by_id[3]["result"]["isError"] is True
        assert "tenant_id" in by_id[3]["result"]["content"][0]["text"]
    else:
        assert by_id[3]["error"]["code"] == -32602
    assert [(method, principal) for method, principal, _ in service.calls] == [("store", ALICE)]
