"""Semantic precision and recall: of what routing brought each beacon owner, how much was wanted.

Transport figures (:mod:`.metrics`) judge a strategy against the routing oracle; these judge
it against people. For every beacon owner of a labelled workload (:mod:`.labelled`):

* **routed**: the cells that reached the owner's node and that one of the owner's beacons
  accepts by the routing rule: what the node would consider for the owner's inbox;
* **admitted**: those of them an *admission stage* lets in. The stage is a plain callable,
  ``admit(beacon_payload, cell_payload) -> bool``, asked once per (beacon, cell) pair that
  routing delivered, in the order the cells reached the node; a cell enters the owner's inbox
  when any of the owner's beacons admits it. The default admits everything routing delivered.

Each set is scored against the union of the judgements of the owner's beacons, the owner's own
memories left out on both sides (``benchmarks/relevance.py`` scores real nodes the same way;
precision of an empty inbox counts as 0), and the figures are macro-averaged over owners.

Admission runs after the run, on what each node stored: a node's inbox does not change what its
engine relays, so applying the stage afterwards gives the same inboxes as applying it in flight.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from mesh.wire import BeaconPayload, CellPayload

from .labelled import LabelledWorkload

__all__ = ["Admit", "accept_routed", "admission_name", "load_admission", "score", "semantic_summary", "rule_summary"]

Admit = Callable[[BeaconPayload, CellPayload], bool]


def accept_routed(beacon: BeaconPayload, cell: CellPayload) -> bool:
    """The default admission stage: whatever routing delivered enters the inbox."""
    return True


def load_admission(spec: str | None) -> Admit:
    """``MODULE:NAME`` -> that callable (None: :func:`accept_routed`)."""
    if not spec:
        return accept_routed
    module, sep, name = spec.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"admission is MODULE:NAME, not {spec!r}")
    try:
        found = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"admission {spec!r} cannot be loaded: {exc}") from exc
    if not callable(found):
        raise ValueError(f"admission {spec!r} is not callable")
    return found


def fresh(admit: Admit) -> Admit:
    """The stage for one strategy's inboxes: a class (a stage that learns from what it sees)
    is made anew, so no strategy's inboxes hear of another's."""
    return admit() if isinstance(admit, type) else admit


def admission_name(admit: Admit) -> str:
    return f"{getattr(admit, '__module__', '?')}:{getattr(admit, '__qualname__', type(admit).__name__)}"


def score(got: Iterable[str], relevant: Iterable[str]) -> dict[str, Any]:
    """Precision, recall and F1 of one owner's inbox (empty inbox: precision 0)."""
    got, relevant = set(got), set(relevant)
    hits = len(got & relevant)
    p = hits / len(got) if got else 0.0
    r = hits / len(relevant) if relevant else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f, "delivered": len(got), "relevant": len(relevant), "hits": hits}


def _r(x: float) -> float:
    return round(float(x), 6)


_FIGURES = ("precision", "recall", "f1")


def _macro(per_owner: Mapping[str, dict[str, Any]]) -> dict[str, Any]:
    """The mean of each figure over owners, and each owner's (rounded only here, once)."""
    rows = list(per_owner.values())
    out: dict[str, Any] = {k: _r(sum(row[k] for row in rows) / len(rows)) if rows else None for k in _FIGURES}
    out["per_owner"] = {o: {k: _r(v) if k in _FIGURES else v for k, v in row.items()} for o, row in per_owner.items()}
    return out


def semantic_summary(
    workload: LabelledWorkload, delivered: list[dict[int, tuple[int, int]]], origin_ms: int, admit: Admit,
    skipped: frozenset[int] = frozenset(),
) -> dict[str, Any]:  # fmt: skip
    """``{"routed": ..., "admitted": ...}`` for one strategy; ``delivered[cell][node] = (at, hops)``
    is what the strategy's recorder saw, ``origin_ms`` the absolute time of store-phase 0."""
    dim = workload.spec.dim
    payloads: dict[int, CellPayload] = {}
    routed: dict[str, dict[str, Any]] = {}
    admitted: dict[str, dict[str, Any]] = {}
    for owner in workload.owners:
        node = workload.team[owner]
        rows = [j for j, b in enumerate(workload.beacons) if b.payload.agent_id == owner]
        # What the owner's node holds, in the order it came: what reached it, and its own
        # agents' memories as they are stored there (a stage that learns from the cells a node
        # holds hears of each through ``hold``, after it has been judged).
        arrivals = sorted(
            [(got[node][0], cell.index) for cell, got in zip(workload.cells, delivered)
             if cell.index not in skipped and node in got]
            + [(origin_ms + c.at_ms, c.index) for c in workload.stream_cells
               if c.author == owner and c.index not in skipped]
        )  # fmt: skip
        hold = getattr(admit, "hold", None)
        routed_ids: set[str] = set()
        admitted_ids: set[str] = set()
        for at, i in arrivals:
            cell = workload.stream_cells[i]
            memory, author = cell.memory_id, cell.author
            if i not in payloads:
                payloads[i] = cell.payload(origin_ms + cell.at_ms, dim)
            matching = [j for j in rows if workload.accepts[j, i]]
            if author != owner and matching:  # else a relay's copy, or the owner's own: never an inbox item
                routed_ids.add(memory)
                # every matching beacon is asked (a stage may learn from each pair it sees)
                verdicts = [bool(admit(workload.beacons[j].payload, payloads[i])) for j in matching]
                if any(verdicts):
                    admitted_ids.add(memory)
            if hold is not None:
                hold(owner, payloads[i])
        # the owner's own memories (the judgements never list them) and those never stored are not wanted
        relevant = workload.relevant[owner] - {
            c.memory_id for c in workload.stream_cells if c.author == owner or c.index in skipped
        }
        routed[owner] = {"beacons": len(rows), **score(routed_ids, relevant)}
        admitted[owner] = {"beacons": len(rows), **score(admitted_ids, relevant)}
    return {"owners": len(workload.owners), "routed": _macro(routed), "admitted": _macro(admitted)}


def rule_summary(workload: LabelledWorkload, skipped: frozenset[int] = frozenset()) -> dict[str, Any]:
    """The routing rule's own semantic figures, as if every interested node got every cell (the
    ceiling of any transport: what the oracle strategy reaches)."""
    perfect = [{node: (0, 0) for node in cell.interested} for cell in workload.cells]
    routed = semantic_summary(workload, perfect, 0, accept_routed, skipped)["routed"]
    return {k: routed[k] for k in _FIGURES}
