"""The engine's hot-path shortcuts give exactly the answers of the plain code they replace.

Speed is measured elsewhere (``benchmarks/results/simulation.md``); these tests pin the
*behaviour*: the liveness heap picks the same peers, in the same order, as a scan of every
peer would; the control-diff decode cache and the digest codec accept and reject exactly
what the strict decoder does.
"""

from __future__ import annotations

import heapq
import random

import msgpack
import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mesh.errors import WireError
from mesh.identity import NodeIdentity
from mesh.membership import Liveness, PeerState, PeerTable
from mesh.wire import BeaconPayload, Envelope, MsgType, PeerPayload, encode_envelope, sign_diff

from .shared_decoding import decode_envelope, decode_signed

PROBE, DEAD_PROBE, COUNT = 2000, 10_000, 3


def scan_for_due(table: PeerTable, now: int, count: int) -> list:
    """The selection as the engine made it before the heap: every peer, in table order."""
    due = []
    for peer in table:
        limit = DEAD_PROBE if peer.state is PeerState.DEAD else PROBE
        if not peer.ping_nonce and now - max(peer.heard_at, peer.ping_sent_at) >= limit:
            due.append(peer)
    if len(due) > count:
        due = heapq.nsmallest(count, due, key=lambda p: max(p.heard_at, p.ping_sent_at))
    return [p.node_id for p in due]


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), peers=st.integers(0, 40), steps=st.integers(1, 120))
def test_the_most_silent_peers_are_the_ones_a_full_scan_picks(seed, peers, steps):
    rng = random.Random(seed)
    table = PeerTable("me")
    now = 1_000
    for i in range(peers):
        table.learn(f"p{i}", f"a{i}", now + rng.randrange(0, 3000))
    nonce = 0
    for _ in range(steps):
        now += rng.choice((0, 1, 250, 1000, 1000, 3000))
        action = rng.random()
        members = list(table)
        if action < 0.05:
            table.learn(f"p{len(table)}", f"a{len(table)}", now)
        elif members and action < 0.45:
            table.apply(rng.choice(members), rng.choice(list(Liveness)), now)
        elif members and action < 0.55:
            rng.choice(members).ping_nonce = 0  # a ping timed out
        else:
            expected = scan_for_due(table, now, COUNT)
            chosen = table.most_silent(now, COUNT, PROBE, DEAD_PROBE)
            assert [p.node_id for p in chosen] == expected
            for peer in chosen:
                nonce += 1
                table.pinged(peer, nonce, now)
        watched = {p.node_id for p in table.watched()}
        assert watched == {p.node_id for p in table if p.ping_nonce or p.state is PeerState.SUSPECT}


def test_watched_peers_come_in_table_order():
    table = PeerTable("me")
    peers = [table.learn(f"p{i}", f"a{i}", 0)[0] for i in range(5)]
    table.pinged(peers[3], 1, 10)
    table.apply(peers[1], Liveness.FAILED, 10)
    table.pinged(peers[0], 2, 10)
    assert [p.node_id for p in table.watched()] == ["p0", "p1", "p3"]
    table.apply(peers[0], Liveness.HEARD, 20)  # the answer clears the ping
    table.apply(peers[1], Liveness.HEARD, 20)
    assert [p.node_id for p in table.watched()] == ["p3"]


ME = NodeIdentity.generate()
VEC = np.linspace(-1, 1, 8, dtype=np.float32)


def beacon_diff(**routing):
    payload = BeaconPayload("b1", "t", "a", "which db", 0.4, ("Decision",), "p", 0.2, 99, VEC, "space", ("p",))
    return sign_diff(payload, origin=ME.node_id, seq=7, ts=1000, sign=ME.sign, **routing)


def test_a_cached_control_diff_decodes_like_a_fresh_one():
    diff = beacon_diff(hops=2, ttl=0)
    first = decode_signed(diff.signed, diff.signature, 2, 0)
    again = decode_signed(bytes(diff.signed), diff.signature, 3, 1)  # equal bytes, another object
    assert (again.kind, again.origin, again.seq, again.ts) == (first.kind, first.origin, first.seq, first.ts)
    assert again.payload == first.payload == diff.payload
    assert (again.hops, again.ttl) == (3, 1)
    assert not again.payload.embedding.flags.writeable  # shared between engines: must stay read-only


@pytest.mark.parametrize("signature, hops, ttl", [(b"short", 0, 0), (bytes(64), -1, 0), (bytes(64), 0, "x")])
def test_a_cached_control_diff_still_checks_its_unsigned_fields(signature, hops, ttl):
    diff = beacon_diff()
    decode_signed(diff.signed, diff.signature, 0, 0)  # now cached
    with pytest.raises(WireError):
        decode_signed(diff.signed, signature, hops, ttl)


def test_a_peer_diff_is_cached_too_but_not_across_limits():
    from mesh.wire import WireLimits

    diff = sign_diff(PeerPayload("n" * 40), origin=ME.node_id, seq=1, ts=5, sign=ME.sign)
    assert decode_signed(diff.signed, diff.signature, 0, 0).payload == PeerPayload("n" * 40)
    with pytest.raises(WireError):  # the cache answers for the limits it was decoded under only
        decode_signed(diff.signed, diff.signature, 0, 0, WireLimits(max_text_chars=10))


def gossip_frame(digest) -> bytes:
    env = Envelope(MsgType.GOSSIP, 1000, "n1", {ME.node_id: (ME.public_key, bytes(32))}, digest={}, reply_wanted=True)
    top = msgpack.unpackb(encode_envelope(env), raw=False, strict_map_key=False)
    top[6][0] = digest
    return msgpack.packb(top, use_bin_type=True)


def test_the_digest_round_trips():
    ids = [NodeIdentity.generate().node_id for _ in range(50)]
    digest = {node_id: i * 3 for i, node_id in enumerate(ids)}
    env = Envelope(MsgType.GOSSIP, 1000, "n1", {ME.node_id: (ME.public_key, bytes(32))}, digest=digest)
    assert decode_envelope(encode_envelope(env)).digest == digest


@pytest.mark.parametrize(
    "digest",
    [{b"short": 1}, {"text-key": 1}, {7: 1}, {bytes(16): "1"}, {bytes(16): 1.5}, {bytes(16): True}, {bytes(16): None}],
)
def test_a_bad_digest_entry_is_malformed(digest):
    assert decode_envelope(gossip_frame({bytes.fromhex(ME.node_id): 1})).digest == {ME.node_id: 1}
    with pytest.raises(WireError):
        decode_envelope(gossip_frame(digest))


@pytest.mark.parametrize("bad", ["1", 1.5, True, None, [1]])
def test_a_bad_version_is_malformed_where_every_origin_is_known_too(bad):
    ids = [NodeIdentity.generate().node_id for _ in range(5)]
    known = {bytes.fromhex(node_id): i for i, node_id in enumerate(ids)}
    assert decode_envelope(gossip_frame(known)).digest == dict(zip(ids, range(5)))  # all memoised now
    with pytest.raises(WireError):
        decode_envelope(gossip_frame({**known, bytes.fromhex(ids[2]): bad}))


def test_engines_decoding_one_diff_share_its_bytes_but_not_a_different_signature():
    diff = beacon_diff()
    first = decode_signed(bytes(diff.signed), bytes(diff.signature), 1, 0)
    again = decode_signed(bytes(diff.signed), bytes(diff.signature), 2, 0)  # another frame, equal bytes
    assert again.signed is first.signed and again.signature is first.signature
    forged = decode_signed(bytes(diff.signed), bytes(64), 1, 0)  # same body, another signature
    assert forged.signature == bytes(64) and forged.signed is first.signed
    assert not ME.verify(ME.public_key, forged.signature, forged.signed)


def test_frames_carrying_one_key_share_it_and_a_changed_proof_is_kept_apart():
    frame = lambda proof: Envelope(MsgType.PING, 1000, "n1", {ME.node_id: (ME.public_key, proof)}, nonce=1)  # noqa: E731
    first = decode_envelope(encode_envelope(frame(bytes(32)))).keys[ME.node_id]
    again = decode_envelope(encode_envelope(frame(bytes(32)))).keys[ME.node_id]
    assert again is first and again == (ME.public_key, bytes(32))
    other = decode_envelope(encode_envelope(frame(b"\x01" * 32))).keys[ME.node_id]
    assert other == (ME.public_key, b"\x01" * 32)  # what the frame says, checked by the keyring as before


def test_a_membership_proof_checks_out_under_its_own_team_only_however_often_asked():
    # Proofs are computed once per (team key, public key): asking again, or under another
    # team, must give the answer the HMAC gives.
    from mesh.team import Team

    ours, theirs = Team.create(), Team.create()
    proof = ours.membership_proof(ME.public_key)
    for _ in range(3):
        assert ours.is_member(ME.public_key, proof)
        assert not theirs.is_member(ME.public_key, proof)
        assert theirs.membership_proof(ME.public_key) != proof
    assert not ours.is_member(NodeIdentity.generate().public_key, proof)


def test_a_network_that_does_not_record_still_reports_every_effect():
    # The simulator watches effects through on_effect and keeps none per host (at N=10,000
    # that is millions); the same run seen through either gives the same cells.
    from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
    from mesh.team import Team
    from mesh.testing import VirtualNetwork, make_engine

    from .test_engine import ENERGY, beacon, cell, unit

    delivered = {}
    for record in (True, False):
        net = VirtualNetwork(seed=2, record=record)
        team = Team.create()
        for name in ("a", "b", "c"):
            net.add(make_engine(name, team, ENERGY, seed=2, fast=True))
        seen = []
        net.on_effect = lambda host, effect: seen.append((host.address, type(effect).__name__))  # noqa: B023
        net.start()
        net.inject("a", PeerDiscovered("b"))
        net.inject("c", PeerDiscovered("b"))
        net.inject("b", BeaconPlaced(beacon(unit(3), agent="agent-b")))
        net.run_for(5_000)
        net.inject("a", CellStored(cell(unit(3))))
        net.run_for(5_000)
        kept = [address for address, host in net.hosts.items() if host.cells]
        assert kept == (["b"] if record else [])
        delivered[record] = sorted(address for address, kind in seen if kind == "StoreRemoteCell")
    assert delivered[True] == delivered[False] == ["b"]


def test_the_control_states_digest_goes_on_the_wire_as_the_plain_digest_would():
    # The control state keeps the digest's wire form in step (applies, newer versions, an
    # origin forgotten and learned again): the frame is byte for byte the plain dict's.
    from mesh.control import ControlState

    people = [NodeIdentity.generate() for _ in range(4)]
    state = ControlState()
    for seq, who in [(3, 0), (1, 1), (5, 2), (9, 0), (2, 3), (4, 1)]:
        state.apply(sign_diff(PeerPayload(f"n{who}"), origin=people[who].node_id, seq=seq, ts=1, sign=people[who].sign))
    state.forget(people[1].node_id)
    state.apply(sign_diff(PeerPayload("n1"), origin=people[1].node_id, seq=6, ts=1, sign=people[1].sign))
    digest = state.digest()
    frame = lambda d: encode_envelope(Envelope(MsgType.GOSSIP, 1, "n0", digest=d, reply_wanted=True))  # noqa: E731
    assert frame(digest) == frame(dict(digest))
    assert list(decode_envelope(frame(digest)).digest.items()) == [
        (people[0].node_id, 9), (people[2].node_id, 5), (people[3].node_id, 2), (people[1].node_id, 6)
    ]


def test_a_gossip_answer_follows_the_control_state_through_its_changes():
    # Answers reuse each origin's entries in seq order, marked with their hops, made once per
    # change: a newer entry, a nearer origin, an origin forgotten must each show at once.
    from mesh.control import ControlState

    people = [NodeIdentity.generate() for _ in range(2)]
    a, b = people[0].node_id, people[1].node_id
    state = ControlState()

    def peer(who, seq, address):
        return sign_diff(PeerPayload(address), origin=people[who].node_id, seq=seq, ts=1, sign=people[who].sign)

    def answer(digest, within=None):
        return [(d.origin, d.seq, d.hops, d.payload.address) for d in state.delta_for(digest, 64, 1 << 20, within)]

    state.apply(peer(0, 1, "a1"))
    state.closer(a, 2)
    state.apply(peer(1, 4, "b4"))
    state.closer(b, 1)
    assert answer({}) == [(a, 1, 0, "a1"), (b, 4, 0, "b4")]  # full view: as held
    assert answer({}, 2) == [(a, 1, 3, "a1"), (b, 4, 2, "b4")]
    assert answer({}, 1) == [(b, 4, 2, "b4")]
    state.closer(a, 1)
    assert answer({}, 1) == [(a, 1, 2, "a1"), (b, 4, 2, "b4")]
    state.apply(peer(0, 2, "a2"))  # supersedes a's peer entry
    assert answer({}, 1) == [(a, 2, 2, "a2"), (b, 4, 2, "b4")]
    assert answer({a: 2}, 2) == [(b, 4, 2, "b4")]
    state.forget(b)
    assert answer({}, 2) == [(a, 2, 2, "a2")] and state.in_order(b, 2) == []


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), count=st.integers(1, 12))
@example(seed=3459, count=9)  # an owner whose best similarity to the (non-unit) probe is below -2
def test_the_nearest_owners_are_ranked_by_their_best_beacon_then_by_id(seed, count):
    # What the vectorised ranking must give: every owner's most similar live beacon, best
    # first, ties by owner id (here every group's rows fit the rows it looks at).
    from mesh.routing import BeaconIndex

    rng = np.random.default_rng(seed)
    index, vectors = BeaconIndex(), {}
    for i in range(24):
        vector = rng.normal(size=8).astype(np.float32)
        vector /= np.linalg.norm(vector)
        owner = f"o{i % 9}"
        index.add(BeaconPayload(f"b{i}", "t", "a", "q", 0.5, None, None, None, None, vector, "s", ()), owner, 1)
        vectors[f"b{i}"] = owner, vector
    for i in range(0, 24, 5):
        index.remove(f"b{i}", f"o{i % 9}")
        del vectors[f"b{i}"]
    probe = rng.normal(size=(2, 8)).astype(np.float32)
    best: dict[str, float] = {}
    for owner, vector in vectors.values():
        best[owner] = max(best.get(owner, -2.0), float((probe @ vector).max()))
    expected = sorted(best, key=lambda o: (-best[o], o))[:count]
    assert index.nearest_owners({("t", "s"): probe}, max(count, 5))[:count] == expected


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), filtered=st.floats(0, 1))
def test_the_bulk_match_accepts_exactly_the_beacons_the_scalar_rule_does(seed, filtered):
    # BeaconIndex.match skips the filter columns no beacon of the group set, and the agent
    # column for an agent that owns no beacon: the answers of `accepts`, row by row.
    from mesh.routing import BeaconIndex
    from mesh.routing_rule import accepts
    from mesh.wire import CellPayload
    from node.energy import EnergyModel

    rng, energy = random.Random(seed), EnergyModel()
    unit = lambda: (lambda v: (v / np.linalg.norm(v)).astype(np.float32))(np.array([rng.gauss(0, 1) for _ in range(6)]))
    agents, projects, kinds = ["a0", "a1", "a2"], [None, "apollo", "gemini"], ["Fact", "Risk", "Decision"]
    index, entries = BeaconIndex(), {}
    for i in range(rng.randint(1, 30)):
        filters = {} if rng.random() >= filtered else {
            "cell_types": rng.choice([None, tuple(rng.sample(kinds, rng.randint(1, 2)))]),
            "project": rng.choice(projects), "min_salience": rng.choice([None, rng.random()]),
            "expires_at": rng.choice([None, rng.randint(0, 2000)]),
            "scope_projects": rng.choice([(), ("apollo",)]),
        }  # fmt: skip
        beacon = BeaconPayload(f"b{i}", "t", rng.choice(agents), "q", rng.uniform(-0.2, 0.6), embedding=unit(),
                               embedding_space="s", **filters)  # fmt: skip
        index.add(beacon, f"o{i % 7}", 1)
        entries[beacon.beacon_id] = beacon
    for i in rng.sample(range(len(entries)), len(entries) // 4):
        index.remove(f"b{i}", f"o{i % 7}")
        del entries[f"b{i}"]
    for _ in range(20):
        cell = CellPayload("c1", "t", rng.choice(agents + ["stranger"]), "x", rng.choice(kinds), rng.random(), 0,
                           project=rng.choice(projects), embedding=unit(), embedding_space="s")  # fmt: skip
        e0, now = energy.initial(cell.salience, cell.cell_type), 1000
        got = sorted(e.beacon.beacon_id for e in index.match(cell, e0, now, energy))
        by_rule = index.of_owner  # every live entry, owner by owner
        want = sorted(e.beacon.beacon_id for o in {f"o{i}" for i in range(7)} for e in by_rule(o)
                      if accepts(e.beacon, cell, e0, now, energy))  # fmt: skip
        assert got == want
        # the routers' form: the owners of those beacons, read off a column
        assert index.match_owners(cell, e0, now, energy) == {o for o in {f"o{i}" for i in range(7)}
                                                             for e in by_rule(o) if e.beacon.beacon_id in want}


def test_an_index_gives_its_vectors_as_they_stand_after_each_change():
    # vectors() is kept between changes (a node's own beacons probe every gossip round)
    from mesh.routing import BeaconIndex

    def placed(i, vector):
        return BeaconPayload(f"b{i}", "t", "a", "q", 0.5, None, None, None, None, np.asarray(vector, np.float32), "s", ())

    index = BeaconIndex()
    assert index.vectors() == {}
    index.add(placed(1, [1, 0]), "me", 1)
    assert index.vectors()[("t", "s")].tolist() == [[1, 0]]
    index.add(placed(2, [0, 1]), "me", 1)
    assert index.vectors()[("t", "s")].tolist() == [[1, 0], [0, 1]]
    index.remove("b1", "me")
    assert index.vectors()[("t", "s")].tolist() == [[0, 1]]
    index.add(placed(2, [0.6, 0.8]), "me", 2)  # placed again: replaces
    assert np.allclose(index.vectors()[("t", "s")], [[0.6, 0.8]])
    index.remove("b2", "me")
    assert index.vectors() == {}
