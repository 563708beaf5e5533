"""The engine, stapled to other engines over an in-memory network on a virtual clock."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.errors import Reason
from mesh.events import (
    BeaconPlaced, BeaconRemoved, CellForgotten, CellStored, PeerDiscovered, SceneChanged, SendFailed, SendFrame,
)  # fmt: skip
from mesh.membership import LIVENESS, Liveness, PeerState, PeerTable
from mesh.team import Team
from mesh.testing import LinkConditions, VirtualNetwork, make_engine
from mesh.wire import BeaconPayload, CellPayload, decode_envelope
from node.energy import EnergyModel

ENERGY = EnergyModel()
DIM = 16
_ids = itertools.count()


def unit(seed: int | list[float]) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM) if isinstance(seed, int) else np.asarray(seed, float)
    v = np.asarray(v, np.float32)
    return v / np.linalg.norm(v)


def near(v: np.ndarray, cos: float, seed: int = 0) -> np.ndarray:
    """A unit vector at exactly ``cos`` from ``v``."""
    noise = unit(seed + 1000)
    noise = noise - (noise @ v) * v
    noise /= np.linalg.norm(noise)
    return (cos * v + np.sqrt(1 - cos * cos) * noise).astype(np.float32)


def cell(vector, *, tenant="t", agent="writer", salience=0.9, cell_type="Decision", project=None, at=0, cid=None):
    return CellPayload(
        cid or f"cell-{next(_ids)}", tenant, agent, "content", cell_type, salience, at, project=project,
        embedding=vector, embedding_space="space",
    )  # fmt: skip


def beacon(vector, *, tenant="t", agent="reader", threshold=0.8, **filters):
    return BeaconPayload(
        f"beacon-{next(_ids)}", tenant, agent, "query", threshold, embedding=vector, embedding_space="space", **filters
    )


class Mesh:
    """A few engines joined through the first one; nodes are addressed by name."""

    def __init__(self, *names: str, seed: int = 0, link: LinkConditions | None = None, **config) -> None:
        self.team = Team.create()
        self.net = VirtualNetwork(seed=seed, link=link)
        for name in names:
            self.net.add(make_engine(name, self.team, ENERGY, seed=seed, **config))
        self.net.start()
        for name in names[1:]:
            self.net.inject(name, PeerDiscovered(names[0]))

    def __getitem__(self, name: str):
        return self.net.hosts[name]

    def do(self, name: str, event) -> None:
        self.net.inject(name, event)

    def run(self, ms: int) -> None:
        self.net.run_for(ms)

    def settle(self, ms: int = 8000) -> None:
        """Run until every node knows every other and every beacon (or ``ms`` pass)."""
        hosts = list(self.net.hosts.values())

        def converged() -> bool:
            digests = [h.engine.control.digest() for h in hosts]
            return all(len(h.engine.peers) == len(hosts) - 1 for h in hosts) and all(d == digests[0] for d in digests)

        assert self.net.run_until(self.net.now + ms, converged), "control plane did not converge"


def test_two_nodes_find_each_other():
    mesh = Mesh("alice", "bob")
    mesh.settle()
    assert mesh["alice"].peer_states == {mesh["bob"].node_id: "alive"}
    assert mesh["bob"].peer_states == {mesh["alice"].node_id: "alive"}
    assert {p.address for p in mesh["alice"].engine.peers} == {"bob"}


def test_control_plane_reaches_every_member():
    mesh = Mesh("alice", "bob", "carol", "dave")
    mesh.settle()
    placed = beacon(unit(1))
    mesh.do("dave", BeaconPlaced(placed))
    mesh.do("bob", SceneChanged({"scene_id": "s1", "tenant_id": "t", "title": "sprint"}))
    mesh.settle()
    for name in ("alice", "bob", "carol"):
        assert mesh[name].remote_beacons[placed.beacon_id].beacon == placed
        assert mesh[name].remote_beacons[placed.beacon_id].origin_node == mesh["dave"].node_id
    assert {n for n in ("alice", "carol", "dave") if "s1" in mesh[n].scenes} == {"alice", "carol", "dave"}
    mesh.do("dave", BeaconRemoved(placed.beacon_id, "t"))
    mesh.settle()
    assert all(placed.beacon_id not in mesh[n].remote_beacons for n in ("alice", "bob", "carol"))
    assert len(mesh["alice"].engine.beacons) == 0


def test_a_cell_goes_only_to_interested_nodes_with_provenance():
    mesh = Mesh("alice", "bob", "carol")
    topic = unit(1)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(unit(2))))
    mesh.settle()
    stored = cell(near(topic, 0.9), at=mesh.net.now)
    mesh.do("alice", CellStored(stored))
    mesh.run(2000)
    got = mesh["bob"].cells[stored.node_id]
    assert got.cell == stored and got.origin_node == mesh["alice"].node_id and got.hops == 1
    assert mesh["carol"].cells == {}
    assert mesh["alice"].engine.counters.data_diffs_sent == 1  # the oracle's count: one per interested node
    assert mesh["alice"].engine.counters.data_diffs_resent == 0


@pytest.mark.parametrize(
    "filters, changes, delivered",
    [
        ({}, {}, True),
        ({"cell_types": ("Risk",)}, {}, False),
        ({"cell_types": ("Risk", "Decision")}, {}, True),
        ({"project": "apollo"}, {"project": None}, False),
        ({"project": "apollo"}, {"project": "apollo"}, True),
        ({"min_salience": 0.95}, {}, False),
        ({"expires_at": 0}, {}, False),
        ({"scope_projects": ("apollo",)}, {"project": "gemini"}, False),
        ({}, {"tenant": "other"}, False),
        ({}, {"agent": "reader"}, False),  # never back to the beacon's own agent
    ],
)
def test_beacon_filters(filters, changes, delivered):
    mesh = Mesh("alice", "bob")
    topic = unit(3)
    mesh.do("bob", BeaconPlaced(beacon(topic, **filters)))
    mesh.settle()
    stored = cell(topic, at=mesh.net.now, **changes)
    mesh.do("alice", CellStored(stored))
    mesh.run(2000)
    assert (stored.node_id in mesh["bob"].cells) is delivered


def test_higher_energy_matches_wider_and_travels_further():
    mesh = Mesh("alice", "bob")
    topic = unit(4)
    mesh.do("bob", BeaconPlaced(beacon(topic, threshold=0.8)))
    mesh.settle()
    frames = []
    mesh.net.on_effect = lambda host, e: frames.append(e) if isinstance(e, SendFrame) and not e.is_control else None
    # routing's floor: tau - slack * E0 - route_margin (0.04)
    strong = cell(near(topic, 0.73), salience=1.0, at=mesh.net.now)  # 0.8 - 0.05 * 1.0 - 0.04 = 0.71 <= 0.73
    weak = cell(near(topic, 0.73), salience=0.2, cell_type="Context", at=mesh.net.now)  # 0.8 - 0.004 - 0.04 > 0.73
    mesh.do("alice", CellStored(strong))
    mesh.do("alice", CellStored(weak))
    mesh.run(2000)
    assert strong.node_id in mesh["bob"].cells and weak.node_id not in mesh["bob"].cells
    (frame,) = frames
    _, _, plain = mesh.team.sealer().open(frame.frame)
    (diff,) = decode_envelope(plain).diffs
    assert (diff.hops, diff.ttl) == (1, ENERGY.hop_budget(1.0) - 1) == (1, 5)


def test_tombstones_follow_their_cell():
    mesh = Mesh("alice", "bob", "carol")
    topic = unit(5)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    stored = cell(topic, at=mesh.net.now)
    mesh.do("alice", CellStored(stored))
    mesh.run(1000)
    mesh.do("alice", CellForgotten(stored.node_id, "t"))
    mesh.run(1000)
    assert mesh["bob"].tombstones[stored.node_id].origin_node == mesh["alice"].node_id
    assert mesh["carol"].tombstones == {}


def test_under_backpressure_the_highest_energy_goes_first_and_the_lowest_is_dropped():
    mesh = Mesh("alice", "bob", send_queue_limit=4, max_inflight_batches=1, ack_timeout_ms=5_000)
    topic = unit(6)
    mesh.do("bob", BeaconPlaced(beacon(topic, threshold=0.5)))
    mesh.settle()
    mesh.net.partition(["alice"], ["bob"])
    saliences = [0.1, 0.9, 0.3, 0.7, 0.5, 1.0, 0.2, 0.8]
    cells = [cell(topic, salience=s, at=mesh.net.now) for s in saliences]
    for c in cells:
        mesh.do("alice", CellStored(c))
    engine = mesh["alice"].engine
    # The first diff went out at once (and was lost); the rest queue, the lowest dropped.
    assert engine.outbox.depth(mesh["bob"].node_id) == 4
    assert engine.counters.drops[Reason.QUEUE_FULL] == 3
    queued = sorted(d.payload.salience for _, _, _, d in engine.outbox._lanes[mesh["bob"].node_id].queue)
    assert queued == [0.7, 0.8, 0.9, 1.0]
    mesh.net.heal()
    mesh.run(120_000)  # retransmission, then periodic repair recovers the dropped ones
    assert set(mesh["bob"].cells) == {c.node_id for c in cells}
    assert engine.counters.repair_diffs_sent >= 3  # the three dropped ones came by repair


def test_a_lost_batch_is_sent_again_and_counted_as_resent():
    mesh = Mesh("alice", "bob")
    topic = unit(8)
    mesh.do("bob", BeaconPlaced(beacon(topic, threshold=0.5)))
    mesh.settle()
    mesh.net.links[("alice", "bob")] = LinkConditions(loss=1.0)
    stored = cell(topic, at=mesh.net.now)
    mesh.do("alice", CellStored(stored))
    mesh.run(500)
    del mesh.net.links[("alice", "bob")]
    mesh.run(5000)  # the ack timeout passes: the batch goes again
    counters = mesh["alice"].engine.counters
    assert stored.node_id in mesh["bob"].cells
    assert (counters.data_diffs_sent, counters.data_diffs_resent, counters.repair_diffs_sent) == (2, 1, 0)


def test_the_liveness_table_is_total():
    assert set(LIVENESS) == {(s, i) for s in PeerState for i in Liveness}
    assert LIVENESS[(PeerState.DEAD, Liveness.HEARD)] is PeerState.ALIVE


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(list(Liveness)), max_size=30))
def test_liveness_walks_follow_the_table(inputs):
    table = PeerTable("me")
    peer, _ = table.learn("p", "addr", 0)
    state = PeerState.ALIVE
    for t, event in enumerate(inputs, 1):
        changed = table.apply(peer, event, t)
        expected = LIVENESS[(state, event)]
        assert peer.state is expected and (changed is expected if expected is not state else changed is None)
        state = expected


def test_a_silent_peer_goes_suspect_then_dead_and_comes_back():
    mesh = Mesh("alice", "bob")
    mesh.settle()
    bob = mesh["bob"].node_id
    mesh.net.partition(["alice"], ["bob"])
    mesh.run(20_000)
    states = [e.state for e in mesh["alice"].state_log if e.peer_id == bob]
    assert states[-2:] == ["suspect", "dead"]
    mesh.net.heal()
    mesh.run(15_000)
    assert mesh["alice"].peer_states[bob] == "alive"


def test_failed_sends_count_against_a_peer():
    mesh = Mesh("alice", "bob")
    mesh.settle()
    mesh.do("alice", SendFailed("bob"))
    assert mesh["alice"].peer_states[mesh["bob"].node_id] == "suspect"


def alice_and_two_readers(seed: int, **config) -> tuple[Mesh, np.ndarray]:
    """Alice, bob and carol, settled; bob and carol have a beacon on the same topic."""
    mesh = Mesh("alice", "bob", "carol", **config)
    topic = unit(seed)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.do("carol", BeaconPlaced(beacon(topic, agent="reader2")))
    mesh.settle()
    return mesh, topic


def test_a_cut_off_node_is_repaired_by_any_holder_after_the_heal():
    mesh, topic = alice_and_two_readers(7, repair_interval_ms=20_000)
    mesh.net.partition(["alice", "bob"], ["carol"])
    stored = cell(topic, at=mesh.net.now)
    mesh.do("alice", CellStored(stored))
    mesh.run(30_000)
    assert stored.node_id in mesh["bob"].cells and stored.node_id not in mesh["carol"].cells
    mesh.net.partition(["alice"], ["bob", "carol"])  # the origin goes away as the others reconnect
    mesh.run(30_000)
    got = mesh["carol"].cells[stored.node_id]
    assert got.origin_node == mesh["alice"].node_id and got.hops == 2


def test_decayed_cells_are_not_repaired():
    mesh = Mesh("alice", "bob")
    topic = unit(8)
    mesh.do("bob", BeaconPlaced(beacon(topic, threshold=0.5)))
    mesh.settle()
    mesh.net.partition(["alice"], ["bob"])
    day = 86_400_000
    old = cell(topic, cell_type="Context", salience=0.5, at=mesh.net.now - 30 * day)  # E = 0.2 * 2^-10
    fresh = cell(topic, at=mesh.net.now)
    mesh.do("alice", CellStored(old))
    mesh.do("alice", CellStored(fresh))
    mesh.run(30_000)
    mesh.net.heal()
    mesh.run(60_000)
    assert fresh.node_id in mesh["bob"].cells and old.node_id not in mesh["bob"].cells


def test_a_beacon_placed_during_a_partition_is_honoured_after_it():
    mesh = Mesh("alice", "bob")
    mesh.settle()
    mesh.net.partition(["alice"], ["bob"])
    topic = unit(9)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.run(1000)
    stored = cell(topic, at=mesh.net.now + 5000)
    mesh.net.run_for(5000)
    mesh.do("alice", CellStored(stored))  # alice does not know the beacon yet
    mesh.run(10_000)
    mesh.net.heal()
    mesh.run(40_000)
    assert stored.node_id in mesh["bob"].cells


def test_repair_sends_nothing_the_requester_already_holds():
    mesh = Mesh("alice", "bob", repair_interval_ms=5_000)
    topic = unit(10)
    mesh.do("bob", BeaconPlaced(beacon(topic)))
    mesh.settle()
    for _ in range(3):
        mesh.do("alice", CellStored(cell(topic, at=mesh.net.now)))
    mesh.run(60_000)
    assert len(mesh["bob"].cells) == 3 and mesh["bob"].engine.counters.repairs_requested >= 5
    assert mesh["alice"].engine.counters.data_diffs_sent == 3
    assert mesh["bob"].engine.counters.drops[Reason.DUPLICATE] == 0


@pytest.mark.parametrize("seed", range(10))
def test_a_hostile_network_still_delivers_everything_to_everyone_interested(seed):
    names = ["n0", "n1", "n2", "n3", "n4"]
    hostile = LinkConditions(latency_ms=(1, 120), loss=0.15, duplicate=0.1)
    mesh = Mesh(*names, seed=seed, link=hostile, repair_interval_ms=10_000)
    rng = np.random.default_rng(seed)
    topics = [unit(100 + i) for i in range(3)]
    interests: dict[str, set[int]] = {}
    for i, name in enumerate(names):
        chosen = {int(t) for t in rng.choice(3, size=1 + i % 2, replace=False)}
        interests[name] = chosen
        for t in chosen:
            mesh.do(name, BeaconPlaced(beacon(topics[t], agent=f"reader-{name}", threshold=0.74)))  # routes from 0.70
    mesh.settle(60_000)
    expected: dict[str, set[str]] = {name: set() for name in names}
    for round_ in range(4):
        if round_ == 2:
            cut = [names[int(rng.integers(len(names)))]]
            mesh.net.partition(cut, [n for n in names if n not in cut])
        for _ in range(5):
            origin = names[int(rng.integers(len(names)))]
            topic = int(rng.integers(3))
            stored = cell(near(topics[topic], 0.9, seed=int(rng.integers(1 << 30))), at=mesh.net.now)
            mesh.do(origin, CellStored(stored))
            for name in names:
                if name != origin and topic in interests[name]:
                    expected[name].add(stored.node_id)
            mesh.run(int(rng.integers(50, 3000)))
        if round_ == 2:
            mesh.run(20_000)
            mesh.net.heal()
    mesh.run(90_000)
    for name in names:
        assert set(mesh[name].cells) == expected[name], name
    drops = sum((mesh[n].engine.counters.drops for n in names), start=__import__("collections").Counter())
    assert drops[Reason.REPLAY] > 0  # the network duplicated frames; admission caught them
    assert drops[Reason.BAD_SIGNATURE] == drops[Reason.NOT_MEMBER] == 0


def test_repair_names_a_backlog_of_any_size_as_held():
    # Bob receives 5,000 of alice's cells between two repair requests to carol, who holds them
    # too: his next request must say he holds every one (a list of his latest 4,096 receipts
    # left the oldest out, and carol sent those again).
    mesh, topic = alice_and_two_readers(11, repair_interval_ms=60_000)
    for _ in range(10):
        for _ in range(500):
            mesh.do("alice", CellStored(cell(topic, at=mesh.net.now)))
        mesh.run(1_000)
    bob, carol = mesh["bob"].engine, mesh["carol"].engine
    asked = bob.counters.repairs_requested, carol.counters.repairs_requested
    mesh.run(150_000)
    assert len(mesh["bob"].cells) == len(mesh["carol"].cells) == 5_000
    assert bob.counters.repairs_requested - asked[0] >= 2 and carol.counters.repairs_requested - asked[1] >= 2
    assert mesh["alice"].engine.counters.data_diffs_resent == 0
    assert (carol.counters.repair_diffs_sent, bob.counters.repair_diffs_sent) == (0, 0)
    assert bob.counters.drops[Reason.DUPLICATE] == carol.counters.drops[Reason.DUPLICATE] == 0


@pytest.mark.parametrize("setting, says", [
    ({"gossip_interval_ms": 0}, "gossip_interval_ms must be at least 1, not 0"),
    ({"interest_radius": 0}, "interest_radius must be at least 1, not 0"),
    ({"relay_hold_ms": -25}, "relay_hold_ms must be at least 0, not -25"),
    ({"choice_margin": -0.1}, "choice_margin must be at least 0, not -0.1"),
    ({"gossip_jitter": 1.5}, "gossip_jitter must be below 1, not 1.5"),
    ({"view": "partiel"}, "view must be 'full' or 'partial', not 'partiel'"),
])  # fmt: skip
def test_a_setting_the_engine_cannot_run_on_is_refused_by_name(setting, says):
    from mesh.config import MeshConfig

    with pytest.raises(ValueError, match=says.replace("(", r"\(")):
        MeshConfig(team=Team("t", bytes(32)), address="n0", **setting)
    # Zero is "off" or "at once" where it means that, and None where a bound is optional.
    MeshConfig(team=Team("t", bytes(32)), address="n0", told_limit=0, relay_hold_ms=0, interest_offers=0,
               flush_interval_ms=0, max_inbound_links=None)  # fmt: skip
