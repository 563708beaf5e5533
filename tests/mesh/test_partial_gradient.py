"""Partial view: pushes along known interest spend no hop budget; only the walk does.

Hand-drawn lines (``a - b - c - d - e``, each node told about the one before it) with an
interest radius of 1, so each node knows the beacons of its line neighbours only.
"""

from __future__ import annotations

import numpy as np

from mesh.events import BeaconPlaced, CellStored

from .test_engine import beacon, cell, near, unit
from .test_routing_partial import LINE, line


def sent(net) -> int:
    return sum(net.hosts[n].engine.counters.data_diffs_sent for n in LINE)


def test_a_low_energy_cell_follows_known_interest_to_the_end_of_the_line():
    net = line(1)
    topic = unit(11)
    for name in LINE[1:]:
        net.inject(name, BeaconPlaced(beacon(topic, agent=f"agent-{name}")))
    net.run_for(20_000)
    stored = cell(near(topic, 0.95), salience=0.2, at=net.now)  # budget round(6 × 0.2) = 1 hop
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    # each node knows the next one's beacon: a push each, none of them spends the budget
    assert {n: net.hosts[n].cells[stored.node_id].hops for n in LINE[1:]} == {"b": 1, "c": 2, "d": 3, "e": 4}
    assert sent(net) == 4


def test_a_walk_hands_over_to_known_interest_with_its_budget_spent():
    net = line(1)
    topic = unit(12)
    for name in ("d", "e"):
        net.inject(name, BeaconPlaced(beacon(topic, agent=f"agent-{name}")))
    net.run_for(20_000)
    stored = cell(near(topic, 0.95), salience=0.3, at=net.now)  # budget 2: a → b → c walks, c knows d
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    got = {n: net.hosts[n].cells[stored.node_id].hops for n in LINE if stored.node_id in net.hosts[n].cells}
    assert got == {"b": 1, "c": 2, "d": 3, "e": 4}
    assert sent(net) == 4


def test_without_interest_in_sight_the_walk_ends_with_the_budget():
    net = line(1)
    for name in LINE:
        net.inject(name, BeaconPlaced(beacon(unit(13), agent=f"agent-{name}")))  # nobody wants this cell
    net.run_for(20_000)
    stored = cell(unit(14), salience=0.3, at=net.now)  # budget 2
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    assert {n for n in LINE if stored.node_id in net.hosts[n].cells} == {"b", "c"}
    assert sent(net) == 2


def spread(topic: np.ndarray, wanting: tuple[str, ...], **config) -> tuple[set[str], int]:
    """On a radius-2 line drawn by hand, ``wanting`` place a beacon on ``topic``; ``a`` stores a
    high-energy cell on it. Who holds the cell 5 s later, and how many copies were sent."""
    net = line(2, interest_neighbours=0, **config)  # the hand-drawn line, fixed
    for name in wanting:
        net.inject(name, BeaconPlaced(beacon(topic, agent=f"agent-{name}")))
    net.run_for(30_000)
    stored = cell(near(topic, 0.95), salience=1.0, at=net.now)
    net.inject("a", CellStored(stored))
    net.run_for(5_000)
    return {n for n in LINE if stored.node_id in net.hosts[n].cells}, sent(net)


def test_a_relay_that_wanted_the_cell_pushes_within_its_neighbourhood_only():
    """Radius 2, everyone but ``a`` interested. ``a`` pushes to the two it knows (b, c); a relay
    that wanted the cell then pushes to the interests one hop away only: interest two hops away
    is one hop from another holder, which pushes it there too. Same reach, about half the copies
    (which holder pushes first depends on the link latencies). The ends of the line are leaves
    of the spread, which widen (next test), and copies name who was sent them (test_told.py):
    this one reads the relay radius alone."""
    reached, copies = {}, {}
    for relay_radius in (1, 2):
        reached[relay_radius], copies[relay_radius] = spread(
            unit(41), LINE[1:], relay_radius=relay_radius, widen_leaves=False, told_limit=0
        )
    assert reached[1] == reached[2] == {"b", "c", "d", "e"}
    assert copies[1] <= 6 and copies[2] >= 9  # 5 and 10 run alone; the ids earlier tests drew shift who pushes first


def test_a_relay_with_no_interest_linked_to_it_pushes_to_every_interest_it_knows():
    """``b``, ``d`` and ``e`` want the cell, ``c`` between them does not. The only interest ``a``
    knows is ``b``; ``b``'s links lead to no other interest, but it knows ``d`` two hops away.
    Pushing along its links only, the spread ends at ``b`` (until repair); a leaf of the spread
    pushes to all the interest it knows, and ``d`` takes it on to ``e``."""
    outcome = {widen: spread(unit(43), ("b", "d", "e"), widen_leaves=widen, repair_interval_ms=600_000) for widen in (True, False)}
    assert outcome == {True: ({"b", "d", "e"}, 3), False: ({"b"}, 1)}


def test_a_steered_walk_goes_to_the_known_node_nearest_the_cell_not_only_to_a_neighbour():
    """Radius 2: ``a`` knows ``b`` (its neighbour) and ``c``; neither wants the cell, ``c``'s
    beacon is nearer it. Only ``e`` wants it, two hops past ``c``. With a budget of one hop
    the walk to the neighbour ``b`` ends there (``e`` is three hops from ``b``); the walk to
    ``c`` lands within ``e``'s radius, and ``c`` pushes it on, spending nothing."""
    topic = unit(44)
    held = {}
    for walk_far in (True, False):
        net = line(2, interest_neighbours=0, walk_far=walk_far, origin_walks=1, repair_interval_ms=600_000)
        net.inject("b", BeaconPlaced(beacon(near(topic, 0.1, seed=1), agent="agent-b")))
        net.inject("c", BeaconPlaced(beacon(near(topic, 0.6, seed=2), agent="agent-c")))
        net.inject("e", BeaconPlaced(beacon(topic, agent="agent-e")))
        net.run_for(30_000)
        stored = cell(near(topic, 0.95), salience=0.2, at=net.now)  # budget 1
        net.inject("a", CellStored(stored))
        net.run_for(5_000)
        held[walk_far] = {n for n in LINE if stored.node_id in net.hosts[n].cells}
    assert held == {True: {"c", "e"}, False: {"b"}}


def test_a_relay_that_wanted_the_cell_and_sees_no_other_interest_walks_on_with_leaf_walk():
    """Radius 1: ``b`` and ``e`` want the cell. ``a`` pushes it to ``b``, which knows no other
    interest: the spread ends there, unless ``b`` walks on (``leaf_walk``): to ``c``, then ``d``,
    which knows ``e``. Budget 3: the origin's copy carries 2, one per walk hop."""
    topic = unit(45)
    held = {}
    for leaf_walk in (True, False):
        net = line(1, leaf_walk=leaf_walk, repair_interval_ms=600_000)
        for name in ("b", "e"):
            net.inject(name, BeaconPlaced(beacon(topic, agent=f"agent-{name}")))
        net.run_for(20_000)
        stored = cell(near(topic, 0.95), salience=0.5, at=net.now)
        net.inject("a", CellStored(stored))
        net.run_for(5_000)
        held[leaf_walk] = {n for n in LINE if stored.node_id in net.hosts[n].cells}
    assert held == {True: {"b", "c", "d", "e"}, False: {"b"}}
