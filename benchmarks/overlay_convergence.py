"""How far a partial view's interest overlay has converged, over warm-up time.

The partial view's routing assumes that nodes of like interest know each other: each
node's nearest beacons mesh-wide among its chosen neighbours (T-Man), so that a cell that
reaches one interested node is within reach of the others. This runs the production
engines through the warm-up only (no cells) and reads, every ``--step-ms`` of virtual
time, against ground truth from the workload (each node's 4 nearest other nodes by
beacon, and its topic's members):

* ``linked``: the share of a node's true 4 nearest that are its gossip neighbours;
* ``known``: the share it knows at all (their beacons are in its index);
* ``mate``: the share of nodes that know at least one other node of their own topic;
* ``origins``: control origins a node holds (what its memory grows with);
* ``moved`` (over all nodes): the share whose gossip neighbours changed during the step;

by the size of the node's topic (few members are where delivery is lost), and the CPU
seconds each step took::

    python benchmarks/overlay_convergence.py --nodes 2000 --until-ms 20000 [--mesh KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from node.energy import EnergyModel
from simulations.network import Latency, LinkModel, address
from simulations.strategies import Context, boot_nodes, sim_network
from simulations.workload import Workload, WorkloadSpec

NEAREST = 4
BUCKETS = ((0, 30, "<30"), (30, 100, "30-99"), (100, 300, "100-299"), (300, 1 << 30, "300+"))


def true_nearest(w: Workload, count: int, chunk: int = 1000) -> np.ndarray:
    """Each node's ``count`` nearest other nodes by their most similar pair of beacons."""
    n, per = w.spec.nodes, w.spec.beacons_per_node
    vectors = w._b_vec.reshape(n, per, -1)  # beacons are drawn node by node, ``per`` each
    flat = vectors.reshape(n * per, -1)
    out = np.empty((n, count), np.int64)
    for lo in range(0, n, chunk):
        hi = min(n, lo + chunk)
        sims = (vectors[lo:hi].reshape((hi - lo) * per, -1) @ flat.T).reshape(hi - lo, per, n, per).max(axis=(1, 3))
        sims[np.arange(hi - lo), np.arange(lo, hi)] = -np.inf
        out[lo:hi] = np.argpartition(-sims, count, axis=1)[:, :count]
    return out


def measure(
    net, w: Workload, truth: np.ndarray, topic_of: list[int], members: dict[int, set[str]], before: list[set[str]]
) -> dict:
    """The figures of the module docstring; ``before`` (each node's neighbours) is brought up to date."""
    n = w.spec.nodes
    moved = 0
    ids = [net.hosts[address(i)].engine.node_id for i in range(n)]
    sizes = {t: len(m) for t, m in members.items()}
    rows: dict[str, list[tuple[float, float, bool, int]]] = {label: [] for *_, label in BUCKETS}
    for i in range(n):
        engine = net.hosts[address(i)].engine
        known = engine.beacons.owners()
        linked = {p.node_id for p in engine.peers.neighbours()}
        moved += linked != before[i]
        before[i] = linked
        want = [ids[j] for j in truth[i]]
        mates = members[topic_of[i]] - {ids[i]}
        label = next(lab for lo, hi, lab in BUCKETS if lo <= sizes[topic_of[i]] < hi)
        rows[label].append((
            sum(x in linked for x in want) / len(want), sum(x in known for x in want) / len(want),
            bool(mates & known), len(engine.control),
        ))  # fmt: skip
    out: dict = {"moved": round(moved / n, 4)}
    for label, got in rows.items():
        if got:
            a = np.array(got, float)
            out[label] = {
                "nodes": len(got), "linked": round(a[:, 0].mean(), 3), "known": round(a[:, 1].mean(), 3),
                "mate": round(a[:, 2].mean(), 3), "origins": round(a[:, 3].mean(), 1),
            }  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--beacons-per-node", type=int, default=1)
    p.add_argument("--until-ms", type=int, default=20_000)
    p.add_argument("--step-ms", type=int, default=2_000)
    p.add_argument("--mesh", action="append", default=[], metavar="KEY=VALUE", help="MeshConfig override")
    args = p.parse_args()
    mesh = {}
    for item in args.mesh:
        key, _, value = item.partition("=")
        mesh[key.strip()] = float(value) if "." in value else int(value)
    energy = EnergyModel.from_config({})
    spec = WorkloadSpec(nodes=args.nodes, stores=0, dim=args.dim, beacons_per_node=args.beacons_per_node)
    w = Workload(spec, args.seed, energy)
    ctx = Context(w, LinkModel(args.nodes, latency=Latency.parse("uniform:5:25"), seed=args.seed), args.seed,
                  energy, view="partial", mesh_config=mesh)  # fmt: skip
    net = sim_network(ctx)
    boot_nodes(ctx, net)
    truth = true_nearest(w, NEAREST)
    topic_of = [w.beacons[i * args.beacons_per_node].topic for i in range(args.nodes)]
    members: dict[int, set[str]] = {}
    for i, t in enumerate(topic_of):
        members.setdefault(t, set()).add(net.hosts[address(i)].engine.node_id)
    before: list[set[str]] = [set() for _ in range(args.nodes)]
    start, cpu = net.now, time.process_time()
    while net.now - start < args.until_ms:
        net.run_for(args.step_ms)
        spent, cpu = time.process_time() - cpu, time.process_time()
        figures = measure(net, w, truth, topic_of, members, before)
        print(json.dumps({"at_ms": net.now - start, "cpu_s": round(spent, 1), **figures}), flush=True)


if __name__ == "__main__":
    main()
