"""SEP-1303: under 2025-11-25 an argument that fails its inputSchema is a tool execution error.

The model sees ``isError: true`` with a text naming the argument and why, and can correct its
call; a client that negotiated an older revision keeps -32602. Unknown tools and every facade
error stay JSON-RPC errors with their codes (seed 000), whatever the revision. Each transport
must know the negotiated revision: the HTTP header, the in-process binding, both relays.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import trio

from mcp_bridge import Dispatcher, HttpRelay, make_mcp_app
from mcp_bridge.local import SocketRelay, bind_local_socket, serve_local_socket
from tests.mcp_bridge.fakes import ALICE, FakeService, asgi_request

BAD_CALLS = [
    ({"name": "recall", "arguments": {"query": "q", "k": 1000}}, "recall: argument 'k' must be an integer between 1 and 100"),
    ({"name": "get_scene", "arguments": {"scene_id": "nope"}}, "get_scene: argument 'scene_id' must be a UUID string"),
    ({"name": "query", "arguments": {"query": "q", "layer": "L9"}}, "query: argument 'layer' must be one of L0, L1, L2"),
    ({"name": "store", "arguments": {"content": "c"}}, "store: missing required argument 'cell_type'"),
    ({"name": "store", "arguments": {"content": "c", "cell_type": "Fact", "tenant_id": "t"}},
     "store: unknown argument 'tenant_id' (identity comes from your API key)"),
    ({"name": "store", "arguments": {"content": "c", "cell_type": "Fact", "metadata": {"supersedes": ["x"]}}},
     "store: argument 'metadata.supersedes[0]' must be a UUID string"),
    ({"name": "recall", "arguments": "q"}, "recall: 'arguments' must be an object"),
]


def message(params: dict[str, Any], method: str = "tools/call", request_id: int = 1) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


@pytest.fixture
def fake() -> FakeService:
    return FakeService()


@pytest.fixture
def dispatcher(fake) -> Dispatcher:
    return Dispatcher(fake, server_version="0", check_results=True)


@pytest.mark.parametrize("params, text", BAD_CALLS)
async def test_a_bad_argument_is_a_tool_error_the_model_sees_under_2025_11_25(dispatcher, fake, params, text) -> None:
    response = await dispatcher.handle(message(params), ALICE, protocol_version="2025-11-25")
    assert response["result"] == {"content": [{"type": "text", "text": text}], "isError": True}
    assert fake.calls == []


@pytest.mark.parametrize("version", ["2025-06-18", "2025-03-26", "2024-11-05", None])
@pytest.mark.parametrize("params, text", BAD_CALLS)
async def test_older_revisions_keep_invalid_params(dispatcher, fake, params, text, version) -> None:
    response = await dispatcher.handle(message(params), ALICE, protocol_version=version)
    assert response["error"]["code"] == -32602 and response["error"]["message"] == text
    assert fake.calls == []


async def test_unknown_tools_and_facade_errors_stay_json_rpc_errors_under_2025_11_25(dispatcher) -> None:
    unknown = await dispatcher.handle(message({"name": "forget", "arguments": {}}), ALICE, protocol_version="2025-11-25")
    assert unknown["error"]["code"] == -32602 and "unknown tool 'forget'" in unknown["error"]["message"]
    scene = "6f9619ff-8b86-d011-b42d-00cf4fc964ff"
    missing = await dispatcher.handle(message({"name": "get_scene", "arguments": {"scene_id": scene}}), ALICE,
                                      protocol_version="2025-11-25")
    assert missing["error"]["code"] == -32004 and missing["error"]["data"]["reason"] == "not_found"
    too_big = await dispatcher.handle(message({"name": "store", "arguments": {"content": "x" * 70_000,
                                                                             "cell_type": "Fact"}}),
                                      ALICE, protocol_version="2025-11-25")
    assert too_big["error"]["code"] == -32013


async def test_bind_answers_by_the_revision_its_initialize_negotiated(dispatcher) -> None:
    bad = json.dumps(message(BAD_CALLS[0][0], request_id=2)).encode()
    for requested, tool_error in (("2025-11-25", True), ("2025-06-18", False)):
        handle = dispatcher.bind(ALICE)
        before = json.loads(await handle(bad))
        assert before["error"]["code"] == -32602  # nothing negotiated yet: the old rule
        init = json.loads(await handle(json.dumps(message({"protocolVersion": requested}, "initialize")).encode()))
        assert init["result"]["protocolVersion"] == requested
        after = json.loads(await handle(bad))
        assert ("result" in after and after["result"]["isError"] is True) is tool_error, after


@pytest.mark.parametrize("header, tool_error", [("2025-11-25", True), ("2025-06-18", False), (None, False)])
async def test_over_http_the_protocol_version_header_decides(fake, header, tool_error) -> None:
    app = make_mcp_app(Dispatcher(fake, server_version="0"), fake.authenticate)
    headers = {"x-hyphae-key": "key-alice", "content-type": "application/json"}
    if header is not None:
        headers["mcp-protocol-version"] = header
    with trio.fail_after(5):
        result = await asgi_request(app, headers=headers, body=json.dumps(message(BAD_CALLS[0][0])).encode())
    assert result.status == 200
    body = result.json()
    if tool_error:
        assert body["result"]["isError"] is True and "argument 'k'" in body["result"]["content"][0]["text"]
    else:
        assert body["error"]["code"] == -32602


async def test_the_http_relay_sends_the_negotiated_revision(fake) -> None:
    app = make_mcp_app(Dispatcher(fake, server_version="0"), fake.authenticate)
    seen: list[str | None] = []

    async def daemon(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("mcp-protocol-version"))
        result = await asgi_request(app, method=request.method, headers=list(request.headers.items()),
                                    body=request.content, path=request.url.path)
        return httpx.Response(result.status, headers=result.headers, content=result.body)

    relay = HttpRelay("http://127.0.0.1:1", "key-alice", httpx.AsyncClient(transport=httpx.MockTransport(daemon)))
    await relay(json.dumps(message({"protocolVersion": "2025-11-25"}, "initialize")).encode())
    answer = json.loads(await relay(json.dumps(message(BAD_CALLS[1][0], request_id=2)).encode()))
    assert seen == [None, "2025-11-25"]
    assert answer["id"] == 2 and answer["result"]["isError"] is True


async def test_the_socket_relay_carries_the_negotiated_revision(fake, tmp_path, nursery) -> None:
    path = tmp_path / "mcp.sock"
    sock = bind_local_socket(path)
    assert sock is not None
    await nursery.start(serve_local_socket, sock, Dispatcher(fake, server_version="0"), fake.authenticate)
    relay = SocketRelay(path, "key-alice")
    bad = json.dumps(message(BAD_CALLS[1][0], request_id=2)).encode()
    assert json.loads(await relay(bad))["error"]["code"] == -32602  # before initialize
    init = json.loads(await relay(json.dumps(message({"protocolVersion": "2025-11-25"}, "initialize")).encode()))
    assert init["result"]["protocolVersion"] == "2025-11-25"
    answers = []

    async def one() -> None:
        answers.append(json.loads(await relay(bad)))

    async with trio.open_nursery() as calls:  # several at once: fresh connections carry it too
        for _ in range(4):
            calls.start_soon(one)
    assert all(answer["result"]["isError"] is True for answer in answers), answers
    await relay.aclose()
