"""Data in HTTP responses: a batch for the peer whose frame is being handled rides back in the
response to it, and the ack for such a batch rides on the next data frame the other way.

Two engines settled over the virtual network, then driven by hand on a virtual clock, so each
test decides which frames travel in a request (``replies_ride``) and which in a response
(``in_response``), as the HTTP runtime does.
"""

from __future__ import annotations

from mesh.events import BeaconPlaced, CellStored, FrameReceived, SendFrame, SetTimer, StoreRemoteCell, TimerFired
from mesh.wire import Envelope, MsgType, decode_envelope

from .test_engine import Mesh, beacon, cell, unit

BOB_TOPIC, ALICE_TOPIC = unit(31), unit(32)


def frames(effects, to: str) -> list[tuple[SendFrame, Envelope]]:
    """The frames sent to ``to`` among ``effects``, with their envelopes opened."""
    out = []
    for effect in effects:
        if isinstance(effect, SendFrame) and effect.address == to:
            _, _, plaintext = SEALERS[effect.frame[1:17]].open(effect.frame)
            out.append((effect, decode_envelope(plaintext)))
    return out


SEALERS: dict = {}  # sender id bytes -> the sealer of its team


def settled() -> Mesh:
    """Alice and Bob, each with a beacon the other's cells can match."""
    mesh = Mesh("alice", "bob")
    mesh.do("bob", BeaconPlaced(beacon(BOB_TOPIC, threshold=0.5)))
    mesh.do("alice", BeaconPlaced(beacon(ALICE_TOPIC, threshold=0.5)))
    mesh.settle()
    mesh.run(3000)  # let catch-up repair and its acks finish: nothing of ours in flight
    for name in ("alice", "bob"):
        SEALERS[bytes.fromhex(mesh[name].node_id)] = mesh.team.sealer()
    return mesh


def test_a_held_batch_rides_back_in_the_response_to_a_frame_from_its_peer():
    mesh = settled()
    alice, bob = mesh["alice"].engine, mesh["bob"].engine
    now = mesh.net.now
    ((to_bob, _),) = frames(alice.handle(CellStored(cell(BOB_TOPIC, at=now)), now), "bob")
    # Bob sends Alice one batch, then holds the next behind it (its ack is outstanding).
    ((first, _),) = frames(bob.handle(CellStored(cell(ALICE_TOPIC, at=now)), now), "alice")
    held = cell(ALICE_TOPIC, at=now + 1)
    assert frames(bob.handle(CellStored(held), now + 1), "alice") == []
    assert bob.outbox.depth(alice.node_id) == 1

    # Alice's batch reaches Bob in a request: his ack and the held batch go back in its response,
    # though the pacing gap has not passed.
    sent = frames(bob.handle(FrameReceived("alice", to_bob.frame, replies_ride=True), now + 2), "alice")
    assert [(env.type, effect.in_reply) for effect, env in sent] == [(MsgType.ACK, True), (MsgType.DATA, True)]
    assert [d.payload.node_id for d in sent[1][1].diffs] == [held.node_id]

    # The same frame in a runtime with no response channel: the batch waits for its gap.
    mesh2 = settled()
    alice2, bob2 = mesh2["alice"].engine, mesh2["bob"].engine
    t = mesh2.net.now
    (to_bob2,) = [e for e in alice2.handle(CellStored(cell(BOB_TOPIC, at=t)), t) if isinstance(e, SendFrame)]
    bob2.handle(CellStored(cell(ALICE_TOPIC, at=t)), t)
    bob2.handle(CellStored(cell(ALICE_TOPIC, at=t + 1)), t + 1)
    effects = bob2.handle(FrameReceived("alice", to_bob2.frame), t + 2)
    assert [e.in_reply for e in effects if isinstance(e, SendFrame)] == [True]  # the ack alone
    assert bob2.outbox.depth(alice2.node_id) == 1


def test_the_ack_for_a_batch_that_came_in_a_response_rides_on_the_next_data_frame():
    mesh = settled()
    alice, bob = mesh["alice"].engine, mesh["bob"].engine
    now = mesh.net.now
    ((to_alice, data_env),) = frames(bob.handle(CellStored(cell(ALICE_TOPIC, at=now)), now), "alice")
    assert bob.outbox.inflight(alice.node_id) == 1

    # It reaches Alice in a response: she stores it, and sends no ack yet (that would be a
    # request of its own); a timer holds it for ack_delay_ms.
    effects = alice.handle(FrameReceived("bob", to_alice.frame, in_response=True), now + 1)
    assert any(isinstance(e, StoreRemoteCell) for e in effects)
    assert frames(effects, "bob") == []
    assert SetTimer("ack", now + 1 + alice.config.ack_delay_ms) in effects

    # Her next cell for Bob carries the ack.
    ((to_bob, env),) = frames(alice.handle(CellStored(cell(BOB_TOPIC, at=now + 5)), now + 5), "bob")
    assert env.type is MsgType.DATA and env.acks == (data_env.batch_id,) and len(env.diffs) == 1
    assert frames(alice.handle(TimerFired("ack"), now + 1 + alice.config.ack_delay_ms), "bob") == []

    sent = frames(bob.handle(FrameReceived("alice", to_bob.frame, replies_ride=True), now + 6), "alice")
    assert bob.outbox.inflight(alice.node_id) == 0  # acked by the data frame
    assert [(env.type, env.acks) for _, env in sent] == [(MsgType.ACK, (env.batch_id,))]


def test_with_no_data_frame_to_ride_on_the_ack_goes_alone_after_the_delay():
    mesh = settled()
    alice, bob = mesh["alice"].engine, mesh["bob"].engine
    now = mesh.net.now
    ((to_alice, data_env),) = frames(bob.handle(CellStored(cell(ALICE_TOPIC, at=now)), now), "alice")
    assert frames(alice.handle(FrameReceived("bob", to_alice.frame, in_response=True), now + 1), "bob") == []
    due = now + 1 + alice.config.ack_delay_ms
    assert frames(alice.handle(TimerFired("ack"), due - 1), "bob") == []  # early: not yet
    ((ack, env),) = frames(alice.handle(TimerFired("ack"), due), "bob")
    assert env.type is MsgType.ACK and env.acks == (data_env.batch_id,) and not ack.in_reply
    bob.handle(FrameReceived("alice", ack.frame, replies_ride=True), due + 1)
    assert bob.outbox.inflight(alice.node_id) == 0
