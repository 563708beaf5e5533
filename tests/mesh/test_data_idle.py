"""When an engine's part of the data plane is done (``MeshEngine.data_idle``): a simulator ends
its drain when every engine says so, instead of waiting out a quiet period."""

from __future__ import annotations

from mesh.events import BeaconPlaced, CellStored, SendFrame
from mesh.repair import RepairClient
from mesh.testing import LinkConditions
from mesh.wire import MsgType, decode_envelope

from .test_engine import Mesh, beacon, cell, near, unit
from .test_lazy_push import lazy_line, store
from .test_routing_partial import LINE

LONGEST_MS = 25  # the virtual network's longest link delay


def watch_until_idle(net, frames, until_ms: int) -> int | None:
    """Step 1 ms at a time; the first time every engine says its data plane is done."""
    while net.now < until_ms:
        if all(h.engine.data_idle(net.now, LONGEST_MS) for h in net.hosts.values()):
            return net.now
        net.run_for(1)
    return None


def test_the_data_plane_is_done_only_once_the_last_of_its_frames_has_landed():
    # A cell's eager copies, their acks, then the relays' announcements (fire and forget: the
    # last frames of its spread here): every engine says its part is done only once none of
    # them can still be on its way, at once then, and nothing of the data plane moves after.
    net, topic, frames = lazy_line()
    store(net, topic, 0)
    assert watch_until_idle(net, frames, net.now + 1) == net.now  # nothing under way
    frames.clear()
    sent_at: list[int] = []
    net.on_effect = on_frames(net, frames, sent_at)
    stored = cell(near(topic, 0.95, seed=1), salience=1.0, at=net.now, cid="c1")
    net.inject("a", CellStored(stored))
    done = watch_until_idle(net, frames, net.now + 5_000)
    assert done is not None and all(stored.node_id in net.hosts[n].cells for n in LINE[1:])
    data_plane = [(t, env.type) for t, (_, _, env) in zip(sent_at, frames) if env.type not in CONTROL]
    last, last_type = data_plane[-1]
    assert {MsgType.DATA, MsgType.ACK, MsgType.IHAVE} <= {kind for _, kind in data_plane} and last_type is MsgType.IHAVE
    assert last + LONGEST_MS < done <= last + LONGEST_MS + 1
    net.run_for(5_000)
    assert [t for t, (_, _, env) in zip(sent_at, frames) if env.type not in CONTROL][-1] == last


CONTROL = {MsgType.GOSSIP, MsgType.PING, MsgType.PONG}


def on_frames(net, frames, sent_at):
    def on_effect(host, effect) -> None:
        if isinstance(effect, SendFrame):
            frames.append((host.address, effect.address, decode_envelope(host.engine._sealer.open(effect.frame)[2])))
            sent_at.append(net.now)

    return on_effect


def test_a_frame_awaiting_its_ack_keeps_its_sender_busy():
    # bob's acks are lost: alice's batch waits for its retry, and she says she is not done
    mesh = Mesh("alice", "bob")
    topic = unit(1)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    mesh.run(2_000)
    mesh.net.links[("bob", "alice")] = LinkConditions(loss=1.0)
    mesh.do("alice", CellStored(cell(near(topic, 0.9), at=mesh.net.now)))
    mesh.run(500)
    assert mesh["bob"].cells and not mesh["alice"].engine.outbox.idle
    assert not mesh["alice"].engine.data_idle(mesh.net.now, LONGEST_MS)


def test_a_repair_request_is_in_flight_until_answered_or_timed_out():
    client = RepairClient(timeout_ms=5_000)
    assert not client.in_flight(0)
    request_id, _ = client.start("p", now=0)
    assert client.in_flight(4_999) and not client.in_flight(5_000)
    client.finish("p", request_id, upto=3, ready=True)
    assert not client.in_flight(1)
