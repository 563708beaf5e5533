"""Tenant and project isolation across every MCP tool and every REST route.

One node, three principals besides the victim: ``alice`` (tenant A, every project) owns
the secrets: a tenant-wide cell, a cell in project ``beta`` stored inside her session
(so in its scene), a beacon, and an inbox item a teammate's cell delivered. ``outsider``
holds a key of a *second tenant* on the same node; ``scoped`` is alice's teammate
limited to project ``alpha``. Both placed a beacon on alice's secret text before she
stored it.

Both tables are driven from the product's own tables, so a new tool or route cannot
escape: every tool of ``mcp_bridge.tools.TOOLS`` must have probe arguments here, and every
route of ``api.rest.rest.ROUTES`` is probed by its kind (a key route with a path parameter
aimed at alice's resource must be refused with 403/404; any other key route must answer
without leaking; an admin route refuses agent keys). The invariants:

* nothing the prober may not read appears anywhere in a response: alice's out-of-scope
  contents and ids, her beacon, her inbox, her agent id (the outsider may not even see
  the tenant-wide cell);
* a call aimed at alice's session, scene, cell or beacon is refused;
* afterwards alice's state is untouched (session open, scene not consolidated, cells
  not forgotten, beacon live), and neither prober's inbox caught her secret.

The transports are the product's, in process: the API port's ASGI app (REST and
``POST /mcp``) through ``httpx.ASGITransport``.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import trio

from mcp_bridge import Dispatcher, make_mcp_app
from mcp_bridge.tools import TOOLS
from api.rest import RestApi, make_api_app
from api.rest.rest import ROUTES
from node.embedding import HashedEmbedder
from app.home import init_home, open_node
from node.ratelimit import RateLimiter
from tests.node.helpers import second_tenant_key

SECRET = "The beta launch codes are kept in vault seven"
WIDE = "The whole team shares the standup at nine"
INBOX_SECRET = "deploy freeze starts on friday at noon"
ASK = "beta launch codes kept in vault seven?"  # what the probers ask: close to SECRET, never containing it
ASK_WIDE = "whole team shares the standup at nine?"
ADMIN_TOKEN = "admin-token-of-the-data-dir-owner"

# Arguments per tool, aimed at alice's things; True: the call must be refused.
TOOL_PROBES: dict[str, list[tuple[dict[str, Any], bool]]] = {
    "store": [({"content": "probe", "cell_type": "Fact", "scene_id": "{scene_id}"}, True),
              ({"content": "probe in beta", "cell_type": "Fact", "project": "beta"}, False)],
    "recall": [({"query": ASK}, False), ({"query": ASK, "project": "beta"}, False), ({"query": ASK_WIDE}, False)],
    "query": [({"query": ASK, "layer": "L0"}, False), ({"query": ASK, "layer": "L1"}, False)],
    "start_session": [({"project": "beta"}, False)],
    "end_session": [({"session_id": "{session_id}"}, True)],
    "place_beacon": [({"query": ASK, "project": "beta"}, False)],
    "list_beacons": [({}, False)],
    "inbox": [({"since": 0}, False)],
    "get_scene": [({"scene_id": "{scene_id}"}, True)],
    "list_scenes": [({}, False), ({"project": "beta"}, False)],
    "pull_inbox": [({}, False)],
}  # fmt: skip

# What a REST route without a path parameter is sent (body for POST, query for GET).
REST_BODIES = {
    "/v1/cells": {"content": "probe", "cell_type": "Fact", "scene_id": "{scene_id}"},
    "/v1/search": {"query": ASK, "k": 100},
    "/v1/recall": {"query": ASK, "k": 100},
    "/v1/beacons": {"query": ASK, "project": "beta"},
    "/v1/sessions": {"project": "beta"},
    "/v1/inbox/pull": {"limit": 500},
}
REST_QUERIES = {"/v1/scenes": {"project": "beta"}, "/v1/inbox": {"since": "0"}, "/v1/cells": {"limit": "500"}}


@pytest.fixture
async def world(tmp_path):
    home = tmp_path / "home"
    init_home(home)
    async with open_node(home, embedder=HashedEmbedder()) as service:
        service.rate_limiter = RateLimiter(0, 1)
        alice, alice_key = await service.add_agent("alice")
        carol, _ = await service.add_agent("carol")
        scoped, scoped_key = await service.add_agent("scoped", ["alpha"])
        outsider_key = second_tenant_key(service, "outsider")
        outsider = await service.authenticate(outsider_key)
        for prober in (outsider, scoped):  # standing interests in alice's secrets
            await service.place_beacon(prober, query=ASK)
            await service.place_beacon(prober, query=ASK_WIDE)
        wide = await service.store(alice, content=WIDE, cell_type="Fact")
        beacon = await service.place_beacon(alice, query=INBOX_SECRET)
        await service.store(carol, content=INBOX_SECRET, cell_type="Decision", project="beta")
        session = await service.start_session(alice, project="beta")
        beta = await service.store(alice, content=SECRET, cell_type="Decision")
        assert (await service.inbox(alice))["diffs"][0]["content"] == INBOX_SECRET
        ids = {"node_id": beta["node_id"], "scene_id": session["scene_id"], "session_id": session["session_id"],
               "beacon_id": beacon["beacon_id"], "name": "alice"}  # fmt: skip
        app = make_api_app(RestApi(service, ADMIN_TOKEN), {
            "/mcp": make_mcp_app(Dispatcher(service, server_version="0"), service.authenticate)})  # fmt: skip
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:7777") as http:
            yield {
                "service": service, "http": http, "ids": ids, "wide_id": wide["node_id"], "alice": alice,
                "probers": {"outsider": outsider_key, "scoped": scoped_key},
            }  # fmt: skip


def forbidden_strings(world, prober: str) -> list[str]:
    """What ``prober`` must never see."""
    ids = world["ids"]
    hidden = [SECRET, INBOX_SECRET, ids["node_id"], ids["scene_id"], ids["session_id"], ids["beacon_id"]]
    if prober == "outsider":
        hidden += [WIDE, world["wide_id"], world["alice"].agent_id]
    return hidden


def fill(value: Any, ids: dict[str, str]) -> Any:
    text = json.dumps(value)
    return json.loads(re.sub(r"\{(\w+)\}", lambda m: ids[m.group(1)], text))


def assert_no_leak(text: str, hidden: list[str], what: str, sent: str = "") -> None:
    """No hidden string in ``text``, except an id the prober sent itself (an error may echo it)."""
    leaked = [item for item in hidden if item in text and item not in sent]
    assert not leaked, f"{what} leaked {leaked}: {text[:500]}"


async def check_alice_untouched(world) -> None:
    service, ids = world["service"], world["ids"]
    scene = await service.get_scene(world["alice"], scene_id=ids["scene_id"])
    assert scene["ended_at"] is None and scene["consolidated_at"] is None
    assert (await service.get_cell(world["alice"], node_id=ids["node_id"]))["forgotten_at"] is None
    assert ids["beacon_id"] in [b["beacon_id"] for b in (await service.list_beacons(world["alice"]))["beacons"]]
    assert [a["revoked_at"] for a in await service.list_agents() if a["name"] == "alice"] == [None]


def test_every_tool_and_route_has_a_probe() -> None:
    assert set(TOOL_PROBES) == {tool.name for tool in TOOLS}, "a tool without isolation probes"
    for route in ROUTES:  # a route with an unknown path parameter or body needs a probe here
        assert set(route.pattern.groupindex) <= {"node_id", "scene_id", "session_id", "beacon_id", "name"}, route
        if route.auth == "key" and route.method == "POST" and not route.pattern.groupindex:
            assert route.path in REST_BODIES, f"no isolation probe body for POST {route.path}"


@pytest.mark.parametrize("prober", ["outsider", "scoped"])
async def test_no_tool_reads_or_changes_outside_the_keys_scope(world, prober) -> None:
    http, hidden = world["http"], forbidden_strings(world, prober)
    headers = {"x-hyphae-key": world["probers"][prober], "content-type": "application/json"}
    calls = 0
    for tool, probes in TOOL_PROBES.items():
        for arguments, must_refuse in probes:
            message = {"jsonrpc": "2.0", "id": calls, "method": "tools/call",
                       "params": {"name": tool, "arguments": fill(arguments, world["ids"])}}  # fmt: skip
            with trio.fail_after(10):
                response = await http.post("/mcp", json=message, headers=headers)
            calls += 1
            assert response.status_code == 200, response.text
            assert_no_leak(response.text, hidden, f"{prober} {tool} {arguments}", json.dumps(message))
            body = response.json()
            if must_refuse:
                assert body["error"]["data"]["reason"] in ("not_found", "forbidden"), (tool, body)
    await check_alice_untouched(world)
    principal = await world["service"].authenticate(world["probers"][prober])  # its beacons caught nothing of hers
    caught = await world["service"].inbox(principal)
    assert_no_leak(json.dumps(caught), hidden, f"{prober}'s inbox")
    assert len(caught["diffs"]) == (1 if prober == "scoped" else 0)  # scoped reads the tenant-wide cell: it arrived


@pytest.mark.parametrize("prober", ["outsider", "scoped"])
async def test_no_route_reads_or_changes_outside_the_keys_scope(world, prober) -> None:
    http, ids, hidden = world["http"], world["ids"], forbidden_strings(world, prober)
    key = world["probers"][prober]
    for route in ROUTES:
        path = route.path.format(**ids)
        body = fill(REST_BODIES.get(route.path), ids) if route.method == "POST" else None
        query = REST_QUERIES.get(route.path) if route.method == "GET" else None
        attempts = [{"x-hyphae-key": key}]
        if route.auth == "admin":  # an agent's key is no admin token, in either header
            attempts.append({"x-hyphae-admin": key})
        for headers in attempts:
            with trio.fail_after(10):
                response = await http.request(route.method, path, json=body, params=query, headers=headers)
            what = f"{prober} {route.method} {path}"
            assert response.status_code < 500, (what, response.text)
            assert_no_leak(response.text, hidden, what, f"{path} {json.dumps(body)}")
            if route.auth == "admin":
                assert response.status_code == 401, (what, response.status_code)
            elif route.pattern.groupindex:  # aimed at one of alice's things
                assert response.status_code in (403, 404), (what, response.status_code, response.text)
    await check_alice_untouched(world)
