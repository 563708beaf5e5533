"""A real daemon's API port: the key every MCP client can send, the challenge on a 401, and the
Host check on every route (DNS rebinding), with ``[api] allowed_hosts`` to widen it."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from tests.e2e.conftest import HYPHAE, add_agent, make_home, start_daemon

INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}  # fmt: skip
TOOLS = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}


def test_bearer_keys_challenges_and_the_host_check(tmp_path):
    home = make_home(tmp_path / "node")
    config = home / "config.toml"
    config.write_text(config.read_text().replace("[api]\n", '[api]\nallowed_hosts = ["hyphae.internal"]\n', 1))
    daemon = start_daemon(home)
    try:
        key = add_agent(home, "alice")
        with httpx.Client(base_url=daemon.url, timeout=30) as http:
            # Authorization: Bearer works on /mcp as x-hyphae-key does.
            bearer = {"authorization": f"Bearer {key}"}
            assert http.post("/mcp", json=INITIALIZE, headers=bearer).json()["result"]["serverInfo"]
            assert len(http.post("/mcp", json=TOOLS, headers=bearer).json()["result"]["tools"]) == 11
            assert http.post("/mcp", json=TOOLS, headers={"x-hyphae-key": key}).status_code == 200

            # A 401, with no key or a wrong one, names the scheme that works.
            for headers in ({}, {"authorization": "Bearer hy_not_a_key"}, {"authorization": f"Basic {key}"}):
                response = http.post("/mcp", json=TOOLS, headers=headers)
                assert response.status_code == 401, headers
                assert response.headers["www-authenticate"] == 'Bearer realm="hyphae"'
                assert response.json()["error"]["data"]["reason"] == "unauthenticated"

            # A Host the daemon does not serve is refused on every route, before any key is read.
            port = daemon.url.rsplit(":", 1)[1]
            for path, method in (("/mcp", "POST"), ("/healthz", "GET"), ("/v1/whoami", "GET"), ("/metrics", "GET"), ("/", "GET")):
                response = http.request(method, path, json=TOOLS if method == "POST" else None,
                                        headers={**bearer, "host": f"rebound.example:{port}"})  # fmt: skip
                assert response.status_code == 421, path
                assert "allowed_hosts" in response.json()["error"]["message"]
            for host in (f"localhost:{port}", f"127.0.0.1:{port}", "hyphae.internal", "hyphae.internal:8443"):
                assert http.get("/healthz", headers={"host": host}).status_code == 200, host
            assert http.get("/healthz", headers={"host": "localhost:1"}).status_code == 421
    finally:
        daemon.stop()


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('allowed_hosts = "hyphae.internal"', "must be a list"),
        ("allowed_hosts = [7777]", "must be a list"),
        ('allowed_hosts = ["host:port"]', "not a host name or host:port: 'host:port'"),
    ],
)
def test_a_bad_allowed_hosts_entry_stops_the_start_with_a_clear_error(tmp_path, line, says):
    home = make_home(tmp_path / "node")
    config = home / "config.toml"
    config.write_text(config.read_text().replace("[api]\n", f"[api]\n{line}\n", 1))
    result = subprocess.run([*HYPHAE, "--home", str(home), "up"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 3, result.stderr
    assert "[api] allowed_hosts" in result.stderr and says in result.stderr, result.stderr
    assert not (home / "daemon.json").exists()
