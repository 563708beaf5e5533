"""The official MCP Python SDK as a client of a real node, over stdio and over HTTP.

The SDK is a *test* dependency (DESIGN §2: no SDK in the product). The version pinned
in ``pyproject.toml`` is the newest major, 2.x: its ``Client`` probes ``server/discover``
before falling back to ``initialize``, so these tests also show that a node answers the
probe with a refusal: -32601 over stdio; over HTTP the probe carries ``MCP-Protocol-Version:
2026-07-28``, which is answered 400 before the method is read. (A server that ignored the
probe would cost every connection the SDK's 10 s probe timeout; here that timeout is raised
to an hour, so an unanswered probe trips the test's hang guard instead of being timed.) The
older 1.x line, which most hosts still ship, gets its own test (connect, list, store, recall,
follow a resource_link, the prompts, a bad argument) in a throwaway virtualenv (cached under pytest's cache dir), since one environment cannot hold
both majors.

Both SDK scenarios run inside plain sync tests: pytest-trio owns ``async def`` tests, and
the SDK brings its own event loop (anyio): stdio under asyncio (what most hosts use),
HTTP under trio (what the node itself runs on).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2  # the SDK's own HTTP client (a dependency of mcp 2.x)
import mcp
import mcp.client.session
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from tests.mcp_contract import ANNOTATIONS

from .conftest import DEADLINE, Daemon, add_agents, make_home, start_daemon, stop_process

OLD_SDK = "mcp==1.30.0"  # the last 1.x release

# One standing interest per transport, far apart in meaning, so neither run feeds the other's inbox.
TOPICS = {"stdio": "deploys go through the staging cluster first", "http": "the mobile app ships every second Thursday"}


@pytest.fixture
def unanswered_probe_hangs(monkeypatch) -> None:
    """The 2.x client waits ``DISCOVER_TIMEOUT_SECONDS`` for an answer to ``server/discover``
    and then falls back to ``initialize``: an hour instead of 10 s, so a node that ignored the
    probe would run into the scenario's hang guard rather than connect slowly."""
    monkeypatch.setattr(mcp.client.session, "DISCOVER_TIMEOUT_SECONDS", 3600.0)


@pytest.fixture(scope="module")
def sdk_node(tmp_path_factory) -> Any:
    """One daemon for this module; ``alice``/``carol`` drive the SDK, ``bob`` feeds their inboxes."""
    home = make_home(tmp_path_factory.mktemp("sdk") / "home")
    daemon = start_daemon(home)
    try:
        keys = add_agents(home, "alice", "bob", "carol")
        yield daemon, keys
    finally:
        daemon.stop()


PROMPTS = {
    "catch_up": {},
    "check_team_history": {"topic": "where the build cache lives"},
    "record_decision": {"decision": "Keep the build cache on NFS.", "rationale": "Every runner mounts it."},
}


def _payload(result: Any) -> dict[str, Any]:
    """structuredContent of a successful call, checked against its text block (recall and
    query add one resource_link per hit after it)."""
    assert result.is_error is False
    text, *links = result.content
    assert text.type == "text" and json.loads(text.text) == result.structured_content
    assert all(link.type == "resource_link" for link in links)
    return result.structured_content


async def _read_back(client: Client, node_id: str, content: str) -> None:
    """Recall's resource_link for a hit, followed with resources/read, gives the cell."""
    recalled = await client.call_tool("recall", {"query": content, "k": 3})
    links = [block for block in recalled.content if block.type == "resource_link"]
    assert len(links) == len(recalled.structured_content["results"])
    link = links[0]
    assert str(link.uri) == f"hyphae://cells/{node_id}" and content.startswith(link.description.rstrip("…"))
    read = await client.read_resource(str(link.uri))
    [contents] = read.contents
    assert contents.mime_type == "application/json"
    cell = json.loads(contents.text)
    assert cell["node_id"] == node_id and cell["content"] == content

    listed = await client.list_resources()
    assert {"hyphae://inbox", "hyphae://beacons", f"hyphae://cells/{node_id}"} <= {str(r.uri) for r in listed.resources}
    templates = await client.list_resource_templates()
    assert {t.uri_template for t in templates.resource_templates} == {"hyphae://cells/{node_id}",
                                                                      "hyphae://scenes/{scene_id}"}


async def _prompts_and_a_bad_argument(client: Client) -> None:
    prompts = await client.list_prompts()
    assert [prompt.name for prompt in prompts.prompts] == list(PROMPTS)
    for name, arguments in PROMPTS.items():
        got = await client.get_prompt(name, arguments)
        assert got.messages and got.messages[0].content.type == "text", name

    bad = await client.call_tool("recall", {"query": "anything", "k": 1000})
    assert bad.is_error is True  # SEP-1303: the model sees it and corrects its call
    assert "argument 'k'" in bad.content[0].text


async def _exercise(client: Client, daemon: Daemon, bob_key: str, tag: str) -> None:
    """The 11 tools, in the order an agent meets them, through an SDK ``Client``."""
    assert client.protocol_version == "2025-11-25"
    assert client.server_info.name == "hyphae"

    listed = await client.list_tools()
    assert {tool.name for tool in listed.tools} == set(ANNOTATIONS)
    assert len(listed.tools) == 11
    for tool in listed.tools:
        hints = tool.annotations
        assert hints is not None, tool.name
        stated = (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
        assert None not in stated, f"{tool.name} leaves a hint out: {hints}"
        assert stated == (*ANNOTATIONS[tool.name], False), tool.name
        assert not {"source_agent", "tenant_id"} & set(tool.input_schema.get("properties", {}))

    content = f"[{tag}] The build cache lives on the shared NFS volume."
    stored = _payload(await client.call_tool("store", {"content": content, "cell_type": "Fact", "salience": 0.7}))
    assert set(stored) == {"node_id"}
    node_id = stored["node_id"]

    recalled = _payload(await client.call_tool("recall", {"query": content, "k": 5}))
    assert set(recalled) == {"results"}
    assert recalled["results"][0]["node_id"] == node_id
    assert all(set(hit) == {"node_id", "distance"} for hit in recalled["results"])
    await _read_back(client, node_id, content)
    await _prompts_and_a_bad_argument(client)

    queried = _payload(await client.call_tool("query", {"query": content, "layer": "L0", "k": 3}))
    assert queried["results"][0]["node_id"] == node_id
    assert all(set(hit) == {"node_id", "distance"} for hit in queried["results"])

    project = f"e2e-{tag}"
    session = _payload(await client.call_tool("start_session", {"project": project, "title": "SDK walk"}))
    assert set(session) == {"session_id", "scene_id"}
    in_scene = _payload(await client.call_tool("store", {"content": f"[{tag}] Scene note.", "cell_type": "Context"}))
    ended = _payload(await client.call_tool("end_session", {"session_id": session["session_id"]}))
    assert ended["session_id"] == session["session_id"]
    assert ended["cell_count"] == 1 and isinstance(ended["ended_at"], int)

    beacon = _payload(await client.call_tool("place_beacon", {"query": TOPICS[tag]}))
    assert set(beacon) == {"beacon_id"}
    beacons = _payload(await client.call_tool("list_beacons", {}))
    assert [b["beacon_id"] for b in beacons["beacons"]] == [beacon["beacon_id"]]

    # Another agent stores what the beacon asks for; it lands in this agent's inbox.
    with daemon.client(bob_key) as rest:
        response = rest.post("/v1/cells", json={"content": TOPICS[tag].capitalize() + ".", "cell_type": "Decision"})
        assert response.status_code == 201, response.text
        delivered_id = response.json()["node_id"]

    inbox = _payload(await client.call_tool("inbox", {}))
    assert set(inbox) == {"diffs", "next_since"}
    assert [d["node_id"] for d in inbox["diffs"]] == [delivered_id]
    diff = inbox["diffs"][0]
    assert diff["content"] == TOPICS[tag].capitalize() + "." and diff["beacon_id"] == beacon["beacon_id"]
    assert inbox["next_since"] == diff["received_at"]

    scene = _payload(await client.call_tool("get_scene", {"scene_id": session["scene_id"]}))
    assert scene["scene_id"] == session["scene_id"] and scene["project"] == project
    assert scene["cell_ids"] == [in_scene["node_id"]] and scene["ended_at"] == ended["ended_at"]

    scenes = _payload(await client.call_tool("list_scenes", {"project": project}))
    assert [s["scene_id"] for s in scenes["scenes"]] == [session["scene_id"]]
    assert scenes["next_cursor"] is None

    pulled = _payload(await client.call_tool("pull_inbox", {"limit": 10}))
    assert set(pulled) == {"diffs", "cursor", "remaining"}
    assert [d["node_id"] for d in pulled["diffs"]] == [delivered_id] and pulled["remaining"] == 0
    again = _payload(await client.call_tool("pull_inbox", {}))
    assert again["diffs"] == [] and again["cursor"] == pulled["cursor"]


def test_sdk_over_stdio(sdk_node, unanswered_probe_hangs) -> None:
    daemon, keys = sdk_node
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "app.cli", "--home", str(daemon.home), "mcp"],
        env={"HYPHAE_API_KEY": keys["alice"]},
    )

    async def scenario() -> float:
        with anyio.fail_after(DEADLINE * 2):
            started = time.monotonic()
            async with Client(params, read_timeout_seconds=DEADLINE) as client:
                connect_time = time.monotonic() - started
                await _exercise(client, daemon, keys["bob"], "stdio")
            return connect_time

    connect_time = asyncio.run(scenario())
    # Printed, not asserted (it includes starting `hyphae mcp`, a Python process): `pytest -rP` shows it.
    print(f"SDK over stdio connected in {connect_time:.2f} s")


def test_sdk_over_streamable_http(sdk_node, unanswered_probe_hangs) -> None:
    daemon, keys = sdk_node

    sent: list[tuple[str, str | None]] = []  # (JSON-RPC method, MCP-Protocol-Version header)

    async def record(request) -> None:
        body = json.loads(request.content or b"{}")
        sent.append((body.get("method"), request.headers.get("mcp-protocol-version")))

    async def scenario() -> float:
        with anyio.fail_after(DEADLINE * 2):
            async with httpx2.AsyncClient(headers={"x-hyphae-key": keys["carol"]}, timeout=DEADLINE,
                                          event_hooks={"request": [record]}) as http:
                started = time.monotonic()
                async with Client(streamable_http_client(daemon.mcp_url, http_client=http),
                                  read_timeout_seconds=DEADLINE) as client:
                    connect_time = time.monotonic() - started
                    await _exercise(client, daemon, keys["bob"], "http")
            return connect_time

    connect_time = anyio.run(scenario, backend="trio")
    methods = [method for method, _ in sent]
    assert methods[:3] == ["server/discover", "initialize", "notifications/initialized"], sent[:4]
    assert all(version == "2025-11-25" for method, version in sent[2:]), sent  # what was negotiated
    print(f"SDK over HTTP connected in {connect_time:.2f} s")  # `pytest -rP` shows it


def test_sdk_over_http_refuses_a_bad_key(sdk_node) -> None:
    daemon, _ = sdk_node

    async def scenario() -> None:
        with anyio.fail_after(DEADLINE):
            async with httpx2.AsyncClient(headers={"x-hyphae-key": "hy_not-a-key"}, timeout=DEADLINE) as http:
                async with Client(streamable_http_client(daemon.mcp_url, http_client=http)):
                    pass

    with pytest.raises((mcp.MCPError, BaseExceptionGroup)) as raised:  # anyio may wrap it in task groups
        anyio.run(scenario, backend="trio")
    errors = _leaves(raised.value)
    assert any(isinstance(e, mcp.MCPError) and e.code == -32001 for e in errors), errors


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


# -- the older SDK line, in a throwaway virtualenv ------------------------------------------

_OLD_SDK_CLIENT = textwrap.dedent(
    """
    import json, sys, time
    import anyio
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamablehttp_client

    server_python, home, url, key = sys.argv[1:5]

    async def use(session):
        init = await session.initialize()
        tools = await session.list_tools()
        content = "The 1.x client reads what it recalls: " + str(time.monotonic())
        stored = await session.call_tool("store", {"content": content, "cell_type": "Fact"})
        recalled = await session.call_tool("recall", {"query": content, "k": 3})
        links = [b for b in recalled.content if b.type == "resource_link"]
        read = await session.read_resource(links[0].uri)
        prompts = await session.list_prompts()
        got = [await session.get_prompt(p.name, {a.name: "x" for a in p.arguments or [] if a.required})
               for p in prompts.prompts]
        bad = await session.call_tool("recall", {"query": "anything", "k": 1000})
        return {"version": init.protocolVersion, "tools": sorted(t.name for t in tools.tools),
                "recall": recalled.structuredContent, "error": recalled.isError,
                "stored": stored.structuredContent["node_id"], "link": str(links[0].uri),
                "read": json.loads(read.contents[0].text)["content"] == content,
                "prompts": [p.name for p in prompts.prompts], "prompt_messages": [len(g.messages) for g in got],
                "bad_is_error": bad.isError, "bad_text": bad.content[0].text}

    async def main():
        report = {}
        started = time.monotonic()
        params = StdioServerParameters(command=server_python, args=["-m", "app.cli", "--home", home, "mcp"],
                                       env={"HYPHAE_API_KEY": key})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                report["stdio"] = await use(session)
        report["stdio_seconds"] = time.monotonic() - started
        started = time.monotonic()
        async with streamablehttp_client(url, headers={"x-hyphae-key": key}) as (read, write, _):
            async with ClientSession(read, write) as session:
                report["http"] = await use(session)
        report["http_seconds"] = time.monotonic() - started
        print(json.dumps(report))

    anyio.run(main)
    """
)


def _old_sdk_python(cache_dir: Path) -> Path:
    """A virtualenv with the 1.x SDK, made once and reused from pytest's cache.

    It sees this environment's packages (``--system-site-packages``), so only the SDK
    and the few dependencies we lack are installed: ~5 s once, instead of ~40 s for a
    clean environment. Its own site-packages come first, so its ``mcp`` shadows ours.
    """
    venv = cache_dir / "venv"
    python = venv / "bin" / "python"
    marker = venv / "installed.txt"
    if marker.exists() and marker.read_text() == OLD_SDK and python.exists():
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, timeout=120, capture_output=True)
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", OLD_SDK],
        timeout=300, capture_output=True, text=True,
    )
    if install.returncode != 0:
        pytest.fail(f"could not install {OLD_SDK} into a throwaway venv:\n{install.stderr[-2000:]}")
    marker.write_text(OLD_SDK)
    return python


def _cache_dir(request, tmp_path_factory, name: str) -> Path:
    """pytest's cache dir (kept between runs), or a temporary one under ``-p no:cacheprovider``."""
    cache = getattr(request.config, "cache", None)
    return Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)


def test_older_sdk_line_connects_and_recalls(sdk_node, request, tmp_path_factory) -> None:
    daemon, keys = sdk_node
    python = _old_sdk_python(_cache_dir(request, tmp_path_factory, "hyphae-e2e-" + OLD_SDK.replace("==", "-")))
    version = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('mcp'))"],
                             capture_output=True, text=True, timeout=DEADLINE, check=True).stdout.strip()
    assert version == OLD_SDK.split("==")[1]

    script = _cache_dir(request, tmp_path_factory, "hyphae-e2e-scripts") / "old_sdk_client.py"
    script.write_text(_OLD_SDK_CLIENT)
    started = time.monotonic()
    process = subprocess.Popen(
        [str(python), str(script), sys.executable, str(daemon.home), daemon.mcp_url, keys["alice"]],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if k != "HYPHAE_API_KEY"},
    )
    try:
        out, err = process.communicate(timeout=120)  # a hang guard only
    finally:
        stop_process(process)
    elapsed = time.monotonic() - started
    assert process.returncode == 0, err[-3000:]
    report = json.loads(out.strip().splitlines()[-1])
    for transport in ("stdio", "http"):
        assert report[transport]["version"] == "2025-11-25"
        assert report[transport]["tools"] == sorted(ANNOTATIONS)
        assert report[transport]["error"] is False
        assert isinstance(report[transport]["recall"]["results"], list)
        assert report[transport]["link"] == f"hyphae://cells/{report[transport]['stored']}"
        assert report[transport]["read"] is True
        assert report[transport]["prompts"] == list(PROMPTS) and report[transport]["prompt_messages"] == [1, 1, 1]
        assert report[transport]["bad_is_error"] is True and "argument 'k'" in report[transport]["bad_text"]
    # interpreter + SDK import + `hyphae mcp` start, both transports; `pytest -rP` shows it
    print(f"the 1.x SDK over both transports: {elapsed:.2f} s (stdio {report['stdio_seconds']:.2f} s)")
