"""Stale exposure: how long the nodes holding a superseded (or forgotten) cell go on serving it.

A node *holds* a cell once the engine hands it over (``StoreRemoteCell``), and its author's
node holds it from its store. After a supersede stored at ``t``, a holder of the old cell
serves it as active until it holds the successor (a node applies the link whichever came
first, :mod:`mesh.lifecycle`): its *lag* is the successor's arrival there less ``t`` (0 if it
came earlier, or it is the author's node), or never. The same for a forget: a holder's lag is
its tombstone's arrival less the forget's time. Holders that left the mesh for good are not
counted. Pairs whose old cell or successor is itself forgotten are left to the forget figures.

Everything is read off the :class:`~simulations.metrics.Recorder` after the run: the
simulator's node model is these few lines, the engine's effects its input.
"""

from __future__ import annotations

import math
from typing import Any

from .metrics import Recorder, percentile
from .workload import Workload

__all__ = ["lifecycle_summary", "STALE_AFTER_MS"]

STALE_AFTER_MS = (0, 500, 1_000, 2_000, 5_000, 10_000, 30_000, 60_000)


def _lags(rec_at: dict[int, int], holders: set[int], since: int, instant: int | None) -> list[float]:
    return [
        0.0 if node == instant else (max(0, rec_at[node] - since) if node in rec_at else math.inf)
        for node in sorted(holders)
    ]


def _figures(lags: list[float], count: int, whole_within_ms: int, per_event: list[list[float]]) -> dict[str, Any]:
    ordered = sorted(lags)
    never = sum(1 for x in ordered if x == math.inf)

    def ms(q: float) -> int | None:
        value = percentile(ordered, q)
        return None if value is None or value == math.inf else int(value)

    return {
        "events": count,
        "holders": len(ordered),
        "holders_never": never,
        "lag_ms_p50": ms(50),
        "lag_ms_p99": ms(99),  # 99 % of the holders serve the new state within this
        "lag_ms_max": ms(100) if not never else None,  # ... and all of them (None: some never did)
        "stale_share_after_ms": {
            str(t): round(sum(1 for x in ordered if x > t) / len(ordered), 6) if ordered else None
            for t in STALE_AFTER_MS
        },
        "events_whole_within_ms": {
            str(whole_within_ms): round(
                sum(1 for lags in per_event if all(x <= whole_within_ms for x in lags)) / len(per_event), 6
            ) if per_event else None,
        },
    }


def lifecycle_summary(
    rec: Recorder, workload: Workload, origin_ms: int, *, skipped: frozenset[int] = frozenset(),
    gone: dict[int, int] | None = None, whole_within_ms: int,
) -> dict[str, Any]:  # fmt: skip
    """The stale-exposure figures of one strategy's run (``whole_within_ms``: the repair period)."""
    gone = gone or {}
    cells = workload.cells
    forgotten = {c.index for c in cells if c.forgotten_at_ms is not None and c.index not in skipped}
    pairs: list[float] = []
    per_supersede: list[list[float]] = []
    messages = targets = 0
    for cell in cells:
        if not cell.supersedes or cell.index in skipped or cell.index in forgotten:
            continue
        for old_index in cell.supersedes:
            old = cells[old_index]
            if old_index in skipped or old_index in forgotten:
                continue
            holders = {n for n in (*rec.delivered[old_index], old.origin) if n not in gone}
            lags = _lags({n: at for n, (at, _) in rec.delivered[cell.index].items()}, holders,
                         origin_ms + cell.at_ms, cell.origin)  # fmt: skip
            pairs += lags
            per_supersede.append(lags)
            messages += rec.messages[cell.index]
            targets += len((holders | set(cell.interested)) - {cell.origin})
    out: dict[str, Any] = {"supersede": _figures(pairs, len(per_supersede), whole_within_ms, per_supersede)}
    out["supersede"]["messages_per_supersede"] = round(messages / len(per_supersede), 4) if per_supersede else None
    # One diff per node that wanted the new cell or held the old one is the floor.
    out["supersede"]["targets_per_supersede"] = round(targets / len(per_supersede), 4) if per_supersede else None
    forget_lags: list[float] = []
    per_forget: list[list[float]] = []
    for index in sorted(forgotten):
        cell = cells[index]
        assert cell.forgotten_at_ms is not None
        holders = {n for n in rec.delivered[index] if n not in gone}
        lags = _lags(rec.tombstoned.get(index, {}), holders, origin_ms + cell.forgotten_at_ms, None)
        forget_lags += lags
        per_forget.append(lags)
    out["forget"] = _figures(forget_lags, len(per_forget), whole_within_ms, per_forget)
    sent = sum(rec.tombstones_sent[i] for i in forgotten)
    out["forget"]["tombstones_sent_per_forget"] = round(sent / len(per_forget), 4) if per_forget else None
    return out
