"""The routing rule, written once: which beacons a cell travels to.

A beacon with threshold τ is *routed* a cell when ``cos(beacon, cell) ≥ τ − slack × E0 −
route_margin`` and its filters hold: not expired, the cell's type among the beacon's types,
its project the beacon's project, its salience at least the beacon's floor, its project in
the owner's read scope, and not the beacon owner's own agent's cell. The margin makes the
rule wide on purpose: routing runs at every hop on vectors alone and is tuned for recall;
the node that receives the cell decides what enters an inbox with a better judge
(:mod:`node.admission_rule`), which never accepts what this rule refuses.

The rule has one form, over columns: :class:`BeaconColumns` keeps the beacons of one
(tenant, embedding space) as a float32 matrix with the filters as parallel numpy columns,
so matching a cell against thousands of beacons is one matrix-vector product and a few
vectorised comparisons. The one-beacon question (:func:`accepts`) asks the same code with
a one-row table. Both the mesh's index of remote beacons (:mod:`mesh.routing`) and the
node's book of local ones (``node.delivery``) keep their beacons in these columns.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from .config import EnergyParams

__all__ = ["BeaconColumns", "BeaconView", "CellView", "Codes", "accepts", "routed_rows"]

_NEVER = np.iinfo(np.int64).max
_ANY = -1
_NONE = -2


class BeaconView(Protocol):
    """What the rule reads of a beacon (a mesh ``BeaconPayload`` or a node ``Beacon``)."""

    tenant_id: str
    agent_id: str
    threshold: float
    embedding: np.ndarray
    embedding_space: str
    cell_types: Sequence[str] | None
    project: str | None
    min_salience: float | None
    expires_at: int | None

    @property
    def scope_projects(self) -> Sequence[str]: ...


class CellView(Protocol):
    """What the rule reads of a cell (a mesh ``CellPayload`` or a node ``CellFacts``)."""

    tenant_id: str
    source_agent: str
    cell_type: str
    salience: float
    project: str | None
    embedding: np.ndarray
    embedding_space: str


class BeaconColumns:
    """Beacons of one (tenant, space): a matrix plus filter columns, one row a beacon."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self.n = 0
        self.dead = 0
        # Rows appended with each filter: a column no row uses is not looked at (most beacons
        # set no filter, and a cell's match runs at every hop).
        self.expiring = self.floored = self.typed = self.projected = self.scoped = 0
        self._alloc(8)

    def _alloc(self, cap: int) -> None:
        old = self.__dict__.get("matrix")
        # The filter columns start out as "no filter", so a row without one needs no write.
        cols = {
            "matrix": np.zeros((cap, self.dim), np.float32), "threshold": np.zeros(cap, np.float32),
            "expires": np.full(cap, _NEVER, np.int64), "min_salience": np.full(cap, -1.0, np.float32),
            "types": np.zeros(cap, np.int64), "project": np.full(cap, _ANY, np.int64),
            "agent": np.zeros(cap, np.int64), "owner": np.zeros(cap, np.int64), "alive": np.zeros(cap, bool),
        }  # fmt: skip
        for name, array in cols.items():
            if old is not None:
                array[: self.n] = getattr(self, name)[: self.n]
            setattr(self, name, array)
        if old is None:
            self.entries: list[Any] = []
            self.scopes: list[frozenset[str] | None] = []  # the owner's read scope per row

    def append(self, entry: Any, beacon: BeaconView, owner: int, codes: Codes) -> int:
        """Add ``beacon`` as a row (``entry`` is what the row hands back; ``owner`` a code)."""
        if self.n == len(self.alive):
            self._alloc(2 * len(self.alive))
        b, i = beacon, self.n
        self.matrix[i] = b.embedding
        self.threshold[i] = b.threshold
        if b.expires_at is not None:
            self.expires[i] = b.expires_at
            self.expiring += 1
        if b.min_salience is not None:
            self.min_salience[i] = b.min_salience
            self.floored += 1
        if b.cell_types:
            self.types[i] = codes.type_mask(b.cell_types)
            self.typed += 1
        if b.project is not None:
            self.project[i] = codes.project(b.project)
            self.projected += 1
        self.scoped += bool(b.scope_projects)
        self.scopes.append(frozenset(b.scope_projects) if b.scope_projects else None)
        self.agent[i] = codes.agent(b.agent_id)
        self.owner[i] = owner
        self.alive[i] = True
        self.entries.append(entry)
        self.n += 1
        return i

    def kill(self, row: int) -> Any:
        """Take a row out: never matched again (an infinite threshold), compacted away later."""
        entry = self.entries[row]
        self.alive[row] = False
        self.threshold[row] = np.inf
        self.entries[row] = None
        self.scopes[row] = None
        self.dead += 1
        return entry

    def matching(self, cell: CellView, e0: float, now: int, energy: EnergyParams, codes: Codes) -> np.ndarray:
        """Which rows the routing rule sends ``cell`` to (a bool per row), all but the per-row
        project scope (:func:`routed_entries` applies it)."""
        n = self.n
        # Dead rows hold an infinite threshold: no alive column to combine.
        ok = (self.matrix[:n] @ cell.embedding) >= energy.route_threshold(self.threshold[:n], e0)
        if not ok.any():
            return ok
        if self.expiring:
            ok &= self.expires[:n] > now
        if self.floored:
            ok &= self.min_salience[:n] <= cell.salience
        if self.typed:
            types = self.types[:n]
            ok &= (types == 0) | ((types & codes.type_bit(cell.cell_type)) != 0)
        if self.projected:
            projects = self.project[:n]
            ok &= (projects == _ANY) | (projects == codes.project_if_known(cell.project))
        agent = codes.agent_if_known(cell.source_agent)
        if agent != _NONE:
            ok &= self.agent[:n] != agent
        return ok


class Codes:
    """Small-integer codes for strings the filters compare."""

    def __init__(self) -> None:
        self._projects: dict[str, int] = {}
        self._agents: dict[str, int] = {}
        self._types: dict[str, int] = {}
        self._owners: dict[str, int] = {}
        self.owner_ids: list[str] = []  # by code

    def owner(self, node_id: str) -> int:
        code = self._owners.get(node_id)
        if code is None:
            code = self._owners[node_id] = len(self.owner_ids)
            self.owner_ids.append(node_id)
        return code

    def project(self, name: str) -> int:
        return self._projects.setdefault(name, len(self._projects))

    def project_if_known(self, name: str | None) -> int:
        return _NONE if name is None else self._projects.get(name, _NONE)

    def agent(self, name: str) -> int:
        return self._agents.setdefault(name, len(self._agents))

    def agent_if_known(self, name: str) -> int:
        return self._agents.get(name, _NONE)

    def type_bit(self, name: str) -> int:
        code = self._types.setdefault(name, len(self._types))
        return 1 << (code % 63)

    def type_mask(self, names: Iterable[str]) -> int:
        mask = 0
        for name in names:
            mask |= self.type_bit(name)
        return mask


def routed_rows(columns: BeaconColumns, cell: CellView, e0: float, now: int, energy: EnergyParams, codes: Codes) -> list[int]:
    """The rows of ``columns`` the routing rule sends ``cell`` to, the owner's scope included."""
    rows = np.flatnonzero(columns.matching(cell, e0, now, energy, codes)).tolist()
    if cell.project is not None and columns.scoped:
        scopes = columns.scopes
        rows = [r for r in rows if scopes[r] is None or cell.project in scopes[r]]  # type: ignore[operator]
    return rows


def accepts(beacon: BeaconView, cell: CellView, e0: float, now: int, energy: EnergyParams) -> bool:
    """The rule for one beacon: the same columns, one row (repair asks it of a few candidates)."""
    if beacon.tenant_id != cell.tenant_id or beacon.embedding_space != cell.embedding_space:
        return False
    if np.shape(beacon.embedding) != np.shape(cell.embedding):
        return False
    codes = Codes()
    columns = BeaconColumns(len(beacon.embedding))
    columns.append(beacon, beacon, 0, codes)
    return bool(routed_rows(columns, cell, e0, now, energy, codes))
