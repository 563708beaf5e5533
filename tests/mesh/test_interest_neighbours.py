"""Partial view: neighbours chosen for their interest (T-Man style), and the walk steered by it.

A random overlay (each node told about two random others) of three interest communities;
each node's one beacon lies near its community's topic. Gossip with the neighbours
nearest in interest brings *their* neighbourhoods within the radius, nearer nodes among
them: after some rounds each node's chosen neighbours are its nearest mesh-wide.
"""

from __future__ import annotations

import random

import numpy as np

from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
from mesh.team import Team
from mesh.testing import VirtualNetwork, make_engine

from .test_engine import ENERGY, beacon, cell, near, unit

TOPICS = (unit(21), unit(22), unit(23))
N = 36


def community_mesh(threshold: float = 0.99, **config) -> tuple[VirtualNetwork, dict[str, np.ndarray]]:
    net = VirtualNetwork(seed=3)
    team = Team.create()
    names = [f"n{i}" for i in range(N)]
    for name in names:
        net.add(make_engine(name, team, ENERGY, seed=3, fast=True, view="partial", **config))
    net.start()
    rng = random.Random(3)
    vectors = {}
    for i, name in enumerate(names):
        vectors[name] = near(TOPICS[i % 3], rng.uniform(0.8, 0.97), seed=i)
        net.inject(name, BeaconPlaced(beacon(vectors[name], agent=f"agent-{name}", threshold=threshold)))
        for other in rng.sample([n for n in names if n != name], 2):
            net.inject(name, PeerDiscovered(other))
    return net, vectors


def nearest(vectors: dict[str, np.ndarray], name: str, count: int) -> set[str]:
    others = sorted((n for n in vectors if n != name), key=lambda n: (-float(vectors[n] @ vectors[name]), n))
    return set(others[:count])


def neighbours(net: VirtualNetwork, name: str) -> set[str]:
    return {p.address for p in net.hosts[name].engine.peers.neighbours()}


def chosen(net: VirtualNetwork, name: str) -> set[str]:
    return {p.address for p in net.hosts[name].engine.peers.neighbours() if p.chosen}


def gossip_graph(net: VirtualNetwork) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in net.hosts}
    for name, host in net.hosts.items():
        for peer in host.engine.peers.neighbours():
            graph[name].add(peer.address)
            graph[peer.address].add(name)
    return graph


def connected(graph: dict[str, set[str]]) -> bool:
    start = next(iter(graph))
    seen, todo = {start}, [start]
    while todo:
        for other in graph[todo.pop()] - seen:
            seen.add(other)
            todo.append(other)
    return len(seen) == len(graph)


def test_after_some_rounds_each_node_has_chosen_its_interest_nearest_nodes():
    net, vectors = community_mesh(interest_neighbours=4, choice_margin=0)  # the exact nearest
    net.run_for(60_000)
    # each node's four nearest in interest, mesh-wide, are among its neighbours, though it was
    # introduced to two random nodes and knows only what lies within two hops; those not
    # already random neighbours it chose (a random neighbour that is one counts)
    for name in net.hosts:
        kept = neighbours(net, name)
        assert nearest(vectors, name, 4) <= kept
        assert chosen(net, name) <= nearest(vectors, name, 4)
        assert len(kept) <= 8 + 4


def test_without_interest_neighbours_the_overlay_stays_random():
    net, vectors = community_mesh(interest_neighbours=0)
    net.run_for(60_000)
    assert not any(chosen(net, name) for name in net.hosts)
    hits = sum(len(nearest(vectors, n, 4) & neighbours(net, n)) for n in net.hosts)
    assert hits < N  # about 4 x 4 / 35 of the 4 nearest per node by chance


def test_the_random_share_keeps_the_mesh_connected_across_interests():
    net, _ = community_mesh(interest_neighbours=4)
    introduced = {name: set(net.hosts[name].engine._contacts) for name in net.hosts}  # noqa: SLF001
    assert all(introduced.values())
    net.run_for(60_000)
    graph = gossip_graph(net)
    assert connected(graph)
    # the seeds a node was introduced to stay its neighbours, whatever their interest
    for name, host in net.hosts.items():
        assert introduced[name] <= neighbours(net, name)
    # and the communities are linked to each other, not islands
    community = {name: i % 3 for i, name in enumerate(net.hosts)}
    assert {frozenset((community[a], community[b])) for a in graph for b in graph[a]} >= {
        frozenset((0, 1)), frozenset((1, 2)), frozenset((0, 2)),
    }  # fmt: skip


def hub(steer: bool, origin_walks: int = 1) -> VirtualNetwork:
    """``a`` is told about ``b``, ``c`` and ``d``; ``b``'s beacon lies near the topic, theirs do not."""
    net = VirtualNetwork(seed=4)
    team = Team.create()
    for name in "abcd":
        net.add(make_engine(name, team, ENERGY, seed=4, view="partial", interest_radius=1, steer_walk=steer,
                            origin_walks=origin_walks))  # fmt: skip
    net.start()
    for name in "bcd":
        net.inject("a", PeerDiscovered(name))
    topic = unit(31)
    net.inject("b", BeaconPlaced(beacon(near(topic, 0.9), agent="agent-b", threshold=0.99)))
    net.inject("c", BeaconPlaced(beacon(unit(32), agent="agent-c", threshold=0.99)))
    net.inject("d", BeaconPlaced(beacon(unit(33), agent="agent-d", threshold=0.99)))
    net.run_for(20_000)
    for k in range(6):  # nobody wants these cells; a knows no matching beacon, so it walks one hop
        net.inject("a", CellStored(cell(near(topic, 0.95, seed=k), salience=0.2, at=net.now, cid=f"walk-{steer}-{k}")))
    net.run_for(5_000)
    return net


def test_a_steered_walk_goes_to_the_neighbour_nearest_the_cell():
    net = hub(steer=True)
    assert len(net.hosts["b"].cells) == 6
    assert not net.hosts["c"].cells and not net.hosts["d"].cells


def test_an_origin_that_sees_no_interest_starts_as_many_steered_walks_as_configured():
    net = hub(steer=True, origin_walks=2)
    assert len(net.hosts["b"].cells) == 6  # the nearest, for every cell
    # and the next nearest of the two, for every cell a walked: ``b``'s beacon accepts the first
    # (cos 0.991 >= 0.99 - slack x E0), so a pushes that one to b, and starts no walk
    assert len(net.hosts["c"].cells) + len(net.hosts["d"].cells) == 5


def test_an_unsteered_walk_goes_to_any_neighbour():
    net = hub(steer=False)
    assert len(net.hosts["b"].cells) < 6
    assert sum(len(net.hosts[n].cells) for n in "bcd") == 6


def test_a_chosen_neighbour_counts_the_chooser_one_hop_away():
    """A node it chose (a stranger, often full of random neighbours) learns the chooser's own
    diffs from its gossip, so each holds the other one hop away and relays to it."""
    net, _ = community_mesh(interest_neighbours=4)
    net.run_for(60_000)
    ids = {name: host.node_id for name, host in net.hosts.items()}
    for name, host in net.hosts.items():
        for peer in host.engine.peers.neighbours():
            assert host.engine.control.distance.get(peer.node_id) == 1
            assert net.hosts[peer.address].engine.control.distance.get(ids[name]) == 1
