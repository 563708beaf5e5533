"""MCP clients nobody here wrote, from npm: the TypeScript SDK (1.x and the 2.x client) and the
MCP Inspector CLI, against a real node over stdio and streamable HTTP.

Each initializes, lists the 11 tools, stores, recalls, follows the recall's ``resource_link``
with ``resources/read`` and gets the content back, lists and gets each prompt, and sees a bad
argument come back as ``isError: true`` (SEP-1303).

The packages are pinned in ``npm_clients/package.json`` and its committed lockfile, and installed
with ``npm ci`` into pytest's cache dir (once per lockfile: ~60 s the first time, nothing after).
Node.js 20+ and npm must be on PATH; ``.ci/run`` installs them when missing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.mcp_contract import ANNOTATIONS

from .conftest import DEADLINE, add_agents, make_home, start_daemon

PACKAGES = Path(__file__).parent / "npm_clients"
PROMPTS = ("catch_up", "check_team_history", "record_decision")
PROMPT_ARGS = {"catch_up": [], "check_team_history": ["topic=the build cache"],
               "record_decision": ["decision=Keep the cache on NFS.", "rationale=Every runner mounts it."]}
TOOL_ERROR_EXIT = 5  # the Inspector CLI's exit code for a tools/call answered with isError: true


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not on PATH: these tests need Node.js 20+ and npm (.ci/run installs them)")
    return found


@pytest.fixture(scope="module")
def clients(request, tmp_path_factory) -> Path:
    """A directory holding the pinned packages (``npm ci`` from the committed lockfile) and the
    client script, reused from pytest's cache while the lockfile is unchanged."""
    node, npm = _tool("node"), _tool("npm")
    version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=DEADLINE, check=True).stdout
    assert int(version.strip().lstrip("v").split(".")[0]) >= 20, f"Node.js 20+ is needed, this is {version}"
    lock = (PACKAGES / "package-lock.json").read_bytes()
    name = "hyphae-e2e-npm-" + hashlib.sha256(lock + (PACKAGES / "package.json").read_bytes()).hexdigest()[:12]
    cache = getattr(request.config, "cache", None)
    where = Path(cache.mkdir(name)) if cache is not None else tmp_path_factory.mktemp(name)
    marker = where / "installed.txt"
    if not (marker.exists() and (where / "node_modules").is_dir()):
        for file in ("package.json", "package-lock.json"):
            shutil.copy(PACKAGES / file, where / file)
        install = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--loglevel=error"],
            cwd=where, capture_output=True, text=True, timeout=600, check=False,
        )
        if install.returncode != 0:
            pytest.fail(f"npm ci of the pinned MCP clients failed:\n{install.stderr[-3000:]}")
        marker.write_text(name)
    shutil.copy(PACKAGES / "ts_client.mjs", where / "ts_client.mjs")
    return where


@pytest.fixture(scope="module")
def npm_node(tmp_path_factory):
    home = make_home(tmp_path_factory.mktemp("npm") / "home")
    daemon = start_daemon(home)
    try:
        yield daemon, add_agents(home, "alice")["alice"]
    finally:
        daemon.stop()


def _run(command: list[str], cwd: Path, key: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYPHAE_API_KEY"}
    env.update(HYPHAE_API_KEY=key, HOME=str(tmp_path), MCP_CATALOG_PATH=str(tmp_path / "catalog.json"))
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)  # a hang guard


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("line, version", [("v1", "1.32.2"), ("v2", "2.3.1")])
def test_typescript_sdk(clients, npm_node, tmp_path, line, version, transport) -> None:
    daemon, key = npm_node
    target = [sys.executable, str(daemon.home)] if transport == "stdio" else [daemon.mcp_url]
    done = _run([_tool("node"), "ts_client.mjs", line, transport, *target], clients, key, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])

    assert report["sdk"] == version and report["server"] == "hyphae"
    assert report["tools"] == sorted(ANNOTATIONS)
    assert report["results"][0]["node_id"] == report["stored"]
    assert all(set(hit) == {"node_id", "distance"} for hit in report["results"])
    assert report["blocks"] == ["text"] + ["resource_link"] * len(report["results"])
    assert report["link"] == f"hyphae://cells/{report['stored']}"
    assert report["read"]["mimeType"] == "application/json"
    assert report["read"]["cell"]["node_id"] == report["stored"]
    assert report["read"]["cell"]["content"] == report["content"]
    assert report["resources"][:2] == ["hyphae://inbox", "hyphae://beacons"] and report["link"] in report["resources"]
    assert report["templates"] == ["hyphae://cells/{node_id}", "hyphae://scenes/{scene_id}"]
    assert report["prompts"] == {name: ["text"] for name in PROMPTS}
    assert report["bad"] == {"isError": True, "text": "recall: argument 'k' must be an integer between 1 and 100"}


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_mcp_inspector_cli(clients, npm_node, tmp_path, transport) -> None:
    daemon, key = npm_node
    launcher = clients / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / "launcher" / "build"
    inspector = [_tool("node"), str(launcher / "index.js"), "--cli"]
    if transport == "stdio":
        server = ["-e", f"HYPHAE_API_KEY={key}", "--", sys.executable, "-m", "app.cli", "--home", str(daemon.home), "mcp"]
    else:
        server = [daemon.mcp_url, "--transport", "http", "--header", f"x-hyphae-key: {key}"]

    def inspect(*options: str, exit_code: int = 0) -> dict[str, Any]:
        # --tool-arg and --prompt-args take every word after them: the URL goes first, the command last.
        command = [*inspector, *server, *options] if transport == "http" else [*inspector, *options, *server]
        done = _run(command, clients, key, tmp_path)
        assert done.returncode == exit_code, (options, done.stdout[-2000:], done.stderr[-2000:])
        return json.JSONDecoder().raw_decode(done.stdout.lstrip())[0]  # the result, first on stdout

    assert sorted(tool["name"] for tool in inspect("--method", "tools/list")["tools"]) == sorted(ANNOTATIONS)
    content = f"The MCP Inspector CLI stored this over {transport}."
    stored = inspect("--method", "tools/call", "--tool-name", "store",
                     "--tool-arg", f"content={content}", "cell_type=Fact")["structuredContent"]["node_id"]
    recalled = inspect("--method", "tools/call", "--tool-name", "recall", "--tool-arg", f"query={content}", "k=3")
    assert recalled["structuredContent"]["results"][0]["node_id"] == stored
    links = [block for block in recalled["content"] if block["type"] == "resource_link"]
    assert links[0]["uri"] == f"hyphae://cells/{stored}" and links[0]["description"] == content
    read = inspect("--method", "resources/read", "--uri", links[0]["uri"])
    assert json.loads(read["contents"][0]["text"])["content"] == content

    assert [p["name"] for p in inspect("--method", "prompts/list")["prompts"]] == list(PROMPTS)
    for name in PROMPTS:
        arguments = ["--prompt-args", *PROMPT_ARGS[name]] if PROMPT_ARGS[name] else []
        got = inspect("--method", "prompts/get", "--prompt-name", name, *arguments)
        assert got["messages"][0]["content"]["type"] == "text", name

    bad = inspect("--method", "tools/call", "--tool-name", "recall", "--tool-arg", "query=x", "k=1000",
                  exit_code=TOOL_ERROR_EXIT)
    assert bad == {"content": [{"type": "text", "text": "recall: argument 'k' must be an integer between 1 and 100"}],
                   "isError": True}
