"""MCP resources over a real node: reading back what recall finds, under the tools' read scope.

The dispatcher runs over a real ``MemoryService`` (hashed embedder, a temp data dir), so the
scope rules are the node's own: another tenant's cell, or a cell in a project outside the
key's list, reads exactly like a uri that names nothing.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
import trio

from mcp_bridge import Dispatcher
from mcp_bridge.resources import BEACONS_URI, INBOX_URI, RESOURCE_NOT_FOUND, one_line
from tests.node.helpers import second_tenant_key, store

NEW, OLD = "2025-11-25", "2025-03-26"


async def call(dispatcher: Dispatcher, principal: Any, method: str, params: dict[str, Any] | None = None,
               version: str | None = NEW) -> dict[str, Any]:
    message = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    with trio.fail_after(10):
        response = await dispatcher.handle(message, principal, protocol_version=version)
    return json.loads(json.dumps(response))  # what a client receives


async def read(dispatcher: Dispatcher, principal: Any, uri: str) -> dict[str, Any]:
    response = await call(dispatcher, principal, "resources/read", {"uri": uri})
    assert "result" in response, response
    [content] = response["result"]["contents"]
    assert content["uri"] == uri and content["mimeType"] == "application/json"
    return json.loads(content["text"])


async def not_found(dispatcher: Dispatcher, principal: Any, uri: str) -> dict[str, Any]:
    response = await call(dispatcher, principal, "resources/read", {"uri": uri})
    error = response["error"]
    assert error["code"] == RESOURCE_NOT_FOUND and error["data"]["reason"] == "not_found", error
    return error


@pytest.fixture
def dispatcher(service) -> Dispatcher:
    return Dispatcher(service, server_version="test", check_results=True)


async def test_recall_links_each_hit_and_the_link_reads_the_whole_cell(service, dispatcher, make_agent):
    alice, _ = await make_agent("alice")
    text = "Payments retries use exponential backoff capped at 30 seconds, because the bank throttles bursts. " * 2
    node_id = await store(service, alice, text, "Decision", salience=0.9, source_ref={"kind": "file", "locator": "pay.md:3"})
    other = await store(service, alice, "The cafeteria closes at three.")

    for method, arguments in (("recall", {"query": text, "k": 5}), ("query", {"query": text, "layer": "L0"})):
        result = (await call(dispatcher, alice, "tools/call", {"name": method, "arguments": arguments}))["result"]
        assert result["isError"] is False
        text_block, *links = result["content"]
        assert text_block["type"] == "text" and json.loads(text_block["text"]) == result["structuredContent"]
        hits = result["structuredContent"]["results"]
        assert all(set(hit) == {"node_id", "distance"} for hit in hits)  # seed 000, unchanged
        assert [link["uri"] for link in links] == [f"hyphae://cells/{hit['node_id']}" for hit in hits]
        assert hits[0]["node_id"] == node_id and {h["node_id"] for h in hits} == {node_id, other}
        first = links[0]
        assert first["type"] == "resource_link" and first["name"] == node_id
        assert first["mimeType"] == "application/json"
        assert first["description"] == one_line(text) and len(first["description"]) <= 120
        assert "\n" not in first["description"] and first["description"].endswith("…")

    cell = await read(dispatcher, alice, f"hyphae://cells/{node_id}")
    assert cell == await service.get_cell(alice, node_id=node_id)  # the facade's rendering, whole
    assert cell["content"] == text and cell["source_ref"] == {"kind": "file", "locator": "pay.md:3"}


async def test_older_revisions_get_the_text_block_alone(service, dispatcher, make_agent):
    alice, _ = await make_agent("alice")
    await store(service, alice, "Links need 2025-06-18.")
    for version in (OLD, "2024-11-05", None):
        result = (await call(dispatcher, alice, "tools/call",
                             {"name": "recall", "arguments": {"query": "links"}}, version))["result"]
        assert [block["type"] for block in result["content"]] == ["text"], version
    result = (await call(dispatcher, alice, "tools/call",
                         {"name": "recall", "arguments": {"query": "links"}}, "2025-06-18"))["result"]
    assert [block["type"] for block in result["content"]] == ["text", "resource_link"]


async def test_another_tenants_cell_reads_as_not_found(service, dispatcher, make_agent):
    alice, _ = await make_agent("alice")
    node_id = await store(service, alice, "Tenant secret: the merger closes in May.")
    outsider = await service.authenticate(second_tenant_key(service))

    missing = await not_found(dispatcher, outsider, f"hyphae://cells/{uuid.uuid4()}")
    hidden = await not_found(dispatcher, outsider, f"hyphae://cells/{node_id}")
    assert hidden["message"].replace(node_id, "X") == missing["message"].replace(missing["data"]["uri"][15:], "X")
    assert "merger" not in json.dumps(hidden)
    listed = (await call(dispatcher, outsider, "resources/list"))["result"]["resources"]
    assert [entry["uri"] for entry in listed] == [INBOX_URI, BEACONS_URI]
    recalled = (await call(dispatcher, outsider, "tools/call", {"name": "recall", "arguments": {"query": "merger"}}))
    assert recalled["result"]["content"][1:] == []


async def test_a_cell_in_a_project_outside_the_key_reads_as_not_found(service, dispatcher, make_agent):
    admin, _ = await make_agent("admin")
    frontend, _ = await make_agent("frontend-agent", projects=["frontend"])
    backend_cell = await store(service, admin, "The billing schema migrates on Sundays.", project="backend")
    frontend_cell = await store(service, admin, "The design tokens live in tokens.json.", project="frontend")
    scene = (await service.start_session(admin, project="backend"))["scene_id"]

    await not_found(dispatcher, frontend, f"hyphae://cells/{backend_cell}")  # never -32003 forbidden
    await not_found(dispatcher, frontend, f"hyphae://scenes/{scene}")
    assert (await read(dispatcher, frontend, f"hyphae://cells/{frontend_cell}"))["content"].startswith("The design")
    assert (await read(dispatcher, admin, f"hyphae://cells/{backend_cell}"))["project"] == "backend"
    assert (await read(dispatcher, admin, f"hyphae://scenes/{scene}"))["scene_id"] == scene
    listed = {entry["uri"] for entry in (await call(dispatcher, frontend, "resources/list"))["result"]["resources"]}
    assert f"hyphae://cells/{frontend_cell}" in listed and f"hyphae://cells/{backend_cell}" not in listed


async def test_resources_list_pages_with_a_cursor_and_leaves_forgotten_cells_out(service, dispatcher, make_agent):
    alice, _ = await make_agent("alice")
    stored = [await store(service, alice, f"note number {i}") for i in range(120)]
    forgotten = stored[-1]
    with trio.fail_after(10):
        await service.forget(alice, node_id=forgotten)

    pages, cursor = [], None
    while True:
        result = (await call(dispatcher, alice, "resources/list", {} if cursor is None else {"cursor": cursor}))["result"]
        pages.append(result["resources"])
        cursor = result.get("nextCursor")
        if cursor is None:
            break
    assert len(pages) == 3  # 50 cells a page
    assert [entry["uri"] for entry in pages[0][:2]] == [INBOX_URI, BEACONS_URI]
    cells = [entry for page in pages for entry in page if entry["uri"].startswith("hyphae://cells/")]
    assert [entry["name"] for entry in cells] == list(reversed(stored[:-1]))  # newest first, the forgotten one out
    assert all(entry["mimeType"] == "application/json" and entry["description"].startswith("note number")
               for entry in cells)
    assert (await read(dispatcher, alice, f"hyphae://cells/{forgotten}"))["forgotten_at"] is not None

    bad = await call(dispatcher, alice, "resources/list", {"cursor": "not-a-cursor"})
    assert bad["error"]["code"] == -32602 and bad["error"]["data"]["field"] == "cursor"


async def test_inbox_and_beacons_are_the_callers_own(service, dispatcher, make_agent):
    alice, _ = await make_agent("alice")
    bob, _ = await make_agent("bob")
    with trio.fail_after(10):
        beacon = (await service.place_beacon(alice, query="deploys go through staging", threshold=0.1))["beacon_id"]
    delivered = await store(service, bob, "Deploys go through staging first.", "Decision")
    with trio.fail_after(10):
        while not (await service.inbox(alice))["diffs"]:
            await trio.sleep(0.01)  # delivery is asynchronous on the node

    inbox = await read(dispatcher, alice, INBOX_URI)
    assert [diff["node_id"] for diff in inbox["diffs"]] == [delivered]
    assert (await read(dispatcher, alice, BEACONS_URI))["beacons"][0]["beacon_id"] == beacon
    assert (await read(dispatcher, bob, INBOX_URI))["diffs"] == []
    assert (await read(dispatcher, bob, BEACONS_URI))["beacons"] == []


async def test_templates_and_bad_uris(service, dispatcher, make_agent):
    alice, _ = await make_agent("alice")
    templates = (await call(dispatcher, alice, "resources/templates/list"))["result"]["resourceTemplates"]
    assert [t["uriTemplate"] for t in templates] == ["hyphae://cells/{node_id}", "hyphae://scenes/{scene_id}"]
    assert all(t["mimeType"] == "application/json" and t["description"] for t in templates)

    for uri in ("hyphae://cells/not-a-uuid", "hyphae://nothing", "hyphae://cells/", f"hyphae://scenes/{uuid.uuid4()}"):
        await not_found(dispatcher, alice, uri)
    for params in ({}, {"uri": 7}, {"uri": "https://example.com/x"}):
        response = await call(dispatcher, alice, "resources/read", params)
        assert response["error"]["code"] == -32602 and response["error"]["data"]["field"] == "uri", params
