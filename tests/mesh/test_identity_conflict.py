"""Two nodes on one node key (a copied ``node.key``: a cloned VM, a copied home dir) are found and told.

Both sign diffs under one origin, so their peers took whichever (origin, seq) came first and
dropped the other without a word, and followed whichever of the two spoke last. Now both
nodes say so (``status()["identity"]``, an ``IdentityConflict`` effect the daemon logs as an
error), the one that started later stops publishing, and no member takes a forked
(origin, seq) silently: the second copy is a counted ``fork`` drop, reported too.
"""

from __future__ import annotations

import copy
import dataclasses
import random

from mesh.engine import MeshEngine
from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
from mesh.memory import MemoryDiffLog
from mesh.testing import LinkConditions

from .test_engine import ENERGY, Mesh, beacon, cell, near, unit


def twin(original: MeshEngine, address: str, log: MemoryDiffLog) -> MeshEngine:
    """A node at ``address`` on ``original``'s key, over ``log`` (a copy of its data dir's)."""
    return MeshEngine(
        original.node_id, dataclasses.replace(original.config, address=address), log, energy=ENERGY,
        signer=original._sign, public_key=original.public_key, key_agreement=original._agree,
        rng=random.Random(address),
    )  # fmt: skip


def identity(engine: MeshEngine) -> dict:
    return engine.status()["identity"]


def conflicts_about(engine: MeshEngine, node_id: str) -> list[dict]:
    return [c for c in identity(engine)["conflicts"] if c["node_id"] == node_id]


def test_a_copied_key_is_reported_on_both_nodes_and_the_newcomer_stops_publishing():
    mesh = Mesh("alice", "bob")
    topic = unit(21)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    mesh.run(60_000)  # alice has run for a minute
    alice, bob = mesh["alice"].engine, mesh["bob"].engine
    copied = twin(alice, "alice-copy", copy.deepcopy(alice.store))
    mesh.net.add(copied)
    mesh.net.start("alice-copy")
    mesh.do("alice-copy", PeerDiscovered("bob"))
    assert mesh.net.run_until(mesh.net.now + 10_000, lambda: identity(copied)["stopped"]), identity(copied)

    for engine in (alice, copied):  # both say so, naming the other's address
        found = conflicts_about(engine, alice.node_id)
        assert found and all(c["ours"] for c in found), identity(engine)
    assert {c["address"] for c in conflicts_about(copied, alice.node_id)} & {"alice"}
    assert {c["address"] for c in conflicts_about(alice, alice.node_id)} & {"alice-copy"}
    assert not identity(alice)["stopped"]  # the node that was there first keeps its id

    kept = [cell(near(topic, 0.9), at=mesh.net.now) for _ in range(2)]
    refused = [cell(near(topic, 0.9), at=mesh.net.now) for _ in range(2)]
    for stored in kept:
        mesh.do("alice", CellStored(stored))
    for stored in refused:
        mesh.do("alice-copy", CellStored(stored))
    mesh.run(5000)
    got = mesh["bob"].cells
    assert all(c.node_id in got for c in kept)
    assert not any(c.node_id in got for c in refused)
    assert copied.counters.drops["identity_conflict"] >= len(refused)  # refused, and counted
    assert bob.peers.get(alice.node_id).address == "alice"  # the members follow alice again
    assert bob.counters.drops["fork"] == 0


def test_a_frame_claiming_our_id_from_elsewhere_is_a_counted_drop_and_is_reported():
    mesh = Mesh("alice", "bob")
    mesh.settle()
    mesh.run(60_000)
    alice = mesh["alice"].engine
    copied = twin(alice, "alice-copy", MemoryDiffLog())
    mesh.net.add(copied)
    mesh.net.start("alice-copy")
    mesh.do("alice-copy", PeerDiscovered("alice"))  # a frame under alice's id, from alice-copy
    mesh.run(3000)
    assert alice.counters.drops["own_id"] >= 1
    assert any(c["evidence"] == "own_frame" and c["address"] == "alice-copy" for c in identity(alice)["conflicts"])
    assert identity(copied)["stopped"] and not identity(alice)["stopped"]


def test_a_forked_seq_is_a_counted_fork_drop_and_reported_never_taken_silently():
    # Two nodes on one key and one copied log, started in the same millisecond: one incarnation,
    # so they sign the same seqs with different content. Every other member keeps the first
    # copy of each (origin, seq) it got, drops the other as a fork, and says so.
    mesh = Mesh("alice", "bob", "carol")
    topic = unit(22)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(topic)))
    mesh.settle()
    alice = mesh.net.hosts.pop("alice").engine  # stopped; its data dir copied; both copies start at once
    for address in ("alice", "alice-copy"):
        mesh.net.add(twin(alice, address, copy.deepcopy(alice.store)))
    mesh.net.start("alice", "alice-copy")
    mesh.do("alice-copy", PeerDiscovered("bob"))
    one, other = cell(near(topic, 0.9), at=mesh.net.now), cell(near(topic, 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(one))
    mesh.do("alice-copy", CellStored(other))  # the same (origin, seq) as ``one``
    mesh.run(5000)
    for name in ("bob", "carol"):
        engine, got = mesh[name].engine, mesh[name].cells
        assert engine.counters.drops["fork"] >= 1, (name, engine.counters.drops)
        assert any(c["evidence"] == "fork" and not c["ours"] for c in conflicts_about(engine, alice.node_id)), name
        assert (one.node_id in got) != (other.node_id in got), name  # the first copy, never both
    for address in ("alice", "alice-copy"):  # they found each other too; started together, both stop
        assert identity(mesh[address].engine)["stopped"], address


def test_the_newcomer_stops_even_when_the_first_answers_are_lost():
    """Under load a frame is lost: the copy tells the address it last listened at again, every
    few seconds of its grace, and each time it is heard the original answers with its record."""
    mesh = Mesh("alice", "bob")
    mesh.settle()
    mesh.run(60_000)
    alice = mesh["alice"].engine
    copied = twin(alice, "alice-copy", copy.deepcopy(alice.store))
    mesh.net.add(copied)
    lost = LinkConditions(loss=1.0)
    for link in (("alice", "alice-copy"), ("alice-copy", "alice")):
        mesh.net.links[link] = lost  # the first tellings, both ways: lost
    mesh.net.partition(["alice", "bob"], ["alice-copy"])  # and no word through bob at all
    mesh.net.start("alice-copy")
    mesh.net.run_until(mesh.net.now + 6_000)
    assert not identity(copied)["stopped"]
    mesh.net.links.clear()  # the direct link recovers, well within the copy's 30 s grace
    mesh.net.partition(["alice", "alice-copy"], ["bob"])
    assert mesh.net.run_until(mesh.net.now + 15_000, lambda: identity(copied)["stopped"]), identity(copied)
    assert not identity(alice)["stopped"]
