"""Beacons and local delivery: which principals' inboxes a cell lands in.

A beacon is a standing interest. When a cell is ingested, from a local agent or from
the mesh alike, every live beacon of a *local* principal in the cell's tenant is asked
two questions, each owned by one module: does the routing rule send the cell to it
(:mod:`mesh.routing_rule`: vectors and filters, the rule every hop of the mesh applies),
and does the admission rule let it in (:mod:`node.admission_rule`: a better judge, which
never admits what routing refuses). The cell lands in the inbox of each principal (other
than its author) with an admitted beacon, once: the best-scoring beacon names it.

The book keeps beacons as the routing rule's columns per (tenant, space), so a cell is
matched against all of them with one matrix-vector product.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable

import numpy as np

from mesh.routing_rule import BeaconColumns, Codes, routed_rows

from .admission_rule import Admission, AdmissionRule
from .energy import EnergyModel

__all__ = ["Beacon", "BeaconBook", "CellFacts"]


@dataclasses.dataclass(frozen=True)
class Beacon:
    beacon_id: str
    tenant_id: str
    agent_id: str
    origin_node: str
    query: str
    threshold: float
    embedding: np.ndarray
    embedding_space: str
    created_at: int
    cell_types: tuple[str, ...] | None = None
    project: str | None = None
    min_salience: float | None = None
    ttl_seconds: int | None = None
    expires_at: int | None = None
    owner_projects: tuple[str, ...] = ()  # the owner's read scope; () reads every project

    @property
    def scope_projects(self) -> tuple[str, ...]:
        return self.owner_projects

    def public(self) -> dict:
        return {
            "beacon_id": self.beacon_id,
            "query": self.query,
            "threshold": self.threshold,
            "cell_types": list(self.cell_types) if self.cell_types else None,
            "project": self.project,
            "min_salience": self.min_salience,
            "ttl_seconds": self.ttl_seconds,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
        }


@dataclasses.dataclass(frozen=True)
class CellFacts:
    """What matching needs to know about a cell."""

    tenant_id: str
    source_agent: str
    cell_type: str
    salience: float
    project: str | None
    embedding: np.ndarray
    embedding_space: str
    content: str = ""  # what a judge reads beside the vector


class BeaconBook:
    """The live beacons of this node's principals, as routing-rule columns per (tenant, space)."""

    def __init__(self, energy: EnergyModel, admission: AdmissionRule | None = None) -> None:
        self._energy = energy
        self.admission = admission if admission is not None else AdmissionRule(energy)
        self._lock = threading.Lock()
        self._beacons: dict[str, Beacon] = {}
        self._columns: dict[tuple[str, str], tuple[BeaconColumns, Codes]] = {}

    def add(self, beacon: Beacon) -> None:
        with self._lock:
            self._beacons.pop(beacon.beacon_id, None)
            self._beacons[beacon.beacon_id] = beacon
            self._rebuild()

    def add_many(self, beacons: Iterable[Beacon]) -> None:
        with self._lock:
            for beacon in beacons:
                self._beacons.pop(beacon.beacon_id, None)
                self._beacons[beacon.beacon_id] = beacon
            self._rebuild()

    def remove(self, beacon_id: str) -> None:
        self.remove_where(lambda b: b.beacon_id == beacon_id)

    def remove_agent(self, agent_id: str) -> None:
        self.remove_where(lambda b: b.agent_id == agent_id)

    def remove_where(self, doomed) -> None:
        with self._lock:
            kept = {bid: b for bid, b in self._beacons.items() if not doomed(b)}
            if len(kept) != len(self._beacons):
                self._beacons = kept
                self._rebuild()

    def _rebuild(self) -> None:
        # Beacons change rarely and a book holds a node's own principals' few: rebuilt whole,
        # then swapped in, so a match in flight keeps the table it started with.
        columns: dict[tuple[str, str], tuple[BeaconColumns, Codes]] = {}
        for beacon in self._beacons.values():
            key = (beacon.tenant_id, beacon.embedding_space)
            table = columns.get(key)
            if table is None or table[0].dim != len(beacon.embedding):
                table = columns[key] = (BeaconColumns(len(beacon.embedding)), Codes())
            table[0].append(beacon, beacon, 0, table[1])
        self._columns = columns

    def of_agent(self, agent_id: str, now_ms: int) -> list[Beacon]:
        with self._lock:
            beacons = list(self._beacons.values())
        return [b for b in beacons if b.agent_id == agent_id and (b.expires_at is None or b.expires_at > now_ms)]

    def all_live(self, now_ms: int) -> list[Beacon]:
        with self._lock:
            beacons = list(self._beacons.values())
        return [b for b in beacons if b.expires_at is None or b.expires_at > now_ms]

    def routed(self, cell: CellFacts, now_ms: int) -> list[Beacon]:
        """The local beacons the routing rule sends ``cell`` to."""
        table = self._columns.get((cell.tenant_id, cell.embedding_space))
        if table is None or np.shape(cell.embedding) != (table[0].dim,):
            return []
        columns, codes = table
        e0 = self._energy.initial(cell.salience, cell.cell_type)
        return [columns.entries[row] for row in routed_rows(columns, cell, e0, now_ms, self._energy, codes)]

    def match(self, cell: CellFacts, now_ms: int) -> list[Admission]:
        """The inbox deliveries a cell earns: routed, then admitted; the best beacon per principal."""
        return self.admission.admit(self.routed(cell, now_ms), cell)
