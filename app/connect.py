"""Copy-paste MCP set-up for the hosts people use: ``hyphae connect HOST``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from node.config import load_config

__all__ = ["snippet", "HOSTS"]

HOSTS = ("claude-code", "cursor", "vscode", "cline")
KEY_PLACEHOLDER = "<key from `hyphae agent add NAME`>"


def _command() -> str:
    return shutil.which("hyphae") or str(Path(sys.executable).with_name("hyphae"))


def snippet(host: str, *, home: Path, http: bool = False, api_key: str | None = None) -> str:
    key = api_key or KEY_PLACEHOLDER
    env = {"HYPHAE_API_KEY": key, "HYPHAE_HOME": str(home)}
    try:
        url = f"http://{load_config(home).api_listen}/mcp"
    except Exception:
        url = "http://127.0.0.1:7777/mcp"
    stdio = {"command": _command(), "args": ["mcp"], "env": env}
    remote = {"url": url, "headers": {"x-hyphae-key": key}}
    if host == "claude-code":
        if http:
            return (
                "# Claude Code over HTTP (the daemon must be running: `hyphae up`)\n"
                f"claude mcp add --transport http hyphae {url} --header \"x-hyphae-key: {key}\""
            )
        return (
            "# Claude Code over stdio (starts the node daemon on first use)\n"
            f"claude mcp add hyphae --env HYPHAE_API_KEY={key} --env HYPHAE_HOME={home} -- {_command()} mcp"
        )
    if host == "cursor":
        server = {"url": url, "headers": remote["headers"]} if http else stdio
        return "// ~/.cursor/mcp.json (or .cursor/mcp.json in a project)\n" + json.dumps({"mcpServers": {"hyphae": server}}, indent=2)
    if host == "vscode":
        server = {"type": "http", **remote} if http else {"type": "stdio", **stdio}
        return "// .vscode/mcp.json\n" + json.dumps({"servers": {"hyphae": server}}, indent=2)
    if host == "cline":
        server = {"url": url, "headers": remote["headers"], "type": "streamableHttp"} if http else dict(stdio)
        server.update({"disabled": False, "autoApprove": []})
        return "// cline_mcp_settings.json (Cline: MCP Servers > Configure)\n" + json.dumps({"mcpServers": {"hyphae": server}}, indent=2)
    raise ValueError(f"unknown host {host!r}; choose one of {', '.join(HOSTS)}")
