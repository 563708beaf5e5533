"""Anti-entropy backs off while nothing changes, and comes back at the first change.

A settled mesh exchanges nothing but digests; those rounds slow down (1 s, 2 s, then
every ``gossip_max_interval_ms``: 4 s by default in a partial view, on request in a full
view), so idle traffic drops, and a change anywhere (a new
beacon, a moved digest, a peer lacking something) brings the short period back, so the
control plane still converges as fast as it did.
"""

from __future__ import annotations

from mesh.events import BeaconPlaced, PeerDiscovered, SendFrame
from mesh.team import Team
from mesh.testing import VirtualNetwork, make_engine
from mesh.wire import MsgType, decode_envelope

from .test_engine import ENERGY, Mesh, beacon, unit


def count_gossip(net: VirtualNetwork, team: Team) -> list[int]:
    """A one-item list that counts the GOSSIP frames sent on ``net`` from now on."""
    counted = [0]
    opener = team.sealer()

    def on_effect(host, effect) -> None:
        if isinstance(effect, SendFrame) and decode_envelope(opener.open(effect.frame)[2]).type is MsgType.GOSSIP:
            counted[0] += 1

    net.on_effect = on_effect
    return counted


def quiet_gossip(**config) -> int:
    mesh = Mesh("alice", "bob", "carol", "dave", **config)
    mesh.settle()
    mesh.run(10_000)  # past the back-off's ramp
    counted = count_gossip(mesh.net, mesh.team)
    mesh.run(60_000)
    return counted[0]


def test_a_quiet_mesh_gossips_every_few_seconds_not_every_second():
    every_second = quiet_gossip(gossip_max_interval_ms=1000)  # the period without back-off
    backed_off = quiet_gossip(gossip_max_interval_ms=4000)  # a full view backs off only when told to
    assert every_second >= 4 * 60 * 0.8  # one round per node per second (no replies: nothing to exchange)
    assert backed_off <= 4 * 60 / 4 * 1.3  # one round per node per ~4 s
    assert backed_off * 3 <= every_second


def test_a_full_view_gossips_every_second_by_default():
    assert quiet_gossip() >= 4 * 60 * 0.8


def test_a_change_after_a_long_quiet_spreads_at_the_short_period():
    mesh = Mesh("alice", "bob", "carol", "dave", gossip_max_interval_ms=4000)
    mesh.settle()
    mesh.run(60_000)
    assert all(h.engine._quiet_rounds >= 3 for h in mesh.net.hosts.values())  # everyone backed off
    placed = beacon(unit(3))
    mesh.do("dave", BeaconPlaced(placed))
    mesh.net.run_until(
        mesh.net.now + 3000, lambda: all(placed.beacon_id in mesh[n].remote_beacons for n in ("alice", "bob", "carol"))
    )
    assert all(placed.beacon_id in mesh[n].remote_beacons for n in ("alice", "bob", "carol"))


def test_a_partial_view_learns_a_newcomer_two_hops_away_after_a_long_quiet():
    # a - b - c, quiet for a minute; then d joins next to b. a pulls only origins it knows,
    # so it learns d (a new origin) only by asking b; b's moved digest tells it to ask soon.
    net = VirtualNetwork(seed=3)
    team = Team.create()
    for name in "abcd":
        net.add(make_engine(name, team, ENERGY, seed=3, view="partial", interest_radius=2))
    net.start("a", "b", "c")
    net.inject("b", PeerDiscovered("a"))
    net.inject("c", PeerDiscovered("b"))
    net.run_for(60_000)
    counted = count_gossip(net, team)
    net.run_for(20_000)
    assert counted[0] <= 3 * 20 / 4 * 1.3  # quiet: a round per node per ~4 s
    assert net.hosts["a"].engine._quiet_rounds >= 3
    net.start("d")
    net.inject("d", BeaconPlaced(placed := beacon(unit(5), agent="agent-d")))
    net.inject("d", PeerDiscovered("b"))
    start = net.now
    assert net.run_until(start + 10_000, lambda: placed.beacon_id in net.hosts["a"].remote_beacons)
    assert net.now - start <= 5000
