"""Admission at its edges: the exact limits of the freshness checks, a sender's clock as the
engine tracks it, the nonces it keeps, the counters, and the keyring underneath.

``tests/mesh/test_security.py`` shows each kind of bad frame refused; here each limit is
met exactly (accepted) and passed by a millisecond (refused), because a check written
``>=`` for ``>`` or a window that ends 60 s early passes every test that stays far from it.
"""

from __future__ import annotations

import pytest

from mesh.engine import MeshEngine
from mesh.errors import Reason
from mesh.events import FrameReceived, Started
from mesh.identity import NodeIdentity
from mesh.membership import Keyring
from mesh.team import AUTH_SIGNED, FrameAuth, Team
from mesh.testing import make_engine
from mesh.wire import Envelope, MsgType, WireLimits, encode_envelope

from .test_engine import ENERGY, cell, unit
from .test_security import diff_from

NOW = 1_780_000_000_000
SKEW = 600_000  # MeshConfig defaults: max_clock_skew_ms
FUTURE = 60_000  # max_future_skew_ms
AGE = 120_000  # frame_max_age_ms


class Sender:
    """A member that seals frames (PINGs unless given diffs) stamped with any ``sent_at``."""

    def __init__(self, team: Team, address: str = "127.0.0.1:9") -> None:
        self.team, self.address = team, address
        self.identity = NodeIdentity.generate()
        self.proof = team.membership_proof(self.identity.public_key)
        self.nonces = 0

    def frame(self, sent_at: int, *diffs, keys: dict | None = None) -> bytes:
        self.nonces += 1
        keys = {self.identity.node_id: (self.identity.public_key, self.proof)} if keys is None else keys
        if diffs:
            env = Envelope(MsgType.DATA, sent_at, self.address, keys, diffs, batch_id=self.nonces)
        else:
            env = Envelope(MsgType.PING, sent_at, self.address, keys, nonce=self.nonces)
        # A first-contact frame: its sender tag is the sender's own signature (mesh.frame_auth).
        auth = FrameAuth(AUTH_SIGNED, self.identity.sign)
        return self.team.sealer().seal(self.identity.node_id, encode_envelope(env), auth)


@pytest.fixture
def team() -> Team:
    return Team.create()


def receiver(team: Team, **config) -> MeshEngine:
    engine = make_engine("bob", team, ENERGY, **config)
    engine.handle(Started(), NOW)
    return engine


def heard(engine: MeshEngine, data: bytes, now: int, source: str = "127.0.0.1:50000") -> bool:
    """Was the frame admitted (a counted drop otherwise)?"""
    before = sum(engine.counters.drops.values())
    engine.handle(FrameReceived(source, data), now)
    return sum(engine.counters.drops.values()) == before


# -- a sender's first frame: judged against the team's skew ----------------------------------------


@pytest.mark.parametrize("sample, admitted, reason", [
    (SKEW, True, None),  # exactly the skew ahead: still a member's clock
    (SKEW + 1, False, Reason.FUTURE),
    (-SKEW - AGE, True, None),  # exactly as far behind as skew and replay window allow
    (-SKEW - AGE - 1, False, Reason.REPLAY),
])  # fmt: skip
def test_a_first_frame_is_judged_against_the_skew_to_the_millisecond(team, sample, admitted, reason):
    bob, sender = receiver(team), Sender(team)
    assert heard(bob, sender.frame(NOW + sample), NOW) is admitted
    assert dict(bob.counters.drops) == ({} if admitted else {reason: 1})
    assert len(bob.peers) == (1 if admitted else 0)  # a refused frame leaves no trace but the count


# -- later frames: judged against the sender's own clock, as tracked -----------------------------


def test_a_later_frame_may_be_as_old_as_the_replay_window_by_the_senders_clock_and_no_older(team):
    bob, at_limit, beyond = receiver(team), Sender(team), Sender(team)
    for sender in (at_limit, beyond):  # senders 5 minutes behind: that is their offset
        assert heard(bob, sender.frame(NOW - 300_000), NOW)
    assert heard(bob, at_limit.frame(NOW - 300_000 - AGE), NOW)  # exactly the window behind it
    assert not heard(bob, beyond.frame(NOW - 300_000 - AGE - 1), NOW)
    assert dict(bob.counters.drops) == {Reason.REPLAY: 1}


def test_a_sender_clock_that_jumps_ahead_is_followed_by_its_median_a_bounded_step_per_frame(team):
    """One frame stamped ahead (forged or a clock that jumps and jumps back) does not move the
    estimate; a clock that stays ahead is followed, 5 s per frame (the issue "Trust no member")."""
    bob, sender = receiver(team), Sender(team)
    assert heard(bob, sender.frame(NOW), NOW)
    assert heard(bob, sender.frame(NOW + 50_000), NOW)  # one jump: the median of (0, 50 s) is 0
    assert heard(bob, sender.frame(NOW - 80_000), NOW)  # so 80 s behind is still within the window
    for i in range(4):  # the clock stays ahead: medians 0, 50 s, 50 s, 50 s; the estimate 0, 5, 10, 15 s
        assert heard(bob, sender.frame(NOW + 50_000 + i), NOW)
    assert bob._replay.offsets[sender.identity.node_id] == 15_000
    assert not heard(bob, sender.frame(NOW + 15_000 - AGE - 1), NOW)  # older than the window by its clock
    assert heard(bob, sender.frame(NOW + 15_000 - AGE), NOW)  # exactly the window
    assert dict(bob.counters.drops) == {Reason.REPLAY: 1}


def test_a_sender_clock_that_falls_back_is_followed_slowly(team):
    """Downward, the offset moves 1/64 of the way per frame: a sender cannot walk its offset
    back a window at a time and then replay what it sent long ago."""
    bob, sender = receiver(team), Sender(team)
    assert heard(bob, sender.frame(NOW), NOW)  # offset 0
    assert heard(bob, sender.frame(NOW - 50_000), NOW)  # offset 0 + (-50_000 // 64) = -782 ms
    assert heard(bob, sender.frame(NOW - 120_500), NOW)  # within the window below -782 ms (-120_782)
    walker = Sender(team)
    assert heard(bob, walker.frame(NOW), NOW)
    for back in (50_000, 100_000):  # each step within the window of the one before
        assert heard(bob, walker.frame(NOW - back), NOW)
    assert not heard(bob, walker.frame(NOW - 150_000), NOW)  # the offset followed only to -2_333 ms
    assert dict(bob.counters.drops) == {Reason.REPLAY: 1}


def test_a_sealed_frame_is_refused_again_for_the_whole_window_and_its_nonce_then_let_go(team):
    bob, sender, other = receiver(team), Sender(team), Sender(team)
    first = sender.frame(NOW)
    assert heard(bob, first, NOW)
    assert heard(bob, other.frame(NOW + 61_000), NOW + 61_000)  # another frame tidies the nonces
    assert not heard(bob, first, NOW + 62_000)  # still remembered: a replay
    assert heard(bob, other.frame(NOW + AGE + FUTURE + 1), NOW + AGE + FUTURE + 1)  # the first nonce expires
    assert len(bob._replay._nonces) == 2  # the two frames of `other` are what remains
    assert not heard(bob, first, NOW + AGE + FUTURE + 2)  # forgotten, yet refused: too old by now
    assert bob.counters.drops[Reason.REPLAY] == 2


# -- diffs: stamps and keys --------------------------------------------------------------------------


def test_a_diff_may_be_stamped_exactly_the_skew_ahead(team):
    bob, sender = receiver(team), Sender(team)
    at_limit = diff_from(sender.identity, cell(unit(1), at=NOW), ts=NOW + SKEW)
    beyond = diff_from(sender.identity, cell(unit(2), at=NOW), seq=2, ts=NOW + SKEW + 1)
    bob.handle(FrameReceived("x", sender.frame(NOW, at_limit, beyond)), NOW)
    assert bob.counters.cells_delivered == 1 and dict(bob.counters.drops) == {Reason.FUTURE: 1}


def test_a_frame_is_decoded_under_the_engines_own_limits(team):
    bob, sender = receiver(team, limits=WireLimits(max_diffs=3)), Sender(team)
    diffs = [diff_from(sender.identity, cell(unit(i), at=NOW), seq=i) for i in range(1, 5)]
    bob.handle(FrameReceived("x", sender.frame(NOW, *diffs)), NOW)
    assert bob.counters.cells_delivered == 0 and dict(bob.counters.drops) == {Reason.TOO_MANY_DIFFS: 1}
    bob.handle(FrameReceived("x", sender.frame(NOW, *diffs[:3])), NOW)
    assert bob.counters.cells_delivered == 3


def test_the_peer_is_learned_at_the_address_it_announces_not_the_connections_source(team):
    bob, sender = receiver(team), Sender(team, address="alice.example:7979")
    assert heard(bob, sender.frame(NOW), NOW, source="10.0.0.7:53122")  # an ephemeral client port
    assert [p.address for p in bob.peers] == ["alice.example:7979"]


def test_every_frame_is_counted_with_its_bytes_whatever_becomes_of_it(team):
    bob, sender = receiver(team), Sender(team)
    frames = [sender.frame(NOW), b"\x02" + bytes(60), sender.frame(NOW + 1)]  # the middle one: garbage of our version
    frames.append(frames[0])  # a replay
    for data in frames:
        bob.handle(FrameReceived("x", data), NOW)
    assert (bob.counters.frames_received, bob.counters.bytes_received) == (4, sum(map(len, frames)))
    assert dict(bob.counters.drops) == {Reason.DECRYPT_FAILED: 1, Reason.REPLAY: 1}


def test_a_members_key_once_verified_is_remembered_for_its_diffs(team):
    """A relay's frame names its own key; the origin of a diff in it was verified before."""
    bob, origin, relay = receiver(team), Sender(team), Sender(team)
    assert heard(bob, origin.frame(NOW), NOW)
    relayed = diff_from(origin.identity, cell(unit(3), at=NOW), ts=NOW)
    own_key_only = {relay.identity.node_id: (relay.identity.public_key, relay.proof)}
    bob.handle(FrameReceived("x", relay.frame(NOW, relayed, keys=own_key_only)), NOW)
    assert bob.counters.cells_delivered == 1 and not bob.counters.drops


@pytest.mark.parametrize("mtype, invited, neighbour", [
    (MsgType.PING, True, True),  # a seed we contacted, heard from the address we dialled
    (MsgType.PING, False, False),  # a ping alone does not make a neighbour
    (MsgType.GOSSIP, False, True),  # gossip does, while there is room
])  # fmt: skip
def test_a_partial_view_takes_as_neighbour_a_contacted_seed_or_a_peer_that_gossips(team, mtype, invited, neighbour):
    from mesh.events import PeerDiscovered

    bob, seed = receiver(team, view="partial"), Sender(team, address="seed.example:7979")
    if invited:
        bob.handle(PeerDiscovered("10.0.0.9:7979"), NOW)  # dialled by address; it announces another name
    env = Envelope(mtype, NOW, seed.address, {seed.identity.node_id: (seed.identity.public_key, seed.proof)}, nonce=1)
    sealed = team.sealer().seal(seed.identity.node_id, encode_envelope(env), FrameAuth(AUTH_SIGNED, seed.identity.sign))
    bob.handle(FrameReceived("10.0.0.9:7979", sealed), NOW)
    (peer,) = list(bob.peers)
    assert peer.neighbour is neighbour


# -- the keyring -------------------------------------------------------------------------------------


def test_a_key_is_kept_only_for_its_own_id_and_with_the_teams_proof(team):
    ring = Keyring(team.is_member)
    alice, mallory = NodeIdentity.generate(), NodeIdentity.generate()
    proof = team.membership_proof(alice.public_key)
    assert ring.learn(alice.node_id, alice.public_key, proof) and ring.get(alice.node_id) == (alice.public_key, proof)
    assert ring.learn(alice.node_id, alice.public_key, proof)  # the same again: still a member
    # Another key for a known id, even with a valid proof of its own, is not the member's key.
    assert not ring.learn(alice.node_id, mallory.public_key, team.membership_proof(mallory.public_key))
    assert not ring.learn(mallory.node_id, mallory.public_key, Team.create().membership_proof(mallory.public_key))
    assert ring.get(alice.node_id) == (alice.public_key, proof) and ring.get(mallory.node_id) is None
