"""The write path of a cell, run by write jobs on the writer thread.

Every cell is written here, whoever made it: a local store, a scene's summary, a cell
from the mesh, an imported one. One path means one set of rules: the energy it starts
with, whether it arrives promoted, the layers it joins, and the inboxes whose beacons it
matches (delivery happens in the same job, so an acknowledged store has been delivered).

The in-memory structures follow after the commit: the batch's new cells enter the
catalogue, then its layer members join the indexes, once per batch rather than per row
(``Transaction.after_commit_gathered``), so a burst of stores takes one lock and wakes
the indexer once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .cells import Cell
from .config import DEFAULT_CONFLICT_COS
from .delivery import BeaconBook, CellFacts
from .energy import EnergyModel
from .layers import LayerSet
from .lifecycle import Lifecycle
from .store import Store, Transaction

__all__ = ["CellWrites"]


class CellWrites:
    def __init__(
        self, store: Store, layers: LayerSet, beacons: BeaconBook, energy: EnergyModel, clock: Callable[[], int],
        *, conflict_cos: float = DEFAULT_CONFLICT_COS,
    ) -> None:
        self._cells = store.cells
        self._members = store.members
        self._inbox = store.inbox
        self.layers = layers
        self.beacons = beacons
        self.energy = energy
        self.clock = clock
        # Inbox times only go up, even when the clock does not (received_at is a cursor).
        self._last_received = store.inbox.last_received()  # touched only by the writer thread
        self.lifecycle = Lifecycle(
            store.lifecycle, conflict_cos=conflict_cos, next_received=self._next_received,
            superseded=layers.catalog.supersede,
        )  # fmt: skip

    def write(self, tx: Transaction, cell: Cell, *, idempotency: tuple[str, str | None] = ("", None)) -> str:
        """Write one cell with its layer memberships, inbox deliveries and lifecycle links
        (:mod:`node.lifecycle`); returns its id, or the id already stored under the agent's
        idempotency key."""
        agent_id, key = idempotency
        if key is not None:
            earlier = self._cells.idempotent(agent_id, key, tx)
            if earlier is not None:
                return earlier
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        layer = cell.layer
        if layer == "L0" and self.energy.promoted_on_arrival(e0):
            layer = "L1"
        now = self.clock()
        rowid = self._cells.insert(tx, cell, energy0=e0, layer=layer, stored_at=now)
        if key is not None:
            self._cells.remember_idempotency(tx, agent_id, key, cell.node_id, now)
        tx.after_commit_gathered(
            self._rows_committed,
            ((rowid, cell.node_id, cell.tenant_id, cell.project, cell.cell_type, cell.source_agent, True), None),
        )
        layers = ["L2"] if layer == "L2" else ["L0", "L1"] if layer == "L1" else ["L0"]
        for name in layers:
            self._join_layer(tx, name, rowid, cell.embedding)
        facts = CellFacts(
            cell.tenant_id, cell.source_agent, cell.cell_type, cell.salience, cell.project,
            cell.embedding, cell.embedding_space, cell.content or "",
        )  # fmt: skip
        for delivery in self.beacons.match(facts, now):
            received_at = max(now, self._last_received + 1)
            delivered = self._inbox.deliver(tx, delivery.agent_id, rowid, delivery, received_at, cell.hops)
            if delivered:
                self._last_received = received_at
        self.beacons.admission.observe(cell.embedding, cell.content)  # judged first, then held
        if cell.source_hash is not None or cell.stale_at is not None:
            self.lifecycle.store.record_source(tx, rowid, cell.source_hash, cell.stale_at, cell.stale_reason)
        self.lifecycle.after_write(tx, cell, rowid, now)
        return cell.node_id

    def _next_received(self) -> int:
        """An inbox time later than every earlier one (received_at is a cursor)."""
        self._last_received = max(self.clock(), self._last_received + 1)
        return self._last_received

    def write_tombstone(self, tx: Transaction, cell: Cell) -> None:
        """Record a cell that was forgotten before it got here (an imported tombstone): the
        row alone, with no content, vector, index entry or delivery."""
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        self._cells.insert(tx, cell, energy0=e0, layer=cell.layer, stored_at=self.clock())

    def promote(self, tx: Transaction, rowid: int) -> None:
        """Move a live L0 cell to L1 (a reinforced one); anything else stays as it is."""
        vector = self._cells.promotable(tx, rowid)
        if vector is None:
            return
        self._cells.set_layer(tx, rowid, "L1")
        self._join_layer(tx, "L1", rowid, vector)

    def _join_layer(self, tx: Transaction, layer: str, rowid: int, vector: np.ndarray) -> None:
        seq = self._members.join(tx, layer, rowid)
        if seq:
            tx.after_commit_gathered(self._rows_committed, (None, (layer, seq, rowid, vector)))

    def _rows_committed(self, rows: list[tuple[tuple | None, tuple | None]]) -> None:
        """After a commit (writer thread): the batch's new cells enter the catalogue, then
        its layer members join the layers. The catalogue first, whatever order the jobs
        came in: the indexer skips rows it does not know to be alive."""
        self.layers.catalog.add_many(cell for cell, _ in rows if cell is not None)
        members = [member for _, member in rows if member is not None]
        if members:
            self.layers.add_rows(members)
