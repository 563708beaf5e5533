"""The admission judge replayed offline, as the receiving node runs it; used by relevance.py.

The product's own classes, not a copy of their rule: one :class:`node.delivery.BeaconBook`
holds every beacon of the labelled stream with a :class:`node.judges.CalibratedJudge`, and
the memories arrive in timestamp order. A memory the routing rule sends to none of the
beacons never reaches the receiving node, so only routed memories join the judge's
background afterwards (as on the real node, where every cell written is observed after
it has been judged). The judge is run once per lexical weight with ``z_floor = 0`` and the
margin ``score - floor`` of every routed pair is kept, so admission at any ``z_floor`` is
``margin >= z_floor`` (pairs judged by the cosine fallback, before 32 cells are held, keep
their own floor). From those margins:

* the curve of macro P/R/F1 per agent over ``z_floor`` for each lexical weight: the curve a
  team can move along;
* leave-one-agent-out: the (weight, z_floor) that is best on the other agents, scored on the
  held-out one, which says how well the constants carry to people they were not tuned on.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import numpy as np

WEIGHTS = (0.0, 2.0, 4.0, 6.0)
Z_FLOORS = [round(1.0 + 0.25 * i, 2) for i in range(17)]  # 1.0 .. 5.0
TENANT, SPACE = "team", "benchmark"


def replay(
    data: dict[str, Any], memory_vectors: np.ndarray, beacon_vectors: np.ndarray, prf, macro, defaults: tuple[float, float]
) -> dict[str, Any]:
    """``defaults``: the node's (lexical_weight, z_floor); its admissions are the prediction the
    report holds against the real receiving node's inboxes."""
    from node.admission_rule import AdmissionRule
    from node.config import DEFAULT_BEACON_THRESHOLD
    from node.delivery import Beacon, BeaconBook, CellFacts
    from node.energy import EnergyModel
    from node.judges import MIN_BACKGROUND, Background, CalibratedJudge, TermStats, load_background_notes

    energy = EnergyModel()
    memories, beacons = data["memories"], data["beacons"]
    order = sorted(range(len(memories)), key=lambda j: memories[j]["timestamp_ms"])
    owners = sorted({b["owner"] for b in beacons})
    relevant = {o: {m for b in beacons if b["owner"] == o for m in data["judged"][b["id"]]} for o in owners}

    routed_any: set[int] = set()
    judged_pairs, judged_seconds = 0, 0.0  # the judge's own CPU, at the defaults' weight
    margins: dict[float, dict[tuple[str, int], float]] = {}
    fallback: set[tuple[str, int]] = set()
    for weight in sorted({*WEIGHTS, defaults[0]}):
        judge = CalibratedJudge(
            energy, Background(memory_vectors.shape[1]), TermStats(load_background_notes()),
            default_threshold=DEFAULT_BEACON_THRESHOLD, z_floor=0.0, lexical_weight=weight,
        )  # fmt: skip
        book = BeaconBook(energy, AdmissionRule(energy, judge))
        book.add_many(
            Beacon(b["id"], TENANT, b["owner"], "receiving", b["query"], DEFAULT_BEACON_THRESHOLD,
                   beacon_vectors[i], SPACE, 0)
            for i, b in enumerate(beacons)
        )  # fmt: skip
        kept = margins[weight] = {}
        for j in order:
            m = memories[j]
            cell = CellFacts(TENANT, m["author"], m["cell_type"], m["salience"], None, memory_vectors[j], SPACE, m["content"])
            routed = book.routed(cell, 0)
            if not routed:
                continue
            similarities = np.stack([b.embedding for b in routed]) @ cell.embedding
            e0 = energy.initial(cell.salience, cell.cell_type)
            calibrated = len(judge.background) >= MIN_BACKGROUND
            began = time.process_time()
            verdicts = judge.judge(routed, cell, similarities, e0)
            if weight == defaults[0] and calibrated:
                judged_seconds += time.process_time() - began
                judged_pairs += len(routed)
            for beacon, verdict in zip(routed, verdicts):
                key = (beacon.beacon_id, j)
                kept[key] = verdict.score - verdict.floor
                if not calibrated:
                    fallback.add(key)
            routed_any.add(j)
            judge.observe(cell.embedding, cell.content)

    owner_of = {b["id"]: b["owner"] for b in beacons}
    ids = [m["id"] for m in memories]

    def admitted(weight: float, z_floor: float) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {o: set() for o in owners}
        for (beacon_id, j), margin in margins[weight].items():
            floor = 0.0 if (beacon_id, j) in fallback else z_floor
            if margin >= floor:
                out[owner_of[beacon_id]].add(ids[j])
        return out

    def per_agent(weight: float, z_floor: float) -> dict[str, dict[str, float]]:
        got = admitted(weight, z_floor)
        return {o: prf(got[o], relevant[o]) for o in owners}

    grid = {(w, z): per_agent(w, z) for w, z in itertools.product(WEIGHTS, Z_FLOORS)}
    curve = [{"lexical_weight": w, "z_floor": z, **macro(list(grid[(w, z)].values()))} for w, z in grid]
    held_out = []
    for o in owners:
        rest = [x for x in owners if x != o]
        best = max(grid, key=lambda k: float(np.mean([grid[k][x]["f1"] for x in rest])))
        held_out.append({"agent": o, "chosen": {"lexical_weight": best[0], "z_floor": best[1]}, **grid[best][o]})
    at_defaults = per_agent(*defaults)
    return {
        "defaults": {"lexical_weight": defaults[0], "z_floor": defaults[1], "per_agent": at_defaults,
                     "macro": macro(list(at_defaults.values()))},  # fmt: skip
        "predicted": {o: sorted(v) for o, v in admitted(*defaults).items()},
        "curve": curve,
        "leave_one_agent_out": {"per_agent": held_out, "macro": macro(held_out)},
        "routed_memories": len(routed_any),
        "judge_cpu_us_per_pair": 1e6 * judged_seconds / max(1, judged_pairs),
        "judged_pairs": judged_pairs,
        "routing_agent_macro": macro(list(per_agent_routing(data, margins, owners, ids, relevant, prf).values())),
    }


def per_agent_routing(data, margins, owners, ids, relevant, prf) -> dict[str, dict[str, float]]:
    """What routing alone delivers to each agent (every routed pair admitted)."""
    owner_of = {b["id"]: b["owner"] for b in data["beacons"]}
    reached: dict[str, set[str]] = {o: set() for o in owners}
    for beacon_id, j in next(iter(margins.values())):
        reached[owner_of[beacon_id]].add(ids[j])
    return {o: prf(reached[o], relevant[o]) for o in owners}
