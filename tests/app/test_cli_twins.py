"""The CLI twin of every session and scene tool, ``hyphae stop`` on a real daemon, and the small
truths: help on every option, agent names in any script, ``team join`` keeping its token to
itself, layer counts as text and a port clash that names the option to change."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess

import pytest

from app.cli.parser import build_parser
from node.agents import check_agent_name
from node.errors import InvalidArgument
from tests.e2e.conftest import (
    HYPHAE,
    add_agent,
    make_home,
    pid_alive,
    read_daemon_json,
    run_cli,
    start_daemon,
)


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every (command path, action) of the parser, subcommands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from walk(sub, path + (name,))
        else:
            yield path, action


def test_every_option_and_argument_has_help_text():
    missing = [f"hyphae {' '.join(path)} {action.dest}" for path, action in walk(build_parser())
               if not (action.help or "").strip() or action.help == argparse.SUPPRESS]  # fmt: skip
    assert not missing, "options without help: " + ", ".join(missing)
    commands = {path for path, _ in walk(build_parser())}
    for twin in (("session", "start"), ("session", "end"), ("scene", "get"), ("scene", "list"), ("stop",)):
        assert twin in commands


@pytest.mark.parametrize("name", ["tomás", "李雷", "Ærøskøbing", "अनु", "bob-2.x_y"])
def test_agent_names_may_use_letters_of_any_script(name):
    assert check_agent_name(name) == name


@pytest.mark.parametrize("name", ["a b", "a/b", "a\\b", "a\x00b", "a\tb", "a\u200bb", "", "x" * 65, "\u0301a", "a:b"])
def test_agent_names_refuse_whitespace_control_characters_and_slashes(name):
    with pytest.raises(InvalidArgument) as error:
        check_agent_name(name)
    assert error.value.field == "name"


def test_a_name_typed_composed_or_decomposed_is_one_agent():
    assert check_agent_name("toma\u0301s") == check_agent_name("tom\u00e1s") == "tom\u00e1s"


def test_sessions_scenes_unicode_agents_status_and_stop_through_a_real_daemon(tmp_path):
    home = make_home(tmp_path / "node")
    daemon = start_daemon(home)
    try:
        key = add_agent(home, "李雷")
        env = {"HYPHAE_API_KEY": key}
        agents = json.loads(run_cli(home, "agent", "list", "--json").stdout)["agents"]
        assert [a["name"] for a in agents] == ["李雷"]

        # session start prints its id on the last line; stores go to its scene until it ends.
        started = run_cli(home, "session", "start", "--project", "payments", "--title", "ledger work", env=env)
        session_id = started.stdout.strip().splitlines()[-1]
        opened = json.loads(run_cli(home, "scene", "list", "--json", env=env).stdout)["scenes"]
        (scene,) = opened
        assert scene["session_id"] == session_id and scene["project"] == "payments" and scene["ended_at"] is None
        node_id = run_cli(home, "store", "Ledger writes are idempotent by key.", "--type", "Decision",
                          "--project", "payments", env=env).stdout.strip()  # fmt: skip
        got = json.loads(run_cli(home, "scene", "get", scene["scene_id"], "--json", env=env).stdout)
        assert got["cell_ids"] == [node_id]
        text = run_cli(home, "scene", "get", scene["scene_id"], env=env).stdout
        assert scene["scene_id"] in text and node_id in text and "open" in text
        ended = json.loads(run_cli(home, "session", "end", session_id, "--json", env=env).stdout)
        assert ended["session_id"] == session_id and ended["cell_count"] == 1
        listed = run_cli(home, "scene", "list", "--project", "payments", env=env).stdout
        assert scene["scene_id"] in listed and "ended" in listed and "ledger work" in listed
        bad = run_cli(home, "scene", "get", "not-a-uuid", env=env, check=False)
        assert bad.returncode == 1 and "scene_id" in bad.stderr

        # status: layer counts as words, not a Python dict.
        status = run_cli(home, "status", env=env).stdout
        (cells,) = [line for line in status.splitlines() if line.startswith("cells")]
        assert "{" not in cells and "L0 1" in cells, cells

        # The revoke path carries the name in a URL: any script works there too.
        assert "Revoked" in run_cli(home, "agent", "revoke", "李雷").stdout

        # stop: the daemon drains and exits, its files go, the lock is free.
        pid = daemon.info["pid"]
        stopped = run_cli(home, "stop")
        assert f"pid {pid}" in stopped.stdout
        assert daemon.process.wait(timeout=30) == 0
        assert not pid_alive(pid) and read_daemon_json(home) is None and not (home / "admin.token").exists()
        again = run_cli(home, "stop", "--json")
        assert json.loads(again.stdout) == {"home": str(home), "stopped": False, "running": False}
    finally:
        daemon.stop()


def test_a_port_clash_names_the_option_to_change(tmp_path):
    home = make_home(tmp_path / "node")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = subprocess.run([*HYPHAE, "--home", str(home), "up", "--api", f"127.0.0.1:{port}"],
                                capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert result.returncode != 0
    assert f"127.0.0.1:{port}" in result.stderr and "hyphae up --api 127.0.0.1:PORT" in result.stderr, result.stderr


def test_team_join_does_not_print_the_token_again(tmp_path):
    alice, bob = make_home(tmp_path / "alice"), make_home(tmp_path / "bob")
    token = run_cli(alice, "team", "create").stdout.strip().splitlines()[-1]
    joined = run_cli(bob, "team", "join", token)
    assert token not in joined.stdout + joined.stderr and "Joined team" in joined.stdout
    assert "join_token" not in json.loads(run_cli(bob, "team", "show", "--json").stdout)
    assert token not in run_cli(bob, "team", "join", token, "--json").stdout
