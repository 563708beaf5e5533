"""Issue "Trust no member": a member (or a member's compromised machine) holds the team key.

Each story below is one of the issue's bugs, told the way it was found: an insider ``mallory``
beside honest ``alice`` and ``bob``, on the virtual network. The insider uses nothing but what
a member has: the team key, its own node key, and its own engine's signing of diffs.
"""

from __future__ import annotations

from mesh.admission import ReplayWindow
from mesh.errors import Reason
from mesh.events import BeaconPlaced, BeaconRemoved, CellStored, FrameReceived
from mesh.wire import BeaconPayload, Envelope, MsgType, encode_envelope

from .test_engine import Mesh, beacon, cell, near, unit

MINUTE = 60_000


def insider_mesh() -> Mesh:
    mesh = Mesh("alice", "bob", "mallory")
    mesh.settle()
    return mesh


# -- bug 2: a frame's sender id was protected by the team key alone ---------------------------


def test_a_forged_ping_in_anothers_name_does_not_cut_that_member_off():
    """One PING "from bob", sealed by mallory with the team key and stamped 9.5 minutes
    ahead, used to move alice's estimate of bob's clock so far that every real frame of bob's
    was a ``replay``: 0 of 10 cells delivered in 60 s while alice showed bob alive."""
    mesh = insider_mesh()
    alice, bob = mesh["alice"].engine, mesh["bob"].engine
    topic = unit(21)
    mesh.do("alice", BeaconPlaced(beacon(topic)))
    mesh.settle()
    env = Envelope(MsgType.PING, mesh.net.now + 9 * MINUTE + 30_000, "bob", {bob.node_id: (bob.public_key, bob._proof)},
                   nonce=7)  # fmt: skip
    forged = mesh.team.sealer().seal(bob.node_id, encode_envelope(env))  # the team key is all it takes
    mesh.net.inject("alice", FrameReceived("mallory", forged))
    cells = [cell(near(topic, 0.95, seed=i)) for i in range(10)]
    for stored in cells:
        mesh.do("bob", CellStored(stored))
        mesh.run(1000)
    mesh.run(50_000)
    delivered = sum(c.node_id in mesh["alice"].cells for c in cells)
    assert delivered == 10, (delivered, dict(alice.counters.drops))
    assert alice.counters.drops[Reason.REPLAY] == 0


def test_one_wild_clock_sample_moves_a_senders_offset_estimate_by_a_bounded_step():
    """Even from the sender itself (a clock that jumps, a frame replayed across the window):
    the estimate is the median of the last samples, moved a bounded step per frame."""
    window = ReplayWindow(max_clock_skew_ms=10 * MINUTE, max_future_skew_ms=MINUTE, frame_max_age_ms=2 * MINUTE)
    now, nonces = 1_000_000_000, iter(range(1, 1000))

    def frame(offset: int) -> str | None:
        return window.admit("bob", now + offset, next(nonces).to_bytes(12, "big"), now)

    for _ in range(8):
        assert frame(-20) is None
        now += 1000
    assert frame(9 * MINUTE + 30_000) is None  # within the +-10 min bound: taken, but ...
    assert abs(window.offsets["bob"]) <= 10_000  # ... it does not become bob's clock
    for _ in range(10):
        now += 1000
        assert frame(-20) is None  # bob's ordinary frames are not replays


# -- bug 3: any member could delete or take over anyone's beacon --------------------------------


def test_an_unbeacon_from_another_member_does_not_remove_a_beacon():
    mesh = insider_mesh()
    topic = unit(31)
    wanted = beacon(topic)
    mesh.do("bob", BeaconPlaced(wanted))
    mesh.settle()
    mesh.do("mallory", BeaconRemoved(wanted.beacon_id, wanted.tenant_id))  # signed by mallory, for bob's id
    mesh.settle()
    alice = mesh["alice"].engine
    assert [e.beacon.beacon_id for e in alice.beacons.of_owner(mesh["bob"].node_id)] == [wanted.beacon_id]
    stored = cell(near(topic, 0.95))
    mesh.do("alice", CellStored(stored))
    mesh.run(2000)
    assert stored.node_id in mesh["bob"].cells


def test_a_beacon_reusing_another_members_id_does_not_take_it_over():
    mesh = insider_mesh()
    topic, elsewhere = unit(32), unit(33)
    wanted = beacon(topic)
    mesh.do("bob", BeaconPlaced(wanted))
    mesh.settle()
    stolen = BeaconPayload(wanted.beacon_id, wanted.tenant_id, "reader", "query", 0.8, embedding=elsewhere,
                           embedding_space="space")  # fmt: skip
    mesh.do("mallory", BeaconPlaced(stolen))
    mesh.settle()
    alice = mesh["alice"].engine
    owned = alice.beacons.of_owner(mesh["bob"].node_id)
    assert [e.beacon for e in owned] == [wanted]
    stored = cell(near(topic, 0.95))
    mesh.do("alice", CellStored(stored))
    mesh.run(2000)
    assert stored.node_id in mesh["bob"].cells


# -- bug 7: no bound on what one member may make every other member hold ------------------------


def flood_of_beacons(mesh: Mesh, name: str, count: int, query_bytes: int) -> None:
    """What a modified node does: sign and record control diffs of its own with no limit, so
    that its anti-entropy serves them to everyone (its engine's checks on placing are bypassed)."""
    engine = mesh[name].engine
    state = engine.state
    for i in range(count):
        payload = BeaconPayload(f"flood-{i}", "t", "spam", "x" * query_bytes, 0.99, embedding=unit(5000 + i % 50),
                                embedding_space="space")  # fmt: skip
        diff = state.sign_new(payload)
        engine.control.apply(diff)
        state.store.put(diff, mesh.net.now)


def test_one_member_cannot_make_every_other_hold_unbounded_control_state():
    """5,120 beacons of 4 KB were accepted and spread to every node (+80 MiB each)."""
    mesh = Mesh("alice", "bob", "carol", "mallory")
    mesh.settle()
    flood_of_beacons(mesh, "mallory", 5120, 4096)
    mesh.net.partition(["alice", "bob", "mallory"], ["carol"])  # carol hears of it through the others only
    mesh.run(30_000)
    mesh.net.partition(["alice", "bob", "carol"], ["mallory"])  # the flood stops at mallory; carol catches up
    mesh.run(15_000)
    mallory = mesh["mallory"].node_id
    for name in ("alice", "bob", "carol"):
        engine = mesh[name].engine
        held = list(engine.control.entries(mallory))
        assert len(engine.beacons.of_owner(mallory)) <= 256, name
        assert sum(d.size for d in held) <= 1 << 21, name
    assert mesh["alice"].engine.counters.drops["quota"] > 0
