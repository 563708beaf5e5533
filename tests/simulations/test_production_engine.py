"""The harness drives the production engine, and holds no routing logic of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from mesh import routing, routing_rule
from simulations.runner import RunConfig, run

SIMULATIONS = Path(__file__).resolve().parents[2] / "simulations"


def test_hyphae_follows_the_engines_router(monkeypatch):
    # routing exactly at the beacons' thresholds: the scenario's catch-up timing was built on it
    cfg = RunConfig(nodes=6, stores=6, seed=7, strategies=("hyphae",), dim=16, topics=3, beacons_per_node=1,
                    drain_ms=5000, energy=(("route_margin", 0.0),))  # fmt: skip
    before = run(cfg).summary["strategies"]["hyphae"]
    assert before["delivery_ratio"] == 1.0 and before["interested_mean"] > 0
    # Break the production router: the origin now selects no targets at all.
    monkeypatch.setattr(routing.FullView, "origin_targets", lambda self, diff, cell, now: set())
    after = run(cfg).summary["strategies"]["hyphae"]
    # No push leaves an origin. What still arrives comes by repair: a node's catch-up with a
    # peer it has just met asks once more when the first answer is in, and here the second
    # answer comes after the first stores (one cell, one frame).
    assert after["delivery_ratio"] <= 0.1 and before["delivery_ratio"] == 1.0
    assert after["messages_per_store"] <= before["messages_per_store"] / 5


def test_partial_view_is_the_engines_partial_policy(monkeypatch):
    """In a partial view, cells travel several hops because the engine's PartialView relays them."""
    cfg = RunConfig(nodes=40, stores=20, seed=2, view="partial", strategies=("hyphae",), dim=16, topics=3,
                    beacons_per_node=1, drain_ms=5000, warmup_max_ms=20_000)  # fmt: skip
    before = run(cfg).summary["strategies"]["hyphae"]
    assert before["hops_max"] > 1 and before["delivery_ratio"] > 0.8
    monkeypatch.setattr(routing.PartialView, "relay_targets", lambda self, diff, cell, sender, now: set())
    after = run(cfg).summary["strategies"]["hyphae"]
    assert after["delivery_ratio"] < before["delivery_ratio"]
    assert after["messages_per_store"] < before["messages_per_store"]


def test_hyphae_follows_the_engines_matching(monkeypatch):
    """Matching lives in mesh.routing_rule (its columns' ``matching``, behind
    ``BeaconIndex.match`` and ``match_owners``): loosen it and precision falls."""
    cfg = RunConfig(nodes=6, stores=6, seed=7, strategies=("hyphae",), dim=16, topics=3, beacons_per_node=1,
                    drain_ms=5000)  # fmt: skip
    everyone = routing_rule.BeaconColumns.matching

    def match_all(self, cell, e0, now, energy, codes):
        class Loose:
            def route_threshold(self, tau, e0):
                return tau - 2.0

        return everyone(self, cell, e0, now, Loose(), codes)

    monkeypatch.setattr(routing_rule.BeaconColumns, "matching", match_all)
    s = run(cfg).summary["strategies"]["hyphae"]
    assert s["precision"] < 1.0


# What "no routing logic of its own" means, checked on the source:
#  1. simulations/ never imports mesh.routing, mesh.outbox, mesh.repair, mesh.control or
#     mesh.membership (where target selection, batching, repair and anti-entropy live);
#  2. from mesh.engine it imports only MeshEngine, and never calls private engine methods
#     (attribute names starting with "_" on an engine: engine._enqueue, router._x ...);
#  3. the only mesh modules it uses are for building engines (config, engine, memory,
#     team, testing), the events it injects/reads, and the wire codec (to *read* data
#     frames for per-cell accounting and to size yardstick messages).
ALLOWED = {"mesh.config", "mesh.engine", "mesh.events", "mesh.memory", "mesh.team", "mesh.testing", "mesh.wire"}
FORBIDDEN = {"mesh.routing", "mesh.outbox", "mesh.repair", "mesh.control", "mesh.membership"}


def _modules():
    for path in sorted(SIMULATIONS.glob("*.py")):
        yield path, ast.parse(path.read_text(), str(path))


def test_simulations_imports_no_routing_internals():
    used = set()
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mesh"):
                used.add(node.module)
                if node.module == "mesh.engine":
                    assert {a.name for a in node.names} == {"MeshEngine"}, path
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("mesh"):
                        used.add(alias.name)
    assert used and not used & FORBIDDEN and used <= ALLOWED, sorted(used)


def test_simulations_never_touches_engine_privates():
    for path, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                base = node.value
                owner = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                assert owner not in ("engine", "router", "beacons", "outbox", "control"), (
                    f"{path.name}:{node.lineno} reaches into {owner}.{node.attr}"
                )
