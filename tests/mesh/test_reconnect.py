"""What a node does when peers come and go: repair on reconnect, but not on every flap."""

from __future__ import annotations

from mesh.events import SendFailed

from .test_engine import Mesh


def test_a_flapping_peer_costs_one_repair_per_interval_not_one_per_flap():
    mesh = Mesh("alice", "bob", repair_interval_ms=600_000)
    mesh.settle()
    alice = mesh["alice"].engine
    start = alice.counters.repairs_requested
    flips = 0
    for _ in range(10):  # 10 suspect -> alive flips in 15 s
        mesh.do("alice", SendFailed("bob"))
        assert mesh["alice"].peer_states[mesh["bob"].node_id] == "suspect"
        mesh.run(1500)  # bob's gossip arrives: alive again
        flips += mesh["alice"].peer_states[mesh["bob"].node_id] == "alive"
    assert flips == 10
    requested = alice.counters.repairs_requested - start
    assert 1 <= requested <= 15_000 // alice.config.repair_min_interval_ms + 1, requested
