"""Outsiders can neither read nor inject; bad diffs are rejected and counted by reason."""

from __future__ import annotations

import dataclasses

import pytest

from mesh.engine import MeshEngine
from mesh.errors import Reason, SealError
from mesh.events import (
    ApplyTombstone, BeaconPlaced, CellForgotten, CellStored, FrameReceived, PeerDiscovered, SendFrame,
)  # fmt: skip
from mesh.identity import NodeIdentity
from mesh.team import AUTH_SIGNED, FRAME_VERSION, FrameAuth, Team
from mesh.testing import make_engine
from mesh.wire import Diff, Envelope, MsgType, TombstonePayload, encode_envelope, sign_diff

from .test_engine import ENERGY, Mesh, beacon, cell, unit

NOW = 1_780_000_000_000


@pytest.fixture
def team() -> Team:
    return Team.create()


@pytest.fixture
def bob(team) -> MeshEngine:
    engine = make_engine("bob", team, ENERGY)
    engine.handle(__import__("mesh").Started(), NOW)
    return engine


MALLORY = NodeIdentity.generate()


def diff_from(who: NodeIdentity, payload=None, *, seq=1, ts=NOW) -> Diff:
    payload = payload or cell(unit(1), at=ts)
    return sign_diff(payload, origin=who.node_id, seq=seq, ts=ts, sign=who.sign, hops=1)


def frame(team: Team, who: NodeIdentity, *diffs: Diff, proof: bytes | None = None, sent_at=NOW, keys=None) -> bytes:
    keys = keys if keys is not None else {who.node_id: (who.public_key, proof or team.membership_proof(who.public_key))}
    env = Envelope(MsgType.DATA, sent_at, "mallory", keys, diffs, batch_id=1)
    return team.sealer().seal(who.node_id, encode_envelope(env), FrameAuth(AUTH_SIGNED, who.sign))


def deliver(engine: MeshEngine, data: bytes, now=NOW + 10) -> list:
    return engine.handle(FrameReceived("mallory", data), now)


def stored(effects) -> list:
    return [e for e in effects if type(e).__name__ == "StoreRemoteCell"]


def test_a_member_frame_is_accepted(team, bob):
    effects = deliver(bob, frame(team, MALLORY, diff_from(MALLORY)))
    assert len(stored(effects)) == 1 and not bob.counters.drops


def test_another_team_can_neither_read_nor_inject(team, bob):
    outsiders = Team.create()
    mine = frame(team, MALLORY, diff_from(MALLORY))
    with pytest.raises(SealError):
        outsiders.sealer().open(mine)  # cannot read
    effects = deliver(bob, frame(outsiders, MALLORY, diff_from(MALLORY)))  # cannot inject
    assert stored(effects) == [] and bob.counters.drops == {Reason.DECRYPT_FAILED: 1}
    assert len(bob.peers) == 0


def test_the_key_without_the_proof_is_not_membership(team, bob):
    # Someone holding the frame key but not vouched for by the team: the HMAC proof fails.
    effects = deliver(bob, frame(team, MALLORY, diff_from(MALLORY), proof=Team.create().membership_proof(MALLORY.public_key)))
    assert stored(effects) == [] and bob.counters.drops == {Reason.NOT_MEMBER: 1}


def test_an_origin_whose_id_is_not_its_key_is_not_a_member(team, bob):
    other = NodeIdentity.generate()
    keys = {MALLORY.node_id: (MALLORY.public_key, team.membership_proof(MALLORY.public_key)),
            other.node_id: (MALLORY.public_key, team.membership_proof(MALLORY.public_key))}  # fmt: skip
    forged = sign_diff(cell(unit(1)), origin=other.node_id, seq=1, ts=NOW, sign=MALLORY.sign, hops=1)
    assert stored(deliver(bob, frame(team, MALLORY, forged, keys=keys))) == []
    assert bob.counters.drops == {Reason.NOT_MEMBER: 1}


def test_a_diff_without_a_known_origin_key_is_dropped(team, bob):
    stranger = NodeIdentity.generate()
    assert stored(deliver(bob, frame(team, MALLORY, diff_from(stranger)))) == []
    assert bob.counters.drops == {Reason.UNKNOWN_ORIGIN: 1}


def test_tampered_signatures_and_contents_are_rejected(team, bob):
    good = diff_from(MALLORY)
    bad_sig = dataclasses.replace(good, signature=bytes([good.signature[0] ^ 1]) + good.signature[1:])
    other = diff_from(MALLORY, cell(unit(1), cid="other"), seq=2)
    swapped = dataclasses.replace(other, signature=good.signature)  # a valid signature, for other bytes
    effects = deliver(bob, frame(team, MALLORY, bad_sig, swapped))
    assert stored(effects) == [] and bob.counters.drops == {Reason.BAD_SIGNATURE: 2}
    assert len(stored(deliver(bob, frame(team, MALLORY, good), now=NOW + 20))) == 1  # the real one still gets in


def test_replays_are_rejected(team, bob):
    diff = diff_from(MALLORY)
    data = frame(team, MALLORY, diff)
    assert len(stored(deliver(bob, data))) == 1
    assert stored(deliver(bob, data, now=NOW + 50)) == []  # the same sealed frame again
    assert bob.counters.drops[Reason.REPLAY] == 1
    resent = frame(team, MALLORY, diff, sent_at=NOW + 60)  # the same diff, a new frame
    assert stored(deliver(bob, resent, now=NOW + 70)) == []
    assert bob.counters.drops[Reason.DUPLICATE] == 1
    stale = frame(team, MALLORY, diff_from(MALLORY, seq=5), sent_at=NOW - 10 * 60_000)
    assert stored(deliver(bob, stale)) == []
    assert bob.counters.drops[Reason.REPLAY] == 2


def test_the_far_future_is_rejected(team, bob):
    future_diff = diff_from(MALLORY, ts=NOW + 3_600_000)
    assert stored(deliver(bob, frame(team, MALLORY, future_diff))) == []
    assert bob.counters.drops == {Reason.FUTURE: 1}
    assert stored(deliver(bob, frame(team, MALLORY, diff_from(MALLORY, seq=2), sent_at=NOW + 3_600_000))) == []
    assert bob.counters.drops == {Reason.FUTURE: 2}


def test_malformed_and_oversized_batches_are_counted(team, bob):
    deliver(bob, team.sealer().seal(MALLORY.node_id, b"\x93garbage"))
    too_many = [diff_from(MALLORY, seq=i) for i in range(1, 300)]
    env = Envelope(MsgType.DATA, NOW, "m", {}, tuple(too_many), batch_id=1)
    deliver(bob, team.sealer().seal(MALLORY.node_id, encode_envelope(env)))
    deliver(bob, bytes([FRAME_VERSION]) + bytes(100))
    deliver(bob, b"\x01" + bytes(100))  # protocol 1: its sender needs upgrading
    assert bob.counters.drops == {
        Reason.MALFORMED: 1, Reason.TOO_MANY_DIFFS: 1, Reason.DECRYPT_FAILED: 1, Reason.OLD_VERSION: 1,
    }


def test_an_outsider_engine_never_joins_and_mesh_traffic_stays_unreadable():
    mesh = Mesh("alice", "bob")
    topic = unit(3)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    outsider = make_engine("eve", Team.create(), ENERGY)
    host = mesh.net.add(outsider)
    mesh.net.start("eve")
    sniffed: list[bytes] = []
    mesh.net.on_effect = lambda h, e: sniffed.append(e.frame) if isinstance(e, SendFrame) else None
    mesh.do("eve", PeerDiscovered("alice"))
    mesh.do("alice", CellStored(cell(topic, at=mesh.net.now, cid="secret-cell")))
    mesh.run(20_000)
    assert len(outsider.peers) == 0 and host.cells == {}
    assert mesh["alice"].engine.counters.drops[Reason.DECRYPT_FAILED] >= 1
    assert all(mesh["eve"].node_id not in {p.node_id for p in mesh[n].engine.peers} for n in ("alice", "bob"))
    assert not any(b"secret-cell" in f for f in sniffed)
    assert "secret-cell" in mesh["bob"].cells


# -- forgetting: only a cell's origin may turn it into a tombstone ---------------------------


ALICE = NodeIdentity.generate()


def tombstone_from(who: NodeIdentity, cell_id: str, *, cell_origin: str | None, seq: int) -> Diff:
    return diff_from(who, TombstonePayload(cell_id, "t", NOW, cell_origin, 1), seq=seq)


def applied(effects) -> list[ApplyTombstone]:
    return [e for e in effects if isinstance(e, ApplyTombstone)]


def test_a_cells_origin_may_forget_it(team, bob):
    alices = diff_from(ALICE, cell(unit(1), cid="alices-cell"))
    assert len(stored(deliver(bob, frame(team, ALICE, alices)))) == 1
    effects = deliver(bob, frame(team, ALICE, tombstone_from(ALICE, "alices-cell", cell_origin=ALICE.node_id, seq=2)),
                      now=NOW + 20)  # fmt: skip
    assert applied(effects) == [ApplyTombstone("alices-cell", "t", ALICE.node_id, NOW)]
    assert not bob.counters.drops and bob.counters.diffs_accepted["tombstone"] == 1


@pytest.mark.parametrize("named", ["the cell's origin", "itself", "nobody"])
def test_another_member_cannot_forget_a_cell_it_did_not_originate(team, bob, named):
    """Whatever origin mallory's tombstone names, bob holds the cell from alice: a drop."""
    deliver(bob, frame(team, ALICE, diff_from(ALICE, cell(unit(1), cid="alices-cell"))))
    cell_origin = {"the cell's origin": ALICE.node_id, "itself": MALLORY.node_id, "nobody": None}[named]
    forged = tombstone_from(MALLORY, "alices-cell", cell_origin=cell_origin, seq=7)
    effects = deliver(bob, frame(team, MALLORY, forged), now=NOW + 20)
    assert applied(effects) == [] and bob.counters.drops == {Reason.NOT_ORIGIN: 1}
    assert not bob.store.has(MALLORY.node_id, 7)  # not kept, so never served onward by repair
    assert "tombstone" not in bob.counters.diffs_accepted


def test_a_tombstone_for_a_cell_not_held_is_judged_by_the_origin_it_names(team, bob):
    """Without the cell, the engine can only compare the signer with the origin the tombstone
    names; one naming nobody passes here, and the node's facade checks its own row."""
    naming_alice = tombstone_from(MALLORY, "unheld-cell", cell_origin=ALICE.node_id, seq=1)
    assert applied(deliver(bob, frame(team, MALLORY, naming_alice))) == []
    assert bob.counters.drops == {Reason.NOT_ORIGIN: 1}
    naming_nobody = tombstone_from(MALLORY, "unheld-cell", cell_origin=None, seq=2)
    effects = deliver(bob, frame(team, MALLORY, naming_nobody), now=NOW + 20)
    assert applied(effects) == [ApplyTombstone("unheld-cell", "t", MALLORY.node_id, NOW)]


def test_a_member_forgetting_anothers_cell_over_the_mesh_erases_nothing():
    """carol holds alice's cell and forgets it through her own engine: the tombstone she
    signs goes to alice and bob, and both drop it."""
    mesh = Mesh("alice", "bob", "carol")
    topic = unit(11)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(topic, agent="reader2")))
    mesh.settle()
    stored_cell = cell(topic, at=mesh.net.now)
    mesh.do("alice", CellStored(stored_cell))
    assert mesh.net.run_until(mesh.net.now + 5000, lambda: all(stored_cell.node_id in mesh[n].cells
                                                               for n in ("bob", "carol")))  # fmt: skip
    mesh.do("carol", CellForgotten(stored_cell.node_id, "t"))
    for name in ("alice", "bob"):
        drops = mesh[name].engine.counters.drops
        assert mesh.net.run_until(mesh.net.now + 5000, lambda: drops[Reason.NOT_ORIGIN] == 1), (name, drops)
    assert mesh["bob"].tombstones == {} and mesh["alice"].tombstones == {}
    mesh.do("alice", CellForgotten(stored_cell.node_id, "t"))  # the origin itself: honoured everywhere
    assert mesh.net.run_until(mesh.net.now + 5000, lambda: all(stored_cell.node_id in mesh[n].tombstones
                                                               for n in ("bob", "carol")))  # fmt: skip
    assert mesh["bob"].tombstones[stored_cell.node_id].origin_node == mesh["alice"].node_id
