"""Three agents, one node, the built-in model: knowledge arrives where it is wanted.

Alice, Bob and Carol are three agent sessions (``hyphae mcp`` processes, as an editor
would launch them) on one machine's node. Bob wants to know which database the team
uses; Carol cares about frontend styling. Alice decides on pgvector. With no query in
between, the decision lands in Bob's inbox, with its content and its provenance, and
nowhere else: not in Carol's, and not back in Alice's own.

Meaning matters here, so the daemon runs the built-in MiniLM model (DESIGN §12: the
beacon and the decision score 0.43 against a 0.35 default threshold; styling scores far
lower).
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from .conftest import DEADLINE, Daemon, StdioSession, add_agents, make_home, start_daemon, tool_payload

DECISION = "Use pgvector for the V1 storage backend."


@pytest.fixture
def semantic_daemon(tmp_path) -> Iterator[Daemon]:
    home = make_home(tmp_path / "home", provider="builtin")
    daemon = start_daemon(home, timeout=DEADLINE * 2)
    try:
        yield daemon
    finally:
        daemon.stop()


def test_a_decision_reaches_the_agent_who_asked_and_no_one_else(semantic_daemon) -> None:
    daemon = semantic_daemon
    keys = add_agents(daemon.home, "alice", "bob", "carol")
    ids = {}
    for name, key in keys.items():
        ids[name] = httpx.get(f"{daemon.url}/v1/whoami", headers={"x-hyphae-key": key}, timeout=DEADLINE).json()

    sessions = {name: StdioSession(daemon.home, key) for name, key in keys.items()}  # start together
    try:
        for session in sessions.values():
            session.initialize()
        alice, bob, carol = sessions["alice"], sessions["bob"], sessions["carol"]

        bob_beacon = tool_payload(bob.call("place_beacon", {"query": "which database do we use for storage"}))
        carol_beacon = tool_payload(carol.call("place_beacon", {"query": "frontend styling conventions"}))
        # Alice is interested in her own topic too; her own cell must still not come back to her.
        tool_payload(alice.call("place_beacon", {"query": "storage backend decisions"}))

        stored = tool_payload(alice.call("store", {
            "content": DECISION, "cell_type": "Decision", "salience": 0.9,
            "source_ref": {"kind": "file", "locator": "specs/hyphae-storage.md:42"},
        }))

        inbox = tool_payload(bob.call("inbox", {}))
        assert [d["node_id"] for d in inbox["diffs"]] == [stored["node_id"]]
        diff = inbox["diffs"][0]
        assert diff["content"] == DECISION and diff["cell_type"] == "Decision"
        assert diff["source_agent"] == ids["alice"]["agent_id"]
        assert diff["origin_node"] == daemon.info["node_id"]
        assert diff["beacon_id"] == bob_beacon["beacon_id"]
        assert diff["source_ref"] == {"kind": "file", "locator": "specs/hyphae-storage.md:42"}
        assert 0.35 <= diff["similarity"] <= 1.0 and diff["hops"] == 0

        pulled = tool_payload(bob.call("pull_inbox", {}))
        assert [d["node_id"] for d in pulled["diffs"]] == [stored["node_id"]] and pulled["remaining"] == 0
        assert pulled["diffs"][0]["content"] == DECISION
        assert pulled["diffs"][0]["source_agent"] == ids["alice"]["agent_id"]
        assert pulled["diffs"][0]["beacon_id"] == bob_beacon["beacon_id"]
        assert tool_payload(bob.call("pull_inbox", {}))["diffs"] == []  # each diff once

        assert tool_payload(carol.call("inbox", {}))["diffs"] == []
        assert tool_payload(carol.call("pull_inbox", {}))["diffs"] == []
        assert [b["beacon_id"] for b in tool_payload(carol.call("list_beacons"))["beacons"]] == [carol_beacon["beacon_id"]]
        assert tool_payload(alice.call("inbox", {}))["diffs"] == []
        assert tool_payload(alice.call("pull_inbox", {}))["diffs"] == []

        # Recall by meaning finds it for anyone; over MCP it is an id, not content.
        hits = tool_payload(carol.call("recall", {"query": "what is our storage backend", "k": 1}))["results"]
        assert hits == [{"node_id": stored["node_id"], "distance": pytest.approx(hits[0]["distance"])}]

        for session in sessions.values():
            session.close_stdin()
        for session in sessions.values():
            assert session.wait() == 0, session.stderr
    finally:
        for session in sessions.values():
            session.stop()
