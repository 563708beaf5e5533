"""The dispatch core: the MCP methods, tools/call end to end, and the error boundary."""

from __future__ import annotations

import json
import logging

import jsonschema
import pytest
import trio

from mcp_bridge import Dispatcher, tools
from mcp_bridge.dispatch import INSTRUCTIONS, SUPPORTED_PROTOCOL_VERSIONS
from node import errors
from tests.mcp_bridge.fakes import ALICE, BOB, FakeService

SCENE_ID = "6f9619ff-8b86-d011-b42d-00cf4fc964ff"


@pytest.fixture
def fake() -> FakeService:
    return FakeService()


@pytest.fixture
def dispatcher(fake) -> Dispatcher:
    return Dispatcher(fake, server_version="1.2.3", check_results=True)


async def request(dispatcher, method, params=None, principal=ALICE, request_id=1):
    message = {"jsonrpc": "2.0", "id": request_id, "method": method}
    if params is not None:
        message["params"] = params
    return await dispatcher.handle(json.dumps(message).encode(), principal)


async def call(dispatcher, name, arguments=None, principal=ALICE):
    params = {"name": name} if arguments is None else {"name": name, "arguments": arguments}
    return await request(dispatcher, "tools/call", params, principal)


def payload(response) -> dict:
    assert "error" not in response, response
    return response["result"]["structuredContent"]


# -- lifecycle ------------------------------------------------------------------------


@pytest.mark.parametrize("version", SUPPORTED_PROTOCOL_VERSIONS)
async def test_initialize_echoes_a_supported_protocol_version(dispatcher, version) -> None:
    response = await request(dispatcher, "initialize", {"protocolVersion": version, "capabilities": {},
                                                         "clientInfo": {"name": "t", "version": "0"}})
    assert response["result"]["protocolVersion"] == version


@pytest.mark.parametrize("params", [{"protocolVersion": "2099-01-01"}, {"protocolVersion": 20250618}, {}, None])
async def test_initialize_answers_anything_else_with_the_newest(dispatcher, params) -> None:
    response = await request(dispatcher, "initialize", params)
    assert response["result"]["protocolVersion"] == "2025-11-25"


def test_supported_versions_are_listed_newest_first() -> None:
    assert SUPPORTED_PROTOCOL_VERSIONS == ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")


async def test_initialize_declares_tools_server_info_and_instructions(dispatcher) -> None:
    result = (await request(dispatcher, "initialize", {"protocolVersion": "2025-06-18"}))["result"]
    assert result["capabilities"] == {
        "tools": {"listChanged": False},
        "resources": {"subscribe": False, "listChanged": False},
        "prompts": {"listChanged": False},
    }
    assert result["serverInfo"]["name"] == "hyphae" and result["serverInfo"]["version"] == "1.2.3"
    assert result["instructions"] == INSTRUCTIONS
    for word in ("place_beacon", "pull_inbox", "inbox", "salience", "store", "start of a task"):
        assert word in INSTRUCTIONS


@pytest.mark.parametrize(
    "message",
    [
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 1}},
        {"jsonrpc": "2.0", "method": "notifications/roots/list_changed"},
        {"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "nope"}},  # even a would-be error
        {"jsonrpc": "2.0", "id": 9, "result": {}},  # a client's reply: nothing waits for it
    ],
)
async def test_notifications_and_responses_are_never_answered(dispatcher, fake, message) -> None:
    assert await dispatcher.handle(message, ALICE) is None
    assert fake.calls == []


async def test_ping_answers_an_empty_result(dispatcher) -> None:
    assert await request(dispatcher, "ping", request_id="p") == {"jsonrpc": "2.0", "id": "p", "result": {}}


@pytest.mark.parametrize("method", ["server/discover", "resources/subscribe", "completion/complete", "logging/setLevel", ""])
async def test_any_other_method_is_method_not_found_at_once(dispatcher, method) -> None:
    response = await request(dispatcher, method, {}, request_id=4)
    assert response["id"] == 4
    assert response["error"]["code"] == -32601 and method in response["error"]["message"]


async def test_params_given_as_an_array_are_invalid_params(dispatcher) -> None:
    response = await request(dispatcher, "tools/call", ["store"])
    assert response["error"]["code"] == -32602


async def test_malformed_input_is_answered_with_parse_or_request_errors(dispatcher) -> None:
    assert (await dispatcher.handle(b"{nope", ALICE))["error"]["code"] == -32700
    assert (await dispatcher.handle("[]", ALICE))["error"]["code"] == -32600
    assert (await dispatcher.handle({"jsonrpc": "2.0", "id": 2, "method": 3}, ALICE))["id"] == 2


# -- tools/list and tools/call --------------------------------------------------------


async def test_tools_list_returns_the_eleven_descriptors(dispatcher) -> None:
    result = (await request(dispatcher, "tools/list", {}))["result"]
    assert result == {"tools": tools.tool_descriptors()}
    assert len(result["tools"]) == 11


async def test_a_successful_call_returns_the_seed_envelope(dispatcher) -> None:
    response = await call(dispatcher, "store", {"content": "Use pgvector for the V1 storage backend.",
                                                "cell_type": "Decision", "salience": 0.9,
                                                "source_ref": {"kind": "file", "locator": "specs/storage.md:42"}})
    result = response["result"]
    assert set(result) == {"content", "structuredContent", "isError"}
    assert result["isError"] is False
    assert result["content"] == [{"type": "text", "text": json.dumps(result["structuredContent"],
                                                                     separators=(",", ":"))}]
    assert set(result["structuredContent"]) == {"node_id"}


async def test_every_tool_answers_within_its_output_schema(dispatcher, fake) -> None:
    """A story: Bob listens, Alice works, Bob catches up; every payload checked by jsonschema."""
    results = {}
    results["place_beacon"] = payload(await call(dispatcher, "place_beacon",
                                                 {"query": "storage backend", "threshold": 0.5, "ttl_seconds": 60},
                                                 principal=BOB))
    results["start_session"] = payload(await call(dispatcher, "start_session", {"project": "hyphae", "title": "t"}))
    scene_id = results["start_session"]["scene_id"]
    results["store"] = payload(await call(dispatcher, "store", {"content": "The storage backend is SQLite.",
                                                                "cell_type": "Decision", "salience": 0.9}))
    results["recall"] = payload(await call(dispatcher, "recall", {"query": "storage backend"}))
    results["query"] = payload(await call(dispatcher, "query", {"query": "storage", "layer": "L1", "k": 3}))
    results["end_session"] = payload(await call(dispatcher, "end_session",
                                                {"session_id": results["start_session"]["session_id"]}))
    results["list_beacons"] = payload(await call(dispatcher, "list_beacons", principal=BOB))
    results["inbox"] = payload(await call(dispatcher, "inbox", {"since": 0}, principal=BOB))
    results["get_scene"] = payload(await call(dispatcher, "get_scene", {"scene_id": scene_id}))
    results["list_scenes"] = payload(await call(dispatcher, "list_scenes", {"project": "hyphae", "limit": 10}))
    results["pull_inbox"] = payload(await call(dispatcher, "pull_inbox", {"limit": 5}, principal=BOB))

    assert set(results) == {d["name"] for d in tools.tool_descriptors()}
    for descriptor in tools.tool_descriptors():
        jsonschema.validate(results[descriptor["name"]], descriptor["outputSchema"])
    assert results["recall"]["results"][0]["node_id"] == results["store"]["node_id"]
    assert all(set(hit) == {"node_id", "distance"} for hit in results["recall"]["results"])
    assert [d["content"] for d in results["inbox"]["diffs"]] == ["The storage backend is SQLite."]
    assert results["pull_inbox"]["remaining"] == 0 and len(results["pull_inbox"]["diffs"]) == 1
    assert results["get_scene"]["cell_ids"] == [results["store"]["node_id"]]


async def test_the_principal_comes_from_the_transport_and_arguments_reach_the_facade(dispatcher, fake) -> None:
    await call(dispatcher, "recall", {"query": "q", "k": 3.0, "cell_types": ["Fact"]}, principal=BOB)
    method, principal, arguments = fake.calls[-1]
    assert (method, principal) == ("recall", BOB)
    assert arguments == {"query": "q", "k": 3, "cell_types": ["Fact"], "project": None}


async def test_absent_optional_arguments_are_left_to_the_facades_defaults(dispatcher, fake) -> None:
    await call(dispatcher, "store", {"content": "x", "cell_type": "Fact"})
    assert fake.calls[-1][2]["salience"] == 0.5


async def test_a_self_asserted_identity_is_refused_before_the_facade(dispatcher, fake) -> None:
    response = await call(dispatcher, "store", {"content": "x", "cell_type": "Fact", "source_agent": "bob"})
    assert response["error"]["code"] == -32602
    assert response["error"]["message"] == "store: unknown argument 'source_agent' (identity comes from your API key)"
    assert fake.calls == []


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"name": "forget", "arguments": {}}, "unknown tool 'forget'"),
        ({"arguments": {}}, "params.name"),
        ({"name": 5}, "unknown tool"),
        ({"name": "recall", "arguments": "q"}, "'arguments' must be an object"),
        ({"name": "recall", "arguments": {"query": "q", "k": 1000}}, "recall: argument 'k'"),
    ],
)
async def test_unknown_tools_and_bad_arguments_are_invalid_params(dispatcher, fake, params, fragment) -> None:
    response = await request(dispatcher, "tools/call", params)
    assert response["error"]["code"] == -32602
    assert fragment in response["error"]["message"]
    assert response["error"]["data"]["reason"] == "invalid_argument"
    assert fake.calls == []


# -- the error boundary ---------------------------------------------------------------

FACADE_ERRORS = [
    (errors.InvalidArgument("content is empty", field="content"), -32602, "invalid_argument"),
    (errors.TooLarge("content exceeds 64 KiB", field="content", limit=65536), -32013, "too_large"),
    (errors.Unauthenticated("key revoked"), -32001, "unauthenticated"),
    (errors.Forbidden("project outside your scope", field="project"), -32003, "forbidden"),
    (errors.NotFound("no such scene", field="scene_id"), -32004, "not_found"),
    (errors.Conflict("session already ended"), -32009, "conflict"),
    (errors.Unavailable("index rebuilding", retry_after=5), -32050, "unavailable"),
]


@pytest.mark.parametrize("exc, code, reason", FACADE_ERRORS)
async def test_a_facade_error_becomes_a_json_rpc_error_with_a_stable_code(dispatcher, fake, monkeypatch,
                                                                          exc, code, reason) -> None:
    async def failing(principal, **arguments):
        raise exc

    monkeypatch.setattr(fake, "get_scene", failing)
    response = await call(dispatcher, "get_scene", {"scene_id": SCENE_ID})
    assert "result" not in response  # never an isError block
    assert response["id"] == 1
    assert response["error"]["code"] == code
    assert response["error"]["message"] == exc.message
    assert response["error"]["data"] == exc.to_dict()
    assert response["error"]["data"]["reason"] == reason


async def test_the_fakes_own_errors_take_the_same_path(dispatcher) -> None:
    response = await call(dispatcher, "get_scene", {"scene_id": SCENE_ID})
    assert response["error"]["code"] == -32004
    assert response["error"]["data"] == {"reason": "not_found", "message": f"no scene {SCENE_ID}", "field": "scene_id"}
    big = await call(dispatcher, "store", {"content": "x" * 70_000, "cell_type": "Fact"})
    assert big["error"]["code"] == -32013 and big["error"]["data"]["limit"] == 65536


async def test_an_unexpected_exception_is_an_internal_error_that_leaks_nothing(dispatcher, fake, monkeypatch,
                                                                               caplog) -> None:
    async def broken(principal, **arguments):
        raise RuntimeError("secret path /home/alice/.hyphae/hyphae.db is locked")

    monkeypatch.setattr(fake, "recall", broken)
    with caplog.at_level(logging.ERROR, logger="mcp_bridge.dispatch"):
        response = await call(dispatcher, "recall", {"query": "q"})
    assert response == {"jsonrpc": "2.0", "id": 1,
                        "error": {"code": -32603, "message": "internal error",
                                  "data": {"reason": "internal", "message": "internal error"}}}
    assert "secret" not in json.dumps(response)
    assert "secret path" in caplog.text  # logged, with its traceback, for the operator


async def test_a_result_outside_the_output_schema_is_an_internal_error_and_is_logged(dispatcher, fake,
                                                                                      monkeypatch, caplog) -> None:
    async def drifted(principal, **arguments):
        return {"results": [{"node_id": "n", "distance": "close"}]}

    monkeypatch.setattr(fake, "recall", drifted)
    with caplog.at_level(logging.ERROR, logger="mcp_bridge.dispatch"):
        response = await call(dispatcher, "recall", {"query": "q"})
    assert response["error"]["code"] == -32603
    assert "results[0].distance" in caplog.text


async def test_a_non_dict_result_is_an_internal_error(dispatcher, fake, monkeypatch) -> None:
    async def wrong(principal, **arguments):
        return ["n1"]

    monkeypatch.setattr(fake, "recall", wrong)
    assert (await call(dispatcher, "recall", {"query": "q"}))["error"]["code"] == -32603


async def test_bind_serves_bytes_for_one_principal(dispatcher, fake) -> None:
    handle = dispatcher.bind(BOB)
    line = await handle(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"list_beacons"}}')
    assert b"\n" not in line
    assert json.loads(line)["result"]["structuredContent"] == {"beacons": []}
    assert fake.calls[-1][1] == BOB
    assert await handle(b'{"jsonrpc":"2.0","method":"notifications/initialized"}') is None


# -- against the real facade ------------------------------------------------------------


async def test_the_real_facades_payloads_fit_every_output_schema(service, make_agent) -> None:
    """The same story through node.service (tests/conftest.py): contract drift shows up here."""
    dispatcher = Dispatcher(service, server_version="0", check_results=True)
    alice, _ = await make_agent("mcp-alice")
    bob, _ = await make_agent("mcp-bob")

    async def ok(name, arguments=None, principal=alice):
        with trio.fail_after(20):
            return payload(await call(dispatcher, name, arguments, principal))

    results = {"place_beacon": await ok("place_beacon", {"query": "storage backend", "threshold": 0.0,
                                                         "ttl_seconds": 600}, bob)}
    results["start_session"] = session = await ok("start_session", {"project": "hyphae", "title": "storage"})
    results["store"] = await ok("store", {"content": "The storage backend is SQLite with WAL.",
                                          "cell_type": "Decision", "salience": 0.9,
                                          "source_ref": {"kind": "file", "locator": "DESIGN.md:14"},
                                          "metadata": {"pr": 12}, "idempotency_key": "mcp-1"})
    results["recall"] = await ok("recall", {"query": "storage backend", "k": 5})
    results["query"] = await ok("query", {"query": "storage backend", "layer": "L1"})
    results["end_session"] = await ok("end_session", {"session_id": session["session_id"]})
    results["list_beacons"] = await ok("list_beacons", None, bob)
    with trio.fail_after(20):
        while not (await ok("inbox", {"since": 0}, bob))["diffs"]:  # delivery may be asynchronous
            await trio.sleep(0.01)
    results["inbox"] = await ok("inbox", {"since": "1970-01-01T00:00:00Z", "limit": 10}, bob)
    results["get_scene"] = await ok("get_scene", {"scene_id": session["scene_id"]})
    results["list_scenes"] = await ok("list_scenes", {"project": "hyphae", "limit": 10})
    results["pull_inbox"] = await ok("pull_inbox", {"limit": 10}, bob)

    for descriptor in tools.tool_descriptors():
        jsonschema.validate(results[descriptor["name"]], descriptor["outputSchema"])
    assert results["inbox"]["diffs"][0]["source_agent"] == alice.agent_id
    assert results["get_scene"]["cell_ids"] == [results["store"]["node_id"]]

    replay = await call(dispatcher, "store", {"content": "something else", "cell_type": "Fact",
                                              "idempotency_key": "mcp-1"}, alice)
    assert payload(replay) == results["store"]
    missing = await call(dispatcher, "get_scene", {"scene_id": "6f9619ff-8b86-d011-b42d-00cf4fc964ff"}, alice)
    assert missing["error"]["code"] == -32004 and missing["error"]["data"]["reason"] == "not_found"
