"""Members whose clocks differ by minutes still form one mesh (issue 7: +-5 min must work).

Each engine reads its own clock: the network below runs one virtual time and hands each
host ``now + skew``. Frames from a node 5 minutes behind are not replays, its diffs are
not "from the future" to a node 5 minutes ahead, and repair still finds the cells a
beacon wants although the cell's and the beacon's stamps come from two clocks.
"""

from __future__ import annotations

from mesh.errors import Reason
from mesh.events import BeaconPlaced, CellStored, FrameReceived, PeerDiscovered, SetTimer, TimerFired
from mesh.team import Team
from mesh.wire import Envelope, MsgType
from mesh.testing import VirtualNetwork, make_engine, sealed_by

from .test_engine import ENERGY, beacon, cell, near, unit

MINUTE = 60_000


class SkewedNetwork(VirtualNetwork):
    """A :class:`VirtualNetwork` where each host's clock is off by ``skew[address]`` ms."""

    def __init__(self, skew: dict[str, int], **kwargs) -> None:
        super().__init__(**kwargs)
        self.skew = skew

    def inject(self, address, event):
        host = self.hosts[address]
        effects = host.engine.handle(event, self.now + self.skew.get(address, 0))
        for effect in effects:
            if isinstance(effect, SetTimer):  # the host's clock -> network time
                at = effect.at_ms - self.skew.get(address, 0)
                self._timers[(address, effect.name)] = at
                self.schedule(at, address, TimerFired(effect.name))
            else:
                self._carry_out(host, effect)
        return effects


def skewed_mesh(skew: dict[str, int]) -> SkewedNetwork:
    team = Team.create()
    net = SkewedNetwork(skew, seed=3)
    for name in skew:
        net.add(make_engine(name, team, ENERGY, seed=3))
    net.start()
    for name in list(skew)[1:]:
        net.inject(name, PeerDiscovered(next(iter(skew))))
    return net


def test_nodes_five_minutes_apart_exchange_beacons_and_cells():
    net = skewed_mesh({"ahead": 5 * MINUTE, "behind": -5 * MINUTE, "exact": 0})
    topic = unit(1)
    net.inject("ahead", BeaconPlaced(beacon(topic)))
    net.inject("exact", BeaconPlaced(beacon(topic)))
    net.run_for(5000)
    for name in net.hosts:
        assert len(net.hosts[name].engine.peers) == 2, name
    assert len(net.hosts["behind"].engine.beacons) == 2

    stored = cell(near(topic, 0.9), at=net.now - 5 * MINUTE)  # stamped by the slow clock
    net.inject("behind", CellStored(stored))
    net.run_for(2000)
    assert stored.node_id in net.hosts["ahead"].cells
    assert stored.node_id in net.hosts["exact"].cells
    for host in net.hosts.values():
        drops = host.engine.counters.drops
        assert drops[Reason.REPLAY] == 0 and drops[Reason.FUTURE] == 0, (host.address, dict(drops))


def test_repair_across_a_partition_between_skewed_clocks():
    net = skewed_mesh({"ahead": 5 * MINUTE, "behind": -5 * MINUTE, "exact": 0})
    topic = unit(2)
    net.inject("ahead", BeaconPlaced(beacon(topic)))  # placed_at by the fast clock
    net.run_for(5000)
    net.partition(["ahead"], ["behind", "exact"])
    stored = cell(near(topic, 0.9), at=net.now - 5 * MINUTE)  # 10 min "older" than the beacon
    net.inject("behind", CellStored(stored))
    net.run_for(20_000)
    assert stored.node_id not in net.hosts["ahead"].cells
    net.heal()
    assert net.run_until(net.now + 90_000, lambda: stored.node_id in net.hosts["ahead"].cells)


def test_stale_and_far_future_frames_are_still_refused_once_the_offset_is_known():
    net = skewed_mesh({"a": 0, "b": -5 * MINUTE})
    net.run_for(5000)
    a = net.hosts["a"].engine
    assert a._clock_offsets  # b's offset was estimated from its frames
    offset = next(iter(a._clock_offsets.values()))
    assert -5 * MINUTE - 1000 <= offset <= -5 * MINUTE + 1000
    # A frame b sealed "3 minutes ago" by its own clock is a replay, though it is within
    # the +-10 min bound a first frame is judged by.
    b = net.hosts["b"].engine

    def ping_from_b(sent_at: int) -> bytes:
        env = Envelope(MsgType.PING, sent_at, "b", {b.node_id: (b.public_key, b._proof)}, nonce=99)
        return sealed_by(b, env, to=a)

    before = dict(a.counters.drops)
    a.handle(FrameReceived("b", ping_from_b(net.now - 5 * MINUTE - 3 * MINUTE)), net.now)
    assert a.counters.drops[Reason.REPLAY] == before.get(Reason.REPLAY, 0) + 1
    a.handle(FrameReceived("b", ping_from_b(net.now - 5 * MINUTE + 3 * MINUTE)), net.now)  # its clock jumped ahead
    assert a.counters.drops[Reason.FUTURE] == before.get(Reason.FUTURE, 0)  # within the +-10 min bound: taken
    a.handle(FrameReceived("b", ping_from_b(net.now + 11 * MINUTE)), net.now)
    assert a.counters.drops[Reason.FUTURE] == before.get(Reason.FUTURE, 0) + 1
