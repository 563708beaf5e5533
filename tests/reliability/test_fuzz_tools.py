"""Fuzz every tool's arguments on both MCP transports, against the real facade.

The node is real (``open_node`` on a fresh data dir, SQLite, HNSW, the hashed embedder);
the transports are the product's own, in process: the API port's ASGI app (REST plus
``POST /mcp``, exactly as the daemon composes them) driven one exchange at a time, and
the stdio loop (``serve_stdio``) over in-memory streams with ``Dispatcher.bind``; and a
shorter run of the same cases goes through real processes: ``hyphae mcp`` relaying to
``hyphae up``, as an editor runs them.

Each case is one ``tools/call`` whose tool is drawn from the tool table and whose
arguments are drawn per property from the tool's own ``inputSchema``: a plausible
value (enums, the ids of real sessions and scenes, bounds and one past them, long and
odd text, a lone surrogate) or any JSON value at all, plus unknown and identity keys,
and arguments that are not an object. The invariants, checked on every case:

* the exchange completes: HTTP 200 with a JSON-RPC response carrying the request's id,
  or exactly one stdio line with it;
* success, or an error a client can act on (a stable code and ``data.reason``); never
  ``internal`` (-32603), never a 5xx;
* a rejected call changes nothing: cells, beacons, sessions, scenes, inbox rows,
  idempotency keys and pull cursors are counted before and after;
* the node keeps serving: after the run, ``ping`` and a valid ``store`` work on both.

Hypothesis runs in a worker thread and hands each call back to the trio loop that owns
the node (``trio.from_thread``), so the whole run shares one node, as real agents do.
"""

from __future__ import annotations

import itertools
import json
import os
from typing import Any

import pytest
import trio
from hypothesis import strategies as st

from mcp_bridge import Dispatcher, make_mcp_app, serve_stdio
from mcp_bridge.tools import TOOLS
from api.rest import RestApi, make_api_app
from node.embedding import HashedEmbedder
from app.home import open_node
from node.ratelimit import RateLimiter
from tests.mcp_bridge.fakes import asgi_request
from tests.mcp_bridge.test_stdio import CollectingStdout, ScriptedStdin

from .fuzz import check_error, count, fuzz_report, json_values, run_given  # noqa: F401 (fixture)

CI_EXAMPLES = 200  # per transport
ODD_TEXT = ("", " ", "\x00", "\ud800 a lone surrogate", "\u202e right-to-left", "Z" * 70_000, "é" * 40_000, "{}",
            "'; DROP TABLE cells; --", "2026-13-45T99:99:99Z", "-1", "1e309")  # fmt: skip
COUNTED = ("cells", "beacons", "sessions", "scenes", "inbox", "idempotency", "pull_cursors")


@pytest.fixture
async def node(tmp_path):
    from app.home import init_home

    home = tmp_path / "home"
    init_home(home)
    async with open_node(home, embedder=HashedEmbedder()) as service:
        service.rate_limiter = RateLimiter(0, 1)  # thousands of calls in seconds: not what this tests
        alice, alice_key = await service.add_agent("alice")
        scoped, scoped_key = await service.add_agent("scoped", ["alpha"])
        session = await service.start_session(alice, project="alpha", title="fuzz")
        other = await service.start_session(scoped, project="alpha")
        await service.end_session(scoped, session_id=other["session_id"])
        stored = await service.store(alice, content="A cell that exists.", cell_type="Fact")
        ids = [session["session_id"], session["scene_id"], other["session_id"], other["scene_id"], stored["node_id"]]
        yield service, {"alice": (alice, alice_key), "scoped": (scoped, scoped_key)}, ids


# -- strategies -----------------------------------------------------------------------------


WORDS = st.text(st.sampled_from("abcdefghij klmnop.,-"), min_size=1, max_size=80).filter(str.strip)


def conforming(schema: dict[str, Any], ids: list[str]) -> st.SearchStrategy:
    """Values the schema accepts (so the call reaches the facade's own checks)."""
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return st.one_of([conforming({**schema, "type": kind}, ids) for kind in kinds])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    if kinds == "string":
        if schema.get("format") == "uuid" or "id" in schema.get("description", ""):
            return st.sampled_from(ids) | st.uuids().map(str)
        if schema.get("format") == "date-time":
            return st.datetimes().map(lambda when: when.isoformat() + "Z")
        return WORDS | st.sampled_from(["alpha", "beta"])
    if kinds == "integer":
        return st.integers(schema.get("minimum", 0), schema.get("maximum", 10**13))
    if kinds == "number":
        return st.floats(schema.get("minimum", -1e6), schema.get("maximum", 1e6), allow_nan=False)
    if kinds == "array":
        return st.lists(conforming(schema.get("items", {}), ids), min_size=schema.get("minItems", 0), max_size=3)
    if kinds == "object":
        properties = schema.get("properties", {})
        if properties or schema.get("additionalProperties") is False:
            required = set(schema.get("required", ()))
            return st.fixed_dictionaries(
                {n: conforming(s, ids) for n, s in properties.items() if n in required},
                optional={n: conforming(s, ids) for n, s in properties.items() if n not in required},
            )
        return st.dictionaries(st.text(max_size=10), json_values(4), max_size=5)
    return json_values()


def plausible(schema: dict[str, Any], ids: list[str]) -> st.SearchStrategy:
    """Values near what the schema asks for, and just past it."""
    kinds = schema.get("type")
    if isinstance(kinds, list):
        return st.one_of([plausible({**schema, "type": kind}, ids) for kind in kinds])
    odd = st.integers(0, len(ODD_TEXT) - 1).map(ODD_TEXT.__getitem__)  # by index: a short repr
    if kinds == "string":
        return conforming(schema, ids) | st.text(max_size=40) | odd
    if kinds == "integer":
        low, high = schema.get("minimum", -10), schema.get("maximum", 10_000)
        return st.integers(low - 3, high + 3) | st.sampled_from([0, -1, 2**63, -(2**63) - 1, 10**30])
    if kinds == "number":
        return st.floats(-1.5, 2.5, allow_nan=False) | st.sampled_from([1e308, -1e308, 5e-324])
    if kinds == "array":
        return st.lists(plausible(schema.get("items", {}), ids) | json_values(2), max_size=5)
    if kinds == "object":
        return conforming(schema, ids) | st.just(20_000).map(lambda size: {"x": "y" * size}) | json_values(3)
    return json_values()


def arguments_for(tool, ids: list[str]) -> st.SearchStrategy:
    """Mostly well-formed calls (so the facade's own checks are reached), then hostile ones."""
    properties = tool.input_schema["properties"]
    well_formed = conforming(tool.input_schema, ids)
    hostile = st.fixed_dictionaries({}, optional={n: plausible(s, ids) | json_values(3) for n, s in properties.items()})
    extra = st.dictionaries(st.sampled_from(["tenant_id", "source_agent", "extra", "node_id", ""]), json_values(2),
                            min_size=1, max_size=2)  # fmt: skip
    with_extra = st.tuples(well_formed, extra).map(lambda pair: {**pair[0], **pair[1]})
    weighted = [well_formed] * 6 + [hostile] * 2 + [with_extra, json_values(4)]
    return st.sampled_from(weighted).flatmap(lambda strategy: strategy)


def calls(ids: list[str], principals: tuple[str, ...] = ("alice", "scoped")) -> st.SearchStrategy:
    """(principal name, (tool name, the tools/call params))."""
    per_tool = [  # built once: strategies made inside a flatmap are rebuilt on every draw
        arguments_for(tool, ids).map(lambda arguments, name=tool.name: (name, {"name": name, "arguments": arguments}))
        for tool in TOOLS
    ]
    params = st.sampled_from(per_tool).flatmap(lambda strategy: strategy)
    broken = st.tuples(st.just("(malformed params)"), st.one_of(
        st.dictionaries(st.sampled_from(["name", "arguments", "_meta"]), json_values(3), max_size=3),
        st.fixed_dictionaries({"name": st.text(max_size=20) | json_values(2)}),
    ))  # fmt: skip
    return st.tuples(st.sampled_from(principals), st.sampled_from([params] * 9 + [broken]).flatmap(lambda s: s))


# -- the invariants ----------------------------------------------------------------------


def snapshot(service) -> tuple[int, ...]:
    return tuple(service.db.query_one(f"SELECT COUNT(*) FROM {table}")[0] for table in COUNTED)


def check_response(response: dict[str, Any], request_id: int, service, before: tuple[int, ...]) -> str:
    assert response.get("jsonrpc") == "2.0" and response.get("id") == request_id, response
    if "result" in response:
        result = response["result"]
        assert result["isError"] is False and isinstance(result["structuredContent"], dict), result
        assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
        return "ok"
    reason = check_error(response["error"])
    if os.environ.get("HYPHAE_FUZZ_DEBUG"):
        print(response["error"]["message"][:150])
    after = snapshot(service)
    assert after == before, f"a rejected call changed {dict(zip(COUNTED, zip(before, after)))}: {response}"
    return reason


def message(request_id: int, params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}).encode()


def fuzz(service, strategy, target: str, exchange, ci_examples: int) -> None:
    """Run the cases in a worker thread; ``exchange(principal_name, body, id)`` runs on the trio loop."""
    ids = itertools.count(1)

    def one(case) -> None:
        who, (tool_name, params) = case
        request_id = next(ids)
        before = trio.from_thread.run_sync(snapshot, service)
        response = trio.from_thread.run(exchange, who, message(request_id, params), request_id)
        outcome = trio.from_thread.run_sync(check_response, response, request_id, service, before)
        count(target)
        count(f"{target} {tool_name} {outcome}")

    run_given(strategy, one, ci_examples)


# -- the two transports ------------------------------------------------------------------


async def test_every_tools_arguments_over_http(node, fuzz_report) -> None:
    service, principals, ids = node
    app = make_api_app(RestApi(service, "admin-token"), {"/mcp": make_mcp_app(Dispatcher(service, server_version="0"),
                                                                               service.authenticate)})  # fmt: skip

    async def exchange(who: str, body: bytes, request_id: int) -> dict[str, Any]:
        headers = {"x-hyphae-key": principals[who][1], "content-type": "application/json"}
        with trio.fail_after(30):
            result = await asgi_request(app, headers=headers, body=body)
        assert result.status == 200, (result.status, result.body[:500])
        return result.json()

    await trio.to_thread.run_sync(fuzz, service, calls(ids), "mcp http tools/call", exchange, CI_EXAMPLES)
    assert (await exchange("alice", json.dumps({"jsonrpc": "2.0", "id": 0, "method": "ping"}).encode(), 0))["result"] == {}
    good = {"name": "store", "arguments": {"content": "Still serving after the fuzz.", "cell_type": "Fact"}}
    assert "node_id" in (await exchange("alice", message(-1, good), -1))["result"]["structuredContent"]


async def test_every_tools_arguments_over_stdio(node, fuzz_report) -> None:
    service, principals, ids = node
    dispatcher = Dispatcher(service, server_version="0")

    async def exchange(who: str, body: bytes, request_id: int) -> dict[str, Any]:
        stdout = CollectingStdout()
        with trio.fail_after(30):
            await serve_stdio(dispatcher.bind(principals[who][0]), stdin=ScriptedStdin([body + b"\n"]), stdout=stdout)
        (line,) = bytes(stdout.data).splitlines()  # exactly one response line
        return json.loads(line)

    await trio.to_thread.run_sync(fuzz, service, calls(ids), "mcp stdio tools/call", exchange, CI_EXAMPLES)
    assert (await exchange("alice", json.dumps({"jsonrpc": "2.0", "id": 0, "method": "ping"}).encode(), 0))["result"] == {}
    good = {"name": "store", "arguments": {"content": "Still serving after the stdio fuzz.", "cell_type": "Fact"}}
    assert "node_id" in (await exchange("scoped", message(-1, good), -1))["result"]["structuredContent"]


# -- the same cases through real processes: `hyphae mcp` relaying to `hyphae up` ---------------


def test_every_tools_arguments_through_a_real_hyphae_mcp(tmp_path, fuzz_report) -> None:
    """The stdio relay an editor launches, its daemon, their own processes: the same invariants."""
    import contextlib
    import sqlite3

    from tests.e2e.conftest import StdioSession, make_home, prepare_agents, start_daemon, tool_payload

    home = make_home(tmp_path / "home")
    keys = prepare_agents(home, "alice")
    daemon = start_daemon(home)
    session = StdioSession(home, keys["alice"])
    try:
        session.initialize()
        started = tool_payload(session.call("start_session", {"project": "alpha"}))
        stored = tool_payload(session.call("store", {"content": "A cell that exists.", "cell_type": "Fact"}))
        ids = [started["session_id"], started["scene_id"], stored["node_id"]]

        def counts() -> tuple[int, ...]:
            with contextlib.closing(sqlite3.connect(f"file:{home / 'hyphae.db'}?mode=ro", uri=True)) as db:
                return tuple(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] for table in COUNTED)

        def one(case) -> None:
            _, (tool_name, params) = case
            before = counts()
            response = session.request("tools/call", params)  # asserts the id pairs up
            if "error" in response:
                reason = check_error(response["error"])
                assert counts() == before, response
            elif response["result"]["isError"]:  # SEP-1303: a bad argument under 2025-11-25
                (block,) = response["result"]["content"]
                assert block["type"] == "text" and block["text"].startswith(f"{tool_name}: "), response
                assert counts() == before, response
                reason = "tool_error"
            else:
                tool_payload(response)
                reason = "ok"
            count("real hyphae mcp tools/call")
            count(f"real hyphae mcp tools/call {tool_name} {reason}")

        run_given(calls(ids, ("alice",)), one, 50)
        assert session.request("ping")["result"] == {}
        assert session.process.poll() is None
    finally:
        session.stop()
        daemon.stop()
