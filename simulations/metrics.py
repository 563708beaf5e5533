"""What a strategy did, per stored cell, and the numbers it adds up to.

A strategy reports four facts to a :class:`Recorder`: a data message *sent* (one cell
to one node), a copy that *arrived*, a cell *delivered* (first arrival that the node
keeps, with its hop count), and control traffic. Everything else is computed here
against the workload's ground truth. Times are absolute virtual ms; latency is
measured from the store's own time.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from typing import Any

from .workload import Workload

__all__ = ["Recorder", "percentile", "summarise", "CELL_COLUMNS"]

CELL_COLUMNS = (
    "strategy", "cell", "origin", "topic", "salience", "cell_type", "e0", "stored_at_ms", "interested",
    "reached", "deliveries", "delivery_ratio", "precision", "latency_ms_p50", "latency_ms_max", "hops_max",
    "messages", "bytes", "duplicates",
)  # fmt: skip


@dataclasses.dataclass
class Recorder:
    stores: int
    delivered: list[dict[int, tuple[int, int]]] = dataclasses.field(default_factory=list)  # node -> (at, hops)
    messages: list[int] = dataclasses.field(default_factory=list)
    data_bytes: list[int] = dataclasses.field(default_factory=list)
    arrivals: list[collections.Counter] = dataclasses.field(default_factory=list)
    load: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # node -> data msgs in+out
    control_messages: int = 0
    control_bytes: int = 0
    data_frames: int = 0
    # mesh.lifecycle: when each node applied each cell's tombstone, and the tombstone diffs sent
    tombstoned: dict[int, dict[int, int]] = dataclasses.field(default_factory=dict)  # cell -> node -> at
    tombstones_sent: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # cell -> diffs

    def __post_init__(self) -> None:
        n = self.stores
        self.delivered = [{} for _ in range(n)]
        self.messages = [0] * n
        self.data_bytes = [0] * n
        self.arrivals = [collections.Counter() for _ in range(n)]

    def sent(self, cell: int, src: int, nbytes: int) -> None:
        self.messages[cell] += 1
        self.data_bytes[cell] += nbytes
        self.load[src] += 1

    def arrived(self, cell: int, dst: int) -> None:
        self.arrivals[cell][dst] += 1
        self.load[dst] += 1

    def deliver(self, cell: int, node: int, at: int, hops: int) -> None:
        self.delivered[cell].setdefault(node, (at, hops))

    def tombstone(self, cell: int, node: int, at: int) -> None:
        self.tombstoned.setdefault(cell, {}).setdefault(node, at)

    def control(self, nbytes: int) -> None:
        self.control_messages += 1
        self.control_bytes += nbytes

    def merge(self, other: "Recorder") -> None:
        """Add what ``other`` saw (another process's nodes of the same run) to ours."""
        for i in range(self.stores):
            self.delivered[i].update(other.delivered[i])  # each node's own record: no overlap
            self.messages[i] += other.messages[i]
            self.data_bytes[i] += other.data_bytes[i]
            self.arrivals[i].update(other.arrivals[i])
        self.load.update(other.load)
        for cell, nodes in other.tombstoned.items():
            self.tombstoned.setdefault(cell, {}).update(nodes)
        self.tombstones_sent.update(other.tombstones_sent)
        self.control_messages += other.control_messages
        self.control_bytes += other.control_bytes
        self.data_frames += other.data_frames


def percentile(ordered: list[float] | list[int], q: float) -> float | None:
    """Nearest-rank percentile of a sorted list (None when empty)."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def summarise(
    name: str, rec: Recorder, workload: Workload, origin_ms: int, end_ms: int, *, heal_ms: int | None = None,
    skipped: frozenset[int] = frozenset(), gone: dict[int, int] | None = None, curve_points: int = 60,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(summary, per-cell rows); ``origin_ms`` is the absolute time of store-phase 0; ``skipped``
    cells (origin down at store time) are left out; ``gone`` (node -> store-phase ms it left the
    mesh for good) removes departed nodes from the interested set of later cells."""
    gone = gone or {}
    rows: list[dict[str, Any]] = []
    latencies: list[int] = []
    hops: list[int] = []
    reach_times: list[int] = []  # store-phase ms of each interested first delivery
    total_interested = total_reached = total_deliveries = total_dups = 0
    whole_after_heal: list[int | None] = []
    cells = [c for c in workload.cells if c.index not in skipped]
    for cell in cells:
        i = cell.index
        got = rec.delivered[i]
        stored_at = origin_ms + cell.at_ms
        interested = [n for n in cell.interested if gone.get(n, cell.at_ms + 1) > cell.at_ms]
        reached = [node for node in interested if node in got]
        lat = sorted(got[node][0] - stored_at for node in reached)
        cell_hops = [got[node][1] for node in reached]
        latencies += lat
        hops += cell_hops
        reach_times += [got[node][0] - origin_ms for node in reached]
        dups = sum(count - 1 for node, count in rec.arrivals[i].items() if count > 1)
        total_interested += len(interested)
        total_reached += len(reached)
        total_deliveries += len(got)
        total_dups += dups
        if heal_ms is not None and cell.at_ms < heal_ms and interested:
            whole = len(reached) == len(interested)
            whole_after_heal.append(max(0, max(got[n][0] for n in reached) - origin_ms - heal_ms) if whole else None)
        rows.append({
            "strategy": name, "cell": cell.cell_id, "origin": cell.origin, "topic": cell.topic,
            "salience": cell.salience, "cell_type": cell.cell_type, "e0": _r(workload.e0(cell)),
            "stored_at_ms": cell.at_ms, "interested": len(interested), "reached": len(reached),
            "deliveries": len(got),
            "delivery_ratio": _r(len(reached) / len(interested)) if interested else None,
            "precision": _r(len(reached) / len(got)) if got else None,
            "latency_ms_p50": percentile(lat, 50), "latency_ms_max": lat[-1] if lat else None,
            "hops_max": max(cell_hops) if cell_hops else None, "messages": rec.messages[i],
            "bytes": rec.data_bytes[i], "duplicates": dups,
        })  # fmt: skip
    stores = max(1, len(cells))
    latencies.sort()
    hops.sort()
    reach_times.sort()
    messages = sum(rec.messages)
    span = max(1, end_ms - origin_ms)
    curve_t = [round(span * k / curve_points) for k in range(curve_points + 1)]
    curve = []
    j = 0
    for t in curve_t:
        while j < len(reach_times) and reach_times[j] <= t:
            j += 1
        curve.append(_r(j / total_interested) if total_interested else None)
    loads = list(rec.load.values()) or [0]
    summary: dict[str, Any] = {
        "stores": len(cells),
        "interested_mean": _r(total_interested / stores),
        "delivery_ratio": _r(total_reached / total_interested) if total_interested else None,
        "precision": _r(total_reached / total_deliveries) if total_deliveries else None,
        "messages_per_store": _r(messages / stores),
        "bytes_per_store": _r(sum(rec.data_bytes) / stores, 1),
        "data_frames_per_store": _r(rec.data_frames / stores),
        "control_messages_per_store": _r(rec.control_messages / stores),
        "control_bytes_per_store": _r(rec.control_bytes / stores, 1),
        "latency_ms_p50": percentile(latencies, 50),
        "latency_ms_p99": percentile(latencies, 99),
        "latency_ms_max": latencies[-1] if latencies else None,
        "latency_ms_quantiles": [percentile(latencies, q) for q in range(0, 101, 5)],
        "hops_p50": percentile(hops, 50),
        "hops_p99": percentile(hops, 99),
        "hops_max": hops[-1] if hops else None,
        "duplicates_per_delivery": _r(total_dups / total_deliveries) if total_deliveries else None,
        "max_node_load": max(loads),
        "mean_node_load": _r(sum(loads) / workload.spec.nodes),
        "delivery_curve": {"t_ms": curve_t, "reached": curve},
    }
    if heal_ms is not None:
        done = [x for x in whole_after_heal if x is not None]
        summary["heal_to_whole_ms"] = max(done) if done and len(done) == len(whole_after_heal) else None
        summary["whole_after_heal_share"] = _r(len(done) / len(whole_after_heal)) if whole_after_heal else None
    return summary, rows
