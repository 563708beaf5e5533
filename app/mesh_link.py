"""The link between a node and its mesh engine: local changes out, remote changes in.

Outbound, the facade's hooks (a cell stored, a beacon placed, ...) become engine events
on the runtime's queue. Inbound, the engine's effects become facade calls: a remote cell
is ingested through the very path local cells take (storage, index, inbox delivery),
with its provenance. At start the link replays this node's live beacons to the engine
and repairs the one gap a crash can open: a write committed on one side of the
cell/diff-log pair and not the other. Nothing in that repair may stop the node from
starting: a logged cell that cannot be stored is quarantined (``node.store.quarantine``,
shown by ``hyphae doctor``), and one the node cannot store *now* (a full disk) waits for
the next start.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

from mesh import events as ev
from mesh.wire import BeaconPayload, CellPayload

from node import cells as v
from node.delivery import Beacon
from node.errors import HyphaeError
from node.service import MemoryService

__all__ = ["MeshLink"]

log = logging.getLogger("hyphae.mesh")

# How far back a restart looks for local cells whose diff a crash may have lost.
RECONCILE_WINDOW_MS = 60_000


def cell_payload(cell: v.Cell) -> CellPayload:
    return CellPayload(
        node_id=cell.node_id, tenant_id=cell.tenant_id, source_agent=cell.source_agent, content=cell.content,
        cell_type=cell.cell_type, salience=cell.salience, created_at=cell.created_at, project=cell.project,
        scene_id=cell.scene_id, source_ref=cell.source_ref, metadata=cell.metadata, embedding=cell.embedding,
        embedding_space=cell.embedding_space,
    )  # fmt: skip


def beacon_payload(beacon: Beacon) -> BeaconPayload:
    return BeaconPayload(
        beacon_id=beacon.beacon_id, tenant_id=beacon.tenant_id, agent_id=beacon.agent_id, query=beacon.query,
        threshold=beacon.threshold, cell_types=beacon.cell_types, project=beacon.project,
        min_salience=beacon.min_salience, expires_at=beacon.expires_at, embedding=beacon.embedding,
        embedding_space=beacon.embedding_space, scope_projects=beacon.owner_projects,
    )  # fmt: skip


class MeshLink:
    """``MeshHooks`` for the facade and ``EffectSink`` for the runtime."""

    def __init__(self, service: MemoryService, submit) -> None:
        self.service = service
        self._submit = submit
        # (owner, beacon id): an id is its owner's, another member's beacon of the same id is another beacon
        self.remote_beacons: dict[tuple[str, str], ev.ApplyRemoteBeacon] = {}
        self.peer_states: dict[str, str] = {}
        self.cells_received = 0
        self.cells_received_from: collections.Counter[str] = collections.Counter()  # by origin node

    # -- outbound (MeshHooks) --------------------------------------------------------

    def cell_stored(self, cell: v.Cell) -> None:
        self._submit(ev.CellStored(cell_payload(cell)))

    def cell_forgotten(self, node_id: str, tenant_id: str, forgotten_at: int) -> None:
        self._submit(ev.CellForgotten(node_id, tenant_id))

    def beacon_placed(self, beacon: Beacon) -> None:
        self._submit(ev.BeaconPlaced(beacon_payload(beacon)))

    def beacon_removed(self, beacon_id: str, tenant_id: str) -> None:
        self._submit(ev.BeaconRemoved(beacon_id, tenant_id))

    def scene_changed(self, scene: dict[str, Any]) -> None:
        self._submit(ev.SceneChanged(scene))

    # -- inbound (EffectSink) ----------------------------------------------------------

    async def apply(self, effect: Any) -> None:
        if isinstance(effect, ev.StoreRemoteCell):
            await self._store_remote(effect.cell, effect.origin_node, effect.hops, effect.signature)
        elif isinstance(effect, ev.ApplyTombstone):
            await self.service.apply_tombstone(effect.cell_id, effect.origin_node, effect.forgotten_at)
        elif isinstance(effect, ev.ApplyScene):
            await self.service.apply_scene(effect.scene, effect.origin_node)
        elif isinstance(effect, ev.ApplyRemoteBeacon):
            self.remote_beacons[(effect.origin_node, effect.beacon.beacon_id)] = effect
        elif isinstance(effect, ev.RemoveRemoteBeacon):
            self.remote_beacons.pop((effect.origin_node, effect.beacon_id), None)
        elif isinstance(effect, ev.PeerStateChanged):
            self.peer_states[effect.peer_id] = effect.state
            log.info("peer %s at %s is %s", effect.peer_id[:12], effect.address, effect.state)
        elif isinstance(effect, ev.IdentityConflict):  # also in the mesh status: status, peers, doctor
            log.error("identity conflict: %s", effect.message())
        elif isinstance(effect, ev.PeerOutdated):  # once per member; also in the mesh status: peers, doctor
            log.warning("%s", effect.message())

    async def apply_many(self, effects: list[Any]) -> None:
        """The cells of the frames the runtime handled together (a run of ``StoreRemoteCell``)
        as one write job: one durable commit and one wake-up for all, not one per cell."""
        cells = [self._cell(e.cell, e.origin_node, e.hops, e.signature) for e in effects]
        stored = await self.service.ingest_remote_many([c for c, _ in cells], re_embed=[again for _, again in cells])
        self._count(stored, {c.node_id: c.origin_node for c, _ in cells})

    async def _store_remote(self, payload: CellPayload, origin_node: str, hops: int, signature: bytes) -> None:
        cell, again = self._cell(payload, origin_node, hops, signature)
        stored = await self.service.ingest_remote(cell, re_embed=again)
        self._count([stored] if stored else [], {cell.node_id: origin_node})

    def _cell(self, payload: CellPayload, origin_node: str, hops: int, signature: bytes) -> tuple[v.Cell, bool]:
        """The cell to store, and whether it must be embedded again (another embedding space)."""
        again = self.service.inbound.needs_embedding(payload.embedding_space, payload.embedding.shape)
        cell = v.Cell(
            node_id=payload.node_id, tenant_id=payload.tenant_id, source_agent=payload.source_agent,
            origin_node=origin_node, content=payload.content, cell_type=payload.cell_type,
            salience=payload.salience, created_at=payload.created_at, layer="L0", embedding=payload.embedding,
            embedding_space=payload.embedding_space, scene_id=payload.scene_id, project=payload.project,
            source_ref=payload.source_ref, metadata=dict(payload.metadata), hops=hops, signature=signature,
        )  # fmt: skip
        return cell, again

    def _count(self, stored: list[str], origins: dict[str, str]) -> None:
        for node_id in stored:
            self.cells_received += 1
            self.cells_received_from[origins[node_id]] += 1

    # -- start-up ----------------------------------------------------------------------

    async def start(self) -> None:
        """Advertise our beacons and close the gaps a crash can leave."""
        for beacon in self.service.live_local_beacons():
            self.beacon_placed(beacon)
        # Remote cells whose diff was logged but whose ingest did not commit (rows that no
        # longer decode went to the quarantine on the way, and so do cells that fail alone).
        for diff in self.service.inbound.logged_cells_not_stored():
            try:
                await self._store_remote(diff.payload, diff.origin, diff.hops, diff.signature)
            except HyphaeError as exc:  # local (a full disk): the next start tries again
                log.warning("could not store the cells logged before the last stop: %s; the next start tries again",
                            exc.message)  # fmt: skip
                break
            except Exception:  # a bug of ours must not keep the node from starting either
                log.exception("storing remote cell %s logged before the last stop failed", diff.payload.node_id)
        # Local cells stored just before a crash whose diff never reached the log.
        for cell_id in self.service.inbound.stored_cells_not_logged(RECONCILE_WINDOW_MS):
            self.cell_stored(self.service.cell_record(cell_id))
        # Local cells forgotten while the mesh was not running (a CLI forget with the node
        # stopped, or a crash before the engine took it): their tombstones go out now.
        for cell_id, forgotten_at in self.service.inbound.forgotten_not_logged():
            self.cell_forgotten(cell_id, self.service.config.tenant_id, forgotten_at)

    def status(self) -> dict[str, Any]:
        return {
            "remote_beacons": len(self.remote_beacons),
            "cells_received": self.cells_received,
            "cells_received_from": dict(self.cells_received_from),
        }
