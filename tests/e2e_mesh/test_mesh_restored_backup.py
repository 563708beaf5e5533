"""A node restored from an older backup of its database delivers every cell it stores next.

Two ``hyphae up`` daemons on 127.0.0.1, alice and bob, one team; bob's agent places a beacon.
alice stores a cell, stops, and her ``hyphae.db`` is copied aside (the backup). She runs again
and stores six more, which bob receives; then she stops and the backup is put back, so her
database no longer remembers having signed those six. She starts again and stores five: bob
must receive all five. A node that numbered its diffs from its own log's highest seq signed
(alice, seq) pairs bob already held, and bob dropped every one as a duplicate, for good.
"""

from __future__ import annotations

import shutil
import sqlite3

from .cluster import DEADLINE, Lab, MeshNode, wait_beacons_known, wait_until

INTEREST = "how we roll back a failed database migration"


def held(node: MeshNode, cell_ids: list[str]) -> set[str]:
    """Which of ``cell_ids`` the node's database holds (read-only, beside the daemon)."""
    conn = sqlite3.connect(f"file:{node.home / 'hyphae.db'}?mode=ro", uri=True, timeout=10)
    try:
        marks = ",".join("?" * len(cell_ids))
        return {row[0] for row in conn.execute(f"SELECT node_id FROM cells WHERE node_id IN ({marks})", cell_ids)}
    finally:
        conn.close()


def store(node: MeshNode, key: str, count: int, label: str) -> list[str]:
    return [
        node.rest("POST", "/v1/cells", key, json={"content": f"{INTEREST}: {label} note {i}", "cell_type": "Decision"},
                  expect=201)["node_id"]
        for i in range(count)
    ]  # fmt: skip


def test_a_node_restored_from_an_older_backup_delivers_every_new_cell(lab: Lab, tmp_path) -> None:
    alice, bob = lab.team(["alice", "bob"], provider="hashed")
    lab.start_mesh([alice, bob])
    key = {n.name: n.add_agent(f"agent-{n.name}")[0] for n in (alice, bob)}
    bob.rest("POST", "/v1/beacons", key["bob"], json={"query": INTEREST}, expect=201)
    wait_beacons_known(alice, 1)

    def arrive(cell_ids: list[str]) -> None:
        wait_until(lambda: held(bob, cell_ids) == set(cell_ids), DEADLINE,
                   message=lambda: f"{len(held(bob, cell_ids))} of {len(cell_ids)} at bob; bob drops "
                                   f"{bob.peers().get('drops')}\n{alice.log_tail()}")  # fmt: skip

    arrive(store(alice, key["alice"], 1, "first"))
    alice.stop()
    backup = tmp_path / "backup.db"
    shutil.copyfile(alice.home / "hyphae.db", backup)

    alice.start(peers=[bob.mesh_address])
    arrive(store(alice, key["alice"], 6, "later"))  # bob holds these; the backup knows nothing of them
    alice.stop()
    for leftover in ("hyphae.db-wal", "hyphae.db-shm"):
        (alice.home / leftover).unlink(missing_ok=True)
    shutil.copyfile(backup, alice.home / "hyphae.db")

    alice.start(peers=[bob.mesh_address])
    fresh = store(alice, key["alice"], 5, "after the restore")
    arrive(fresh)
