"""A node whose diff log went back in time (a restored backup) never re-issues an (origin, seq).

Its peers hold every (origin, seq) it signed before, and drop a diff they hold as a
duplicate for good: a node that numbered its new cells from an older log's highest seq lost
them all. Every start begins a new incarnation of the seq space (``mesh.incarnation``), so
what a restart signs is above anything any run of it signed, whatever its log remembers.
"""

from __future__ import annotations

import copy
import dataclasses
import random

from mesh.diffs import diff_key
from mesh.engine import MeshEngine
from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
from mesh.haves import HaveSet
from mesh.incarnation import COUNTER_BITS
from mesh.memory import MemoryDiffLog

from .test_engine import ENERGY, Mesh, beacon, cell, near, unit


def restart_on(mesh: Mesh, name: str, log: MemoryDiffLog) -> MeshEngine:
    """Stop ``name`` and start it again on the same key, on ``log`` (what a restored backup holds)."""
    old = mesh.net.hosts.pop(name).engine
    engine = MeshEngine(
        old.node_id, dataclasses.replace(old.config), log, energy=ENERGY, signer=old._sign,
        public_key=old.public_key, key_agreement=old._agree, rng=random.Random(name),
    )  # fmt: skip
    mesh.net.add(engine)
    mesh.net.start(name)
    return engine


def test_a_node_restarted_on_an_older_log_keeps_delivering_its_new_cells():
    mesh = Mesh("alice", "bob")
    topic = unit(11)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    first = cell(near(topic, 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(first))
    mesh.run(2000)
    backup = copy.deepcopy(mesh["alice"].engine.store)  # the backup: alice's log as it is now
    lost = [cell(near(topic, 0.9), at=mesh.net.now) for _ in range(6)]
    for stored in lost:  # signed after the backup: bob holds them, alice will not remember them
        mesh.do("alice", CellStored(stored))
    mesh.run(2000)
    got = mesh["bob"].cells
    assert all(c.node_id in got for c in [first, *lost])

    alice_id = mesh["alice"].node_id
    assert backup.max_seq(alice_id) < mesh["bob"].engine.store.max_seq(alice_id)  # bob holds what it forgot
    restart_on(mesh, "alice", backup)
    mesh.do("alice", PeerDiscovered("bob"))
    fresh = [cell(near(topic, 0.9), at=mesh.net.now) for _ in range(5)]
    for stored in fresh:
        mesh.do("alice", CellStored(stored))
    mesh.run(5000)
    assert sum(c.node_id in got for c in fresh) == 5, mesh["bob"].engine.counters.drops


def test_a_node_restarted_on_an_empty_log_beside_its_key_does_not_collide_either():
    mesh = Mesh("alice", "bob")
    topic = unit(12)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    for _ in range(3):
        mesh.do("alice", CellStored(cell(near(topic, 0.9), at=mesh.net.now)))
    mesh.run(3000)
    restart_on(mesh, "alice", MemoryDiffLog())
    mesh.do("alice", PeerDiscovered("bob"))
    fresh = [cell(near(topic, 0.9), at=mesh.net.now) for _ in range(5)]
    for stored in fresh:
        mesh.do("alice", CellStored(stored))
    mesh.run(5000)
    assert sum(c.node_id in mesh["bob"].cells for c in fresh) == 5, mesh["bob"].engine.counters.drops


def test_every_start_signs_above_all_its_earlier_runs_signed():
    mesh = Mesh("alice")
    alice = mesh["alice"].engine
    seqs = [alice.state.seq]
    for _ in range(3):  # restarts in one millisecond, on the same log: the clock alone would not tell them apart
        alice = restart_on(mesh, "alice", alice.store)
        seqs.append(alice.state.seq)
    assert seqs == sorted(set(seqs)), seqs
    assert len({seq >> COUNTER_BITS for seq in seqs}) == len(seqs)  # one incarnation each


def test_a_have_set_span_never_reaches_back_into_an_earlier_incarnation():
    # A peer that restarted within the repair window: its seqs jump by an incarnation. The span
    # of what we hold of it starts at its current incarnation, not billions of seqs back (a scan
    # of ``has`` for each, and a bitmap over the budget); what falls outside is resent at worst.
    origin = "a" * 32
    before, after = (7 << COUNTER_BITS) | 41, (900_000 << COUNTER_BITS) | 3
    held = {(origin, before), *((origin, (900_000 << COUNTER_BITS) | s) for s in (1, 2, 3))}
    asked: list[int] = []

    def has(o: str, seq: int) -> bool:
        asked.append(seq)
        return (o, seq) in held

    haves = HaveSet.build({origin: before}, {origin: after}.__getitem__, has)
    assert len(asked) <= 8, len(asked)
    assert all((origin, (900_000 << COUNTER_BITS) | s) in haves for s in (1, 2, 3))


def test_diff_keys_tell_the_incarnations_apart():
    origin = "b" * 32
    assert diff_key(origin, 5) != diff_key(origin, (1 << 32) | 5)
    assert diff_key(origin, (3 << COUNTER_BITS) | 5) != diff_key(origin, ((3 + (1 << 10)) << COUNTER_BITS) | 5)
    assert diff_key(origin, 5) == diff_key(origin, 5)
