"""The CLI as a guide and for scripts: grouped help, ``--json`` on every read command, beacons,
export / import (both formats) with their exit codes, colour only where it belongs.

In-process through ``app.cli.main`` (same code as the console entry), the hashed embedder."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from app.cli import build_parser, main
from app.term import paint

from .helpers import run_cli

SAMPLE = Path(__file__).parents[1] / "node" / "data" / "memory_server_graph.jsonl"


@pytest.fixture
def hashed_home(home) -> Path:
    config = home / "config.toml"
    config.write_text(config.read_text().replace('provider = "builtin"', 'provider = "hashed"'))
    return home


@pytest.fixture
def cli(hashed_home, monkeypatch, capsys):
    """``cli(*args, key=...) -> (exit code, stdout, stderr)``."""
    monkeypatch.delenv("HYPHAE_API_KEY", raising=False)

    def run(*args: str, key: str | None = None, home: Path | None = None) -> tuple[int, str, str]:
        return run_cli(monkeypatch, capsys, ["--home", str(home or hashed_home), *args], key)

    return run


def agent(cli, name: str = "alice") -> str:
    code, out, err = cli("agent", "add", name)
    assert code == 0, err
    return out.strip()


def test_help_reads_as_a_guide(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for heading in ("set up:", "run the node:", "memories (as $HYPHAE_API_KEY's agent):", "data:"):
        assert f"\n{heading}\n" in text
    for command in ("init", "agent", "team", "connect", "up", "mcp", "status", "peers", "doctor", "store",
                    "recall", "inbox", "beacon", "consolidate", "export", "import", "reindex"):  # fmt: skip
        assert f"\n  {command} " in text, command
    assert "quick start" in text and 'hyphae recall "which database do we use for storage"' in text
    assert "exit codes:" in text and "4 not authenticated" in text and "NO_COLOR" in text


READ_COMMANDS = [
    ["status"], ["peers"], ["doctor"], ["agent", "list"], ["team", "show"], ["recall", "q"], ["inbox"],
    ["beacon", "list"], ["init"], ["export", "f"], ["import", "f"], ["reindex"],
]  # fmt: skip


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_every_read_command_takes_json(command):
    args = build_parser().parse_args([*command, "--json"])
    assert args.json is True


def test_beacons_from_the_command_line(cli):
    alice, bob = agent(cli, "alice"), agent(cli, "bob")
    code, out, _ = cli("beacon", "add", "database storage backend choice", "--threshold", "0.1", "--type", "Decision", key=bob)
    assert code == 0
    beacon_id = out.strip()
    code, out, _ = cli("beacon", "list", "--json", key=bob)
    (beacon,) = json.loads(out)["beacons"]
    assert beacon["beacon_id"] == beacon_id and beacon["cell_types"] == ["Decision"]
    assert cli("store", "The storage backend choice: a database with pgvector.", "--type", "Decision", key=alice)[0] == 0
    code, out, _ = cli("inbox", "--json", key=bob)
    (diff,) = json.loads(out)["diffs"]
    assert diff["beacon_id"] == beacon_id and diff["cell_type"] == "Decision"
    assert cli("beacon", "remove", beacon_id, key=bob)[0] == 0
    assert "No beacons" in cli("beacon", "list", key=bob)[1]
    code, _, err = cli("beacon", "remove", "not-a-uuid", key=bob)
    assert code == 1 and "beacon_id" in err
    assert cli("beacon", "add", "x", "--threshold", "2", key=bob)[0] == 1
    assert cli("beacon", "list")[0] == 4  # no key


def test_export_and_import_from_the_command_line(cli, hashed_home, tmp_path):
    from app.home import init_home

    alice = agent(cli)
    for i in range(3):
        assert cli("store", f"Fact number {i} about the build.", "--type", "Fact", key=alice)[0] == 0
    exported = tmp_path / "backup.jsonl"
    code, out, err = cli("export", str(exported), "--json")
    assert code == 0 and err == ""  # --json: no progress bar
    assert json.loads(out) == {"file": str(exported), "scenes": 0, "beacons": 0, "cells": 3}

    fresh = tmp_path / "fresh"
    init_home(fresh)
    config = fresh / "config.toml"
    config.write_text(config.read_text().replace('provider = "builtin"', 'provider = "hashed"'))
    code, out, _ = cli("import", str(exported), home=fresh)
    assert code == 0 and "3 new cells, 0 already here" in out
    code, out, _ = cli("import", str(exported), "--json", home=fresh)
    assert code == 0 and (json.loads(out)["stored"], json.loads(out)["known"]) == (0, 3)
    again = tmp_path / "again.jsonl"
    assert cli("export", str(again), home=fresh)[0] == 0
    assert again.read_bytes() == exported.read_bytes()

    broken = tmp_path / "broken.jsonl"
    broken.write_text(exported.read_text() + "{oops\n")
    code, out, err = cli("import", str(broken), home=fresh)
    assert code == 1 and f"{broken}:5: not JSON" in err and "1 bad lines skipped" in out
    code, _, err = cli("import", str(tmp_path / "missing.jsonl"), home=fresh)
    assert code == 2 and "no such file" in err
    code, _, err = cli("import", str(SAMPLE), home=fresh)
    assert code == 1 and "--from memory-server" in err


def test_memory_server_import_from_the_command_line(cli):
    code, _, err = cli("import", "--from", "memory-server", str(SAMPLE))
    assert code == 4 and "HYPHAE_API_KEY" in err  # stored as an agent: a key is needed
    alice = agent(cli)
    code, out, _ = cli("import", "--from", "memory-server", str(SAMPLE), key=alice)
    assert code == 0 and "4 entities and 2 relations" in out
    code, out, _ = cli("import", "--from", "memory-server", str(SAMPLE), "--json", key=alice)
    assert code == 0 and json.loads(out)["error_count"] == 0
    code, out, _ = cli("recall", "Speaks fluent Spanish", "-k", "1", "--json", key=alice)
    (hit,) = json.loads(out)["results"]
    assert hit["content"].startswith("John_Smith (person)") and hit["source_ref"]["kind"] == "memory-graph"
    code, out, _ = cli("status", "--json", key=alice)
    assert json.loads(out)["daemon"] is None


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    assert paint("ok", "green", Terminal()) == "\x1b[32mok\x1b[0m"
    assert paint("ok", "green", io.StringIO()) == "ok"
    monkeypatch.setenv("NO_COLOR", "1")
    assert paint("ok", "green", Terminal()) == "ok"


def test_export_and_import_go_through_a_running_daemon(cli, hashed_home, tmp_path):
    from .test_doctor import daemon_running

    text = (hashed_home / "config.toml").read_text().replace('listen = "127.0.0.1:7777"', 'listen = "127.0.0.1:0"')
    (hashed_home / "config.toml").write_text(text)
    with daemon_running(hashed_home, tmp_path / "daemon.log"):
        alice = agent(cli)
        assert cli("store", "Stored while the daemon runs.", "--type", "Fact", key=alice)[0] == 0
        exported = tmp_path / "live.jsonl"
        code, out, _ = cli("export", str(exported), "--json")
        assert code == 0 and json.loads(out)["cells"] == 1  # the daemon wrote it: no lock conflict
        assert json.loads(exported.read_text().splitlines()[1])["content"] == "Stored while the daemon runs."
        code, out, _ = cli("import", str(exported))
        assert code == 0 and "0 new cells, 1 already here" in out
        broken = tmp_path / "broken.jsonl"
        broken.write_text(exported.read_text() + "{oops\n")
        code, _, err = cli("import", str(broken))
        assert code == 1 and f"{broken}:3: not JSON" in err
        code, out, _ = cli("import", "--from", "memory-server", str(SAMPLE), key=alice)
        assert code == 0 and "4 entities and 2 relations" in out
        code, _, err = cli("reindex")
        assert code == 1 and "stop the node" in err
