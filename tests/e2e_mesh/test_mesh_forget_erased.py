"""A forgotten cell leaves no byte of its content or vector in any file of any node that held it,
including a node that was down when it was forgotten; and only its author may forget it.

Three ``hyphae up`` daemons on 127.0.0.1, A, B and C, one team; B's and C's agents place a
beacon that A's secrets match. For each secret, C's data dir is first shown to *hold* its
content, a rare word of it and its vector (the database, the WAL, the index files: the
search can find them), then A's agent forgets it and every file under B's and C's data dirs
is read again until none holds any of them (``tests.node.traces``):

1. D2, with every node up. Before A's agent forgets it, a non-author is refused over REST
   (C's agent at C, an intruder agent at A), over the CLI (through A's daemon), and the
   owner of C's data dir too (the cell came from A: only A may forget it for the team);
   MCP has no forget tool at all (the seed's eleven tools).
2. D3, with C stopped while A's agent forgets it and started again afterwards: the
   tombstone reaches C by the mesh's repair (or the origin's offer of what it owed C).
3. The data dir owner's bulk forget (``hyphae forget --by-agent``) through A's daemon.
"""

from __future__ import annotations

import sqlite3

import numpy as np

from tests.node.traces import needles, traces

from .cluster import DEADLINE, Lab, MeshNode, wait_beacons_known, wait_until

INTEREST = "where the staging vault passphrase is kept"
SECRETS = {
    "D2": ("The staging vault passphrase is kept under qxzylophonic7431 in the team safe.", "ylophonic7431"),
    "D3": ("The staging vault passphrase backup sits with wqvarnishtrope2286 in the old safe.", "varnishtrope2286"),
}
ERASE_DEADLINE = 90.0  # a repair cycle (30 s) and a scrub pass, on a busy 2-core machine


def held(node: MeshNode, cell_id: str) -> tuple[str, bytes, int | None] | None:
    """``(content, embedding bytes, forgotten_at)`` of a cell in the node's database (read-only)."""
    conn = sqlite3.connect(f"file:{node.home / 'hyphae.db'}?mode=ro", uri=True, timeout=10)
    try:
        return conn.execute("SELECT content, embedding, forgotten_at FROM cells WHERE node_id = ?", (cell_id,)).fetchone()
    finally:
        conn.close()


def received(node: MeshNode, cell_id: str) -> dict[str, bytes]:
    """Wait for the cell at ``node``; the needles of its content, word and vector there."""
    row = wait_until(lambda: held(node, cell_id), DEADLINE, message=lambda: f"{cell_id} at {node.name}\n{node.log_tail()}")
    content, embedding, forgotten_at = row
    assert forgotten_at is None and content in {text for text, _ in SECRETS.values()}
    word = next(word for text, word in SECRETS.values() if text == content)
    return needles(content, word, np.frombuffer(embedding, dtype=np.float32))


def wait_erased(node: MeshNode, cell_id: str, wanted: dict[str, bytes]) -> None:
    wait_until(
        lambda: held(node, cell_id)[2] is not None and not traces(node.home, wanted), ERASE_DEADLINE, interval=0.2,
        message=lambda: f"{node.name} still holds {traces(node.home, wanted)} (row {held(node, cell_id)[2:]})\n"
                        f"{node.log_tail()}",
    )  # fmt: skip


def refused(response, reason: str) -> str:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["reason"] == reason, error
    return error["message"]


def test_a_forgotten_cell_is_erased_from_every_holders_files_even_one_that_was_down(lab: Lab) -> None:
    a, b, c = lab.team(["a", "b", "c"], provider="hashed")
    lab.start_mesh([a, b, c])
    key = {n.name: n.add_agent(f"agent-{n.name}")[0] for n in (a, b, c)}
    intruder = a.add_agent("intruder")[0]
    for node in (b, c):
        node.rest("POST", "/v1/beacons", key[node.name], json={"query": INTEREST, "threshold": 0.2}, expect=201)
    wait_beacons_known(a, 2)
    ids = {
        name: a.rest("POST", "/v1/cells", key["a"], json={"content": text, "cell_type": "Decision", "salience": 0.9},
                     expect=201)["node_id"]
        for name, (text, _) in SECRETS.items()
    }  # fmt: skip
    wanted = {name: received(c, cell_id) for name, cell_id in ids.items()}
    for node in (b, c):
        for name, cell_id in ids.items():
            received(node, cell_id)
            assert set(traces(node.home, wanted[name])) == set(wanted[name]), f"{name} must be found at {node.name} first"

    # -- 1. D2, every node up: non-authors are refused everywhere, then the author forgets it.
    d2 = ids["D2"]
    message = refused(c.http.delete(f"/v1/cells/{d2}", headers={"x-hyphae-key": key["c"]}), "forbidden")
    assert d2 in message and "only the agent that stored a cell may forget it" in message
    message = refused(a.http.delete(f"/v1/cells/{d2}", headers={"x-hyphae-key": intruder}), "forbidden")
    assert "only the agent that stored a cell may forget it" in message
    message = refused(c.http.delete(f"/v1/admin/cells/{d2}", headers={"x-hyphae-admin": c.admin_token()}), "forbidden")
    assert a.node_id in message and "only its origin can forget it" in message
    try:
        a.cli("forget", d2, key=intruder)
        raise AssertionError("the intruder's CLI forget was not refused")
    except AssertionError as exc:
        assert "exited 1" in str(exc) and f"{d2}: forbidden" in str(exc), exc
    tools = {t["name"] for t in a.mcp(key["a"]).request("tools/list")["result"]["tools"]}
    assert len(tools) == 11 and not any("forget" in name for name in tools)
    assert held(c, d2)[2] is None and held(a, d2)[2] is None

    assert a.cli("forget", d2, key=key["a"]).strip() == f"Forgot {d2}."  # through A's daemon
    for node in (a, b, c):
        wait_erased(node, d2, wanted["D2"])
    shown = c.rest("GET", f"/v1/cells/{d2}", key["c"])
    assert shown["content"] == "" and shown["forgotten_at"] is not None
    assert set(traces(c.home, wanted["D3"])) == set(wanted["D3"]), "D3 is not forgotten: still there"

    # -- 2. D3, forgotten while C is down: C erases it once it is back.
    c.stop()
    a.rest("DELETE", f"/v1/cells/{ids['D3']}", key["a"])
    for node in (a, b):
        wait_erased(node, ids["D3"], wanted["D3"])
    assert held(c, ids["D3"])[2] is None and traces(c.home, wanted["D3"])  # down: it could not know yet
    c.start(peers=[a.mesh_address])
    wait_erased(c, ids["D3"], wanted["D3"])

    # -- the owner's bulk forget through A's daemon: what is left of A's agent goes too.
    last = a.rest("POST", "/v1/cells", key["a"], json={"content": f"{INTEREST}: not any more", "cell_type": "Fact"},
                  expect=201)["node_id"]  # fmt: skip
    for node in (b, c):
        wait_until(lambda: held(node, last), DEADLINE, message=lambda: f"{last} at {node.name}")
    assert "1 cell of agent 'agent-a' will be forgotten" in a.cli("forget", "--by-agent", "agent-a", "--yes")
    for node in (a, b, c):
        wait_until(lambda: held(node, last)[2] is not None, DEADLINE, message=lambda: f"{last} forgotten at {node.name}")
