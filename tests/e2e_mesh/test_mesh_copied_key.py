"""A copied data dir (the same ``node.key``) started beside the original: refused, and both say why.

Two ``hyphae up`` daemons on 127.0.0.1, alice and bob, one team; bob's agent places a beacon.
Once alice has run past her start-up grace, her data dir is copied (her key, her config, a
consistent copy of her database) and the copy is started too, as a cloned VM would be. The
copy finds alice using its id and, being the newcomer, stops publishing; alice keeps her id.
Both daemons log the conflict as an error and report it in their mesh status (``hyphae
peers``); alice's next cell reaches bob, the copy's never does.
"""

from __future__ import annotations

import shutil
import sqlite3
import time

from .cluster import DEADLINE, Lab, MeshNode, wait_beacons_known, wait_until
from .test_mesh_restored_backup import held

INTEREST = "who owns the release checklist"
GRACE_S = 30.0  # mesh.config.MeshConfig.identity_grace_ms


def copy_data_dir(source: MeshNode, target: MeshNode) -> None:
    """What copying a home dir does, taken from a running node: every file, the database by
    SQLite's online backup (consistent), none of the daemon's run-time files."""
    shutil.copytree(source.home, target.home, ignore=shutil.ignore_patterns(
        "hyphae.db*", "daemon.json", "admin.token", "*.sock", "node.lock",
    ))  # fmt: skip
    with sqlite3.connect(source.home / "hyphae.db") as src, sqlite3.connect(target.home / "hyphae.db") as dst:
        src.backup(dst)


def identity(node: MeshNode) -> dict:
    return node.peers().get("identity") or {}


def test_a_copied_data_dir_is_refused_and_both_nodes_say_why(lab: Lab) -> None:
    alice, bob = lab.team(["alice", "bob"], provider="hashed")
    started = time.monotonic()
    lab.start_mesh([alice, bob])
    key = {n.name: n.add_agent(f"agent-{n.name}")[0] for n in (alice, bob)}
    bob.rest("POST", "/v1/beacons", key["bob"], json={"query": INTEREST}, expect=201)
    wait_beacons_known(alice, 1)
    time.sleep(max(0.0, GRACE_S + 1 - (time.monotonic() - started)))  # alice is no newcomer any more

    copy = lab._new("alice-copy", "hashed")
    copy_data_dir(alice, copy)
    copy.start(peers=[bob.mesh_address])
    assert copy.node_id == alice.node_id
    wait_until(lambda: identity(copy).get("stopped"), DEADLINE,
               message=lambda: f"the copy's identity status: {identity(copy)}\n{copy.log_tail()}")  # fmt: skip
    wait_until(lambda: identity(alice).get("conflicts"), DEADLINE, message=lambda: f"alice: {identity(alice)}")
    assert not identity(alice)["stopped"]
    for node in (alice, copy):
        assert all(c["ours"] for c in identity(node)["conflicts"]), identity(node)
        assert "level=error" in node.log_tail(200) and "identity conflict" in node.log_tail(200), node.log_tail()
    assert "identity conflict" in copy.cli("peers")

    body = {"content": f"{INTEREST}: release captain rota", "cell_type": "Decision"}
    refused = copy.peers()["drops"].get("identity_conflict", 0)
    from_copy = copy.rest("POST", "/v1/cells", key["alice"], json=body, expect=201)["node_id"]  # stored locally
    wait_until(lambda: copy.peers()["drops"].get("identity_conflict", 0) > refused, DEADLINE,
               message="the copy refusing to publish its cell")  # fmt: skip
    from_alice = alice.rest("POST", "/v1/cells", key["alice"], json=body, expect=201)["node_id"]
    wait_until(lambda: held(bob, [from_alice]), DEADLINE, message=lambda: f"alice's cell at bob\n{alice.log_tail()}")
    assert not held(bob, [from_copy])  # the copy never sent it: the engine refused the event, counted above
