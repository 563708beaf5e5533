"""A forgotten cell is forgotten on every node that received it, and only its origin can do that.

Three ``hyphae up`` daemons on 127.0.0.1, A, B and C, one team. B's and C's agents
place the same beacon; A's agent stores a secret that matches it, and both receive it.
First an insider (a member's key, made from the team key in ``team.json``) sends B a
tombstone for A's cell, signed by itself: B drops it as ``not_origin`` and the cell stays.
Then A's agent forgets the cell: the tombstone A's node signs reaches B and C, and on
both the row loses its content and its vector (read from their databases), search no
longer finds it, and the cell shows who forgot it.
"""

from __future__ import annotations

import sqlite3
import time

from mesh.team import Team
from mesh.wire import TombstonePayload, sign_diff

from .cluster import DEADLINE, Lab, MeshNode, team_of, wait_beacons_known, wait_until
from .test_mesh_security import Insider, drops, post_frame, wait_drop

INTEREST = "where the staging database password is kept"
SECRET = "The staging database password is kept in the team vault under staging/db."


def row(node: MeshNode, node_id: str) -> tuple | None:
    """``(content, length(embedding), forgotten_at)`` in the node's database (read-only, beside the daemon)."""
    conn = sqlite3.connect(f"file:{node.home / 'hyphae.db'}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute(
            "SELECT content, length(embedding), forgotten_at FROM cells WHERE node_id = ?", (node_id,)
        ).fetchone()
    finally:
        conn.close()


def found(node: MeshNode, key: str, node_id: str) -> bool:
    hits = node.rest("POST", "/v1/search", key, json={"query": SECRET, "k": 10})["results"]
    return node_id in {hit["node_id"] for hit in hits}


def test_a_forget_reaches_every_holder_and_only_the_origin_can_forget(lab: Lab) -> None:
    a, b, c = lab.team(["a", "b", "c"], provider="hashed")
    lab.start_mesh([a, b, c])
    key = {n.name: n.add_agent(f"agent-{n.name}")[0] for n in (a, b, c)}
    agent_a = a.rest("GET", "/v1/whoami", key["a"])["agent_id"]
    for node in (b, c):
        node.rest("POST", "/v1/beacons", key[node.name], json={"query": INTEREST}, expect=201)
    wait_beacons_known(a, 2)

    cell_id = a.rest("POST", "/v1/cells", key["a"], json={"content": SECRET, "cell_type": "Fact"}, expect=201)["node_id"]
    for node in (b, c):
        wait_until(lambda: row(node, cell_id) is not None, DEADLINE, message=f"the secret at {node.name}")
        assert row(node, cell_id)[0] == SECRET and found(node, key[node.name], cell_id)

    # -- an insider, not the origin, tries to erase A's cell at B --------------------------
    insider = Insider(Team(*team_of(a.home)))
    insider.seq += 1
    now = int(time.time() * 1000)
    forged = sign_diff(TombstonePayload(cell_id, insider.team.team_id, now, a.node_id, 1), origin=insider.identity.node_id,
                       seq=insider.seq, ts=now, sign=insider.identity.sign, hops=1, ttl=2)  # fmt: skip
    before = drops(b)
    assert post_frame(b, insider.frame(forged)).status_code in (200, 202)
    wait_drop(b, "not_origin", before)
    assert row(b, cell_id)[0] == SECRET and found(b, key["b"], cell_id)

    # -- the origin forgets it --------------------------------------------------------------
    forgotten = a.rest("DELETE", f"/v1/cells/{cell_id}", key["a"])
    assert forgotten["node_id"] == cell_id and row(a, cell_id) == ("", 0, forgotten["forgotten_at"])
    for node in (b, c):
        wait_until(lambda: row(node, cell_id)[2] is not None, DEADLINE,
                   message=lambda: f"the tombstone at {node.name}: {row(node, cell_id)}\n{node.log_tail()}")  # fmt: skip
        content, vector_bytes, _ = row(node, cell_id)
        assert (content, vector_bytes) == ("", 0), node.name
        shown = node.rest("GET", f"/v1/cells/{cell_id}", key[node.name])
        assert shown["content"] == "" and shown["provenance"]["forgotten_by"] == agent_a
        assert shown["provenance"]["origin_node"] == a.node_id
        assert not found(node, key[node.name], cell_id)
    assert drops(c).get("not_origin", 0) == 0 and drops(b)["not_origin"] == before.get("not_origin", 0) + 1
