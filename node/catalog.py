"""An in-memory catalogue of every cell's filterable attributes, indexed by rowid.

ANN search returns labels (rowids); read scope, cell types, tombstones and superseded
cells are then checked with numpy over this catalogue instead of a database round trip per
candidate.
Strings are interned to small integer codes; arrays grow by doubling.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable

import numpy as np

from .energy import CELL_TYPES

__all__ = ["CellCatalog"]

_TYPE_CODE = {name: i for i, name in enumerate(CELL_TYPES)}
_NO_PROJECT = 0


class CellCatalog:
    def __init__(self, capacity: int = 1024) -> None:
        self._lock = threading.Lock()
        self._codes: dict[str | None, int] = {None: _NO_PROJECT}
        self._tenant = np.full(capacity, -1, dtype=np.int32)
        self._project = np.zeros(capacity, dtype=np.int32)
        self._type = np.zeros(capacity, dtype=np.int8)
        self._agent = np.full(capacity, -1, dtype=np.int32)
        self._alive = np.zeros(capacity, dtype=bool)
        self._superseded = np.zeros(capacity, dtype=bool)  # set only by supersede(): never reset by add
        self._node_ids: dict[int, str] = {}

    def _code(self, text: str | None) -> int:
        code = self._codes.get(text)
        if code is None:
            code = self._codes[text] = len(self._codes)
        return code

    def _grow(self, rowid: int) -> None:
        size = len(self._tenant)
        if rowid < size:
            return
        new_size = max(size * 2, rowid + 1)
        for name, fill in (("_tenant", -1), ("_project", 0), ("_type", 0), ("_agent", -1), ("_alive", False),
                           ("_superseded", False)):
            old = getattr(self, name)
            grown = np.full(new_size, fill, dtype=old.dtype)
            grown[:size] = old
            setattr(self, name, grown)

    def add(
        self,
        rowid: int,
        node_id: str,
        tenant_id: str,
        project: str | None,
        cell_type: str,
        source_agent: str,
        alive: bool = True,
    ) -> None:
        with self._lock:
            self._grow(rowid)
            self._tenant[rowid] = self._code(tenant_id)
            self._agent[rowid] = self._code(source_agent)
            self._project[rowid] = self._code(project)
            self._type[rowid] = _TYPE_CODE[cell_type]
            self._alive[rowid] = alive
            self._node_ids[rowid] = node_id

    def add_many(self, rows: Iterable[tuple[int, str, str, str | None, str, str, bool]]) -> None:
        """Rows of ``(rowid, node_id, tenant_id, project, cell_type, source_agent, alive)``:
        a batch of stores (or a node opening), under one lock and one array write per column."""
        rows = iter(rows)
        while chunk := list(itertools.islice(rows, 8192)):
            rowids, node_ids, tenants, projects, types, agents, alive = zip(*chunk)
            with self._lock:
                self._grow(max(rowids))
                code = self._code
                self._tenant[rowids,] = [code(t) for t in tenants]
                self._agent[rowids,] = [code(a) for a in agents]
                self._project[rowids,] = [code(p) for p in projects]
                self._type[rowids,] = [_TYPE_CODE[t] for t in types]
                self._alive[rowids,] = alive
                self._node_ids.update(zip(rowids, node_ids))

    def kill(self, rowid: int) -> None:
        with self._lock:
            if rowid < len(self._alive):
                self._alive[rowid] = False

    def supersede(self, rowid: int, current: bool = False) -> None:
        """A cell replaced by another (node.lifecycle): searches leave it out unless asked;
        ``current``: its successor was forgotten, and it is current again."""
        with self._lock:
            self._grow(rowid)
            self._superseded[rowid] = not current

    def supersede_many(self, rowids: list[int]) -> None:
        if rowids:
            with self._lock:
                self._grow(max(rowids))
                self._superseded[rowids,] = True

    def alive(self, rowids: np.ndarray) -> np.ndarray:
        rowids = np.asarray(rowids, dtype=np.int64)
        inside = rowids < len(self._alive)
        return inside & self._alive[np.where(inside, rowids, 0)]

    def node_id(self, rowid: int) -> str:
        return self._node_ids[rowid]

    def same_tenant_other_agent(self, a: int, b: int) -> bool:
        """Do two cells share a tenant but not an author? (reinforcement by a near-duplicate)"""
        size = len(self._alive)
        return (
            a < size
            and b < size
            and self._alive[b]
            and self._tenant[a] == self._tenant[b]
            and self._agent[a] != self._agent[b]
        )

    def mask_for(
        self,
        tenant_id: str,
        projects: tuple[str, ...] | None,
        cell_types: tuple[str, ...] | None,
        *,
        only_project: str | None = None,
        include_superseded: bool = False,
    ):
        """A function ``labels -> bool mask`` for the ANN search's ``allowed`` hook.

        ``projects`` is the key's project list (None or empty: every project); the
        tenant-wide cells (no project) are always readable. ``only_project`` narrows
        the result to one project. Superseded cells are left out unless ``include_superseded``.
        """
        tenant = self._codes.get(tenant_id, -2)
        project_codes = None
        if only_project is not None:
            project_codes = np.array([self._codes.get(only_project, -2)], dtype=np.int32)
        elif projects:
            project_codes = np.array(
                [_NO_PROJECT] + [self._codes.get(p, -2) for p in projects], dtype=np.int32
            )
        type_codes = None
        if cell_types:
            type_codes = np.array([_TYPE_CODE[t] for t in cell_types], dtype=np.int8)

        def allowed(labels: np.ndarray) -> np.ndarray:
            labels = np.asarray(labels, dtype=np.int64)
            inside = labels < len(self._alive)
            safe = np.where(inside, labels, 0)
            mask = inside & self._alive[safe] & (self._tenant[safe] == tenant)
            if not include_superseded:
                mask &= ~self._superseded[safe]
            if project_codes is not None:
                mask &= np.isin(self._project[safe], project_codes)
            if type_codes is not None:
                mask &= np.isin(self._type[safe], type_codes)
            return mask

        return allowed
