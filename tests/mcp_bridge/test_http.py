"""POST /mcp: the ASGI app driven directly, one exchange at a time."""

from __future__ import annotations

import json

import pytest
import trio

from mcp_bridge import Dispatcher, make_mcp_app
from mcp_bridge.http import MAX_BODY_BYTES
from web.origins import is_loopback_origin
from node import errors
from tests.mcp_bridge.fakes import ALICE, BOB, FakeService, asgi_request

PING = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
INITIALIZED = json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()
GOOD = {"x-hyphae-key": "key-alice", "content-type": "application/json"}


@pytest.fixture
def service() -> FakeService:
    return FakeService()


@pytest.fixture
def app(service):
    return make_mcp_app(Dispatcher(service, server_version="0.1.0"), service.authenticate)


async def post(app, body=PING, headers=None, **kwargs):
    with trio.fail_after(5):
        return await asgi_request(app, headers=GOOD if headers is None else headers, body=body, **kwargs)


def error_of(result) -> dict:
    body = result.json()
    assert body["jsonrpc"] == "2.0" and body["id"] is None
    return body["error"]


# -- the happy paths --------------------------------------------------------------------


async def test_a_request_is_answered_200_with_plain_json(app) -> None:
    result = await post(app)
    assert result.status == 200
    assert result.headers["content-type"] == "application/json"
    assert int(result.headers["content-length"]) == len(result.body)
    assert result.json() == {"jsonrpc": "2.0", "id": 1, "result": {}}


async def test_sdk_clients_accept_header_is_fine(app) -> None:
    headers = {**GOOD, "accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-06-18"}
    result = await post(app, headers=headers)
    assert result.status == 200 and result.headers["content-type"] == "application/json"


@pytest.mark.parametrize("body", [INITIALIZED, b'{"jsonrpc":"2.0","id":4,"result":{}}'])
async def test_a_notification_or_response_is_accepted_with_202_and_no_body(app, body) -> None:
    result = await post(app, body)
    assert (result.status, result.body) == (202, b"")


async def test_tools_call_over_http_reaches_the_facade_as_the_keys_principal(app, service) -> None:
    body = json.dumps({"jsonrpc": "2.0", "id": "c", "method": "tools/call",
                       "params": {"name": "store", "arguments": {"content": "x", "cell_type": "Fact"}}}).encode()
    result = await post(app, body, headers={**GOOD, "x-hyphae-key": "key-bob"})
    assert result.status == 200 and result.json()["result"]["isError"] is False
    assert service.calls[-1][:2] == ("store", BOB)


async def test_every_request_is_authenticated_on_its_own(service) -> None:
    seen = []
    authenticate = service.authenticate

    async def counting(key):
        seen.append(key)
        return await authenticate(key)

    app = make_mcp_app(Dispatcher(service, server_version="0"), counting)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                       "params": {"name": "list_beacons"}}).encode()
    for key in ("key-alice", "key-bob", "key-alice"):
        assert (await post(app, body, headers={**GOOD, "x-hyphae-key": key})).status == 200
    assert seen == ["key-alice", "key-bob", "key-alice"]
    assert [principal for _, principal, _ in service.calls] == [ALICE, BOB, ALICE]


async def test_method_errors_travel_as_200_json_rpc_errors(app) -> None:
    result = await post(app, b'{"jsonrpc":"2.0","id":2,"method":"server/discover"}')
    assert result.status == 200 and result.json()["error"]["code"] == -32601
    arguments = {"scene_id": "6f9619ff-8b86-d011-b42d-00cf4fc964ff"}
    bad = json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "get_scene", "arguments": arguments}})
    result = await post(app, bad.encode())
    assert result.status == 200 and result.json()["error"]["data"]["reason"] == "not_found"


# -- each check -----------------------------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "DELETE", "PUT", "OPTIONS", "HEAD"])
async def test_only_post_is_allowed(app, method) -> None:
    result = await post(app, method=method)
    assert result.status == 405 and result.headers["allow"] == "POST"
    assert error_of(result)["code"] == -32600


@pytest.mark.parametrize(
    "origin, allowed",
    [
        ("http://localhost", True),
        ("http://localhost:5173", True),
        ("https://LOCALHOST:8443", True),
        ("http://127.0.0.1:7777", True),
        ("http://127.8.9.10", True),
        ("http://[::1]:3000", True),
        ("https://evil.example", False),
        ("http://localhost.evil.example", False),
        ("http://127.0.0.1.evil.example", False),
        ("http://192.168.1.10:7777", False),
        ("http://0.0.0.0:7777", False),
        ("null", False),
        ("file://", False),
        ("ws://localhost", False),
        ("http://localhost:99999", False),
        ("http://user@localhost", False),
        ("", False),
    ],
)
def test_only_loopback_origins_are_loopback(origin, allowed) -> None:
    assert is_loopback_origin(origin) is allowed


async def test_a_foreign_origin_is_forbidden(app, service) -> None:
    result = await post(app, headers={**GOOD, "origin": "https://evil.example"})
    assert result.status == 403
    assert error_of(result)["code"] == -32003 and error_of(result)["data"]["reason"] == "forbidden"
    assert (await post(app, headers={**GOOD, "origin": "http://localhost:3000"})).status == 200


@pytest.mark.parametrize("key", [None, "", "key-mallory"])
async def test_a_missing_or_unknown_key_is_401(app, key) -> None:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["x-hyphae-key"] = key
    result = await post(app, headers=headers)
    assert result.status == 401
    error = error_of(result)
    assert error["code"] == -32001 and error["data"]["reason"] == "unauthenticated"


async def test_an_authenticator_that_is_unavailable_or_broken_is_answered_not_raised(service) -> None:
    async def unavailable(key):
        raise errors.Unavailable("database is locked")

    async def broken(key):
        raise RuntimeError("boom /secret")

    result = await post(make_mcp_app(Dispatcher(service, server_version="0"), unavailable))
    assert result.status == 503 and error_of(result)["code"] == -32050
    result = await post(make_mcp_app(Dispatcher(service, server_version="0"), broken))
    assert result.status == 500 and error_of(result)["code"] == -32603 and b"secret" not in result.body


@pytest.mark.parametrize("version", [None, "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"])
async def test_an_absent_or_supported_protocol_version_header_is_accepted(app, version) -> None:
    headers = dict(GOOD) if version is None else {**GOOD, "MCP-Protocol-Version": version}
    assert (await post(app, headers=headers)).status == 200


@pytest.mark.parametrize("version", ["2099-01-01", "", "latest", "2025-06-18, 2024-11-05"])
async def test_an_unsupported_protocol_version_header_is_400(app, version) -> None:
    result = await post(app, headers={**GOOD, "mcp-protocol-version": version})
    assert result.status == 400
    error = error_of(result)
    assert error["code"] == -32600 and "2025-11-25" in error["message"]
    assert error["data"]["field"] == "MCP-Protocol-Version"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded", "text/json"])
async def test_a_body_that_is_not_json_by_content_type_is_415(app, content_type) -> None:
    headers = {"x-hyphae-key": "key-alice"}
    if content_type:
        headers["content-type"] = content_type
    assert (await post(app, headers=headers)).status == 415


async def test_content_type_parameters_and_case_are_tolerated(app) -> None:
    result = await post(app, headers={**GOOD, "content-type": "Application/JSON; charset=utf-8"})
    assert result.status == 200


async def test_an_oversized_body_is_413_and_reading_stops_early(app, service) -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"store","arguments":{"content":"' \
        + b"x" * (4 * MAX_BODY_BYTES) + b'","cell_type":"Fact"}}}'
    result = await post(app, body, chunk_size=64 * 1024)
    assert result.status == 413
    assert error_of(result)["data"]["reason"] == "too_large"
    total_chunks = -(-len(body) // (64 * 1024))
    assert result.chunks_read == 17 < total_chunks  # 1 MiB + one chunk, then no more
    assert service.calls == []


async def test_a_declared_oversized_length_is_413_before_reading(app) -> None:
    headers = {**GOOD, "content-length": str(MAX_BODY_BYTES + 1)}
    result = await post(app, b"{}", headers=headers)
    assert result.status == 413 and result.chunks_read == 0


async def test_a_body_of_exactly_the_limit_is_read(app) -> None:
    body = PING + b" " * (MAX_BODY_BYTES - len(PING))
    assert (await post(app, body, chunk_size=100_000)).status == 200


@pytest.mark.parametrize("body, code", [(b"{not json", -32700), (b"", -32700), (b"[]", -32600),
                                        (b'{"jsonrpc":"1.0","id":1,"method":"ping"}', -32600)])
async def test_unparseable_or_invalid_messages_are_400(app, body, code) -> None:
    result = await post(app, body)
    assert result.status == 400 and result.json()["error"]["code"] == code


async def test_a_client_that_disconnects_mid_body_gets_nothing_and_nothing_runs(app, service) -> None:
    result = await post(app, PING * 10, chunk_size=len(PING), disconnect_after=3)
    assert result.status == 0 and service.calls == []


# -- the order of the checks ----------------------------------------------------------


@pytest.mark.parametrize(
    "method, headers, body, status",
    [
        # method before Origin
        ("GET", {"origin": "https://evil.example"}, PING, 405),
        # Origin before the key
        ("POST", {"origin": "https://evil.example", "content-type": "application/json"}, PING, 403),
        # the key before the protocol version
        ("POST", {"mcp-protocol-version": "1999", "content-type": "application/json"}, PING, 401),
        # the protocol version before Content-Type
        ("POST", {"x-hyphae-key": "key-alice", "mcp-protocol-version": "1999"}, PING, 400),
        # Content-Type before size
        ("POST", {"x-hyphae-key": "key-alice", "content-type": "text/plain"}, b"x" * (MAX_BODY_BYTES + 1), 415),
        # size before parsing
        ("POST", GOOD, b"{" * (MAX_BODY_BYTES + 1), 413),
    ],
)
async def test_checks_run_in_order(app, method, headers, body, status) -> None:
    with trio.fail_after(5):
        result = await asgi_request(app, method=method, headers=headers, body=body)
    assert result.status == status


async def test_lifespan_events_are_acknowledged(app) -> None:
    events = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
    sent = []

    async def receive():
        return next(events)

    async def send(message):
        sent.append(message["type"])

    with trio.fail_after(5):
        await app({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
