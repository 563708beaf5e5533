"""The A2A surface of a real ``hyphae up --a2a``, driven by the A2A SDK's own client.

The client fetches the Agent Card, then sends messages that store a memory and recall it,
over ``SendMessage`` and over the stream. The same store and recall through A2A, REST and
MCP reach one cell and refuse the same things for the same reason (the equivalence rows
of "one core, four surfaces"). Keys: a bad one and a revoked one are refused before any
JSON-RPC is read. Off (the default), the A2A paths answer 404; on through config.toml,
they answer.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from a2a.client import A2ACardResolver, A2AClientError, ClientConfig, create_client
from a2a.types.a2a_pb2 import Message, Part, Role, SendMessageRequest
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from .conftest import DEADLINE, Daemon, add_agent, make_home, run_cli, start_daemon

CARD = "/.well-known/agent-card.json"


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[tuple[Daemon, dict[str, str]]]:
    home = make_home(tmp_path_factory.mktemp("a2a") / "home")
    running = start_daemon(home, "--a2a")
    try:
        keys = {"alice": add_agent(home, "alice"), "shopper": add_agent(home, "shopper", "shop")}
        yield running, keys
    finally:
        running.stop()


def message(text: str | None = None, data: dict[str, Any] | None = None, skill: str | None = None) -> Message:
    parts = ([Part(text=text)] if text is not None else []) + ([Part(data=_value(data))] if data is not None else [])
    sent = Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=parts)
    if skill is not None:
        sent.metadata.update({"skill": skill})
    return sent


def _value(data: dict[str, Any]):
    from google.protobuf.struct_pb2 import Value

    value = Value()
    value.struct_value.update(data)
    return value


def answer_of(events: list[Any]) -> tuple[str, dict[str, Any]]:
    """The one agent message of an exchange: (its text, its data part)."""
    assert len(events) == 1, events
    reply = events[0].message
    assert reply.role == Role.ROLE_AGENT
    text = "".join(p.text for p in reply.parts if p.HasField("text"))
    data = [MessageToDict(p.data) for p in reply.parts if p.HasField("data")]
    assert len(data) == 1
    return text, data[0]


def exchange(url: str, key: str | None, *messages: Message, streaming: bool = False,
             bearer: bool = False) -> list[tuple[str, dict[str, Any]]]:  # fmt: skip
    """The SDK's client: fetch the card from ``url``, then send each message in turn."""

    async def run() -> list[tuple[str, dict[str, Any]]]:
        headers = {} if key is None else ({"authorization": f"Bearer {key}"} if bearer else {"x-hyphae-key": key})
        async with httpx.AsyncClient(headers=headers, timeout=DEADLINE) as http:
            card = await A2ACardResolver(http, url).get_agent_card()
            client = await create_client(card, ClientConfig(httpx_client=http, streaming=streaming))
            answers = []
            for sent in messages:
                answers.append(answer_of([event async for event in client.send_message(SendMessageRequest(message=sent))]))
            return answers

    return asyncio.run(run())


def test_the_card_describes_the_skills_the_endpoint_and_the_keys(node) -> None:
    daemon, _ = node

    async def fetch():
        async with httpx.AsyncClient(timeout=DEADLINE) as http:  # the card is public: no key
            return await A2ACardResolver(http, daemon.url).get_agent_card()

    card = asyncio.run(fetch())
    assert [skill.id for skill in card.skills] == ["remember", "recall", "catch_up", "team_knowledge"]
    assert card.supported_interfaces[0].url == f"{daemon.url}/a2a"
    assert card.supported_interfaces[0].protocol_binding == "JSONRPC"
    assert card.capabilities.streaming
    schemes = card.security_schemes
    assert schemes["hyphaeKey"].api_key_security_scheme.name == "x-hyphae-key"
    assert schemes["hyphaeKey"].api_key_security_scheme.location == "header"
    assert schemes["bearer"].http_auth_security_scheme.scheme == "Bearer"
    assert {name for req in card.security_requirements for name in req.schemes} == {"hyphaeKey", "bearer"}


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
def test_the_sdk_client_stores_a_memory_and_recalls_it(node, streaming) -> None:
    daemon, keys = node
    content = f"The payments service retries webhooks five times ({'stream' if streaming else 'send'})."
    (said, stored), (listed, recalled) = exchange(
        daemon.url, keys["alice"],
        message(f"remember: {content}"),
        message(content, skill="recall", data={"k": 3}),
        streaming=streaming,
    )  # fmt: skip
    node_id = stored["node_id"]
    assert node_id in said
    hit = recalled["results"][0]
    assert hit["node_id"] == node_id and hit["content"] == content and hit["cell_type"] == "Fact"
    assert hit["provenance"]["local"] is True and hit["provenance"]["hops"] == 0
    assert content in listed
    # The cell is the core's: REST reads the very cell, stamped with the key's agent.
    with daemon.client(keys["alice"]) as http:
        cell = http.get(f"/v1/cells/{node_id}").json()
        whoami = http.get("/v1/whoami").json()
    assert cell["content"] == content and cell["source_agent"] == whoami["agent_id"]


@pytest.mark.parametrize("method", ["message/send", "message/stream"])
def test_the_0_3_method_names_answer_too(node, method) -> None:
    """Clients of the A2A 0.3 generation say ``message/send`` and ``message/stream``; plain JSON-RPC here."""
    daemon, keys = node
    content = f"Plain JSON-RPC clients say {method}."
    request = {"jsonrpc": "2.0", "id": 7, "method": method, "params": {"message": {
        "messageId": str(uuid.uuid4()), "role": "user", "kind": "message",
        "parts": [{"kind": "text", "text": f"remember: {content}"}],
    }}}  # fmt: skip
    with daemon.client(keys["alice"]) as http:
        response = http.post("/a2a", json=request)
        assert response.status_code == 200, response.text
        if method == "message/stream":
            assert response.headers["content-type"].startswith("text/event-stream")
            [data] = [line[len("data:"):] for line in response.text.splitlines() if line.startswith("data:")]
            answer = json.loads(data)
        else:
            answer = response.json()
        assert answer["id"] == 7
        [stored] = [part["data"] for part in answer["result"]["parts"] if "data" in part]
        assert http.get(f"/v1/cells/{stored['node_id']}").json()["content"] == content


def test_the_bearer_scheme_of_the_card_works_too(node) -> None:
    daemon, keys = node
    [(_, stored)] = exchange(daemon.url, keys["alice"], message("remember: bearer keys are accepted"), bearer=True)
    assert uuid.UUID(stored["node_id"])


def test_identity_never_comes_from_the_message(node) -> None:
    daemon, keys = node
    with daemon.client(keys["shopper"]) as http:
        shopper = http.get("/v1/whoami").json()
    with pytest.raises(InvalidParamsError) as refused:
        exchange(daemon.url, keys["alice"], message("an impostor", skill="remember", data={"source_agent": shopper["agent_id"]}))
    assert "source_agent" in refused.value.message


def test_team_knowledge_and_catch_up(node) -> None:
    daemon, keys = node
    with daemon.client(keys["shopper"]) as http:
        beacon = http.post("/v1/beacons", json={"query": "invoice rounding rules", "threshold": 0.0})
        assert beacon.status_code in (200, 201), beacon.text
    content = "Invoice rounding rules: round half to even, per line."
    [(_, stored)] = exchange(daemon.url, keys["alice"], message(content, skill="remember", data={"cell_type": "Decision"}))
    (knows_text, knows), (_, inbox) = exchange(
        daemon.url, keys["shopper"],
        message("What does the team know about invoice rounding?"),
        message("catch up"),
    )  # fmt: skip
    assert knows["results"][0]["node_id"] == stored["node_id"]
    assert [b["query"] for b in knows["beacons"]] == ["invoice rounding rules"]
    assert knows["contributors"][0]["source_agent"] == knows["results"][0]["source_agent"]
    assert "invoice rounding rules" in knows_text
    assert stored["node_id"] in [d["node_id"] for d in inbox["diffs"]]


def test_a_message_that_names_no_skill_is_refused_with_the_skills(node) -> None:
    daemon, keys = node
    with pytest.raises(InvalidParamsError) as refused:
        exchange(daemon.url, keys["alice"], message("hello there"))
    assert "remember, recall, catch_up, team_knowledge" in refused.value.message


@pytest.mark.parametrize("how", ["no key", "unknown key"])
def test_a_bad_key_is_refused_before_any_json_rpc(node, how) -> None:
    daemon, _ = node
    key = None if how == "no key" else "hy_" + "x" * 40
    with pytest.raises(A2AClientError, match="401"):
        exchange(daemon.url, key, message("recall: anything"))
    response = httpx.post(f"{daemon.url}/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "message/send"},
                          headers={} if key is None else {"x-hyphae-key": key}, timeout=DEADLINE)  # fmt: skip
    assert response.status_code == 401
    assert response.json()["error"]["reason"] == "unauthenticated"
    assert response.headers["www-authenticate"].startswith("Bearer")


def test_a_revoked_key_is_refused_on_its_next_call(node) -> None:
    daemon, _ = node
    home = daemon.home
    key = add_agent(home, "leaver")
    [(_, stored)] = exchange(daemon.url, key, message("remember: leaving soon"))
    run_cli(home, "agent", "revoke", "leaver")
    with pytest.raises(A2AClientError, match="401"):
        exchange(daemon.url, key, message("recall: leaving soon"))
    assert uuid.UUID(stored["node_id"])


def test_only_loopback_origins_may_call(node) -> None:
    daemon, keys = node
    with daemon.client(keys["alice"]) as http:
        for path, call in ((CARD, http.get), ("/a2a", lambda path, **kw: http.post(path, json={}, **kw))):
            refused = call(path, headers={"origin": "http://attacker.example"})
            assert refused.status_code == 403 and refused.json()["error"]["reason"] == "forbidden"
        assert http.get(CARD, headers={"origin": "http://localhost:3000"}).status_code == 200


def test_the_per_key_rate_limit_applies(tmp_path) -> None:
    home = make_home(tmp_path / "home")
    config = home / "config.toml"
    text = re.sub(r"(?m)^# rate_limit = .*$", "rate_limit = 0.001", config.read_text())
    config.write_text(re.sub(r"(?m)^# rate_burst = .*$", "rate_burst = 2", text))
    daemon = start_daemon(home, "--a2a")
    try:
        key = add_agent(home, "alice")  # `agent add` goes through the daemon's admin routes, not this key
        exchange(daemon.url, key, message("remember: one"), message("recall: one"))  # the burst
        with pytest.raises(A2AClientError, match="429"):
            exchange(daemon.url, key, message("recall: one"))
        response = httpx.post(f"{daemon.url}/a2a", json={}, headers={"x-hyphae-key": key}, timeout=DEADLINE)
        assert response.status_code == 429 and response.json()["error"]["reason"] == "rate_limited"
        assert int(response.headers["retry-after"]) >= 1
    finally:
        daemon.stop()


# -- one core: the same store and recall over A2A, REST and MCP ----------------------------


def mcp_call(http: httpx.Client, key: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    headers = {"x-hyphae-key": key, "accept": "application/json, text/event-stream", "content-type": "application/json"}
    response = http.post("/mcp", content=json.dumps(body), headers=headers)
    assert response.status_code == 200, response.text
    return response.json()


def test_store_and_recall_reach_the_same_cell_on_every_surface(node) -> None:
    daemon, keys = node
    key = keys["shopper"]
    content = "The shop's cart keeps items for 30 days."
    [(_, stored)] = exchange(daemon.url, key, message(content, skill="remember", data={"project": "shop"}))
    node_id = stored["node_id"]
    with daemon.client(key) as http:
        rest = http.post("/v1/search", json={"query": content, "k": 3, "project": "shop"}).json()["results"]
        mcp = mcp_call(http, key, "recall", {"query": content, "k": 3, "project": "shop"})
        rest_cell = http.get(f"/v1/cells/{node_id}").json()
    [(_, a2a)] = exchange(daemon.url, key, message(content, skill="recall", data={"k": 3, "project": "shop"}))
    a2a_hits = a2a["results"]
    mcp_hits = mcp["result"]["structuredContent"]["results"]
    assert [h["node_id"] for h in a2a_hits] == [h["node_id"] for h in rest] == [h["node_id"] for h in mcp_hits]
    assert a2a_hits[0]["node_id"] == node_id
    volatile = {"energy", "distance"}  # energy decays with the clock; distances are equal up to float rounding
    assert {k: v for k, v in a2a_hits[0].items() if k not in volatile} == {k: v for k, v in rest_cell.items() if k not in volatile}
    assert a2a_hits[0]["distance"] == pytest.approx(rest[0]["distance"]) == pytest.approx(mcp_hits[0]["distance"])


@pytest.mark.parametrize(
    ("skill", "arguments", "mcp", "reason", "field"),
    [
        ("recall", {"query": "carts", "project": "warehouse"}, None, "forbidden", "project"),
        # MCP's store takes its project from the session (seed 000): the refusal comes when it opens.
        ("remember", {"content": "out of scope", "cell_type": "Fact", "project": "warehouse"},
         ("start_session", {"project": "warehouse"}), "forbidden", "project"),
        ("recall", {"query": "carts", "k": 0}, None, "invalid_argument", "k"),
        ("remember", {"content": "x", "cell_type": "Gossip"}, None, "invalid_argument", "cell_type"),
    ],
)  # fmt: skip
def test_every_surface_refuses_the_same_call_for_the_same_reason(node, skill, arguments, mcp, reason, field) -> None:
    daemon, keys = node
    key = keys["shopper"]  # a key scoped to project "shop"
    tool, mcp_arguments = mcp or ({"recall": "recall", "remember": "store"}[skill], arguments)
    with daemon.client(key) as http:
        rest = http.post("/v1/search" if skill == "recall" else "/v1/cells", json=arguments)
        mcp_answer = mcp_call(http, key, tool, mcp_arguments)
    assert rest.json()["error"]["reason"] == reason and rest.json()["error"]["field"] == field
    mcp_error = mcp_answer.get("error") or mcp_answer["result"]["structuredContent"]["error"]
    assert (mcp_error.get("data") or mcp_error)["reason"] == reason
    with pytest.raises(InvalidParamsError) as refused:
        exchange(daemon.url, key, message(data={"skill": skill, **arguments}))
    assert refused.value.data == {**refused.value.data, "reason": reason, "field": field}


# -- off by default; on through config.toml; without the SDK ------------------------------


def test_off_by_default_its_paths_answer_404(tmp_path) -> None:
    home = make_home(tmp_path / "home")
    daemon = start_daemon(home)
    try:
        key = add_agent(home, "alice")
        with daemon.client(key) as http:
            assert http.get(CARD).status_code == 404
            assert http.post("/a2a", json={"jsonrpc": "2.0", "id": 1, "method": "message/send"}).status_code == 404
            assert http.get("/healthz").status_code == 200
        assert "a2a_url" not in daemon.info
    finally:
        daemon.stop()


def test_config_toml_turns_it_on(tmp_path) -> None:
    home = make_home(tmp_path / "home")
    config = home / "config.toml"
    config.write_text(config.read_text().replace("# enabled = false", "enabled = true"))
    daemon = start_daemon(home)
    try:
        assert daemon.info["a2a_url"] == f"{daemon.url}/a2a"
        assert httpx.get(daemon.url + CARD, timeout=DEADLINE).json()["name"].startswith("Hyphae memory node")
    finally:
        daemon.stop()


def test_without_the_sdk_a2a_stops_at_start_with_one_clear_line(tmp_path) -> None:
    home = make_home(tmp_path / "home")
    # The SDK made unimportable in the child, as on a machine without `pip install '.[a2a]'`.
    code = "import sys; sys.modules['a2a'] = None; from app.cli import main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run([sys.executable, "-c", code, "--home", str(home), "up", "--a2a"],
                          capture_output=True, text=True, timeout=DEADLINE)  # fmt: skip
    assert done.returncode == 3, done.stderr
    assert "pip install 'hyphae[a2a]'" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (home / "daemon.json").exists()
