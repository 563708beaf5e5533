"""Lazy push (mesh.lazy, Plumtree): a copy a node had prunes the link it came over; a pruned
link announces (IHAVE), and an announced diff that no other copy brings is grafted.

On the wire: a prune flag on the ack that goes back anyway, two small unacknowledged message
types (announcements may ride on an ack too); frames without them encode as before. In the engine: the hand-drawn line of
test_routing_partial (radius 2, relays push two hops each way, no told lists) sends the
same cell to most nodes twice; and the three-community mesh of test_interest_neighbours.
"""

from __future__ import annotations

import msgpack
import pytest

from mesh.errors import Reason, WireError
from mesh.events import BeaconPlaced, CellStored, FrameReceived, SendFrame
from mesh.lazy import LazyPush
from mesh.team import Team
from mesh.testing import LinkConditions, make_engine
from mesh.wire import Envelope, MsgType, decode_envelope, encode_envelope

from .test_engine import ENERGY, beacon, cell, near, unit
from .test_interest_neighbours import TOPICS, community_mesh
from .test_routing_partial import LINE, line
from .test_wire import ME

OTHER = "ab" * 16

# -- the wire ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "env",
    [
        Envelope(MsgType.ACK, 1, "a", acks=(1, 2), prune=True),
        Envelope(MsgType.DATA, 1, "a", batch_id=9, acks=(4,), prune=True),
        Envelope(MsgType.DATA, 1, "a", batch_id=9, prune=True),  # a prune with no ack beside it
        Envelope(MsgType.ACK, 1, "a", acks=(1,), refs=((OTHER, 2),)),  # announcements riding on an ack
        Envelope(MsgType.DATA, 1, "a", batch_id=9, prune=True, refs=((OTHER, 2),)),
        Envelope(MsgType.IHAVE, 1, "a", refs=((ME.node_id, 3), (OTHER, 1))),
        Envelope(MsgType.GRAFT, 1, "a", refs=((ME.node_id, 3),)),
    ],
    ids=lambda e: f"{e.type.name}{'-prune' if e.prune else ''}",
)
def test_the_lazy_push_frames_round_trip(env):
    assert decode_envelope(encode_envelope(env)) == env


def test_acks_and_data_without_a_prune_keep_their_old_form():
    for env, extra in [
        (Envelope(MsgType.ACK, 1, "a", acks=(1, 2)), [[1, 2]]),
        (Envelope(MsgType.DATA, 1, "a", batch_id=9), [9]),
        (Envelope(MsgType.DATA, 1, "a", batch_id=9, acks=(4,)), [9, [4]]),
    ]:
        assert msgpack.unpackb(encode_envelope(env), raw=False)[6] == extra


def _frame(mtype: MsgType, extra: list) -> bytes:
    return msgpack.packb([1, int(mtype), 1, "a", {}, [], extra], use_bin_type=True)


RAW_ID = bytes.fromhex(ME.node_id)
MALFORMED = [
    (MsgType.IHAVE, [], Reason.MALFORMED),  # no list of diffs
    (MsgType.IHAVE, [[]], Reason.MALFORMED),  # names none
    (MsgType.IHAVE, [[[RAW_ID, 1]], 5], Reason.MALFORMED),
    (MsgType.IHAVE, [[[RAW_ID]]], Reason.MALFORMED),
    (MsgType.IHAVE, [[[RAW_ID[:8], 1]]], Reason.MALFORMED),  # a short origin
    (MsgType.IHAVE, [[[ME.node_id, 1]]], Reason.MALFORMED),  # hex text, not 16 bytes
    (MsgType.IHAVE, [[[RAW_ID, 0]]], Reason.MALFORMED),
    (MsgType.IHAVE, [[[RAW_ID, -3]]], Reason.MALFORMED),
    (MsgType.IHAVE, [[[RAW_ID, "1"]]], Reason.MALFORMED),
    (MsgType.IHAVE, [[[RAW_ID, 1.5]]], Reason.MALFORMED),
    (MsgType.IHAVE, [[[RAW_ID, 1], [RAW_ID, 1]]], Reason.MALFORMED),  # named twice
    (MsgType.IHAVE, [[[RAW_ID, n] for n in range(1, 258)]], Reason.TOO_MANY_DIFFS),
    (MsgType.GRAFT, [[[RAW_ID, 0]]], Reason.MALFORMED),
    (MsgType.GRAFT, [None], Reason.MALFORMED),
    (MsgType.ACK, [[1], 1], Reason.MALFORMED),  # prune is a boolean
    (MsgType.ACK, [[1], True, True], Reason.MALFORMED),
    (MsgType.DATA, [1, [2], "yes"], Reason.MALFORMED),
    (MsgType.DATA, [1, [2], True, 0], Reason.MALFORMED),
    (MsgType.DATA, [1, [2], True, []], Reason.MALFORMED),  # announcements riding name at least one
    (MsgType.DATA, [1, [2], True, [[RAW_ID, 1]], 5], Reason.MALFORMED),
    (MsgType.ACK, [[1], False, [[RAW_ID, 0]]], Reason.MALFORMED),
]


@pytest.mark.parametrize("mtype, extra, reason", MALFORMED, ids=lambda x: getattr(x, "name", None))
def test_malformed_lazy_push_fields_are_wire_errors(mtype, extra, reason):
    with pytest.raises(WireError) as caught:
        decode_envelope(_frame(mtype, extra))
    assert caught.value.reason == reason


# -- the links, sans-IO ---------------------------------------------------------------


def test_a_missing_diff_is_grafted_from_its_first_reachable_announcer_then_the_next():
    lazy = LazyPush(announce_interval=150, graft_timeout=100, retry_interval=1000)
    ref = (ME.node_id, 7)
    lazy.announced(ref, "x", now=0)
    lazy.announced(ref, "y", now=20)
    lazy.announced(ref, "z", now=30)
    assert lazy.next_deadline() == 100 and lazy.take_grafts(99, lambda p: True) == []
    # x is dead: y is asked; no copy within the retry interval, so z
    assert lazy.take_grafts(100, lambda p: p != "x") == [("y", [ref])]
    assert lazy.next_deadline() == 1100
    assert lazy.take_grafts(1100, lambda p: True) == [("z", [ref])] and not lazy.idle
    lazy.received(ref, "z")
    assert lazy.next_deadline() is None and not lazy.awaiting(ref) and lazy.idle


def test_a_copy_that_comes_in_time_cancels_the_graft():
    lazy = LazyPush(announce_interval=150, graft_timeout=100, retry_interval=1000)
    lazy.announced((ME.node_id, 7), "x", now=0)
    lazy.received((ME.node_id, 7), "w")
    assert lazy.take_grafts(100, lambda p: True) == [] and lazy.next_deadline() is None


def test_a_resend_from_the_first_sender_is_no_reason_to_prune():
    lazy = LazyPush(announce_interval=150, graft_timeout=100, retry_interval=1000)
    lazy.received((ME.node_id, 7), "x")
    assert not lazy.should_prune((ME.node_id, 7), "x") and lazy.should_prune((ME.node_id, 7), "y")


def test_announcements_to_a_peer_wait_to_share_a_frame_and_a_peer_that_has_the_diff_is_spared():
    lazy = LazyPush(announce_interval=150, graft_timeout=100, retry_interval=1000)
    copy = lambda seq: type("D", (), {"origin": ME.node_id, "seq": seq})()  # noqa: E731
    lazy.announce("p", copy(1), 1.0, now=0)
    lazy.announce("p", copy(2), 1.0, now=100)
    lazy.announce("q", copy(1), 1.0, now=100)
    lazy.withdraw("q", (ME.node_id, 1))  # q sent us diff 1: it has it
    assert lazy.next_deadline() == 150 and not lazy.idle
    assert lazy.take_announcements(150) == [("p", [(ME.node_id, 1), (ME.node_id, 2)])]
    assert lazy.copy_for((ME.node_id, 2))[1] == 1.0 and lazy.next_deadline() is None and lazy.idle


# -- the engine -----------------------------------------------------------------------


def lazy_line(**config):
    """The line, everyone but ``a`` interested, warmed up; returns (net, topic, frames) where
    ``frames`` fills with (src, dst, envelope) of every frame sent from then on."""
    config.setdefault("lazy_push", True)
    net = line(2, interest_neighbours=0, relay_radius=2, widen_leaves=False, told_limit=0,
               repair_interval_ms=600_000, **config)  # fmt: skip
    topic = unit(41)
    for name in LINE[1:]:
        net.inject(name, BeaconPlaced(beacon(topic, agent=f"agent-{name}")))
    net.run_for(30_000)
    frames: list[tuple[str, str, Envelope]] = []

    def on_effect(host, effect) -> None:
        if isinstance(effect, SendFrame):
            frames.append((host.address, effect.address, decode_envelope(host.engine._sealer.open(effect.frame)[2])))

    net.on_effect = on_effect
    return net, topic, frames


def store(net, topic, k: int, run_ms: int = 5_000):
    c = cell(near(topic, 0.95, seed=k), salience=1.0, at=net.now, cid=f"c{k}")
    net.inject("a", CellStored(c))
    net.run_for(run_ms)
    return c


def lazy_links(net) -> set[tuple[str, str]]:
    """(from, to) of every link its sending end made lazy."""
    by_id = {h.node_id: name for name, h in net.hosts.items()}
    return {(name, by_id[p]) for name, h in net.hosts.items() for p in h.engine.lazy.lazy}


def copies(frames, c, mtype=MsgType.DATA) -> set[tuple[str, str]]:
    """(src, dst) of the DATA frames that carried cell ``c``, or (``mtype`` IHAVE) of the frames
    that announced a diff (alone or riding on an ack: the tests store one cell at a time)."""
    if mtype is MsgType.IHAVE:
        return {(src, dst) for src, dst, env in frames if env.refs and env.type is not MsgType.GRAFT}
    return {
        (src, dst) for src, dst, env in frames
        if env.type is mtype and any(getattr(d.payload, "node_id", None) == c.node_id for d in env.diffs)
    }  # fmt: skip


def test_a_copy_a_node_had_prunes_its_link_and_the_next_cell_goes_over_it_as_an_announcement():
    net, topic, frames = lazy_line()
    first = store(net, topic, 0)
    assert all(first.node_id in net.hosts[n].cells for n in LINE[1:])
    pruning_acks = {(dst, src) for src, dst, env in frames if env.type is MsgType.ACK and env.prune}
    assert pruning_acks and lazy_links(net) == pruning_acks  # each prune rode on an ack
    assert sum(h.engine.counters.prunes_sent for h in net.hosts.values()) == len(pruning_acks)
    frames.clear()
    second = store(net, topic, 1)
    assert all(second.node_id in net.hosts[n].cells for n in LINE[1:])
    data, announced = copies(frames, second), copies(frames, second, MsgType.IHAVE)
    # the lazy links that carried the cell (the relay was not sent it by that peer) announced it
    assert announced and announced <= pruning_acks and not data & pruning_acks
    assert not any(env.type is MsgType.GRAFT for _, _, env in frames)  # eager copies reached all


def test_an_announced_cell_no_copy_brings_is_grafted_from_the_announcer_which_pushes_eagerly_again():
    """After the first cell, some relay ``x`` announces to some ``y`` (``y`` had the cell when
    ``x``'s copy came). With every frame to ``y`` from anyone else lost, ``y`` learns of the
    next cell from ``x``'s announcement alone: it waits ``lazy_graft_ms`` for a copy, asks
    ``x``, and ``x`` pushes it (and from then on pushes to ``y`` again)."""
    net, topic, frames = lazy_line(lazy_graft_ms=100)
    store(net, topic, 0)
    x, y = min(lazy_links(net))
    for other in set(LINE) - {x, y}:
        net.links[(other, y)] = LinkConditions(loss=1.0)
    frames.clear()
    stored_at = net.now
    second = store(net, topic, 1, run_ms=2_000)
    assert second.node_id in net.hosts[y].cells
    # (a node downstream of y may graft too: y's own copies to it left late)
    assert [(s, d) for s, d, env in frames if env.type is MsgType.GRAFT and s == y] == [(y, x)]
    assert (x, y) in copies(frames, second) and net.hosts[y].engine.counters.diffs_grafted == 1
    assert (x, y) not in lazy_links(net)
    # it waited for an eager copy first: the graft costs one graft timeout at least
    graft = next(env for s, _, env in frames if env.type is MsgType.GRAFT and s == y)
    assert graft.sent_at - stored_at >= 100


def test_on_a_community_mesh_every_interested_node_is_reached_with_fewer_data_frames():
    """36 nodes in three interest communities, each cell wanted by a whole community (as in
    test_told's relay-hold test): lazy push reaches the same nodes with fewer data frames."""
    outcome = {}
    for lazy in (False, True):
        net, vectors = community_mesh(threshold=0.5, lazy_push=lazy, told_limit=4, repair_interval_ms=600_000)
        net.run_for(30_000)
        frames_before = sum(h.engine.counters.frames_sent["data"] for h in net.hosts.values())
        stored = []
        for k in range(9):
            stored.append(cell(near(TOPICS[k % 3], 0.97, seed=100 + k), salience=1.0, at=net.now, cid=f"c{k}"))
            net.inject(f"n{k}", CellStored(stored[-1]))
            net.run_for(300)
        net.run_for(5_000)
        reached = {(c.node_id, a) for c in stored for a, h in net.hosts.items() if c.node_id in h.cells}
        wanted = {(c.node_id, a) for k, c in enumerate(stored) for a, v in vectors.items()
                  if a != f"n{k}" and float(v @ c.embedding) >= 0.5}  # fmt: skip
        assert reached == wanted
        data_frames = sum(h.engine.counters.frames_sent["data"] for h in net.hosts.values()) - frames_before
        outcome[lazy] = data_frames, sum(h.engine.counters.diffs_announced for h in net.hosts.values())
    (frames_off, announced_off), (frames_on, announced_on) = outcome[False], outcome[True]
    assert announced_off == 0 and announced_on > 0
    assert frames_on < 0.8 * frames_off


# -- bad input and the switch ---------------------------------------------------------


def sealed(net, src: str, mtype: MsgType, extra: list) -> bytes:
    """A frame from ``src``'s engine with a hand-made ``extra``, sealed as its own."""
    engine = net.hosts[src].engine
    keys = {bytes.fromhex(engine.node_id): [engine.public_key, engine._proof]}
    plain = msgpack.packb([1, int(mtype), net.now, src, keys, [], extra], use_bin_type=True)
    return engine._sealer.seal(engine.node_id, plain, engine.state.binding.signed)


BAD_FRAMES = MALFORMED[:3] + MALFORMED[12:16] + MALFORMED[-3:]


@pytest.mark.parametrize("mtype, extra, reason", BAD_FRAMES, ids=lambda x: getattr(x, "name", None))
def test_a_malformed_lazy_push_frame_is_dropped_and_changes_nothing(mtype, extra, reason):
    net, topic, frames = lazy_line()
    store(net, topic, 0)
    d = net.hosts["d"].engine
    before = (set(d.lazy.lazy), dict(d.lazy._missing), d.lazy.next_deadline(), d.counters.drops[reason])
    effects = net.inject("d", FrameReceived("e", sealed(net, "e", mtype, extra)))
    assert not effects
    assert (set(d.lazy.lazy), dict(d.lazy._missing), d.lazy.next_deadline()) == before[:3]
    assert d.counters.drops[reason] == before[3] + 1


def test_a_graft_for_a_diff_never_announced_sends_nothing():
    net, topic, frames = lazy_line()
    store(net, topic, 0)
    effects = net.inject("d", FrameReceived("e", sealed(net, "e", MsgType.GRAFT, [[[bytes.fromhex(OTHER), 5]]])))
    assert not [e for e in effects if isinstance(e, SendFrame)]
    assert net.hosts["d"].engine.counters.drops["graft_unknown"] == 1


def test_with_the_switch_off_nothing_is_pruned_announced_or_grafted():
    net, topic, frames = lazy_line(lazy_push=False)
    store(net, topic, 0)
    second = store(net, topic, 1)
    assert all(h.engine.lazy is None for h in net.hosts.values())
    assert {env.type for _, _, env in frames} <= {MsgType.DATA, MsgType.ACK, MsgType.GOSSIP, MsgType.PING, MsgType.PONG}
    assert not any(env.prune for _, _, env in frames)
    # every relay pushes every copy, duplicates and all (10 alone; who pushes first varies)
    assert len(copies(frames, second)) >= 9
    # an announcement (which no one sends it) changes nothing either
    d = net.hosts["d"]
    ihave = sealed(net, "e", MsgType.IHAVE, [[[bytes.fromhex(OTHER), 5]]])
    assert not [e for e in net.inject("d", FrameReceived("e", ihave)) if isinstance(e, SendFrame)]
    net.run_for(2_000)
    assert not any(env.type is MsgType.GRAFT for _, _, env in frames) and d.engine.counters.diffs_grafted == 0


def test_the_full_view_ignores_the_switch():
    assert make_engine("x", Team.create(), ENERGY, lazy_push=True).lazy is None
    assert make_engine("y", Team.create(), ENERGY, view="partial", lazy_push=True).lazy is not None
