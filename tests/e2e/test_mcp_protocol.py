"""MCP-over-HTTP rules and the REST surface, against a real daemon on an ephemeral port.

Raw HTTP with httpx, so every status code, header and byte of the body is visible: the
contract (seeds 000/001, DESIGN §7/§8) is about exactly those.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from api.rest.rest import ROUTES

from .conftest import DEADLINE, Daemon, StdioSession, add_agents, make_home, run_cli, start_daemon, tool_payload

SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
LATEST = SUPPORTED[0]
SECRET = "The staging database password rotates every Monday."


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[Daemon, dict[str, str]]]:
    home = make_home(tmp_path_factory.mktemp("protocol") / "home")
    daemon = start_daemon(home)
    try:
        yield daemon, add_agents(home, "alice", "bob")
    finally:
        daemon.stop()


@pytest.fixture
def http(node) -> Iterator[httpx.Client]:
    """A keep-alive client with no default headers (each test states what it sends)."""
    daemon, _ = node
    with httpx.Client(base_url=daemon.url, timeout=DEADLINE) as client:
        yield client


@pytest.fixture
def key(node) -> str:
    return node[1]["alice"]


def rpc(method: str, params: dict[str, Any] | None = None, id: int | str | None = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if id is not None:
        message["id"] = id
    if params is not None:
        message["params"] = params
    return message


def post_mcp(http: httpx.Client, key: str | None, body: Any, **headers: str) -> httpx.Response:
    sent = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
    if key is not None:
        sent["x-hyphae-key"] = key
    sent.update({name.replace("_", "-"): value for name, value in headers.items()})
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return http.post("/mcp", content=content, headers=sent)


def call(http: httpx.Client, key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    response = post_mcp(http, key, rpc("tools/call", {"name": tool, "arguments": arguments}))
    assert response.status_code == 200, response.text
    return response.json()


def keys_anywhere(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in keys_anywhere(v)}
    if isinstance(value, list):
        return {k for v in value for k in keys_anywhere(v)}
    return set()


# -- version negotiation and headers ----------------------------------------------------


@pytest.mark.parametrize("requested", SUPPORTED)
def test_a_supported_version_is_echoed(http, key, requested) -> None:
    response = post_mcp(http, key, rpc("initialize", {"protocolVersion": requested, "capabilities": {},
                                                      "clientInfo": {"name": "e2e", "version": "0"}}))
    assert response.status_code == 200
    result = response.json()["result"]
    assert result["protocolVersion"] == requested
    assert result["serverInfo"]["name"] == "hyphae" and "tools" in result["capabilities"]


@pytest.mark.parametrize("params", [{"protocolVersion": "1999-01-01"}, {}], ids=["unknown", "absent"])
def test_an_unknown_or_absent_version_gets_the_newest(http, key, params) -> None:
    response = post_mcp(http, key, rpc("initialize", {**params, "capabilities": {}}))
    assert response.json()["result"]["protocolVersion"] == LATEST


def test_the_protocol_version_header(http, key) -> None:
    bad = post_mcp(http, key, rpc("ping"), mcp_protocol_version="1999-01-01")
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == -32600 and "MCP-Protocol-Version" in bad.json()["error"]["message"]
    assert post_mcp(http, key, rpc("ping")).status_code == 200  # absent: a pre-2025-06-18 client
    for version in SUPPORTED:
        ok = post_mcp(http, key, rpc("ping"), mcp_protocol_version=version)
        assert ok.status_code == 200 and ok.json()["result"] == {}


def test_a_key_is_required_on_every_request(http, key) -> None:
    missing = post_mcp(http, None, rpc("tools/list"))
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == -32001
    assert missing.json()["error"]["data"]["reason"] == "unauthenticated"
    wrong = post_mcp(http, "hy_" + "x" * 43, rpc("tools/list"))
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == -32001
    assert post_mcp(http, key, rpc("tools/list")).status_code == 200


def test_only_loopback_origins_may_call(http, key) -> None:
    evil = post_mcp(http, key, rpc("ping"), origin="http://evil.example")
    assert evil.status_code == 403
    assert evil.json()["error"]["data"]["reason"] == "forbidden"
    for origin in ("http://localhost:1234", "http://127.0.0.1:8080", "http://[::1]:3000"):
        assert post_mcp(http, key, rpc("ping"), origin=origin).status_code == 200, origin


def test_a_notification_gets_202_and_no_body(http, key) -> None:
    response = post_mcp(http, key, rpc("notifications/initialized", id=None))
    assert response.status_code == 202 and response.content == b""
    response = post_mcp(http, key, rpc("notifications/whatever-is-new", id=None))
    assert response.status_code == 202 and response.content == b""


@pytest.mark.parametrize("method", ["GET", "DELETE"])
def test_only_post_is_served_on_mcp(http, key, method) -> None:
    response = http.request(method, "/mcp", headers={"x-hyphae-key": key})
    assert response.status_code == 405
    assert response.headers["allow"] == "POST"


@pytest.mark.parametrize("path", ["/mcp", "/v1/cells"])
def test_a_body_over_one_mebibyte_is_refused_and_the_connection_survives(http, key, path) -> None:
    prefix = b'{"jsonrpc":"2.0","id":1,"method":"ping","params":{"pad":"' if path == "/mcp" else b'{"content":"'
    headers = {"content-type": "application/json", "x-hyphae-key": key}

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while streaming
        yield prefix
        for _ in range(20):
            yield b"y" * 65536
        yield b'"}}'

    # Repeated on one keep-alive connection: an answer sent before the body is read must
    # neither be lost to a TCP reset nor leave a dead connection in the client's pool.
    for _ in range(3):
        declared = http.post(path, content=prefix + b"x" * (1 << 20) + b'"}}', headers=headers)
        assert declared.status_code == 413, declared.text
        streamed = http.post(path, content=chunks(), headers=headers)
        assert streamed.status_code == 413, streamed.text
        error = streamed.json()["error"]
        assert (error["data"] if path == "/mcp" else error)["reason"] == "too_large"
        assert post_mcp(http, key, rpc("ping")).status_code == 200  # the node keeps serving


def test_server_discover_is_refused_with_a_plain_answer(http, key) -> None:
    """A JSON body that ends, not an event stream held open: the client's timeout guards a hang."""
    response = post_mcp(http, key, rpc("server/discover", {}, id="probe"))
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    assert response.json() == {"jsonrpc": "2.0", "id": "probe",
                               "error": {"code": -32601, "message": "method not found: server/discover"}}


def test_malformed_json_is_a_parse_error(http, key) -> None:
    response = post_mcp(http, key, b'{"jsonrpc": "2.0", "id": 1, "method": ')
    assert response.status_code == 400
    assert response.json()["error"]["code"] == -32700 and response.json()["id"] is None


def test_an_unknown_tool_is_invalid_params(http, key) -> None:
    error = call(http, key, "consolidate_scene", {"scene_id": str(uuid.uuid4())})["error"]
    assert error["code"] == -32602 and error["data"]["field"] == "name"


@pytest.mark.parametrize("field", ["source_agent", "tenant_id"])
def test_identity_cannot_be_asserted_in_arguments(http, key, field) -> None:
    arguments = {"content": "I am somebody else.", "cell_type": "Fact", field: "someone-else"}
    error = call(http, key, "store", arguments)["error"]
    assert error["code"] == -32602
    assert error["data"]["field"] == field and "API key" in error["message"]


def test_recall_returns_ids_and_distances_only(http, key) -> None:
    stored = call(http, key, "store", {"content": SECRET, "cell_type": "Constraint"})["result"]
    node_id = stored["structuredContent"]["node_id"]
    response = post_mcp(http, key, rpc("tools/call", {"name": "recall", "arguments": {"query": SECRET}}))
    assert SECRET not in response.text and "Monday" not in response.text
    result = response.json()["result"]
    payload = result["structuredContent"]
    assert json.loads(result["content"][0]["text"]) == payload
    assert "content" not in keys_anywhere(payload)
    assert payload["results"][0] == {"node_id": node_id, "distance": pytest.approx(0.0, abs=1e-5)}
    assert all(set(hit) == {"node_id", "distance"} for hit in payload["results"])


def test_a_facade_error_is_a_json_rpc_error(http, key) -> None:
    missing = str(uuid.uuid4())
    body = call(http, key, "get_scene", {"scene_id": missing})
    assert "result" not in body  # not an isError content block
    assert body["error"]["code"] == -32004
    assert body["error"]["data"]["reason"] == "not_found" and body["error"]["data"]["field"] == "scene_id"


def test_current_clients_get_a_link_per_hit_and_read_it_over_http(http, key) -> None:
    content = "The HTTP reader follows its recall's links."
    node_id = call(http, key, "store", {"content": content, "cell_type": "Fact"})["result"]["structuredContent"]["node_id"]
    response = post_mcp(http, key, rpc("tools/call", {"name": "recall", "arguments": {"query": content, "k": 2}}),
                        mcp_protocol_version=LATEST)
    result = response.json()["result"]
    text, *links = result["content"]
    assert json.loads(text["text"]) == result["structuredContent"]
    assert all(set(hit) == {"node_id", "distance"} for hit in result["structuredContent"]["results"])
    assert links[0] == {"type": "resource_link", "uri": f"hyphae://cells/{node_id}", "name": node_id,
                        "mimeType": "application/json", "title": "Fact cell", "description": content}
    read = post_mcp(http, key, rpc("resources/read", {"uri": links[0]["uri"]}), mcp_protocol_version=LATEST)
    [contents] = read.json()["result"]["contents"]
    assert contents["mimeType"] == "application/json" and json.loads(contents["text"])["content"] == content


@pytest.mark.parametrize("header, tool_error", [(LATEST, True), ("2025-06-18", False), (None, False)])
def test_a_bad_argument_is_a_tool_error_from_2025_11_25_on(http, key, header, tool_error) -> None:
    headers = {} if header is None else {"mcp_protocol_version": header}
    body = post_mcp(http, key, rpc("tools/call", {"name": "recall", "arguments": {"query": "q", "k": 0}}), **headers)
    assert body.status_code == 200
    answer = body.json()
    if tool_error:
        assert answer["result"] == {"content": [{"type": "text", "text": "recall: argument 'k' must be an integer "
                                                 "between 1 and 100"}], "isError": True}
    else:
        assert answer["error"]["code"] == -32602 and answer["error"]["data"]["field"] == "k"


def test_http_offers_resources_and_prompts_but_no_subscriptions(http, key) -> None:
    capabilities = post_mcp(http, key, rpc("initialize", {})).json()["result"]["capabilities"]
    assert capabilities == {"tools": {"listChanged": False}, "resources": {"subscribe": False, "listChanged": False},
                            "prompts": {"listChanged": False}}
    refused = post_mcp(http, key, rpc("resources/subscribe", {"uri": "hyphae://inbox"})).json()
    assert refused["error"]["code"] == -32601


def test_a_stdio_host_subscribed_to_its_inbox_hears_of_new_diffs(node) -> None:
    daemon, _ = node
    keys = add_agents(daemon.home, "subscriber", "teller")
    topic = "the release train leaves every other Wednesday"
    session = StdioSession(daemon.home, keys["subscriber"])
    try:
        assert session.initialize()["capabilities"]["resources"]["subscribe"] is True
        tool_payload(session.call("place_beacon", {"query": topic}))
        assert session.request("resources/subscribe", {"uri": "hyphae://inbox"})["result"] == {}
        with daemon.client(keys["teller"]) as rest:
            stored = rest.post("/v1/cells", json={"content": topic.capitalize() + ".", "cell_type": "Decision"})
            assert stored.status_code == 201, stored.text
        # `hyphae mcp` looks every 2 s; DEADLINE is a hang guard, not a timing.
        assert session.recv(DEADLINE) == {"jsonrpc": "2.0", "method": "notifications/resources/updated",
                                          "params": {"uri": "hyphae://inbox"}}
        inbox = json.loads(session.request("resources/read", {"uri": "hyphae://inbox"})["result"]["contents"][0]["text"])
        assert [diff["node_id"] for diff in inbox["diffs"]] == [stored.json()["node_id"]]
    finally:
        session.stop()


# -- REST ---------------------------------------------------------------------------------


def _probe_path(path: str) -> str:
    return path.replace("{name}", "nobody").replace("{", "").replace("}", "").replace(
        "node_id", str(uuid.uuid4())).replace("beacon_id", str(uuid.uuid4())).replace(
        "session_id", str(uuid.uuid4())).replace("scene_id", str(uuid.uuid4()))


def test_openapi_lists_exactly_the_served_routes(http) -> None:
    spec = http.get("/openapi.json").json()
    documented = {(method.upper(), path) for path, ops in spec["paths"].items() for method in ops}
    assert documented == {(route.method, route.path) for route in ROUTES}
    for route in ROUTES:  # the errors a client must be ready for are documented where they can happen
        responses = spec["paths"][route.path][route.method.lower()]["responses"]
        assert ("429" in responses) == (route.auth == "key"), route.path  # the per-key rate limit
        assert ("507" in responses) == (route.method in ("POST", "DELETE")), route.path  # disk_full
    for method, path in sorted(documented):
        response = http.request(method, _probe_path(path), json={} if method == "POST" else None)
        expected = 200 if path == "/healthz" else 401
        assert response.status_code == expected, (method, path, response.text)
    for path in spec["paths"]:  # nothing undocumented answers on a documented path
        for method in {"GET", "POST", "PUT", "PATCH", "DELETE"} - {m.upper() for m in spec["paths"][path]}:
            assert http.request(method, _probe_path(path)).status_code == 405, (method, path)
    assert http.get("/v1/no-such-thing").status_code == 404


def test_rest_round_trip(node, http, key) -> None:
    daemon, keys = node
    auth = {"x-hyphae-key": key}
    me = http.get("/v1/whoami", headers=auth).json()

    stored = http.post("/v1/cells", headers=auth, json={
        "content": "Invoices are generated at 02:00 UTC by the billing cron.", "cell_type": "Fact",
        "salience": 0.8, "source_ref": {"kind": "file", "locator": "billing/cron.py:12"},
    })
    assert stored.status_code == 201, stored.text
    node_id = stored.json()["node_id"]

    cell = http.get(f"/v1/cells/{node_id}", headers=auth).json()
    assert cell["content"].startswith("Invoices are generated")
    assert cell["source_agent"] == me["agent_id"] and cell["provenance"]["source_agent"] == me["agent_id"]
    assert cell["source_ref"] == {"kind": "file", "locator": "billing/cron.py:12"}

    found = http.post("/v1/search", headers=auth, json={"query": "when are invoices generated", "k": 3}).json()
    assert found["results"][0]["node_id"] == node_id and "content" in found["results"][0]

    other = http.delete(f"/v1/cells/{node_id}", headers={"x-hyphae-key": keys["bob"]})
    assert other.status_code == 403  # only the author may forget
    forgotten = http.delete(f"/v1/cells/{node_id}", headers=auth)
    assert forgotten.status_code == 200 and forgotten.json()["node_id"] == node_id
    tombstone = http.get(f"/v1/cells/{node_id}", headers=auth).json()
    assert tombstone["content"] == "" and tombstone["forgotten_at"] is not None
    found = http.post("/v1/search", headers=auth, json={"query": "when are invoices generated", "k": 10}).json()
    assert node_id not in [hit["node_id"] for hit in found["results"]]

    session = http.post("/v1/sessions", headers=auth, json={"project": "billing", "title": "cron"}).json()
    for text in ("The cron runs in UTC.", "Retries back off exponentially."):
        assert http.post("/v1/cells", headers=auth, json={"content": text, "cell_type": "Lesson"}).status_code == 201
    assert http.post(f"/v1/sessions/{session['session_id']}/end", headers=auth).json()["cell_count"] == 2
    consolidated = http.post(f"/v1/scenes/{session['scene_id']}/consolidate", headers=auth)
    assert consolidated.status_code == 201, consolidated.text
    summary = consolidated.json()
    assert summary["scene_id"] == session["scene_id"] and summary["source_count"] == 2
    scene = http.get(f"/v1/scenes/{session['scene_id']}", headers=auth).json()
    assert scene["summary_node_id"] == summary["node_id"] and scene["consolidated_at"] is not None
    assert http.get(f"/v1/cells/{summary['node_id']}", headers=auth).json()["layer"] == "L2"
    again = http.post(f"/v1/scenes/{session['scene_id']}/consolidate", headers=auth)
    assert again.status_code == 409 and again.json()["error"]["reason"] == "conflict"


def test_a_non_loopback_api_address_needs_allow_remote(tmp_path) -> None:
    home = make_home(tmp_path / "home")
    result = run_cli(home, "up", "--api", "0.0.0.0:0", check=False, timeout=DEADLINE)
    assert result.returncode != 0
    assert "not a loopback address" in result.stderr and "--allow-remote" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (home / "daemon.json").exists()
