"""A graph-level model of the partial view's data routing, to try routing rules at N=10,000 in a
minute instead of an hour of simulation. Run by hand:

    python benchmarks/partial_view_model.py --nodes 10000 --stores 1000 --rule current

Not the engine: no clock, no loss, the control plane taken as converged. It draws the overlay the
way the harness does (3 random seeds per node, at most 8 neighbours), lets each node know the
beacons within radius 2, and uses the harness's workload and ground truth (``--dim 64
--beacons-per-node 1``, seed 1). It reproduces the engine's measured delivery within 0.04 at
N=1,000 and exactly (0.134) at N=10,000 for the old rule (benchmarks/results/simulation.md).

Rules, where a node holding the cell first receives it:

* ``old``: every hop spends the budget ``round(6 x E0)``; a walk only into a node that may relay on.
* ``current`` (mesh/routing.py ``PartialView``): push to the owners of the matching beacons you know
  at any ttl; where you know none and did not want the cell, walk to one random neighbour; only
  walk hops spend the budget.
* ``leafwalk``: as current, and an interested node that knows no other interest walks on too.
* ``community``: as current, but relay through every node whose beacon matches the cell's vector,
  its type/salience filters aside (more relays, lower precision).
* ``near``: as current, but a relay that wanted the cell pushes only to the interested among its
  neighbours (radius 1), not to every interest it knows: fewer duplicates where radii overlap.

``--semantic S`` gives each node up to S neighbours chosen by beacon similarity within the cap of
8 (an ideal outcome of T-Man-like neighbour selection). ``--chosen S`` links each node to its S
nearest beacons mesh-wide beside the random links, uncapped and both ways (the engine's
``interest_neighbours`` once converged, with every link known from both ends: an upper bound on
what it learns). ``--steer`` walks to the neighbour whose beacon is nearest the cell.

Options of rule ``near`` (3 Dec, partial3; each tried on the engine's behalf):

* ``--widen``: a relay none of whose links leads to interest pushes to every interest it knows
  (the engine's ``widen_leaves``).
* ``--cap K``: a node counts only the K nearest of the nodes that chose it as linked (the
  engine's ``max_inbound_links``); ``--mutual M``: a node chooses only nodes that rank it among
  their M nearest (an in-degree bound the chooser can respect on its own).
* ``--covered``: a relay sent the cell by the origin one hop away pushes along no link (the
  origin knew them all); ``--outward``: a relay pushes only to nodes whose beacon is farther
  from the cell than its own.

``--told K`` (3 Dec, partial4; the engine's ``told_limit``, :mod:`mesh.told`): each copy names up
to K nodes already sent the cell (its sender's targets, then what its sender was told); a relay
pushes to none of them, nor walks to them. ``--walk-far``: a steered walk goes to the node within
the radius whose beacon is nearest the cell, not only to a neighbour (``walk_far``);
``--origin-walks K``: an origin that knows no interest starts K such walks (``origin_walks``);
``--leaf-walk``: a relay that wanted the cell and knows no other interest walks on (``leaf_walk``).

Messages count every push, duplicates included, as the harness does.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.energy import EnergyModel  # noqa: E402
from simulations.workload import Workload, WorkloadSpec  # noqa: E402

RULES = ("old", "current", "leafwalk", "community", "near")


def overlay(
    n: int, rng: random.Random, vectors: np.ndarray, semantic: int = 0, seeds: int = 3, cap: int = 8,
    chosen: int = 0, mutual: int = 0, picked: list[set[int]] | None = None,
) -> list[list[int]]:
    """Random seeds as the harness draws them; then, with ``semantic``, up to that many links per
    node to the nodes with the most similar beacon while both have room (an ideal T-Man/Vicinity
    outcome: the engine has no such neighbour selection)."""
    adj: list[set[int]] = [set() for _ in range(n)]
    for i in range(n):
        for j in rng.sample(range(n), seeds):
            if j != i and len(adj[j]) < cap:
                adj[i].add(j)
                adj[j].add(i)
    ranks = None
    if chosen and mutual:  # rank of i among j's nearest, for every pair: j's mutual-nearest test
        sims = vectors @ vectors.T
        np.fill_diagonal(sims, -np.inf)
        ranks = np.empty_like(sims, dtype=np.int32)
        order = np.argsort(-sims, axis=0)  # column j: nodes by similarity to j
        ranks[order, np.arange(n)[None, :]] = np.arange(n, dtype=np.int32)[:, None]
    for start in range(0, n if chosen else 0, 1000):  # the engine's interest_neighbours: no cap
        sims = vectors[start : start + 1000] @ vectors.T
        for k, row in enumerate(sims):
            i = start + k
            row[i] = -np.inf
            if ranks is None:
                picks = np.argpartition(-row, chosen)[:chosen].tolist()
            else:  # the nearest j that rank i among their ``mutual`` nearest
                picks = [j for j in np.argsort(-row)[: 20 * chosen].tolist() if ranks[i, j] < mutual][:chosen]
            for j in picks:
                adj[i].add(j)
                adj[j].add(i)
                if picked is not None:
                    picked[i].add(j)
    for start in range(0, n if semantic else 0, 1000):
        sims = vectors[start : start + 1000] @ vectors.T
        for k, row in enumerate(sims):
            i, added = start + k, 0
            row[i] = -np.inf
            for j in np.argsort(-row)[:40].tolist():
                if added >= semantic:
                    break
                if j not in adj[i] and (len(adj[i]) >= cap or len(adj[j]) >= cap):
                    continue
                adj[i].add(j)
                adj[j].add(i)
                added += 1
    return [sorted(a) for a in adj]


def ball(adj: list[list[int]], v: int, radius: int) -> set[int]:
    seen = {v}
    frontier = [v]
    for _ in range(radius):
        frontier = [x for u in frontier for x in adj[u] if x not in seen and not seen.add(x)]  # type: ignore[func-returns-value]
    return seen


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--stores", type=int, default=1000)
    p.add_argument("--radius", type=int, default=2)
    p.add_argument("--rule", choices=RULES, default="current")
    p.add_argument("--semantic", type=int, default=0, help="neighbour links chosen by beacon similarity")
    p.add_argument("--chosen", type=int, default=0, help="links to each node's nearest beacons mesh-wide, beside the random ones (the engine's interest_neighbours, converged)")
    p.add_argument("--mutual", type=int, default=0, help="with --chosen: choose only nodes that rank the chooser among their MUTUAL nearest (bounds in-degree)")
    p.add_argument("--cap", type=int, default=None, help="with --chosen: a relay counts only the CAP nearest of the nodes that chose it (max_inbound_links)")
    p.add_argument("--widen", action="store_true", help="rule near: a relay with no interest one hop away pushes to every interest it knows")
    p.add_argument("--covered", action="store_true", help="rule near: a relay one hop from the origin, sent the cell by it, pushes along no link (the origin knew them all)")
    p.add_argument("--outward", action="store_true", help="rule near: a relay pushes only to those whose beacon is farther from the cell than its own")
    p.add_argument("--told", type=int, default=0, help="each copy names up to TOLD nodes already sent the cell (its sender's targets first, then what the sender was told); a relay skips them")
    p.add_argument("--walk-far", action="store_true", help="a walk goes to the known node (within the radius) whose beacon is nearest the cell, not only to a neighbour")
    p.add_argument("--origin-walks", type=int, default=1, help="an origin that knows no interest starts this many steered walks (to its nearest known nodes)")
    p.add_argument("--leaf-walk", action="store_true", help="rule near: a relay that wanted the cell and knows no other interest walks on while ttl lasts (the engine's leaf_walk)")
    p.add_argument("--steer", action="store_true", help="walk to the neighbour whose beacon is nearest the cell")
    args = p.parse_args()
    energy = EnergyModel()
    w = Workload(WorkloadSpec(nodes=args.nodes, stores=args.stores, dim=64, beacons_per_node=1), 1, energy)
    rng = random.Random(1)
    vectors = np.stack([b.payload.embedding for b in w.beacons])
    picked: list[set[int]] = [set() for _ in range(args.nodes)]
    adj = overlay(args.nodes, rng, vectors, args.semantic, chosen=args.chosen, mutual=args.mutual, picked=picked)
    known = [ball(adj, v, args.radius) for v in range(args.nodes)]
    near = [ball(adj, v, 1) for v in range(args.nodes)]
    if args.cap is not None:  # the engine's max_inbound_links: of the nodes that chose v, the cap nearest
        choosers: list[set[int]] = [set() for _ in range(args.nodes)]
        for i, js in enumerate(picked):
            for j in js:
                choosers[j].add(i)
        for v in range(args.nodes):
            extra = sorted(choosers[v] - picked[v], key=lambda i: (-float(vectors[i] @ vectors[v]), i))[args.cap :]
            near[v] -= set(extra) - (set(adj[v]) - choosers[v])  # still linked if a random link too
    thresholds = np.array([b.payload.threshold for b in w.beacons])
    interested = reached = messages = cells = 0
    load: collections.Counter = collections.Counter()
    by_budget: dict[int, list[int]] = collections.defaultdict(lambda: [0, 0])
    for c in w.cells:
        if not c.interested:
            continue
        e0 = energy.initial(c.salience, c.cell_type)
        budget = energy.hop_budget(e0)
        wanted = set(c.interested)
        if args.rule == "community":
            wanted = set(np.flatnonzero(vectors @ c.vector >= thresholds - energy.match_slack * e0).tolist())
            wanted.discard(c.origin)
        got = {c.origin}
        queue = collections.deque([(c.origin, -1, budget - 1, True, ())])  # node, sender, ttl, origin?, told
        while queue:
            u, sender, ttl, origin, told = queue.popleft()
            nearby = args.rule == "near" and not origin and u in wanted
            owners = ((near[u] if nearby else known[u]) & wanted) - {u, sender, c.origin}
            if nearby and args.widen and not owners:  # a leaf of the spread: to every interest it knows
                owners = (known[u] & wanted) - {u, sender, c.origin}
            elif nearby and args.covered and sender == c.origin and c.origin in near[u]:
                owners = set()  # the origin, one hop away, knew all our links: it pushed to them
            if nearby and args.outward:  # only to those farther from the cell than we are
                mine = float(vectors[u] @ c.vector)
                owners = {y for y in owners if float(vectors[y] @ c.vector) < mine}
            seen_interest = bool(owners)
            owners -= set(told)  # the copy named them: its sender (or one before it) pushed to them
            sends = [(y, ttl) for y in owners]
            if args.rule == "old" and not origin:
                sends = [(y, ttl - 1) for y in owners] if ttl > 0 else []
            if not seen_interest and (origin or args.rule != "old" or ttl > 0):
                if args.rule == "old":
                    walk = ttl > 0 if origin else (ttl - 1 > 0 and u not in wanted)
                else:
                    walk = True if origin else (ttl > 0 and (u not in wanted or args.rule == "leafwalk" or args.leaf_walk))
                pool = sorted(known[u]) if args.walk_far else adj[u]
                nb = [x for x in pool if x not in (u, sender, c.origin) and x not in told]
                if walk and nb:
                    if args.steer:
                        ranked = sorted(nb, key=lambda x: -float(vectors[x] @ c.vector))
                        sends = [(to, ttl if origin else ttl - 1) for to in ranked[: args.origin_walks if origin else 1]]
                    else:
                        sends = [(rng.choice(nb), ttl if origin else ttl - 1)]
            onward = tuple(sorted(y for y, _ in sends)) + tuple(x for x in told if x not in owners)
            onward = onward[: args.told]
            for y, t in sends:
                messages += 1
                load[u] += 1
                load[y] += 1
                if y not in got:
                    got.add(y)
                    queue.append((y, u, t, False, onward))
        hit = len(c.interested & got)
        interested += len(c.interested)
        reached += hit
        cells += 1
        by_budget[budget][0] += len(c.interested)
        by_budget[budget][1] += hit
    budgets = ", ".join(f"{b}: {v[1] / v[0]:.3f}" for b, v in sorted(by_budget.items()))
    print(
        f"N={args.nodes} rule={args.rule} radius={args.radius} semantic={args.semantic} chosen={args.chosen} steer={args.steer} mutual={args.mutual} cap={args.cap} max degree={max(map(len, near))} max adj degree={max(map(len, adj))} busiest={max(load.values())} delivery={reached / interested:.3f} "
        f"messages/store={messages / cells:.1f} interested/store={interested / cells:.1f} by budget {{{budgets}}}"
    )


if __name__ == "__main__":
    main()
