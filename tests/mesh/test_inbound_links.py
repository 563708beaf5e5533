"""Partial view: a relay pushes along its links as they stand now, both ways, in-degree bounded.

A node's links are its own neighbours and the nodes that hold it as theirs (they gossip with
it). The second kind is known only from their gossip, so it lapses when they stop, and a node
chosen by many (near the centre of a popular topic) counts only the few nearest in interest.
"""

from __future__ import annotations

from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
from mesh.links import InboundLinks
from mesh.team import Team
from mesh.testing import VirtualNetwork, make_engine

from .test_engine import ENERGY, beacon, cell, near, unit
from .test_interest_neighbours import TOPICS, community_mesh

# -- the bookkeeping, on its own ---------------------------------------------------------


def test_a_node_that_stops_gossiping_with_us_lapses_after_the_timeout():
    links = InboundLinks(timeout_ms=30_000)
    links.heard("y", 1_000)
    links.heard("z", 20_000)
    assert links.holding(31_000) == {"y", "z"}
    assert links.holding(31_001) == {"z"}  # y has not opened a round with us for 30 s: it let us go
    links.heard("y", 40_000)
    assert links.holding(40_000) == {"y", "z"}


def test_the_in_degree_is_bounded_to_the_nearest_in_interest_and_our_own_neighbours_are_apart():
    score = {"far": 0.1, "mid": 0.5, "near": 0.9, "nearest": 0.99, "ours": 1.0}
    links = InboundLinks(timeout_ms=30_000, cap=2, score=score.__getitem__, mine=lambda n: n == "ours")
    for name in score:
        links.heard(name, 0)
    assert links.holding(0) == {"near", "nearest"}  # "ours" is linked anyway, as our own neighbour
    unbounded = InboundLinks(timeout_ms=30_000)
    for name in score:
        unbounded.heard(name, 0)
    assert unbounded.holding(0) == set(score)


# -- in the engine, on a virtual clock ---------------------------------------------------

SPOKES = [f"s{i}" for i in range(8)]


def star(cap: int | None) -> tuple[VirtualNetwork, dict[str, float]]:
    """Eight spokes, each told about the hub ``h`` only; all want the topic. The hub takes two
    of them as its own (random) neighbours; the other six hold it without being held. Repair is
    put off, so what a spoke holds came by routing."""
    net = VirtualNetwork(seed=5)
    team = Team.create()
    net.add(make_engine("h", team, ENERGY, seed=5, view="partial", interest_radius=1, interest_neighbours=0,
                        max_neighbours=2, max_inbound_links=cap, repair_interval_ms=600_000))  # fmt: skip
    for name in SPOKES:
        net.add(make_engine(name, team, ENERGY, seed=5, view="partial", interest_radius=1, interest_neighbours=0,
                            repair_interval_ms=600_000))  # fmt: skip
    net.start()
    topic = unit(51)
    net.inject("h", BeaconPlaced(beacon(topic, agent="agent-h", threshold=0.5)))
    likeness = {}
    for i, name in enumerate(SPOKES):
        likeness[name] = 0.6 + 0.04 * i  # s7 is the nearest the hub in interest
        net.inject(name, BeaconPlaced(beacon(near(topic, likeness[name], seed=i), agent=f"agent-{name}", threshold=0.5)))
        net.inject(name, PeerDiscovered("h"))
    net.run_for(20_000)
    return net, likeness


def test_a_node_held_by_many_pushes_to_its_own_neighbours_and_its_nearest_holders_only():
    pushed = {}
    for cap in (None, 2):
        net, likeness = star(cap)
        hub = net.hosts["h"].engine
        ids = {net.hosts[n].node_id: n for n in SPOKES}
        own = {p.address for p in hub.peers.neighbours()}
        holders = {ids[n] for n in hub.inbound.holding(net.now)}
        assert len(own) == 2 and own.isdisjoint(holders)
        if cap is None:
            assert holders == set(SPOKES) - own  # every spoke holds the hub
        else:
            assert holders == set(sorted(set(SPOKES) - own, key=likeness.__getitem__)[-cap:])  # the nearest two
        origin = next(n for n in SPOKES if n not in own)  # the farthest in interest: bounded, not counted
        stored = cell(near(unit(51), 0.95), salience=1.0, at=net.now, cid=f"star-{cap}")
        net.inject(origin, CellStored(stored))
        net.run_for(5_000)
        pushed[cap] = {n for n in SPOKES if n != origin and stored.node_id in net.hosts[n].cells}
        assert pushed[cap] == (own | holders) - {origin}  # the spokes know only the hub: it alone relays
        assert hub.counters.data_diffs_sent == len(pushed[cap])
    assert len(pushed[None]) == 7 and len(pushed[2]) == 4


def test_a_small_interested_cluster_is_still_reached_with_the_in_degree_bounded():
    """Three interest communities on a random overlay, neighbours chosen for interest; of
    community 0, those whose beacon lies nearest its topic want a cell at the topic's centre
    (a small cluster), stored by a node of another community."""
    reached, copies = {}, {}
    for cap in (None, 1):
        net, vectors = community_mesh(threshold=0.95, max_inbound_links=cap)
        net.run_for(60_000)
        e0 = ENERGY.initial(1.0, "Decision")
        wanting = {n for n, v in vectors.items() if float(v @ TOPICS[0]) >= 0.95 - ENERGY.match_slack * e0}
        assert 3 <= len(wanting) <= 8
        for host in net.hosts.values():
            assert len(host.engine.inbound.holding(net.now)) <= (cap if cap is not None else len(net.hosts))
        stored = cell(TOPICS[0], salience=1.0, at=net.now, cid=f"cluster-{cap}")
        net.inject("n1", CellStored(stored))  # community 1: it knows the cluster only through the overlay
        net.run_for(5_000)
        reached[cap] = {n for n in net.hosts if stored.node_id in net.hosts[n].cells}
        copies[cap] = sum(h.engine.counters.data_diffs_sent for h in net.hosts.values())
        assert wanting <= reached[cap]
    assert copies[1] <= copies[None]
