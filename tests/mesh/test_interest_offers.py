"""Partial view: a gossip answer offers the asker nodes beyond its radius that are nearer its
interest than those it knows (T-Man's ranked exchange), and the asker keeps the ones nearer
than its chosen neighbours.

A star with an interest radius of 1: every spoke is told about the hub ``h`` only, so a spoke
knows the hub and nothing else by replication; whatever it learns of the other spokes, it
learns from the hub's offers.
"""

from __future__ import annotations

import random

from mesh.events import BeaconPlaced, PeerDiscovered, SendFrame
from mesh.team import Team
from mesh.testing import PlainSealer, VirtualNetwork, make_engine
from mesh.wire import MsgType, decode_envelope

from .test_engine import ENERGY, beacon, near, unit
from .test_interest_neighbours import TOPICS, chosen, community_mesh, neighbours

TOPIC = unit(41)


def star(spokes: dict[str, object], **config) -> VirtualNetwork:
    """Hub ``h`` (no beacon) and one spoke per entry, its beacon at the given vector."""
    net = VirtualNetwork(seed=5)
    team = Team.create()
    for name in ("h", *spokes):
        net.add(make_engine(name, team, ENERGY, seed=5, fast=True, view="partial", interest_radius=1, **config))
    net.start()
    for name, vector in spokes.items():
        net.inject(name, BeaconPlaced(beacon(vector, agent=f"agent-{name}")))
        net.inject(name, PeerDiscovered("h"))
    return net


def knows(net: VirtualNetwork, name: str, other: str) -> bool:
    return net.hosts[other].node_id in net.hosts[name].engine.beacons.owners()


def offers_seen(net: VirtualNetwork) -> list[tuple[str, str, set[str]]]:
    """Record, for each gossip frame sent from now on, (sender, receiver, the nodes it offers)."""
    config = next(iter(net.hosts.values())).engine.config
    opener = PlainSealer(config.team, random.Random(0))  # the engines' frames (fast crypto)
    beyond = config.interest_radius + 1
    seen: list[tuple[str, str, set[str]]] = []

    def on_effect(host, effect) -> None:
        if isinstance(effect, SendFrame) and effect.is_control:
            env = decode_envelope(opener.open(effect.frame)[2], config.limits)
            if env.type is MsgType.GOSSIP:
                seen.append((host.address, effect.address, {d.origin for d in env.diffs if d.hops == beyond}))

    net.on_effect = on_effect
    return seen


def test_a_node_learns_of_a_like_interested_node_beyond_its_radius_from_an_offer():
    spokes = {"a": near(TOPIC, 0.95, seed=1), "x": near(TOPIC, 0.95, seed=2),
              **{f"o{i}": unit(50 + i) for i in range(4)}}  # fmt: skip
    net = star(spokes)
    net.run_for(30_000)
    assert knows(net, "a", "x") and knows(net, "x", "a")
    assert "x" in chosen(net, "a") and "a" in chosen(net, "x")
    # kept at the edge of the radius: known, not shared onward
    assert net.hosts["a"].engine.control.distance[net.hosts["x"].node_id] <= 1


def test_without_offers_a_spoke_knows_only_the_hub():
    spokes = {"a": near(TOPIC, 0.95, seed=1), "x": near(TOPIC, 0.95, seed=2)}
    net = star(spokes, interest_offers=0)
    net.run_for(30_000)
    assert not knows(net, "a", "x") and not knows(net, "x", "a")
    assert not chosen(net, "a")


def test_one_answer_offers_at_most_interest_offers_nodes():
    spokes = {"a": near(TOPIC, 0.95, seed=1), **{f"x{i}": near(TOPIC, 0.9, seed=10 + i) for i in range(10)}}
    net = star(spokes, interest_offers=3)
    seen = offers_seen(net)
    net.run_for(30_000)
    assert any(offered for _, _, offered in seen)
    assert max(len(offered) for _, _, offered in seen) == 3


def test_an_offer_no_nearer_than_the_chosen_neighbours_is_declined():
    # a holds x0..x3 (its seeds, near its interest: they count as chosen) before it meets the
    # hub, which knows none of them and offers it y: farther than all four, so a does not keep
    # it. (y chooses no neighbours, or the hub's offer of a to y would link them anyway.)
    net = VirtualNetwork(seed=5)
    team = Team.create()
    seeds = {f"x{i}": near(TOPIC, 0.9, seed=20 + i) for i in range(4)}
    for name, vector in {"h": None, "y": unit(60), **seeds, "a": near(TOPIC, 0.95, seed=1)}.items():
        net.add(make_engine(name, team, ENERGY, seed=5, fast=True, view="partial", interest_radius=1,
                            interest_neighbours=0 if name == "y" else 4))  # fmt: skip
        net.start(name)
        if vector is not None:
            net.inject(name, BeaconPlaced(beacon(vector, agent=f"agent-{name}")))
    net.inject("y", PeerDiscovered("h"))
    for name in seeds:
        net.inject("a", PeerDiscovered(name))
    net.run_for(20_000)
    assert neighbours(net, "a") == set(seeds)
    net.inject("a", PeerDiscovered("h"))
    seen = offers_seen(net)
    net.run_for(20_000)
    assert any(dst == "a" and net.hosts["y"].node_id in offered for _, dst, offered in seen)
    assert net.hosts["a"].engine.counters.drops["offer_declined"] > 0
    assert not knows(net, "a", "y")
    assert neighbours(net, "a") == {*seeds, "h"}


def test_an_answer_leaves_out_nodes_the_asker_would_decline():
    # a's beacon is the topic itself; it holds x0..x3 (closeness 0.9)
    # (its seeds: they count as chosen) before it meets the hub, which knows them too, and y (0.92) and w (0.99). y ranks above
    # x0..x3 but not by the choice margin (0.05): a would decline it, so no answer offers it
    # (else every round would, a's digest never showing it). w is nearer by more: offered, kept.
    net = VirtualNetwork(seed=5)
    team = Team.create()
    others = {f"x{i}": near(TOPIC, 0.9, seed=20 + i) for i in range(4)}
    others |= {"y": near(TOPIC, 0.92, seed=30), "w": near(TOPIC, 0.99, seed=31)}
    for name, vector in {"h": None, **others, "a": TOPIC}.items():
        net.add(make_engine(name, team, ENERGY, seed=5, fast=True, view="partial", interest_radius=1,
                            interest_neighbours=4 if name in ("a", "h") else 0))  # fmt: skip
        net.start(name)
        if vector is not None:
            net.inject(name, BeaconPlaced(beacon(vector, agent=f"agent-{name}")))
    for name in others:
        net.inject(name, PeerDiscovered("h"))
        if name.startswith("x"):
            net.inject("a", PeerDiscovered(name))
    net.run_for(20_000)
    assert neighbours(net, "a") == {f"x{i}" for i in range(4)}
    net.inject("a", PeerDiscovered("h"))
    seen = offers_seen(net)
    net.run_for(20_000)
    offered_to_a = set().union(*(offered for _, dst, offered in seen if dst == "a"))
    assert net.hosts["w"].node_id in offered_to_a and knows(net, "a", "w")
    assert net.hosts["y"].node_id not in offered_to_a and not knows(net, "a", "y")
    assert net.hosts["a"].engine.counters.drops["offer_declined"] == 0


def test_offers_die_down_as_the_overlay_converges():
    net, _ = community_mesh(interest_neighbours=4)
    seen = offers_seen(net)
    net.run_for(10_000)
    early = sum(len(offered) for _, _, offered in seen)
    net.run_for(50_000)
    seen.clear()
    net.run_for(10_000)
    late = sum(len(offered) for _, _, offered in seen)
    assert early > 0
    assert late * 10 < early


def test_a_full_view_offers_nothing():
    net = VirtualNetwork(seed=6)
    team = Team.create()
    names = [f"f{i}" for i in range(6)]
    for name in names:
        net.add(make_engine(name, team, ENERGY, seed=6, fast=True))
    net.start()
    seen = offers_seen(net)
    for i, name in enumerate(names):
        net.inject(name, BeaconPlaced(beacon(near(TOPICS[i % 3], 0.9, seed=i), agent=f"agent-{name}")))
        if i:
            net.inject(name, PeerDiscovered(names[0]))
    net.run_for(20_000)
    assert seen and not any(offered for _, _, offered in seen)
    assert all(len(net.hosts[n].engine.beacons) == len(names) - 1 for n in names)


def test_with_a_choice_margin_neighbours_settle_within_it_of_the_nearest_after_fewer_changes():
    changes = {}
    for margin in (0.0, 0.05):
        net, vectors = community_mesh(interest_neighbours=4, choice_margin=margin)
        before = {name: chosen(net, name) for name in net.hosts}
        changes[margin] = 0
        for _ in range(60):
            net.run_for(1_000)
            now = {name: chosen(net, name) for name in net.hosts}
            changes[margin] += sum(len(now[n] - before[n]) for n in net.hosts)
            before = now
        for name in net.hosts:
            fourth = sorted((float(vectors[o] @ vectors[name]) for o in vectors if o != name), reverse=True)[3]
            assert all(float(vectors[c] @ vectors[name]) >= fourth - margin - 1e-6 for c in chosen(net, name))
    assert changes[0.05] < changes[0.0]
