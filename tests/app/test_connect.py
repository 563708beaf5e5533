"""``hyphae connect``: every host's set-up is a strict JSON/TOML document on stdout alone, the key
is never in a project-level file, and ``--write`` merges into an existing config file without
losing anything (a backup first, other servers kept, the same set-up twice changes nothing)."""

from __future__ import annotations

import json
import shlex
import stat
import tomllib
from pathlib import Path

import pytest

from app.connect import HOST_NAMES, HOSTS, KEY_PLACEHOLDER
from app.home import init_home
from tests.app.helpers import run_cli

KEY = "hy_test_key_that_must_not_leak_0123456789"



@pytest.fixture
def home(tmp_path, monkeypatch):
    """A data dir, and a fake home directory so no real editor config is ever touched."""
    fake_home = tmp_path / "user"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))
    for variable in ("XDG_CONFIG_HOME", "CODEX_HOME", "CLAUDE_CONFIG_DIR", "APPDATA"):
        monkeypatch.delenv(variable, raising=False)
    data = tmp_path / "data"
    init_home(data)
    return data


def connect(monkeypatch, capsys, home: Path, *args: str) -> tuple[int, str, str]:
    return run_cli(monkeypatch, capsys, ["--home", str(home), "connect", *args], key=None)


def parse(host: str, out: str):
    """Strict parsers only: json.loads, tomllib.loads."""
    return tomllib.loads(out) if HOSTS[host].toml else json.loads(out)


def entry_of(host: str, document) -> dict:
    node = document
    for key in HOSTS[host].servers_key:
        node = node[key]
    assert list(node) == ["hyphae"]
    return node["hyphae"]


def supported(host: str, http: bool, project: bool) -> bool:
    spec = HOSTS[host]
    return not (http and spec.http is None) and not (project and spec.project_file is None)


@pytest.mark.parametrize("host", HOST_NAMES)
@pytest.mark.parametrize("http", [False, True], ids=["stdio", "http"])
@pytest.mark.parametrize("project", [False, True], ids=["user", "project"])
def test_every_output_is_a_strict_document_on_stdout_alone(monkeypatch, capsys, home, tmp_path, host, http, project):
    args = [host, "--key", KEY] + (["--http"] if http else []) + (["--project", str(tmp_path / "repo")] if project else [])
    code, out, err = connect(monkeypatch, capsys, home, *args)
    if not supported(host, http, project):
        assert code == 2 and out == "" and ("--project" in err or "--http" in err), err
        return
    assert code == 0, err
    if host == "claude-code" and not project:  # a shell line, quoted for any POSIX shell
        words = shlex.split(out)
        assert words[:3] == ["claude", "mcp", "add"] and len(out.strip().splitlines()) == 1
        if http:
            assert words[words.index("--header") + 1] == f"Authorization: Bearer {KEY}"
        else:
            assert f"HYPHAE_API_KEY={KEY}" in words and f"HYPHAE_HOME={home.resolve()}" in words
            assert Path(words[-2]).is_absolute() and words[-1] == "mcp"
        return
    entry = entry_of(host, parse(host, out))
    assert not err.strip().startswith("{") and all(line.startswith("#") for line in err.splitlines()), err
    written_key = KEY in out
    if project or host == "vscode" or (host == "codex" and http):
        assert not written_key, f"the key is written in clear into {host}'s file"
    else:
        assert written_key
    if http:
        assert "http://127.0.0.1:7777/mcp" in json.dumps(entry)
    else:
        command = entry["command"][0] if isinstance(entry["command"], list) else entry["command"]
        assert Path(command).is_absolute()
        env = entry.get("env") or entry.get("environment")
        assert env["HYPHAE_HOME"] == str(home.resolve())
    if host == "vscode":
        (prompt,) = parse(host, out)["inputs"]
        assert prompt["password"] is True and prompt["type"] == "promptString"


def test_without_a_key_the_user_file_holds_a_placeholder(monkeypatch, capsys, home):
    code, out, err = connect(monkeypatch, capsys, home, "cursor")
    assert code == 0 and entry_of("cursor", json.loads(out))["env"]["HYPHAE_API_KEY"] == KEY_PLACEHOLDER
    assert "--key" in err


# -- --write ---------------------------------------------------------------------------------


def existing_config(host: str) -> str:
    """A config file as a user already has it: another server and other settings."""
    if HOSTS[host].toml:
        return ('model = "o3"  # my model\n\n[mcp_servers.other]\ncommand = "other-server"\nargs = ["--x"]\n\n'
                '[mcp_servers.other.env]\nTOKEN = "t"\n\n[profiles.fast]\nmodel = "o4-mini"\n')  # fmt: skip
    document: dict = {"theme": "dark", "z_last": [1, 2]}
    node = document
    for key in HOSTS[host].servers_key:
        node = node.setdefault(key, {})
    node["other"] = {"command": "other-server", "args": ["--x"]}
    if host == "vscode":
        document["inputs"] = [{"type": "promptString", "id": "other-token", "password": True}]
    return json.dumps(document, indent=4)


@pytest.mark.parametrize("host", HOST_NAMES)
def test_write_keeps_every_other_server_and_setting_and_backs_up_first(monkeypatch, capsys, home, host):
    target = HOSTS[host].user_file()
    target.parent.mkdir(parents=True, exist_ok=True)
    before = existing_config(host)
    target.write_text(before)
    target.chmod(0o640)
    code, out, err = connect(monkeypatch, capsys, home, host, "--key", KEY, "--write")
    assert code == 0, err
    after = parse(host, target.read_text())
    old = parse(host, before)
    servers = after
    for key in HOSTS[host].servers_key:
        servers = servers[key]
    assert servers["other"] == entry_of_other(host, old)
    assert servers["hyphae"] == entry_of(host, parse(host, out))
    for key, value in old.items():  # every other setting, as it was
        if key not in HOSTS[host].servers_key and key != "inputs":
            assert after[key] == value
    if host == "vscode":
        assert [i["id"] for i in after["inputs"]] == ["other-token", "hyphae-api-key"]
    backups = list(target.parent.glob(target.name + ".*.bak"))
    assert len(backups) == 1 and backups[0].read_text() == before
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    if HOSTS[host].toml:
        assert "# my model" in target.read_text()  # comments outside our table survive

    # The same set-up again: nothing to do, no second backup.
    written = target.read_text()
    code, _, err = connect(monkeypatch, capsys, home, host, "--key", KEY, "--write")
    assert code == 0 and "nothing changed" in err
    assert target.read_text() == written and len(list(target.parent.glob(target.name + ".*.bak"))) == 1


def entry_of_other(host: str, document) -> dict:
    node = document
    for key in HOSTS[host].servers_key:
        node = node[key]
    return node["other"]


def test_write_creates_a_missing_file_private(monkeypatch, capsys, home):
    code, out, err = connect(monkeypatch, capsys, home, "gemini", "--key", KEY, "--write")
    target = HOSTS["gemini"].user_file()
    assert code == 0, err
    assert json.loads(target.read_text()) == json.loads(out)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600  # it holds the key
    assert not list(target.parent.glob("*.bak"))


def test_write_to_a_project_file_and_to_an_explicit_file(monkeypatch, capsys, home, tmp_path):
    repo = tmp_path / "repo"
    code, _, err = connect(monkeypatch, capsys, home, "cursor", "--key", KEY, "--project", str(repo), "--write")
    assert code == 0, err
    text = (repo / ".cursor" / "mcp.json").read_text()
    assert KEY not in text and "${env:HYPHAE_API_KEY}" in text
    chosen = tmp_path / "elsewhere" / "mcp.json"
    code, _, err = connect(monkeypatch, capsys, home, "windsurf", "--key", KEY, "--file", str(chosen), "--write")
    assert code == 0 and json.loads(chosen.read_text())["mcpServers"]["hyphae"]["env"]["HYPHAE_API_KEY"] == KEY


def test_write_leaves_a_file_it_cannot_read_strictly_alone(monkeypatch, capsys, home):
    target = HOSTS["zed"].user_file()
    target.parent.mkdir(parents=True)
    jsonc = '// Zed settings\n{\n  "theme": "One Dark",\n  "context_servers": {},\n}\n'
    target.write_text(jsonc)
    code, _, err = connect(monkeypatch, capsys, home, "zed", "--key", KEY, "--write")
    assert code == 1 and "not plain JSON" in err and "changed nothing" in err
    assert target.read_text() == jsonc and not list(target.parent.glob("*.bak"))


def test_codex_write_replaces_an_older_hyphae_table_and_its_subtables(monkeypatch, capsys, home):
    target = HOSTS["codex"].user_file()
    target.parent.mkdir(parents=True)
    target.write_text('[mcp_servers.hyphae]\ncommand = "old-hyphae"\n\n[mcp_servers.hyphae.env]\nHYPHAE_API_KEY = "old"\n\n'
                      '[mcp_servers.other]\ncommand = "x"\n')  # fmt: skip
    code, _, err = connect(monkeypatch, capsys, home, "codex", "--key", KEY, "--write")
    assert code == 0, err
    servers = tomllib.loads(target.read_text())["mcp_servers"]
    assert servers["other"] == {"command": "x"}
    assert servers["hyphae"]["env"]["HYPHAE_API_KEY"] == KEY and servers["hyphae"]["command"] != "old-hyphae"
    assert "old-hyphae" not in target.read_text()


def test_write_without_a_key_refuses_rather_than_write_a_placeholder(monkeypatch, capsys, home):
    code, out, err = connect(monkeypatch, capsys, home, "cursor", "--write")
    assert code == 2 and "--key" in err and out == ""
    assert not HOSTS["cursor"].user_file().exists()
    code, _, err = connect(monkeypatch, capsys, home, "vscode", "--write")  # VS Code prompts for it: no key needed
    assert code == 0, err
