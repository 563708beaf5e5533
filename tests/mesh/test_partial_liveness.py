"""Partial view: the gossip round is the liveness probe of a live neighbour.

A neighbour silent for ``probe_interval_ms`` is the one the next gossip round goes to, and a
partial-view node answers every gossip that asks for a reply, even with nothing to send: that
answer is the proof of life a ping would fetch. So a mesh whose nodes are all up sends no PING
and no PONG, no live neighbour is ever suspected, and a neighbour that goes silent is still
suspected, pinged and declared dead as before.
"""

from __future__ import annotations

import collections
import random

from mesh.events import PeerDiscovered, SendFrame
from mesh.membership import PeerState
from mesh.team import Team
from mesh.testing import VirtualNetwork, make_engine
from mesh.wire import MsgType, decode_envelope

from .test_engine import ENERGY

N = 16


def random_mesh() -> VirtualNetwork:
    net = VirtualNetwork(seed=5)
    team = Team.create()
    names = [f"n{i}" for i in range(N)]
    for name in names:
        net.add(make_engine(name, team, ENERGY, seed=5, fast=True, view="partial"))
    net.start()
    rng = random.Random(5)
    for name in names:
        for other in rng.sample([n for n in names if n != name], 2):
            net.inject(name, PeerDiscovered(other))
    return net


def count_frames(net: VirtualNetwork) -> collections.Counter:
    """Frames sent, by message type (opened and decoded as the receiver would)."""
    sent: collections.Counter = collections.Counter()

    def observe(host, effect) -> None:  # type: ignore[no-untyped-def]
        if isinstance(effect, SendFrame):
            _, _, plaintext = host.engine._sealer.open(effect.frame)
            sent[decode_envelope(plaintext).type] += 1

    net.on_effect = observe
    return sent


def states_seen(net: VirtualNetwork) -> dict[str, set[PeerState]]:
    """Every state each node's neighbours passed through, sampled every 100 virtual ms."""
    seen: dict[str, set[PeerState]] = collections.defaultdict(set)
    for _ in range(600):
        net.run_for(100)
        for name, host in net.hosts.items():
            for peer in host.engine.peers.neighbours():
                seen[f"{name}->{peer.address}"].add(peer.state)
    return seen


def test_a_mesh_of_live_nodes_sends_no_pings_and_suspects_nobody():
    net = random_mesh()
    sent = count_frames(net)
    seen = states_seen(net)  # 60 virtual s
    assert sent[MsgType.GOSSIP] > 20 * N  # the rounds ran (about one per node per second)
    assert sent[MsgType.PING] == 0 and sent[MsgType.PONG] == 0
    assert all(states == {PeerState.ALIVE} for states in seen.values())
    # and every neighbour was heard from within the last probe interval and a gossip round or two
    now = net.now
    for host in net.hosts.values():
        for peer in host.engine.peers.neighbours():
            assert now - peer.heard_at <= host.engine.config.probe_interval_ms + 2500


def test_a_converged_neighbour_with_nothing_to_send_still_answers():
    net = random_mesh()
    net.run_for(60_000)  # every digest has long been equal
    sent = count_frames(net)
    net.run_for(10_000)
    # each node starts about one round a second, and each round it starts is answered
    assert sent[MsgType.GOSSIP] >= 2 * 8 * N
    assert sent[MsgType.PING] == 0


def test_a_silent_neighbour_is_still_suspected_pinged_and_declared_dead():
    net = random_mesh()
    net.run_for(20_000)
    gone = "n3"
    holders = [name for name, host in net.hosts.items() if any(p.address == gone for p in host.engine.peers.neighbours())]
    assert holders
    sent = count_frames(net)
    net.partition([gone])  # it hears nothing and nothing it sends arrives
    net.run_for(3_000)
    assert any(host_peer_state(net, name, gone) is PeerState.SUSPECT for name in holders)
    net.run_for(20_000)
    assert all(host_peer_state(net, name, gone) is PeerState.DEAD for name in holders)
    assert sent[MsgType.PING] > 0  # the suspect was pinged before it was given up


def host_peer_state(net: VirtualNetwork, name: str, address: str) -> PeerState:
    peer = net.hosts[name].engine.peers.by_address(address)
    assert peer is not None
    return peer.state
