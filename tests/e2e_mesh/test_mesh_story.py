"""The acceptance story of the mesh, with real processes on 127.0.0.1.

Three nodes, A, B and C, in one team (``hyphae team create`` and ``team join TOKEN``
through the CLI; static peers, no zeroconf), each with one agent and the built-in
model, because meaning decides who is interested. B's agent wants to know which
database the team uses; C's agent cares about frontend styling. A's agent decides on
pgvector. With no query in between, the decision arrives in B's inbox with its content
and provenance (A's node, A's agent, at least one hop), and C receives nothing, not even
the diff: once A's outbox is idle, A sent one diff, to B. Then B goes offline, A decides
twice more, B comes back on other ports, and repair brings both decisions. How long each
step took is printed (RELIABILITY.md and ``benchmarks/`` keep the figures); the deadlines
below only stop a hung run.
"""

from __future__ import annotations

import json
import time

from .cluster import Lab, McpClient, wait_beacons_known, wait_connected, wait_outbox_idle, wait_until

DECISION = "Use pgvector for the V1 storage backend."
LATER = (
    "The storage database is PostgreSQL 16 with the pgvector extension.",
    "Database migrations for the storage layer run with Alembic.",
)
DELIVERY_DEADLINE = 30.0  # s, a hang guard: store returned -> in B's inbox (milliseconds on a quiet machine)
REPAIR_DEADLINE = 60.0  # s, a hang guard: B serving again -> both missed decisions in its inbox


def inbox_ids(client: McpClient) -> list[str]:
    return [d["node_id"] for d in client.call("inbox", {"limit": 100})["diffs"]]


def test_a_decision_travels_to_the_interested_node_only_and_repair_fills_the_gap(lab: Lab) -> None:
    a, b, c = lab.team(["a", "b", "c"], provider="builtin", via_cli=True)
    a.start()
    lab.start_all([b, c], peers=[a.mesh_address])
    print(f"\nmesh formed in {wait_connected([a, b, c]):.2f} s")

    # `hyphae agent add NAME` (through A's daemon) prints the key alone on its last line;
    # B's and C's agents come from the admin API, which is what that command calls.
    out = a.cli("agent", "add", "agent-a")
    keys = {"a": out.strip().splitlines()[-1]}
    assert keys["a"].startswith("hy_"), out
    for node in (b, c):
        keys[node.name], _ = node.add_agent(f"agent-{node.name}")
    agent_id = {n.name: n.rest("GET", "/v1/whoami", keys[n.name])["agent_id"] for n in (a, b, c)}
    mcp = {n.name: n.mcp(keys[n.name]) for n in (a, b, c)}

    b_beacon = mcp["b"].call("place_beacon", {"query": "which database do we use for storage"})
    mcp["c"].call("place_beacon", {"query": "frontend styling conventions"})
    print(f"A knew both beacons after {wait_beacons_known(a, 2):.2f} s")

    stored = mcp["a"].call("store", {"content": DECISION, "cell_type": "Decision"})
    stored_at = time.monotonic()
    got = wait_until(lambda: inbox_ids(mcp["b"]), DELIVERY_DEADLINE, interval=0.005,
                     message="the decision in B's inbox")  # fmt: skip
    latency = time.monotonic() - stored_at
    (diff,) = mcp["b"].call("inbox", {})["diffs"]
    print(f"store -> B's inbox: {latency * 1000:.0f} ms polled; "
          f"received_at - created_at = {diff['received_at'] - diff['created_at']} ms")  # fmt: skip
    assert got == [stored["node_id"]]
    assert diff["content"] == DECISION and diff["cell_type"] == "Decision"
    assert diff["origin_node"] == a.node_id
    assert diff["source_agent"] == agent_id["a"]
    assert diff["hops"] >= 1
    assert diff["beacon_id"] == b_beacon["beacon_id"]
    # Provenance survives in the stored copy too, over REST with content.
    cell = b.rest("GET", f"/v1/cells/{stored['node_id']}", keys["b"])
    assert cell["origin_node"] == a.node_id and cell["source_agent"] == agent_id["a"]
    # And `hyphae inbox` shows it the same way.
    (shown,) = json.loads(b.cli("inbox", "--json", key=keys["b"]))["diffs"]
    assert shown["node_id"] == stored["node_id"] and shown["origin_node"] == a.node_id and shown["hops"] >= 1

    status = wait_outbox_idle(a)  # everything A sent was acknowledged, and nothing waits to go
    assert status["data_diffs_sent"] - status["data_diffs_resent"] == 1, status  # one diff: B's
    assert c.peers()["cells_delivered"] == 0, "the data plane sent C a cell no beacon of C's asked for"
    assert c.peers()["cells_received"] == 0 and mcp["c"].call("inbox", {})["diffs"] == []
    assert mcp["a"].call("inbox", {})["diffs"] == []

    # B goes offline; A decides twice more while it is away.
    assert b.stop() == 0, b.log_tail()
    later = [mcp["a"].call("store", {"content": text, "cell_type": "Decision"})["node_id"] for text in LATER]

    b.start(peers=[a.mesh_address])  # same data dir; its ports are new ephemeral ones
    back_at = time.monotonic()
    mcp["b"] = b.mcp(keys["b"])
    wait_until(lambda: set(later) <= set(inbox_ids(mcp["b"])), REPAIR_DEADLINE, interval=0.05,
               message=lambda: f"B's inbox after restart: {inbox_ids(mcp['b'])}\nB log:\n{b.log_tail()}")  # fmt: skip
    print(f"repair after restart: both decisions in B's inbox {time.monotonic() - back_at:.2f} s after B served again")
    diffs = mcp["b"].call("inbox", {})["diffs"]
    assert sorted(d["node_id"] for d in diffs) == sorted([stored["node_id"], *later])  # no duplicates
    for d in diffs:
        assert d["origin_node"] == a.node_id and d["source_agent"] == agent_id["a"] and d["hops"] >= 1
    assert {d["content"] for d in diffs} == {DECISION, *LATER}

    # A pushes to B's new address again (not only repair pulls): live delivery resumes.
    fresh = mcp["a"].call("store", {"content": "Storage database backups go to S3 nightly.", "cell_type": "Decision"})
    stored_at = time.monotonic()
    wait_until(lambda: fresh["node_id"] in inbox_ids(mcp["b"]), DELIVERY_DEADLINE, interval=0.005,
               message="a new decision at B after its restart")  # fmt: skip
    print(f"store -> B's inbox after B's restart: {(time.monotonic() - stored_at) * 1000:.0f} ms")
    wait_outbox_idle(a)
    assert c.peers()["cells_delivered"] == 0 and mcp["c"].call("inbox", {})["diffs"] == []
