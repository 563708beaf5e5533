"""``hyphae mcp`` as an MCP host runs it: a subprocess speaking newline-delimited JSON-RPC.

Raw lines in, raw lines out, so the framing itself is under test: stdout carries
JSON-RPC and nothing else, the key is checked before anything is served, EOF ends the
process cleanly, a key revoked mid-session stops working on the next call while the
process keeps answering, and with no daemon running ``hyphae mcp`` starts one that
outlives it.
"""

from __future__ import annotations

import json

from collections.abc import Iterator

import httpx
import pytest

from .conftest import (
    DEADLINE,
    Daemon,
    StdioSession,
    add_agent,
    make_home,
    pid_alive,
    read_daemon_json,
    run_cli,
    start_daemon,
    tool_payload,
)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory) -> Iterator[Daemon]:
    """One node for the tests that need a running daemon (each uses its own agents)."""
    running = start_daemon(make_home(tmp_path_factory.mktemp("stdio") / "home"))
    try:
        yield running
    finally:
        running.stop()


def test_stdout_carries_only_json_rpc(daemon) -> None:
    key = add_agent(daemon.home, "alice")
    session = StdioSession(daemon.home, key)
    try:
        session.send({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-06-18", "capabilities": {}}})
        session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        session.send(b"")  # a blank line is skipped
        session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        session.send({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "store", "arguments": {"content": "Line one.\nLine two.", "cell_type": "Fact"}}})
        session.send(b'{"jsonrpc": "2.0", "id": 4, "method": ')  # malformed
        session.send({"jsonrpc": "2.0", "id": 5, "method": "server/discover"})
        session.send({"jsonrpc": "2.0", "id": "six", "method": "ping"})
        session.close_stdin()
        lines = []
        while (line := session.recv_line()) is not None:
            lines.append(line)
        assert session.wait() == 0
    finally:
        session.stop()

    assert all(line.endswith(b"\n") and line.count(b"\n") == 1 for line in lines)
    messages = [json.loads(line) for line in lines]
    assert all(m["jsonrpc"] == "2.0" and ("result" in m) != ("error" in m) for m in messages)
    by_id = {m["id"]: m for m in messages}
    assert len(messages) == 6 and set(by_id) == {1, 2, 3, None, 5, "six"}  # nothing for the notification
    assert by_id[1]["result"]["protocolVersion"] == "2025-06-18"
    assert len(by_id[2]["result"]["tools"]) == 11
    assert set(tool_payload(by_id[3])) == {"node_id"}
    assert by_id[None]["error"]["code"] == -32700
    assert by_id[5]["error"]["code"] == -32601
    assert by_id["six"]["result"] == {}
    assert "serving agent 'alice'" in session.stderr


def test_a_missing_key_is_refused_before_anything_is_served(e2e_home) -> None:
    result = run_cli(e2e_home, "mcp", env={"HYPHAE_API_KEY": ""}, input="", check=False)  # DEADLINE guards a hang
    assert result.returncode == 4
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "HYPHAE_API_KEY" in result.stderr
    assert read_daemon_json(e2e_home) is None  # no daemon was started for a session that cannot run


def test_an_invalid_key_is_refused_before_anything_is_served(daemon) -> None:
    request = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}) + "\n"
    result = run_cli(daemon.home, "mcp", env={"HYPHAE_API_KEY": "hy_" + "0" * 43}, input=request, check=False)
    assert result.returncode == 4
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "not valid" in result.stderr


def test_eof_ends_the_session_cleanly(daemon) -> None:
    key = add_agent(daemon.home)
    session = StdioSession(daemon.home, key)
    try:
        session.close_stdin()
        assert session.recv_line() is None
        assert session.wait() == 0
    finally:
        session.stop()


def test_a_key_revoked_mid_session_stops_working_but_serving_goes_on(daemon) -> None:
    key = add_agent(daemon.home, "mallory")
    session = StdioSession(daemon.home, key)
    try:
        session.initialize()
        stored = tool_payload(session.call("store", {"content": "Before revocation.", "cell_type": "Fact"}))

        run_cli(daemon.home, "agent", "revoke", "mallory")

        refused = session.call("store", {"content": "After revocation.", "cell_type": "Fact"})
        assert refused["error"]["code"] == -32001
        assert refused["error"]["data"]["reason"] == "unauthenticated"
        assert session.call("recall", {"query": "revocation"})["error"]["code"] == -32001
        assert session.process.poll() is None  # still serving: each line gets its answer
        assert session.request("tools/list")["error"]["code"] == -32001
        session.close_stdin()
        assert session.wait() == 0
    finally:
        session.stop()
    with daemon.client(add_agent(daemon.home)) as http:  # what was stored before the revocation stays
        assert http.get(f"/v1/cells/{stored['node_id']}").json()["content"] == "Before revocation."
        found = http.post("/v1/search", json={"query": "After revocation.", "k": 100}).json()["results"]
    assert "After revocation." not in [hit["content"] for hit in found]


def test_with_no_daemon_hyphae_mcp_starts_one_that_outlives_it(e2e_home, spawned_daemons) -> None:
    spawned_daemons.watch(e2e_home)
    key = add_agent(e2e_home, "alice")  # no daemon yet: the CLI opens the data dir itself
    assert read_daemon_json(e2e_home) is None
    session = StdioSession(e2e_home, key)
    try:
        session.initialize()
        spawned_daemons.remember()
        stored = tool_payload(session.call("store", {"content": "Spawned on demand.", "cell_type": "Fact"}))
        session.close_stdin()
        assert session.wait() == 0
    finally:
        session.stop()

    info = read_daemon_json(e2e_home)
    assert info is not None and info["pid"] != session.process.pid
    assert pid_alive(info["pid"])  # detached: the agent session ended, the node did not
    assert httpx.get(f"{info['api_url']}/healthz", timeout=DEADLINE).json()["status"] == "ok"
    cell = httpx.get(f"{info['api_url']}/v1/cells/{stored['node_id']}", headers={"x-hyphae-key": key},
                     timeout=DEADLINE).json()
    assert cell["content"] == "Spawned on demand."
    assert "serving" in (e2e_home / "daemon.log").read_text()
