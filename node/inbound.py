"""The inbound port: what arrives from elsewhere (the mesh, or an export file) is stored
here with its provenance, through the very write path local cells take.

The mesh link (``node.mesh_link``) turns the engine's effects into these calls; the
importer (``node.transfer``) calls the import half. Nothing here stamps identity: a
remote cell keeps its author and origin, and is only refused when it belongs to
another tenant. Tombstones and scene updates are taken only from the node that made
the cell or scene.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from mesh.wire import Diff

from . import cells as v
from .delivery import Beacon, BeaconBook
from .embedding import Embedder
from .errors import NotFound, Unavailable
from .ingest import CellWrites
from .layers import LayerSet
from .store import Scene, Store, Transaction
from .store.diff_log import tombstones_of
from .store.quarantine import OTHER_TENANT, STORE_FAILED, Quarantine

__all__ = ["InboundPort"]

log = logging.getLogger("hyphae.service")


class InboundPort:
    def __init__(
        self,
        *,
        node_id: str,
        tenant_id: str,
        store: Store,
        writes: CellWrites,
        layers: LayerSet,
        beacons: BeaconBook,
        embedder: Embedder,
        embed: Callable[[list[str]], Awaitable[np.ndarray]],
        clock: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self.tenant_id = tenant_id
        self._store = store
        self._db = store.db
        self._writes = writes
        self._layers = layers
        self._beacons = beacons
        self._embedder = embedder
        self._embed = embed  # the node's embedding worker, shared with local stores
        self._clock = clock
        # The one erase path (node.forgetting), set by the facade: row, indexes, scrub.
        self.erase_cell: Callable[[Transaction, int, int], None] = self._erase_row

    def _erase_row(self, tx: Transaction, rowid: int, forgotten_at: int) -> None:
        self._store.cells.erase(tx, rowid, forgotten_at)
        tx.after_commit(lambda: self._layers.remove(rowid))

    def needs_embedding(self, space: str, shape: tuple[int, ...]) -> bool:
        """Must a vector of ``space`` and ``shape`` be embedded again to be stored here?"""
        return space != self._embedder.space or shape != (self._embedder.dim,)

    # -- cells from the mesh -------------------------------------------------------------

    async def store_cells(self, cells: list[v.Cell], *, re_embed: list[bool]) -> list[str]:
        """Store the cells of one mesh batch as one write job; the ids that were new.

        One job, not one per cell: a batch of remote cells costs one future and one wake-up,
        and the known-cell check runs inside the job (a cell is checked before it is embedded
        again only when it needs that). If the job fails, each cell is tried alone, so one bad
        cell cannot hold back the others. Cells from another embedding space are embedded
        again from their content, so one index never mixes spaces.

        A cell that cannot be stored for a reason of its own (another tenant's, or a write
        that fails alone) is set aside in the quarantine with that reason, so it is never
        tried again. A local failure (:class:`~node.errors.Unavailable`: a full disk, a
        closed database) sets nothing aside: the cells stay to be tried at the next start,
        and the first such error is raised once the others were tried.
        """
        fresh: list[v.Cell] = []
        for cell, again in zip(cells, re_embed):
            if cell.tenant_id != self.tenant_id:
                log.warning("dropped a cell of another tenant (%s) from %s", cell.tenant_id, cell.origin_node)
                await self._set_aside(cell, OTHER_TENANT, f"the cell is of tenant {cell.tenant_id[:64]!r}")
                continue
            if again:
                if self._store.cells.exists(cell.node_id):
                    continue
                vector = (await self._embed([cell.content]))[0]
                cell = dataclasses.replace(cell, embedding=vector, embedding_space=self._embedder.space)
            fresh.append(cell)

        def ingest(batch: list[v.Cell]) -> Callable[[Transaction], list[str]]:
            def job(tx: Transaction) -> list[str]:
                known = self._store.cells.exists
                batch_ = [cell for cell in batch if not known(cell.node_id, tx)]
                forgotten = tombstones_of(tx, [cell.node_id for cell in batch_]) if batch_ else {}
                stored = []
                for cell in batch_:
                    forgotten_at = forgotten.get(cell.node_id, {}).get(cell.origin_node)
                    if forgotten_at is None:
                        stored.append(self._writes.write(tx, cell))
                    else:  # its origin's tombstone came first: a tombstone it is, never written with content
                        self._writes.write_tombstone(tx, dataclasses.replace(cell, forgotten_at=forgotten_at))
                return stored

            return job

        if len(fresh) > 1:
            try:
                return await self._db.write(ingest(fresh))
            except Unavailable:
                raise  # local (a full disk): no cell of it would fare better alone
            except Exception:
                log.exception("ingesting a batch of %d remote cells failed; trying them one by one", len(fresh))
        stored: list[str] = []
        local_failure: Unavailable | None = None
        for cell in fresh:
            try:
                stored.extend(await self._db.write(ingest([cell])))
            except Unavailable as exc:
                log.error("ingesting remote cell %s failed here: %s", cell.node_id, exc.message)
                local_failure = local_failure or exc
            except Exception as exc:
                log.exception("ingesting remote cell %s failed", cell.node_id)
                await self._set_aside(cell, STORE_FAILED, f"{type(exc).__name__}: {exc}")
        if local_failure is not None:
            raise local_failure
        return stored

    async def _set_aside(self, cell: v.Cell, reason: str, detail: str) -> None:
        """Put the logged diff of a remote cell that cannot be stored in the quarantine."""
        origin, cell_id = cell.origin_node, cell.node_id
        try:
            marked = await self._db.write(lambda tx: Quarantine.mark_cell(tx, origin, cell_id, reason, detail))
        except Exception:  # the quarantine is a record: failing to write it must not fail the batch
            log.exception("could not quarantine remote cell %s", cell_id)
            return
        if marked:
            log.warning("quarantined remote cell %s from %s: %s (%s)", cell_id, origin[:12], reason, detail)

    def quarantined(self) -> int:
        """How many diffs from the mesh are set aside, not stored (the metrics show it)."""
        return self._store.quarantine.count()

    async def apply_tombstone(self, node_id: str, origin_node: str, forgotten_at: int) -> bool:
        """A cell forgotten by its author elsewhere becomes a tombstone here too."""
        cells = self._store.cells

        def job(tx: Transaction) -> bool:
            row = cells.tombstone_target(tx, node_id)
            if row is None or row[1] != origin_node or row[2] is not None:
                return False
            self.erase_cell(tx, row[0], forgotten_at)
            return True

        return await self._db.write(job)

    async def apply_scene(self, scene: dict[str, Any], origin_node: str) -> None:
        """Record a teammate's scene (or an imported one) so get_scene and list_scenes show it."""
        if scene.get("tenant_id") != self.tenant_id or not scene.get("scene_id"):
            return
        row = Scene(
            scene["scene_id"], scene["tenant_id"], scene.get("agent_id", ""), scene.get("project"),
            scene.get("title"), scene.get("session_id"), origin_node, int(scene.get("created_at") or 0),
            scene.get("ended_at"), scene.get("consolidated_at"), scene.get("summary_node_id"),
        )  # fmt: skip
        await self._db.write(lambda tx: self._store.sessions.upsert_scene(tx, row))

    # -- what the mesh asks of the node --------------------------------------------------

    def cell_record(self, node_id: str) -> v.Cell:
        """A stored cell as the immutable record (for re-announcing it to the mesh)."""
        cell = self._store.cells.record(node_id)
        if cell is None:
            raise NotFound(f"no cell {node_id}", field="node_id")
        return cell

    def live_local_beacons(self) -> list[Beacon]:
        """What the mesh must advertise for this node (replayed when the mesh starts)."""
        return self._beacons.all_live(self._clock())

    def logged_cells_not_stored(self) -> list[Diff]:
        """Remote cells whose diff was logged but whose write did not commit (a crash)."""
        return self._store.mesh_gaps.logged_not_stored(self.node_id)

    def forgotten_not_logged(self) -> list[tuple[str, int]]:
        """``(id, forgotten_at)`` of local cells the mesh was sent and that were forgotten
        since without their tombstone reaching the log (forgotten with the mesh off)."""
        return self._store.mesh_gaps.forgotten_not_logged(self.node_id)

    def stored_cells_not_logged(self, window_ms: int) -> list[str]:
        """Ids of local cells stored just before a crash whose diff never reached the log."""
        return self._store.mesh_gaps.stored_not_logged(self.node_id, window_ms)

    # -- an export file ----------------------------------------------------------------------

    async def import_cells(self, cells: list[v.Cell]) -> int:
        """Store cells read from an export file in one transaction, with their provenance;
        returns how many were new. Known ids are skipped, so importing a file twice stores
        nothing the second time. A tombstone (``forgotten_at`` set) is recorded as one, with
        no content, vector or index entry. Nothing is gossiped."""
        known = self._store.cells.exists

        def job(tx: Transaction) -> int:
            stored = 0
            for cell in cells:
                if known(cell.node_id, tx):
                    continue
                stored += 1
                if cell.forgotten_at is None:
                    self._writes.write(tx, cell)
                else:
                    self._writes.write_tombstone(tx, cell)
            return stored

        return await self._db.write(job)

    async def import_beacons(self, beacons: list[tuple[Beacon, int | None]]) -> int:
        """Store beacons read from an export file (with when each was removed, if it was) in
        one transaction; returns how many were new. They match from the node's next start."""
        insert = self._store.beacons.insert_imported
        return await self._db.write(lambda tx: sum(insert(tx, beacon, removed_at) for beacon, removed_at in beacons))
