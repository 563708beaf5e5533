"""``hyphae forget``: your own cells by id; the data dir's owner's bulk forget by agent or
project, with a count and a confirmation; every refusal named, with its exit code.

In-process (``app.cli.main``) on a data dir with no daemon; the daemon's path is the same
calls over REST, exercised by the mesh story (tests/e2e_mesh/test_mesh_forget_erased.py).
"""

from __future__ import annotations

import io
import json
import uuid

import pytest

from .helpers import run_cli


class _Terminal(io.StringIO):
    """A stdin that says it is a terminal, with the user's answer typed in."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def cli(home, monkeypatch, capsys, minilm):
    monkeypatch.setenv("HYPHAE_HOME", str(home))
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal unless a test types an answer

    def run(*args: str, key: str | None = None, typed: str | None = None) -> tuple[int, str, str]:
        if typed is not None:
            monkeypatch.setattr("sys.stdin", _Terminal(typed))
        return run_cli(monkeypatch, capsys, list(args), key)

    return run


def test_forget_by_id_as_the_author_and_in_bulk_as_the_owner(cli):
    keys = {}
    for name in ("alice", "bob"):
        code, out, _ = cli("agent", "add", name)
        assert code == 0
        keys[name] = out.splitlines()[-1]

    def stored(name: str, text: str, *extra: str) -> str:
        code, out, err = cli("store", text, "--type", "Fact", *extra, key=keys[name])
        assert code == 0, err
        return out.strip()

    apollo = [stored("alice", f"Apollo launch note {i}", "--project", "apollo") for i in range(3)]
    loose = stored("alice", "A note of no project")
    bobs = stored("bob", "Bob's apollo budget", "--project", "apollo")

    # -- usage and identity
    assert cli("forget", key=keys["alice"])[0] == 2
    code, _, err = cli("forget", apollo[0], "--by-agent", "alice", key=keys["alice"])
    assert code == 2 and "not both" in err
    code, _, err = cli("forget", apollo[0])
    assert code == 4 and "HYPHAE_API_KEY" in err

    # -- by id: only the author
    code, _, err = cli("forget", apollo[0], key=keys["bob"])
    assert code == 1 and f"{apollo[0]}: forbidden" in err and "only the agent that stored a cell may forget it" in err
    missing = str(uuid.uuid4())
    code, out, err = cli("forget", apollo[0], missing, "not-an-id", key=keys["alice"])
    assert code == 1 and "Forgot 1 cell; 2 refused" in out
    assert f"{missing}: not_found" in err and "not-an-id: invalid_argument" in err
    code, out, _ = cli("forget", apollo[0], key=keys["alice"])  # again: the same tombstone, no error
    assert (code, out.strip()) == (0, f"Forgot {apollo[0]}.")

    # -- in bulk: a count, then a confirmation (required without a terminal)
    code, out, err = cli("forget", "--by-agent", "alice")
    assert code == 2 and "3 cells of agent 'alice' will be forgotten" in out and "--yes" in err
    code, out, _ = cli("forget", "--by-agent", "alice", "--project", "apollo", typed="n\n")
    assert code == 1 and "2 cells of agent 'alice' in project 'apollo'" in out and "Nothing was forgotten" in out
    code, out, _ = cli("forget", "--by-agent", "alice", "--project", "apollo", typed="y\n")
    assert code == 0 and "Forgot 2 cells." in out
    code, out, err = cli("forget", "--by-agent", "nobody", "--yes")
    assert code == 1 and "no agent named 'nobody'" in err
    code, out, _ = cli("forget", "--project", "apollo", "--yes", "--json")
    result = json.loads(out)
    assert code == 0 and [f["node_id"] for f in result["forgotten"]] == [bobs] and result["refused"] == []
    code, out, _ = cli("forget", "--project", "apollo", "--yes")
    assert code == 0 and "Nothing to forget" in out

    # What is left: alice's loose note alone.
    code, out, _ = cli("recall", "note", "--json", key=keys["alice"])
    assert [hit["node_id"] for hit in json.loads(out)["results"]] == [loose]
