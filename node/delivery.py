"""Beacons and local delivery: which principals' inboxes a cell lands in.

A beacon is a standing interest. When a cell is ingested, from a local agent or from
the mesh alike, every live beacon of a *local* principal in the cell's tenant is
evaluated; the cell lands in the inbox of each principal (other than its author) whose
beacon matches. Matching follows the energy model: a beacon with threshold τ accepts a
cell when ``cos ≥ τ − slack × E0``, and its filters (cell types, project, minimum
salience, expiry, the owner's read scope) all hold. One inbox item per principal: the
best-matching beacon names it.

The book keeps beacons as a matrix per tenant, so a cell is matched against all of
them with one matrix-vector product.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable

import numpy as np

from .energy import EnergyModel

__all__ = ["Beacon", "BeaconBook", "Delivery", "CellFacts"]


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


@dataclasses.dataclass(frozen=True)
class Delivery:
    agent_id: str
    beacon_id: str
    similarity: float


class BeaconBook:
    """The live beacons of this node's principals, grouped by tenant."""

    def __init__(self, energy: EnergyModel) -> None:
        self._energy = energy
        self._lock = threading.Lock()
        self._by_tenant: dict[str, tuple[list[Beacon], np.ndarray]] = {}

    def add(self, beacon: Beacon) -> None:
        with self._lock:
            beacons, _ = self._by_tenant.get(beacon.tenant_id, ([], None))
            beacons = [b for b in beacons if b.beacon_id != beacon.beacon_id] + [beacon]
            self._by_tenant[beacon.tenant_id] = (beacons, np.stack([b.embedding for b in beacons]))

    def add_many(self, beacons: Iterable[Beacon]) -> None:
        for beacon in beacons:
            self.add(beacon)

    def remove(self, beacon_id: str) -> None:
        self.remove_where(lambda b: b.beacon_id == beacon_id)

    def remove_agent(self, agent_id: str) -> None:
        self.remove_where(lambda b: b.agent_id == agent_id)

    def remove_where(self, doomed) -> None:
        with self._lock:
            for tenant, (beacons, _) in list(self._by_tenant.items()):
                kept = [b for b in beacons if not doomed(b)]
                if len(kept) == len(beacons):
                    continue
                if kept:
                    self._by_tenant[tenant] = (kept, np.stack([b.embedding for b in kept]))
                else:
                    del self._by_tenant[tenant]

    def of_agent(self, agent_id: str, now_ms: int) -> list[Beacon]:
        with self._lock:
            groups = list(self._by_tenant.values())
        return [
            b
            for beacons, _ in groups
            for b in beacons
            if b.agent_id == agent_id and (b.expires_at is None or b.expires_at > now_ms)
        ]

    def all_live(self, now_ms: int) -> list[Beacon]:
        with self._lock:
            groups = list(self._by_tenant.values())
        return [b for beacons, _ in groups for b in beacons if b.expires_at is None or b.expires_at > now_ms]

    def match(self, cell: CellFacts, now_ms: int) -> list[Delivery]:
        """The inbox deliveries a cell earns, best beacon per principal."""
        with self._lock:
            beacons, matrix = self._by_tenant.get(cell.tenant_id, ([], None))
        if not beacons:
            return []
        similarities = matrix @ cell.embedding
        e0 = self._energy.initial(cell.salience, cell.cell_type)
        best: dict[str, Delivery] = {}
        for beacon, similarity in zip(beacons, similarities.tolist()):
            if beacon.agent_id == cell.source_agent or beacon.embedding_space != cell.embedding_space:
                continue
            if similarity < self._energy.match_threshold(beacon.threshold, e0):
                continue
            if not _filters_pass(beacon, cell, now_ms):
                continue
            current = best.get(beacon.agent_id)
            if current is None or similarity > current.similarity:
                best[beacon.agent_id] = Delivery(beacon.agent_id, beacon.beacon_id, float(similarity))
        return list(best.values())


def _filters_pass(beacon: Beacon, cell: CellFacts, now_ms: int) -> bool:
    if beacon.expires_at is not None and beacon.expires_at <= now_ms:
        return False
    if beacon.cell_types and cell.cell_type not in beacon.cell_types:
        return False
    if beacon.project is not None and cell.project != beacon.project:
        return False
    if beacon.min_salience is not None and cell.salience < beacon.min_salience:
        return False
    if cell.project is not None and beacon.owner_projects and cell.project not in beacon.owner_projects:
        return False
    return True
