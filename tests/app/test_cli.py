"""The ``hyphae`` command line: output a person (or a script) can use, and exit codes that mean something.

Exit codes (app/cli/): 0 done, 1 the operation failed, 2 bad usage, 3 no usable data dir,
4 not authenticated. The story test runs the real console entry in subprocesses; the rest call
``app.cli.main`` in-process (same code, no interpreter start and model load per call). The CLI uses
the data dir's configured embedder, i.e. the built-in MiniLM model.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio

from app.cli import main
from app.home import open_node

from .helpers import run_cli

REPO = Path(__file__).resolve().parents[2]
UUID_LINE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def hyphae(home: Path, *args: str, key: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``python -m app.cli`` as a user would run ``hyphae``."""
    env = {k: v for k, v in os.environ.items() if k not in ("HYPHAE_API_KEY", "HYPHAE_HOME")}
    env["HYPHAE_HOME"] = str(home)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    if key is not None:
        env["HYPHAE_API_KEY"] = key
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cli(home, monkeypatch, capsys, minilm):
    """``cli(*args, key=...) -> (exit code, stdout, stderr)`` in this process, against ``home``."""
    monkeypatch.setenv("HYPHAE_HOME", str(home))
    monkeypatch.delenv("HYPHAE_API_KEY", raising=False)

    def run(*args: str, key: str | None = None) -> tuple[int, str, str]:
        return run_cli(monkeypatch, capsys, list(args), key)

    return run


# -- the real console entry --------------------------------------------------------------------------


def test_first_run_story_through_the_real_console_entry(tmp_path):
    home = tmp_path / "fresh-home"

    first = hyphae(home, "init")
    assert first.returncode == 0, first.stderr
    assert "Initialised" in first.stdout and "hyphae agent add" in first.stdout
    assert (home / "config.toml").exists() and (home / "node.key").exists() and (home / "hyphae.db").exists()
    assert os.stat(home / "node.key").st_mode & 0o077 == 0  # the node key is private

    again = hyphae(home, "init")
    assert again.returncode == 0, again.stderr
    assert "Already initialised" in again.stdout

    added = hyphae(home, "agent", "add", "alice", "--project", "storage")
    assert added.returncode == 0, added.stderr
    key = added.stdout.splitlines()[-1]
    assert added.stdout == key + "\n"  # the key alone: `export HYPHAE_API_KEY=$(hyphae agent add x)` works
    assert key.startswith("hy_") and len(key) >= 43
    assert "alice" in added.stderr

    stored = hyphae(home, "store", "Use pgvector for the V1 storage backend.", "--type", "Decision",
                    "--salience", "0.9", key=key)
    assert stored.returncode == 0, stored.stderr
    node_id = stored.stdout.strip()
    assert UUID_LINE.match(node_id), stored.stdout

    recalled = hyphae(home, "recall", "which database do we use for storage", "-k", "3", key=key)
    assert recalled.returncode == 0, recalled.stderr
    first_line, second_line = recalled.stdout.splitlines()[:2]
    distance, _, rest = first_line.partition("  ")
    assert 0.0 <= float(distance) < 0.7
    assert rest == "[Decision] Use pgvector for the V1 storage backend."
    assert node_id in second_line


def test_usage_errors_and_missing_setup_exit_with_their_codes(tmp_path, home):
    bad_type = hyphae(home, "store", "x", "--type", "decision", key="hy_whatever")
    assert bad_type.returncode == 2
    assert "--type" in bad_type.stderr and "Decision" in bad_type.stderr

    no_key = hyphae(home, "store", "x", "--type", "Fact")
    assert no_key.returncode == 4
    assert "HYPHAE_API_KEY" in no_key.stderr and "Traceback" not in no_key.stderr

    no_home = hyphae(tmp_path / "never-initialised", "store", "x", "--type", "Fact", key="hy_whatever")
    assert no_home.returncode == 3
    assert "hyphae init" in no_home.stderr and "Traceback" not in no_home.stderr
    assert not (tmp_path / "never-initialised").exists()  # nothing was created behind the user's back


# -- in-process ---------------------------------------------------------------------------------------


def add_agent(cli, name: str, *projects: str) -> str:
    args = ["agent", "add", name]
    for project in projects:
        args += ["--project", project]
    code, out, err = cli(*args)
    assert code == 0, err
    return out.strip()


def test_agent_list_json_names_agents_and_never_their_keys(cli):
    key = add_agent(cli, "alice", "web", "api")
    add_agent(cli, "bob")
    code, out, err = cli("agent", "list", "--json")
    assert code == 0, err
    agents = json.loads(out)["agents"]
    assert [(a["name"], a["projects"], a["revoked_at"]) for a in agents] == [
        ("alice", ["api", "web"], None), ("bob", [], None)]
    assert key not in out and not any("key" in field for field in agents[0])

    code, out, _ = cli("agent", "add", "carol", "--json")
    assert code == 0
    created = json.loads(out)
    assert created["name"] == "carol" and created["api_key"].startswith("hy_")
    code, _, err = cli("agent", "add", "carol")
    assert code == 1 and "conflict" in err  # names are unique


def test_store_and_recall_json(cli):
    key = add_agent(cli, "alice")
    code, out, err = cli("store", "Nightly backups run at 02:00 UTC.", "--type", "Fact", "--ref", "file:ops/backup.md:7",
                         "--metadata", '{"ticket": "OPS-1"}', "--json", key=key)
    assert code == 0, err
    node_id = json.loads(out)["node_id"]
    code, out, err = cli("recall", "when do backups run", "-k", "3", "--json", key=key)
    assert code == 0, err
    (hit,) = json.loads(out)["results"]
    assert hit["node_id"] == node_id
    assert hit["content"] == "Nightly backups run at 02:00 UTC."
    assert hit["source_ref"] == {"kind": "file", "locator": "ops/backup.md:7"}
    assert hit["metadata"] == {"ticket": "OPS-1"}
    assert isinstance(hit["distance"], float)

    code, out, _ = cli("recall", "when do backups run", "--type", "Decision", key=key)
    assert code == 0 and "No memories match." in out


def test_store_failures_exit_1_and_name_the_field(cli):
    key = add_agent(cli, "alice")
    code, out, err = cli("store", "x", "--type", "Fact", "--salience", "1.5", key=key)
    assert (code, out) == (1, "")
    assert "salience" in err and "Traceback" not in err
    code, _, err = cli("store", "x", "--type", "Fact", "--metadata", "{not json", key=key)
    assert code == 2 and "--metadata" in err
    code, _, err = cli("store", "x", "--type", "Fact", "--metadata", "[1, 2]", key=key)
    assert code == 1 and "metadata" in err


def test_a_revoked_key_exits_4(cli):
    key = add_agent(cli, "alice")
    assert cli("store", "before", "--type", "Fact", key=key)[0] == 0
    code, out, err = cli("agent", "revoke", "alice")
    assert code == 0 and "alice" in out
    code, out, err = cli("store", "after", "--type", "Fact", key=key)
    assert code == 4 and out == ""
    assert "not valid" in err and "Traceback" not in err
    code, _, err = cli("agent", "revoke", "nobody")
    assert code == 1 and "nobody" in err


def place_beacon(home: Path, minilm, key: str, query: str) -> None:
    """The CLI has no beacon command; agents place beacons over MCP. Do it through the facade."""

    async def run() -> None:
        with trio.fail_after(30):
            async with open_node(home, embedder=minilm) as service:
                principal = await service.authenticate(key)
                await service.place_beacon(principal, query=query)

    trio.run(run)


def test_inbox_shows_what_a_beacon_caught(cli, home, minilm):
    alice = add_agent(cli, "alice")
    bob = add_agent(cli, "bob")
    code, out, _ = cli("inbox", key=bob)
    assert (code, out.strip()) == (0, "Inbox is empty.")

    place_beacon(home, minilm, bob, "which database do we use for storage")
    code, out, err = cli("store", "Use pgvector for the V1 storage backend.", "--type", "Decision", key=alice)
    assert code == 0, err
    node_id = out.strip()

    code, out, err = cli("inbox", key=bob)
    assert code == 0, err
    assert "Use pgvector for the V1 storage backend." in out and node_id in out and "sim=0." in out

    code, out, err = cli("inbox", "--json", key=bob)
    assert code == 0, err
    (diff,) = json.loads(out)["diffs"]
    assert diff["node_id"] == node_id

    code, out, err = cli("inbox", "--since", "2000-01-01T00:00:00Z", "--json", key=bob)
    assert code == 0, err
    assert [d["node_id"] for d in json.loads(out)["diffs"]] == [node_id]

    code, out, err = cli("inbox", "--pull", "--json", key=bob)
    assert code == 0, err
    assert json.loads(out)["remaining"] == 0 and len(json.loads(out)["diffs"]) == 1
    code, out, err = cli("inbox", "--since", "yesterday", key=bob)
    assert code == 1 and "since" in err


def test_inbox_since_accepts_milliseconds_as_its_help_says(cli, home, minilm):
    """``--since`` says "milliseconds or RFC 3339 time"; on the command line every value is a string."""
    alice = add_agent(cli, "alice")
    bob = add_agent(cli, "bob")
    place_beacon(home, minilm, bob, "which database do we use for storage")
    assert cli("store", "Use pgvector for the V1 storage backend.", "--type", "Decision", key=alice)[0] == 0
    code, out, err = cli("inbox", "--since", "0", "--json", key=bob)
    assert code == 0, err
    assert len(json.loads(out)["diffs"]) == 1


def test_no_data_dir_for_admin_commands_exits_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HYPHAE_HOME", str(tmp_path / "nowhere"))
    code = main(["agent", "list"])
    _, err = capsys.readouterr()
    assert code == 3 and "hyphae init" in err


def test_init_json(tmp_path, capsys):
    home = tmp_path / "h"
    assert main(["--home", str(home), "init", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["created"] is True and uuid.UUID(first["tenant_id"])
    assert main(["--home", str(home), "init", "--json"]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["created"] is False
    assert (second["node_id"], second["tenant_id"]) == (first["node_id"], first["tenant_id"])  # nothing regenerated
