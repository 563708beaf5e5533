"""One core, four surfaces: the same operations through MCP (over HTTP), REST, gRPC and A2A
reach the same facade method and give the same cells, the same scope rules, the same errors.

Each surface is an adapter with one method per operation (``store``, ``recall``, ``get``,
``forget``, ``inbox``); each answers an :class:`Answer` normalised the same way (node ids,
distances rounded, a cell's comparable fields), or the ``reason`` of a refusal. An
operation a surface does not offer is ``None`` on it (MCP has no forget: seed 000's tool
table; A2A's skills are remember, recall and catch up, so it neither reads one cell by id nor
forgets). To add a surface, write its adapter and add it to ``SURFACES``; every test here then
runs over it too. ``FACADE`` says which facade method each surface's operation
reaches, checked where the facade counts its calls (``/metrics``).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest

from tests.api.grpc_helpers import DEADLINE, as_dict, key, pb, refusal, stub

from .conftest import Daemon, add_agent, make_home, prepare_agents, start_daemon

CELL_FIELDS = ("node_id", "content", "cell_type", "project", "source_agent", "origin_node", "layer", "status")
MCP_VERSION = "2025-06-18"  # schema violations are JSON-RPC errors with data.reason (later: a tool error text)


@dataclasses.dataclass(frozen=True)
class Answer:
    value: Any = None
    reason: str | None = None  # the core's reason code when refused


def hits(results: list[dict[str, Any]]) -> list[tuple[str, float]]:
    return [(r["node_id"], round(float(r["distance"]), 4)) for r in results]


def cell(data: dict[str, Any]) -> dict[str, Any]:
    return {name: data.get(name) for name in CELL_FIELDS}


# -- the adapters ------------------------------------------------------------------------------


class Mcp:
    name = "mcp"

    def __init__(self, daemon: Daemon) -> None:
        self.http = httpx.Client(base_url=daemon.url, timeout=DEADLINE)
        self._ids = iter(range(1, 1_000_000))

    def close(self) -> None:
        self.http.close()

    def _rpc(self, api_key: str, method: str, params: dict[str, Any]) -> Answer:
        response = self.http.post("/mcp", json={"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params},
                                  headers={"x-hyphae-key": api_key, "mcp-protocol-version": MCP_VERSION,
                                           "accept": "application/json, text/event-stream"})  # fmt: skip
        if response.status_code == 401:
            return Answer(reason=response.json()["error"]["data"]["reason"])
        body = response.json()
        if "error" in body:
            return Answer(reason=body["error"]["data"]["reason"])
        return Answer(body["result"])

    def _tool(self, api_key: str, tool: str, arguments: dict[str, Any], shape: Callable[[dict], Any]) -> Answer:
        answer = self._rpc(api_key, "tools/call", {"name": tool, "arguments": arguments})
        if answer.reason is not None:
            return answer
        assert answer.value["isError"] is False, answer.value
        return Answer(shape(answer.value["structuredContent"]))

    def store(self, api_key, **fields) -> Answer:
        return self._tool(api_key, "store", fields, lambda r: r["node_id"])

    def recall(self, api_key, **fields) -> Answer:
        return self._tool(api_key, "recall", fields, lambda r: hits(r["results"]))

    def get(self, api_key, node_id) -> Answer:
        answer = self._rpc(api_key, "resources/read", {"uri": f"hyphae://cells/{node_id}"})
        return answer if answer.reason else Answer(cell(json.loads(answer.value["contents"][0]["text"])))

    forget = None  # not an MCP tool (seed 000); REST, gRPC and the CLI forget

    def inbox(self, api_key) -> Answer:
        return self._tool(api_key, "inbox", {}, lambda r: [d["node_id"] for d in r["diffs"]])


class Rest:
    name = "rest"

    def __init__(self, daemon: Daemon) -> None:
        self.http = httpx.Client(base_url=daemon.url, timeout=DEADLINE)

    def close(self) -> None:
        self.http.close()

    def _call(self, api_key, method, path, shape, **kwargs) -> Answer:
        response = self.http.request(method, path, headers={"x-hyphae-key": api_key}, **kwargs)
        if response.status_code >= 400:
            return Answer(reason=response.json()["error"]["reason"])
        return Answer(shape(response.json()))

    def store(self, api_key, **fields) -> Answer:
        return self._call(api_key, "POST", "/v1/cells", lambda r: r["node_id"], json=fields)

    def recall(self, api_key, **fields) -> Answer:
        return self._call(api_key, "POST", "/v1/recall", lambda r: hits(r["results"]), json=fields)

    def get(self, api_key, node_id) -> Answer:
        return self._call(api_key, "GET", f"/v1/cells/{node_id}", cell)

    def forget(self, api_key, node_id) -> Answer:
        return self._call(api_key, "DELETE", f"/v1/cells/{node_id}", lambda r: r["node_id"])

    def inbox(self, api_key) -> Answer:
        return self._call(api_key, "GET", "/v1/inbox", lambda r: [d["node_id"] for d in r["diffs"]])


class Grpc:
    name = "grpc"

    def __init__(self, daemon: Daemon) -> None:
        self._stub = stub(daemon.info["grpc_address"])
        self.memory = self._stub.__enter__()

    def close(self) -> None:
        self._stub.__exit__(None, None, None)

    def _call(self, api_key, rpc, request, shape) -> Answer:
        try:
            reply = getattr(self.memory, rpc)(request, metadata=key(api_key), timeout=DEADLINE)
        except grpc.RpcError as error:
            return Answer(reason=refusal(error).reason)
        return Answer(shape(as_dict(reply)))

    def store(self, api_key, **fields) -> Answer:
        return self._call(api_key, "Store", pb.StoreRequest(**fields), lambda r: r["node_id"])

    def recall(self, api_key, **fields) -> Answer:
        return self._call(api_key, "Recall", pb.RecallRequest(**fields), lambda r: hits(r.get("results", [])))

    def get(self, api_key, node_id) -> Answer:
        return self._call(api_key, "GetCell", pb.GetCellRequest(node_id=node_id), cell)

    def forget(self, api_key, node_id) -> Answer:
        return self._call(api_key, "Forget", pb.ForgetRequest(node_id=node_id), lambda r: r["node_id"])

    def inbox(self, api_key) -> Answer:
        return self._call(api_key, "Inbox", pb.InboxRequest(), lambda r: [d["node_id"] for d in r.get("diffs", [])])


class A2a:
    """A2A's JSON-RPC (``message/send``), each message a data part naming its skill and its
    arguments, as the SDK's client sends them (tests/e2e/test_a2a_surface.py drives the SDK itself)."""

    name = "a2a"

    def __init__(self, daemon: Daemon) -> None:
        self.http = httpx.Client(base_url=daemon.url, timeout=DEADLINE)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.http.close()

    def _skill(self, api_key: str, skill: str, arguments: dict[str, Any], shape: Callable[[dict], Any]) -> Answer:
        message = {"messageId": str(uuid.uuid4()), "role": "user", "kind": "message",
                   "parts": [{"kind": "data", "data": {"skill": skill, **arguments}}]}  # fmt: skip
        request = {"jsonrpc": "2.0", "id": next(self._ids), "method": "message/send", "params": {"message": message}}
        response = self.http.post("/a2a", json=request, headers={"x-hyphae-key": api_key})
        if response.status_code >= 400:  # refused before any JSON-RPC: the REST error body
            return Answer(reason=response.json()["error"]["reason"])
        body = response.json()
        if "error" in body:
            return Answer(reason=body["error"]["data"]["reason"])
        [data] = [part["data"] for part in body["result"]["parts"] if "data" in part]
        return Answer(shape(data))

    def store(self, api_key, **fields) -> Answer:
        return self._skill(api_key, "remember", fields, lambda r: r["node_id"])

    def recall(self, api_key, **fields) -> Answer:
        return self._skill(api_key, "recall", fields, lambda r: hits(r["results"]))

    get = None  # no skill reads one cell by id: recall answers with the content
    forget = None  # not a skill

    def inbox(self, api_key) -> Answer:
        return self._skill(api_key, "catch_up", {}, lambda r: [d["node_id"] for d in r["diffs"]])


SURFACES: dict[str, Callable[[Daemon], Any]] = {"mcp": Mcp, "rest": Rest, "grpc": Grpc, "a2a": A2a}

# operation -> surface -> the facade method it reaches (None: not offered on that surface).
# gRPC hydrates, so its recall is the facade's search (full cells), at layer L0 as recall is.
FACADE: dict[str, dict[str, str | None]] = {
    "store": {"mcp": "store", "rest": "store", "grpc": "store", "a2a": "store"},
    "recall": {"mcp": "recall", "rest": "recall", "grpc": "search", "a2a": "search"},
    "get": {"mcp": "get_cell", "rest": "get_cell", "grpc": "get_cell", "a2a": None},
    "forget": {"mcp": None, "rest": "forget", "grpc": "forget", "a2a": None},
    "inbox": {"mcp": "inbox", "rest": "inbox", "grpc": "inbox", "a2a": "inbox"},
}


def offering(node: "Node", operation: str) -> dict[str, Any]:
    """The surfaces that offer ``operation``; one that does not must say so with ``None``."""
    for name, surface in node.surfaces.items():
        assert (getattr(surface, operation) is None) == (FACADE[operation][name] is None), (name, operation)
    return {name: s for name, s in node.surfaces.items() if FACADE[operation][name] is not None}


# -- the node --------------------------------------------------------------------------------------


@dataclasses.dataclass
class Node:
    daemon: Daemon
    keys: dict[str, str]
    agent_ids: dict[str, str]
    surfaces: dict[str, Any]

    def counter(self, name: str, operation: str | None = None) -> float:
        text = self.daemon.client().get("/metrics").text
        label = f'{{operation="{operation}"}}' if operation else ""
        found = re.search(rf"^{name}_total{re.escape(label)} (\S+)$", text, re.MULTILINE)
        return float(found.group(1)) if found else 0.0


@pytest.fixture(scope="module")
def node(tmp_path_factory) -> Iterator[Node]:
    home = make_home(tmp_path_factory.mktemp("surfaces") / "home")
    keys = prepare_agents(home, "alice", "bob")
    daemon = start_daemon(home, "--a2a")
    surfaces: dict[str, Any] = {}
    try:
        keys["carol"] = add_agent(home, "carol", "alpha")  # reads project alpha only
        agent_ids = {name: daemon.client(k).get("/v1/whoami").json()["agent_id"] for name, k in keys.items()}
        daemon.client(keys["bob"]).post("/v1/beacons", json={"query": "the cache is redis", "threshold": 0.1})
        # MCP's store has no project argument (a session places cells): alice's stores go to beta on every surface.
        daemon.client(keys["alice"]).post("/v1/sessions", json={"project": "beta"}).raise_for_status()
        surfaces = {name: make(daemon) for name, make in SURFACES.items()}
        yield Node(daemon, keys, agent_ids, surfaces)
    finally:
        for surface in surfaces.values():
            surface.close()
        daemon.stop()


QUERY = "which cache does the beta service use"


def stored_by_every_surface(node: Node) -> dict[str, str]:
    """One cell stored through each surface (memoised on the node: the tests share it)."""
    if not hasattr(node, "stored"):
        stored = {}
        for name, surface in node.surfaces.items():
            before = node.counter("hyphae_stores")
            answer = surface.store(node.keys["alice"], content=f"the beta service's cache is redis (via {name})",
                                   cell_type="Fact")  # in project beta: alice's open session places it
            assert answer.reason is None, (name, answer)
            assert node.counter("hyphae_stores") == before + 1, f"{name}'s store did not reach the facade's store once"
            stored[name] = answer.value
        node.stored = stored
    return node.stored


def test_a_cell_stored_through_any_surface_reads_the_same_through_every_surface(node: Node) -> None:
    stored = stored_by_every_surface(node)
    for writer, node_id in stored.items():
        views = {name: surface.get(node.keys["alice"], node_id) for name, surface in offering(node, "get").items()}
        assert all(view.reason is None for view in views.values()), views
        first = views["rest"].value
        assert all(view.value == first for view in views.values()), views
        assert first["source_agent"] == node.agent_ids["alice"] and first["project"] == "beta"
        assert first["content"].endswith(f"(via {writer})")


def test_recall_gives_the_same_hits_and_reaches_the_facade_method_of_its_row(node: Node) -> None:
    stored = stored_by_every_surface(node)
    answers = {}
    for name, surface in node.surfaces.items():
        method = FACADE["recall"][name]
        before = node.counter("hyphae_recalls", method)
        answers[name] = surface.recall(node.keys["alice"], query=QUERY, k=5)
        assert node.counter("hyphae_recalls", method) == before + 1, f"{name}'s recall did not reach {method}"
    assert all(answer.reason is None for answer in answers.values()), answers
    first = next(iter(answers.values())).value
    assert all(answer.value == first for answer in answers.values()), answers
    assert set(stored.values()) <= {node_id for node_id, _ in first}


def test_the_inbox_is_the_same_through_every_surface(node: Node) -> None:
    stored = stored_by_every_surface(node)
    answers = {name: surface.inbox(node.keys["bob"]) for name, surface in node.surfaces.items()}
    first = next(iter(answers.values()))
    assert first.reason is None and set(stored.values()) <= set(first.value)
    assert all(answer == first for answer in answers.values()), answers


def test_forget_through_each_surface_that_offers_it_reads_forgotten_everywhere(node: Node) -> None:
    for name, surface in offering(node, "forget").items():
        node_id = surface.store(node.keys["alice"], content=f"a cell to forget (via {name})", cell_type="Fact").value
        assert surface.forget(node.keys["bob"], node_id).reason == "forbidden"  # only its author forgets it
        assert surface.forget(node.keys["alice"], node_id) == Answer(node_id)
        for reader, other in offering(node, "get").items():
            view = other.get(node.keys["alice"], node_id)
            assert view.reason is None and view.value["status"] == "forgotten", (name, reader, view)


# Each refusal: operation, key, arguments, and the reason on each surface. The reason is the
# same everywhere, but for one rule of MCP's resources: a cell outside the key's scope reads as
# not_found there, as an absent one does (mcp_bridge.resources).
REFUSALS = [
    ("store", "alice", {"content": "a hunch", "cell_type": "Hunch"}, "invalid_argument"),
    ("recall", "alice", {"query": ""}, "invalid_argument"),
    ("recall", "carol", {"query": QUERY, "project": "beta"}, "forbidden"),
    ("get", "carol", "beta-cell", {"mcp": "not_found", "default": "forbidden"}),
    ("get", "alice", "01a24a14-7e57-7670-914a-ddd92168b13b", "not_found"),
    ("recall", "hy_not_a_key", {"query": QUERY}, "unauthenticated"),
    ("inbox", "hy_not_a_key", None, "unauthenticated"),
]


@pytest.mark.parametrize(("operation", "who", "arguments", "reason"), REFUSALS)
def test_every_surface_refuses_alike_and_changes_nothing(node: Node, operation, who, arguments, reason) -> None:
    stored = stored_by_every_surface(node)
    api_key = node.keys.get(who, who)
    before = node.surfaces["rest"].recall(node.keys["alice"], query=QUERY, k=10)
    for name, surface in offering(node, operation).items():
        call = getattr(surface, operation)
        if operation == "get":
            answer = call(api_key, stored["rest"] if arguments == "beta-cell" else arguments)
        elif arguments is None:
            answer = call(api_key)
        else:
            answer = call(api_key, **arguments)
        expected = reason if isinstance(reason, str) else reason.get(name, reason["default"])
        assert answer.reason == expected, (name, operation, answer)
    assert node.surfaces["rest"].recall(node.keys["alice"], query=QUERY, k=10) == before
