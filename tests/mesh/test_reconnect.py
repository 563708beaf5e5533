"""What a node does when peers come and go, or when it restarts itself.

Repair on reconnect, but not on every flap; a restarted node starts from the control
state it had (members, addresses, beacons) instead of from nothing; a node back on a
new address is found there again. What an origin could not deliver to a dead peer is
offered again when it comes back; a repair request left unanswered is sent again; the
periodic repair asks every live peer in turn.
"""

from __future__ import annotations

import dataclasses
import random

from mesh.engine import MeshEngine
from mesh.events import BeaconPlaced, BeaconRemoved, CellStored, PeerDiscovered, SendFailed, SendFrame, Started
from mesh.testing import make_engine
from mesh.errors import Reason
from mesh.wire import MsgType, WireLimits, decode_envelope

from .test_engine import ENERGY, Mesh, beacon, cell, near, unit


def test_a_flapping_peer_costs_one_repair_per_interval_not_one_per_flap():
    mesh = Mesh("alice", "bob", repair_interval_ms=600_000)
    mesh.settle()
    alice = mesh["alice"].engine
    start = alice.counters.repairs_requested
    flips = 0
    for _ in range(10):  # 10 suspect -> alive flips in 15 s
        mesh.do("alice", SendFailed("bob"))
        assert mesh["alice"].peer_states[mesh["bob"].node_id] == "suspect"
        mesh.run(1500)  # bob's gossip arrives: alive again
        flips += mesh["alice"].peer_states[mesh["bob"].node_id] == "alive"
    assert flips == 10
    requested = alice.counters.repairs_requested - start
    assert 1 <= requested <= 15_000 // alice.config.repair_min_interval_ms + 1, requested


def restart(mesh: Mesh, name: str, *, address: str | None = None) -> str:
    """Stop ``name`` and start a new engine for it on the same key and log (at ``address``)."""
    old = mesh[name].engine
    address = address or name
    if address == name:
        mesh.net.hosts.pop(name)  # its pending timers reach the new engine, which ignores what it did not set
    engine = MeshEngine(
        old.node_id, dataclasses.replace(old.config, address=address), old.store, energy=ENERGY,
        signer=old._sign, public_key=old.public_key, key_agreement=old._agree, rng=random.Random(address),
    )  # fmt: skip
    mesh.net.add(engine)
    mesh.net.start(address)
    return address


def test_a_restarted_node_routes_its_first_store_from_the_control_state_it_had():
    mesh = Mesh("alice", "bob", "carol")
    wanted = beacon(unit(1))
    mesh.do("bob", BeaconPlaced(wanted))
    mesh.settle()
    restart(mesh, "alice")
    alice = mesh["alice"].engine
    assert len(alice.peers) == 2 and len(alice.beacons) == 1  # before a single frame came in
    assert alice.control.digest() == mesh["bob"].engine.control.digest() | {alice.node_id: alice.control.version(alice.node_id)}
    stored = cell(near(unit(1), 0.9), at=mesh.net.now)
    effects = mesh.net.inject("alice", CellStored(stored))
    data = [e for e in effects if isinstance(e, SendFrame) and not e.is_control]
    assert [e.address for e in data] == ["bob"]  # pushed at once, not after repair
    mesh.run(2000)
    assert stored.node_id in mesh["bob"].cells and stored.node_id not in mesh["carol"].cells


def test_a_node_back_on_a_new_address_is_relearned_by_everyone():
    mesh = Mesh("alice", "bob", "carol")
    mesh.do("bob", BeaconPlaced(beacon(unit(2))))
    mesh.settle()
    bob_id = mesh["bob"].node_id
    mesh.net.partition(["bob"])  # down: nothing reaches it or leaves it any more
    mesh.run(20_000)
    assert mesh["alice"].engine.peers.get(bob_id).state.value == "dead"
    restart(mesh, "bob", address="bob-2")  # no PeerDiscovered: it knows alice and carol from its log
    for name in ("alice", "carol"):
        assert mesh.net.run_until(mesh.net.now + 5000, lambda: mesh[name].engine.peers.get(bob_id).address == "bob-2"
                                  and mesh[name].engine.peers.get(bob_id).state.value == "alive"), name  # fmt: skip
    stored = cell(near(unit(2), 0.9), at=mesh.net.now)
    mesh.do("carol", CellStored(stored))
    assert mesh.net.run_until(mesh.net.now + 2000, lambda: stored.node_id in mesh["bob-2"].cells)


def test_a_restarted_node_asks_every_peer_it_knew_for_what_it_missed():
    mesh = Mesh("alice", "bob", "carol", repair_interval_ms=600_000)  # no periodic repair to lean on
    mesh.do("alice", BeaconPlaced(beacon(unit(3))))
    mesh.settle()
    mesh.net.partition(["alice"])  # alice is down
    missed = [cell(near(unit(3), 0.9), at=mesh.net.now) for _ in range(2)]
    mesh.do("bob", CellStored(missed[0]))
    mesh.do("carol", CellStored(missed[1]))
    mesh.run(60_000)  # bob and carol give up on alice and declare it dead
    assert mesh["bob"].engine.peers.get(mesh["alice"].node_id).state.value == "dead"
    restart(mesh, "alice")
    mesh.net.heal()
    got = mesh["alice"].cells
    assert mesh.net.run_until(mesh.net.now + 10_000, lambda: all(c.node_id in got for c in missed)), list(got)


def test_old_beacon_removals_are_left_behind_at_a_restart_and_versions_stay_exact():
    mesh = Mesh("alice", "bob")
    gone, kept = beacon(unit(4)), beacon(unit(5))
    mesh.do("alice", BeaconPlaced(gone))
    mesh.settle()
    mesh.do("alice", BeaconRemoved(gone.beacon_id, "t"))
    mesh.do("alice", BeaconPlaced(kept))  # alice signs on after the removal
    mesh.settle()
    bob = mesh["bob"].engine
    version = bob.control.version(mesh["alice"].node_id)
    restart(mesh, "bob")  # soon: the removal is kept
    assert "unbeacon" in kinds_of(mesh["bob"].engine, mesh["alice"].node_id)
    # Eight days later the removal is garbage: left out, while alice's version stays what it was,
    # so anti-entropy does not hand it back.
    old = mesh["bob"].engine
    later = MeshEngine(
        old.node_id, old.config, old.store, energy=ENERGY, signer=old._sign, public_key=old.public_key,
        key_agreement=old._agree,
    )  # fmt: skip
    later.handle(Started(), mesh.net.now + 8 * 24 * 3600 * 1000)
    assert kinds_of(later, mesh["alice"].node_id) == {"peer", "beacon"}
    assert later.control.version(mesh["alice"].node_id) == version
    assert [b.beacon.beacon_id for b in later.beacons.of_owner(mesh["alice"].node_id)] == [kept.beacon_id]


def kinds_of(engine: MeshEngine, origin: str) -> set[str]:
    return {d.kind.name.lower() for d in engine.control.entries(origin)}


def test_the_sqlite_log_keeps_one_row_per_control_key(tmp_path):
    from mesh.identity import NodeIdentity
    from mesh.wire import PeerPayload, sign_diff
    from node.store.database import Database
    from node.store.diff_log import SqliteDiffLog

    db = Database(tmp_path / "hyphae.db")
    try:
        log = SqliteDiffLog(db)
        me = NodeIdentity.generate()
        for seq, address in enumerate(("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"), start=1):
            log.put(sign_diff(PeerPayload(address), origin=me.node_id, seq=seq, ts=seq, sign=me.sign), seq)
        db.write_sync(lambda tx: None)  # everything before it is committed
        reopened = SqliteDiffLog(db)
        assert [d.payload.address for d in reopened.control_diffs()] == ["127.0.0.1:3"]
        assert reopened.max_seq(me.node_id) == 3
    finally:
        db.close()


def frames_of_type(mesh: Mesh, sender: str, mtype: MsgType, *, lose: int = 0) -> list[str]:
    """Watch ``sender``'s frames of ``mtype`` (the addresses they go to, in order) and lose
    the first ``lose`` of them on the way."""
    seen: list[str] = []
    send = mesh.net._send

    def watched(src: str, effect: SendFrame) -> None:
        if src == sender:
            engine = mesh[src].engine
            _, _, plaintext = engine._sealer.open(effect.frame)
            if decode_envelope(plaintext, engine.config.limits).type is mtype:
                seen.append(effect.address)
                if len(seen) <= lose:
                    return
        send(src, effect)

    mesh.net._send = watched
    return seen


def test_a_cell_stored_for_a_dead_peer_is_offered_again_by_its_origin_when_the_peer_is_back():
    # The cell is stored seconds before bob returns, so bob's first repair request finds it
    # too fresh to answer (its push may still be in flight), and only alice holds it.
    mesh = Mesh("alice", "bob", "carol", repair_interval_ms=600_000)  # no periodic repair to lean on
    mesh.do("bob", BeaconPlaced(beacon(unit(6))))
    mesh.settle()
    bob_id = mesh["bob"].node_id
    alice = mesh["alice"].engine
    mesh.net.partition(["bob"])  # bob is down
    assert mesh.net.run_until(mesh.net.now + 30_000, lambda: alice.peers.get(bob_id).state.value == "dead")
    stored = cell(near(unit(6), 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(stored))  # nothing sent to a dead peer: owed to it
    assert alice.owed.count(bob_id) == 1 and alice.counters.drops["peer_dead"] >= 1
    mesh.net.heal()
    restart(mesh, "bob")
    got = mesh["bob"].cells
    assert mesh.net.run_until(mesh.net.now + 5_000, lambda: stored.node_id in got)
    assert alice.owed.count(bob_id) == 0
    mesh.run(5_000)
    assert got[stored.node_id].origin_node == mesh["alice"].node_id and len(got) == 1


def test_what_a_batch_gave_up_on_is_offered_again_when_the_peer_answers_again():
    mesh = Mesh("alice", "bob", repair_interval_ms=600_000)
    mesh.do("bob", BeaconPlaced(beacon(unit(7))))
    mesh.settle()
    bob_id = mesh["bob"].node_id
    alice = mesh["alice"].engine
    mesh.net.partition(["bob"])
    stored = cell(near(unit(7), 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(stored))  # sent while bob still counts as alive: resent, then given up or dropped
    assert mesh.net.run_until(mesh.net.now + 60_000, lambda: alice.outbox.depth(bob_id) == 0
                              and alice.outbox.inflight(bob_id) == 0)  # fmt: skip
    assert alice.owed.count(bob_id) == 1
    assert stored.node_id not in mesh["bob"].cells
    mesh.net.heal()
    assert mesh.net.run_until(mesh.net.now + 15_000, lambda: stored.node_id in mesh["bob"].cells)


def test_a_decayed_cell_is_not_offered_again():
    mesh = Mesh("alice", "bob", repair_interval_ms=600_000)
    mesh.do("bob", BeaconPlaced(beacon(unit(8), threshold=0.5)))
    mesh.settle()
    bob_id = mesh["bob"].node_id
    alice = mesh["alice"].engine
    mesh.net.partition(["bob"])
    assert mesh.net.run_until(mesh.net.now + 30_000, lambda: alice.peers.get(bob_id).state.value == "dead")
    day = 86_400_000
    old = cell(unit(8), cell_type="Context", salience=0.5, at=mesh.net.now - 30 * day)  # E = 0.2 * 2^-10
    fresh = cell(unit(8), at=mesh.net.now)
    mesh.do("alice", CellStored(old))
    mesh.do("alice", CellStored(fresh))
    assert alice.owed.count(bob_id) == 2
    mesh.net.heal()
    assert mesh.net.run_until(mesh.net.now + 30_000, lambda: fresh.node_id in mesh["bob"].cells)
    mesh.run(5_000)
    assert old.node_id not in mesh["bob"].cells and alice.owed.count(bob_id) == 0


def test_an_unanswered_repair_request_is_sent_again():
    mesh = Mesh("alice", "carol", repair_interval_ms=600_000)
    mesh.settle()
    stored = cell(near(unit(9), 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(stored))  # wanted by nobody yet: held by alice alone, owed to no one
    bob = mesh.net.add(make_engine("bob", mesh.team, ENERGY, repair_interval_ms=600_000))
    mesh.net.start("bob")
    mesh.do("bob", BeaconPlaced(beacon(unit(9))))
    requests = frames_of_type(mesh, "bob", MsgType.REPAIR_REQUEST, lose=1)
    mesh.do("bob", PeerDiscovered("alice"))
    timeout = bob.engine.config.repair_timeout_ms
    assert mesh.net.run_until(mesh.net.now + timeout + 5_000, lambda: stored.node_id in bob.cells), requests
    assert requests[:2] == ["alice", "alice"]


def test_the_periodic_repair_asks_every_live_peer_in_turn():
    names = ["alice", "bob", "carol", "dave", "erin"]
    mesh = Mesh(*names, repair_interval_ms=10_000)
    mesh.settle()
    mesh.run(15_000)  # the repairs of joining are over
    asked = frames_of_type(mesh, "alice", MsgType.REPAIR_REQUEST)
    alice = mesh["alice"].engine
    start = alice.counters.repairs_requested
    assert mesh.net.run_until(mesh.net.now + 200_000, lambda: alice.counters.repairs_requested - start >= 12)
    rounds = asked[:12]
    assert all(sorted(rounds[i : i + 4]) == sorted(names[1:]) for i in range(0, 12, 4)), rounds


def test_a_catch_up_asks_once_more_for_what_its_peer_received_just_before():
    # bob receives alice's cell a moment before carol, back from a crash, asks bob for what
    # she missed: too fresh for that answer (bob's push to her may still be in flight). Alice
    # is gone, so only a second request to bob, once the cell has settled, brings it.
    mesh = Mesh("alice", "bob", "carol", repair_interval_ms=600_000)  # no periodic repair to lean on
    topic = unit(11)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(topic)))
    mesh.settle()
    mesh.net.partition(["carol"])  # carol is down
    stored = cell(near(topic, 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(stored))
    assert mesh.net.run_until(mesh.net.now + 5_000, lambda: stored.node_id in mesh["bob"].cells)
    mesh.net.partition(["alice"])  # alice is gone; carol is back
    restart(mesh, "carol")
    carol = mesh["carol"].engine
    assert mesh.net.run_until(mesh.net.now + 15_000, lambda: stored.node_id in mesh["carol"].cells)
    assert carol.counters.repairs_requested <= 4  # the first request, maybe "not ready" once, and one more


def test_restarted_nodes_keep_members_keys_and_verify_a_relayed_diff_whose_origin_is_gone():
    # bob holds alice's cell; alice goes away for good. bob and carol both restart, then carol
    # asks bob for repair: bob's reply carries alice's diff, and only keys kept across the
    # restarts can vouch for it (alice is not there to send hers).
    mesh = Mesh("alice", "bob", "carol", repair_interval_ms=600_000)
    topic = unit(10)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(topic)))
    mesh.settle()
    alice_id = mesh["alice"].node_id
    mesh.net.partition(["carol"])
    stored = cell(near(topic, 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(stored))
    assert mesh.net.run_until(mesh.net.now + 5_000, lambda: stored.node_id in mesh["bob"].cells)
    mesh.net.partition(["alice"])  # alice is gone; carol is back
    restart(mesh, "bob")
    restart(mesh, "carol")
    for name in ("bob", "carol"):
        assert mesh[name].engine.keyring.get(alice_id) is not None, name  # before any frame came in
    assert mesh.net.run_until(mesh.net.now + 10_000, lambda: stored.node_id in mesh["carol"].cells)
    assert mesh["carol"].engine.counters.drops["unknown_origin"] == 0


def test_kept_keys_are_checked_again_at_a_restart():
    mesh = Mesh("alice", "bob")
    mesh.settle()
    bob = mesh["bob"].engine
    alice_id = mesh["alice"].node_id
    public_key, proof = bob.keyring.get(alice_id)
    bob.store.put_key(alice_id, public_key, b"\0" * len(proof))  # a proof the team does not vouch for
    restart(mesh, "bob")
    assert mesh["bob"].engine.keyring.get(alice_id) is None
    mesh.run(5_000)  # alice's own frames vouch for her again
    assert mesh["bob"].engine.keyring.get(alice_id) == (public_key, proof)


def test_the_sqlite_log_keeps_members_keys(tmp_path):
    from mesh.identity import NodeIdentity
    from node.store.database import Database
    from node.store.diff_log import SqliteDiffLog

    db = Database(tmp_path / "hyphae.db")
    try:
        log = SqliteDiffLog(db)
        member = NodeIdentity.generate()
        log.put_key(member.node_id, member.public_key, b"old proof")
        log.put_key(member.node_id, member.public_key, b"new proof")
        db.write_sync(lambda tx: None)  # everything before it is committed
        assert SqliteDiffLog(db).keys() == [(member.node_id, member.public_key, b"new proof")]
    finally:
        db.close()


def test_a_repair_cut_short_resumes_where_it_stopped_until_the_relay_has_given_everything():
    """Replies carry at most ``max_diffs`` diffs: carol, cut off while alice stored 12 cells,
    is repaired by bob (a holder; alice is gone by then) over four replies of three, each
    resuming after the last diff the previous one carried."""
    mesh = Mesh("alice", "bob", "carol", limits=WireLimits(max_diffs=3), repair_interval_ms=600_000)
    topic = unit(12)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(topic, agent="reader2")))
    mesh.settle(30_000)
    mesh.net.partition(["alice", "bob"], ["carol"])
    stored = [cell(near(topic, 0.95, seed=i), at=mesh.net.now) for i in range(12)]
    for c in stored:
        mesh.do("alice", CellStored(c))
    wanted = {c.node_id for c in stored}
    assert mesh.net.run_until(mesh.net.now + 30_000, lambda: wanted <= set(mesh["bob"].cells))
    mesh.run(30_000)  # long enough for carol to count the others dead, and alice to give up on her
    assert mesh["carol"].peer_states[mesh["bob"].node_id] == "dead"
    assert not wanted & set(mesh["carol"].cells)
    replies: list[int] = []
    sealer = mesh.team.sealer()

    def watch(host, effect) -> None:
        if isinstance(effect, SendFrame) and host.address == "bob" and effect.address == "carol":
            env = decode_envelope(sealer.open(effect.frame)[2], WireLimits(max_diffs=3))
            if env.type is MsgType.REPAIR_REPLY and env.diffs:
                replies.append(len(env.diffs))

    mesh.net.on_effect = watch
    mesh.net.partition(["alice"], ["bob", "carol"])  # the origin goes away as the others reconnect
    got = mesh["carol"].cells
    assert mesh.net.run_until(mesh.net.now + 60_000, lambda: wanted <= set(got)), f"{len(got)} of 12: {replies}"
    assert replies == [3, 3, 3, 3]
    assert {got[i].origin_node for i in wanted} == {mesh["alice"].node_id}
    assert mesh["carol"].engine.counters.drops[Reason.DUPLICATE] == 0
