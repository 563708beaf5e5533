"""The partial view: bounded neighbours, interests known within a radius, relays within the hop budget.

The meshes here are drawn by hand: who is told about whom (``PeerDiscovered``) is the
overlay, because a partial-view node only gossips with its neighbours.
"""

from __future__ import annotations

import pytest

from mesh.events import BeaconPlaced, CellStored, PeerDiscovered
from mesh.routing import FullView, PartialView
from mesh.team import Team
from mesh.testing import VirtualNetwork, make_engine

from .test_engine import ENERGY, beacon, cell, near, unit

LINE = ("a", "b", "c", "d", "e")


def line(radius: int, *names: str, **config) -> VirtualNetwork:
    """``a - b - c - d - e``: each node is told only about the one before it. No offers from
    beyond the radius (``interest_offers=0``): they would redraw the line these tests read."""
    names = names or LINE
    config.setdefault("interest_offers", 0)
    net = VirtualNetwork(seed=1)
    team = Team.create()
    for name in names:
        net.add(make_engine(name, team, ENERGY, seed=1, view="partial", interest_radius=radius, **config))
    net.start()
    for before, name in zip(names, names[1:]):
        net.inject(name, PeerDiscovered(before))
    return net


def neighbours(net: VirtualNetwork, name: str) -> set[str]:
    return {p.address for p in net.hosts[name].engine.peers.neighbours()}


def test_the_partial_view_is_chosen_by_config():
    team = Team.create()
    assert isinstance(make_engine("x", team, ENERGY).router, FullView)
    assert isinstance(make_engine("y", team, ENERGY, view="partial").router, PartialView)


def test_neighbours_are_bounded_and_the_overlay_is_who_was_introduced():
    net = VirtualNetwork(seed=2)
    team = Team.create()
    names = ["hub", *(f"n{i}" for i in range(10))]
    for name in names:
        net.add(make_engine(name, team, ENERGY, seed=2, view="partial", max_neighbours=4))
    net.start()
    for name in names[1:]:
        net.inject(name, PeerDiscovered("hub"))
    net.run_for(20_000)
    assert len(neighbours(net, "hub")) == 4  # everyone knocked; four were taken in
    assert all(neighbours(net, n) == {"hub"} for n in names[1:])  # each knows only whom it was told about
    # the hub still answers the others (they stay alive to it), it just does not gossip with them
    assert all(net.hosts[n].peer_states.get(net.hosts["hub"].node_id) == "alive" for n in names[1:])


@pytest.mark.parametrize("radius, known", [(1, {"b"}), (2, {"b", "c"}), (3, {"b", "c", "d"})])
def test_interests_are_learned_within_the_radius_only(radius, known):
    net = line(radius, interest_neighbours=0)  # the radius is read off the hand-drawn line: keep it fixed
    for name in LINE[1:]:
        net.inject(name, BeaconPlaced(beacon(unit(LINE.index(name)), agent=f"agent-{name}")))
    net.run_for(30_000)
    a = net.hosts["a"].engine
    owners = {net.hosts[n].node_id: n for n in LINE}
    assert {owners[o] for o in a.beacons.owners()} == known
    assert set(a.contacts) == {net.hosts[n].node_id for n in known}  # addresses for direct pushes, as far
    assert {owners[o]: d for o, d in a.control.distance.items()} == {
        "a": 0, **{n: LINE.index(n) for n in known}
    }
    assert neighbours(net, "a") == {"b"}


def test_a_cell_reaches_interest_beyond_the_radius_in_several_hops():
    net = line(1)
    topic = unit(7)
    net.inject("e", BeaconPlaced(beacon(topic)))
    net.run_for(20_000)
    stored = cell(near(topic, 0.95), salience=1.0, at=net.now)  # Decision, E0 = 1: a budget of 6 hops
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    got = net.hosts["e"].cells[stored.node_id]
    # a, b, c know no matching beacon within one hop: each hands the cell on; d knows e's
    assert got.hops == 4 and got.origin_node == net.hosts["a"].node_id
    assert all(stored.node_id in net.hosts[n].cells for n in ("b", "c", "d"))  # the relays held it


def test_a_known_interest_is_pushed_to_directly_past_the_neighbours():
    net = line(3)
    topic = unit(8)
    net.inject("d", BeaconPlaced(beacon(topic)))
    net.run_for(30_000)
    stored = cell(near(topic, 0.95), salience=1.0, at=net.now)
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    assert net.hosts["d"].cells[stored.node_id].hops == 1  # a knew d's beacon and address: one push
    assert all(stored.node_id not in net.hosts[n].cells for n in ("b", "c", "e"))
    assert net.hosts["a"].engine.counters.data_diffs_sent == 1


@pytest.mark.parametrize(
    "salience, reached",
    [(1.0, {"b", "c", "d", "e"}), (0.5, {"b", "c", "d", "e"}), (0.3, {"b", "c"}), (0.2, {"b"})],
)
def test_the_hop_budget_stops_the_walk(salience, reached):
    """E0 = salience (Decision): budget round(6 × E0) hops: 6, 3, 2 and 1, spent by the walk only.
    With 3, a → b → c → d are walk hops and d → e a push to the beacon d knows (free)."""
    net = line(1)
    topic = unit(9)
    net.inject("e", BeaconPlaced(beacon(topic)))
    net.run_for(20_000)
    stored = cell(near(topic, 0.95), salience=salience, at=net.now)
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    assert {n for n in LINE if stored.node_id in net.hosts[n].cells} == reached
    sent = sum(net.hosts[n].engine.counters.data_diffs_sent for n in LINE)
    assert sent == len(reached)  # one copy per hop taken, none wasted past the budget
