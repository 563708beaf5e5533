"""``hyphae connect HOST``: the MCP set-up of every host a developer has, in each host's own format.

Each host is one row of :data:`HOSTS`: where its user-level and project-level config files
live, the key its servers map sits under, and how it spells a stdio and an HTTP server. The
document printed is exactly what ``--write`` merges into the file, so what a user pastes and
what we write cannot differ.

Where the key goes: a user-level file (in the home directory, never in a repository) holds it
in clear, so the host works without any shell set-up. A project-level file (``--project``),
which a team may commit, never does: it names the variable instead, in the syntax the host
expands (``${env:HYPHAE_API_KEY}``, ``$HYPHAE_API_KEY``, ``{env:HYPHAE_API_KEY}``,
``env_vars``), and VS Code always asks for it through an ``inputs`` entry with
``password: true``, which it keeps in its secret storage. Hosts that expand nothing have no
project form here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["HOSTS", "HOST_NAMES", "KEY_PLACEHOLDER", "SERVER_NAME", "ConnectError", "Setup", "Target", "plan"]

SERVER_NAME = "hyphae"
KEY_VAR = "HYPHAE_API_KEY"
KEY_PLACEHOLDER = "<key from `hyphae agent add NAME`>"
VSCODE_INPUT = "hyphae-api-key"


class ConnectError(Exception):
    """A set-up this host cannot take (no project file, no HTTP), or a config file we must not touch."""


@dataclasses.dataclass(frozen=True)
class Setup:
    """What every host's entry is made of."""

    command: str  # the absolute path of `hyphae`, so the entry works whatever PATH the host has
    home: Path  # the data dir, absolute, always passed (the host's environment may lack HYPHAE_HOME)
    url: str  # the daemon's /mcp URL
    key: str | None  # the key to write in clear, or None to name the variable instead
    project: bool  # a project-level file: the key is never written

    @property
    def shown_key(self) -> str:
        return self.key or KEY_PLACEHOLDER

    def stdio_env(self, reference: str | None) -> dict[str, str]:
        """The server's environment: the key in clear (user files) or as the host's reference."""
        key = reference if self.project else self.shown_key
        env = {KEY_VAR: key} if key is not None else {}
        return {**env, "HYPHAE_HOME": str(self.home)}

    def bearer(self, reference: str | None) -> str:
        return f"Bearer {reference if self.project else self.shown_key}"


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    title: str
    servers_key: tuple[str, ...]  # where the servers map sits in the document
    user_file: Callable[[], Path]
    project_file: str | None  # relative to the project; None: the host has no project-level config
    stdio: Callable[[Setup], dict[str, Any]]
    http: Callable[[Setup], dict[str, Any]] | None  # None: this host's config cannot name an HTTP server
    documented: str  # the documented format this row follows
    toml: bool = False


def _home() -> Path:
    return Path.home()


def _config_dir() -> Path:
    """The per-user application config dir: XDG on Linux, Application Support on macOS, APPDATA on Windows."""
    if sys.platform == "darwin":
        return _home() / "Library" / "Application Support"
    if os.name == "nt":
        return Path(os.environ.get("APPDATA") or _home() / "AppData" / "Roaming")
    return Path(os.environ.get("XDG_CONFIG_HOME") or _home() / ".config")


def _vscode_user_dir() -> Path:
    return _config_dir() / "Code" / "User"


def _stdio(setup: Setup, reference: str | None) -> dict[str, Any]:
    return {"command": setup.command, "args": ["mcp"], "env": setup.stdio_env(reference)}


def _remote(setup: Setup, url_key: str, reference: str | None, **extra: Any) -> dict[str, Any]:
    return {**extra, url_key: setup.url, "headers": {"Authorization": setup.bearer(reference)}}


CURSOR_REF = "${env:" + KEY_VAR + "}"  # Cursor and Windsurf interpolate ${env:NAME} in command, args, env, url, headers

HOSTS: dict[str, Host] = {
    host.name: host
    for host in (
        # Claude Code: `claude mcp add` (the printed line); --write: user scope, `mcpServers` in ~/.claude.json;
        # --project: .mcp.json, which expands ${VAR} in command, args, env, url and headers.
        Host(
            "claude-code", "Claude Code", ("mcpServers",),
            lambda: Path(os.environ["CLAUDE_CONFIG_DIR"]) / ".claude.json" if os.environ.get("CLAUDE_CONFIG_DIR")
            else _home() / ".claude.json",
            ".mcp.json",
            lambda s: {"type": "stdio", **_stdio(s, "${" + KEY_VAR + "}")},
            lambda s: _remote(s, "url", "${" + KEY_VAR + "}", type="http"),
            "code.claude.com/docs/en/mcp (claude mcp add; .mcp.json with ${VAR} expansion)",
        ),
        # Claude Desktop: claude_desktop_config.json, `mcpServers`, stdio only (remote servers are
        # added as connectors in the app, not in this file).
        Host(
            "claude-desktop", "Claude Desktop", ("mcpServers",),
            lambda: _config_dir() / "Claude" / "claude_desktop_config.json",
            None, lambda s: _stdio(s, None), None,
            "modelcontextprotocol.io quickstart (claude_desktop_config.json)",
        ),
        Host(
            "cursor", "Cursor", ("mcpServers",), lambda: _home() / ".cursor" / "mcp.json", ".cursor/mcp.json",
            lambda s: _stdio(s, CURSOR_REF), lambda s: _remote(s, "url", CURSOR_REF),
            "cursor.com/docs/mcp (mcp.json: command/args/env, or url/headers; ${env:NAME})",
        ),
        # VS Code: `servers` with an explicit type; the key always through an `inputs` prompt.
        Host(
            "vscode", "VS Code", ("servers",), lambda: _vscode_user_dir() / "mcp.json", ".vscode/mcp.json",
            lambda s: {"type": "stdio", **_stdio(s, None), "env": {KEY_VAR: "${input:" + VSCODE_INPUT + "}",
                                                                 "HYPHAE_HOME": str(s.home)}},
            lambda s: {"type": "http", "url": s.url, "headers": {"Authorization": "Bearer ${input:" + VSCODE_INPUT + "}"}},
            "code.visualstudio.com/docs/copilot/reference/mcp-configuration (servers, inputs)",
        ),
        Host(
            "windsurf", "Windsurf", ("mcpServers",), lambda: _home() / ".codeium" / "windsurf" / "mcp_config.json",
            None, lambda s: _stdio(s, None), lambda s: _remote(s, "serverUrl", None),
            "docs.windsurf.com/windsurf/cascade/mcp (mcp_config.json: command/args/env, or serverUrl/headers)",
        ),
        # Cline keeps its servers in the VS Code extension's global storage.
        Host(
            "cline", "Cline", ("mcpServers",),
            lambda: _vscode_user_dir() / "globalStorage" / "saoudrizwan.claude-dev" / "settings" / "cline_mcp_settings.json",
            None,
            lambda s: {**_stdio(s, None), "disabled": False, "autoApprove": []},
            lambda s: {**_remote(s, "url", None, type="streamableHttp"), "disabled": False, "autoApprove": []},
            "docs.cline.bot/mcp (cline_mcp_settings.json; type streamableHttp for a URL)",
        ),
        # Zed: `context_servers` in settings.json (a custom server: command/args/env, or url/headers).
        # Zed expands no variables there, so there is no project form.
        Host(
            "zed", "Zed", ("context_servers",),
            lambda: (Path(os.environ.get("APPDATA", "")) / "Zed" if os.name == "nt" else _home() / ".config" / "zed")
            / "settings.json",
            None, lambda s: _stdio(s, None), lambda s: _remote(s, "url", None),
            "zed.dev/docs/ai/mcp (context_servers, custom servers)",
        ),
        # Codex CLI: [mcp_servers.NAME] in config.toml. It forwards variables by name (env_vars) and reads
        # a bearer token only from a variable (bearer_token_env_var): it refuses an inline token.
        Host(
            "codex", "Codex CLI", ("mcp_servers",),
            lambda: Path(os.environ.get("CODEX_HOME") or _home() / ".codex") / "config.toml",
            ".codex/config.toml",
            lambda s: (
                {"command": s.command, "args": ["mcp"], "env": {"HYPHAE_HOME": str(s.home)}, "env_vars": [KEY_VAR]}
                if s.project else _stdio(s, None)
            ),
            lambda s: {"url": s.url, "bearer_token_env_var": KEY_VAR},
            "developers.openai.com/codex/mcp (config.toml [mcp_servers.NAME]: command/args/env/env_vars, "
            "or url/bearer_token_env_var)",
            toml=True,
        ),
        # Gemini CLI: `mcpServers` in settings.json; `httpUrl` is streamable HTTP (`url` would be SSE);
        # string values expand $VAR and ${VAR}.
        Host(
            "gemini", "Gemini CLI", ("mcpServers",), lambda: _home() / ".gemini" / "settings.json",
            ".gemini/settings.json",
            lambda s: _stdio(s, "$" + KEY_VAR), lambda s: _remote(s, "httpUrl", "$" + KEY_VAR),
            "geminicli.com/docs/tools/mcp-server (mcpServers: command/args/env, or httpUrl/headers)",
        ),
        # opencode: `mcp` in opencode.json, type local (command as one array, `environment`) or remote;
        # values expand {env:NAME}.
        Host(
            "opencode", "opencode", ("mcp",),
            lambda: Path(os.environ.get("XDG_CONFIG_HOME") or _home() / ".config") / "opencode" / "opencode.json",
            "opencode.json",
            lambda s: {"type": "local", "command": [s.command, "mcp"],
                       "environment": s.stdio_env("{env:" + KEY_VAR + "}"), "enabled": True},
            lambda s: {**_remote(s, "url", "{env:" + KEY_VAR + "}", type="remote"), "enabled": True},
            "opencode.ai/docs/mcp-servers (mcp: type local/remote)",
        ),
    )
}
HOST_NAMES = tuple(HOSTS)


@dataclasses.dataclass(frozen=True)
class Target:
    """One host's set-up: the document to print and merge, where it goes, what to tell the user."""

    host: Host
    document: dict[str, Any]  # {servers_key...: {"hyphae": entry}} (+ VS Code's inputs)
    path: Path
    advice: list[str]

    @property
    def entry(self) -> dict[str, Any]:
        node: Any = self.document
        for key in self.host.servers_key:
            node = node[key]
        return node[SERVER_NAME]

    def render(self) -> str:
        """The document as the host's file format: JSON (2-space) or TOML."""
        if self.host.toml:
            return toml_table(self.host.servers_key + (SERVER_NAME,), self.entry)
        return json.dumps(self.document, indent=2, ensure_ascii=False)


def command_path() -> str:
    """The absolute path of the ``hyphae`` script of this installation."""
    beside = Path(sys.executable).with_name("hyphae")
    return str(beside) if beside.exists() else (shutil.which("hyphae") or str(beside))


def plan(host_name: str, *, home: Path, url: str, http: bool = False, api_key: str | None = None,
         project: Path | None = None, file: Path | None = None) -> Target:
    """What ``hyphae connect`` prints and ``--write`` merges, for one host."""
    host = HOSTS[host_name]
    if project is not None and host.project_file is None:
        raise ConnectError(
            f"{host.title} has no project-level config that can leave the key out; "
            "drop --project to use its user-level file (in your home directory, never in a repository)"
        )
    if http and host.http is None:
        raise ConnectError(f"{host.title} takes only stdio servers in its config file; drop --http")
    setup = Setup(command_path(), home.resolve(), url, api_key, project is not None)
    entry = (host.http if http else host.stdio)(setup)
    document: dict[str, Any] = {SERVER_NAME: entry}
    for key in reversed(host.servers_key):
        document = {key: document}
    if host.name == "vscode":
        document["inputs"] = [{"type": "promptString", "id": VSCODE_INPUT, "description": "Hyphae API key "
                               "(`hyphae agent add NAME`)", "password": True}]  # fmt: skip
    path = file or (project / host.project_file if project is not None else host.user_file())
    advice = [f"# {host.title}: {'merge into' if path.exists() else 'save as'} {path} (or run again with --write)"]
    if project is not None and host.name != "vscode":
        advice.append(f"# the key is not in this file: export {KEY_VAR} where {host.title} starts")
    elif host.name == "vscode":
        advice.append("# VS Code asks for the key once (a password prompt) and keeps it in its secret storage")
    elif host.name == "codex" and http:
        advice.append(f"# Codex reads the bearer token from {KEY_VAR}: export it where codex starts")
    elif api_key is None:
        advice.append("# put your agent's key in place of the placeholder, or pass --key")
    if http:
        advice.append("# over HTTP the node must be running: `hyphae up`")
    return Target(host, document, path, advice)


def claude_code_line(home: Path, url: str, *, http: bool, api_key: str | None) -> str:
    """The ``claude mcp add`` line, quoted for any POSIX shell."""
    key = api_key or KEY_PLACEHOLDER
    if http:
        words = ["claude", "mcp", "add", "--transport", "http", SERVER_NAME, url, "--header", f"Authorization: Bearer {key}"]
    else:
        words = ["claude", "mcp", "add", SERVER_NAME, "--env", f"{KEY_VAR}={key}", "--env",
                 f"HYPHAE_HOME={home.resolve()}", "--", command_path(), "mcp"]  # fmt: skip
    return shlex.join(words)


# -- TOML, for Codex: one table written, the rest of the file left as it is ------------------


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")  # a JSON string is a TOML basic string


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML form for {value!r}")


def _toml_key(key: str) -> str:
    bare = key.replace("_", "").replace("-", "").isascii() and key.replace("_", "").replace("-", "").isalnum()
    return key if bare else _toml_string(key)


def toml_table(path: tuple[str, ...], entry: dict[str, Any]) -> str:
    lines = ["[" + ".".join(_toml_key(part) for part in path) + "]"]
    lines += [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in entry.items()]
    return "\n".join(lines) + "\n"
