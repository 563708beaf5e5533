"""Stored rows as the JSON the surfaces answer with (the shapes of DESIGN §7).

The store maps SQL rows to domain tuples; these functions decide what a caller sees of
them: field names, derived values (a cell's energy now, its provenance), and rounding.
They are pure, so MCP, REST and the CLI cannot drift apart.
"""

from __future__ import annotations

from typing import Any

from .energy import EnergyModel
from .lifecycle import status_of, supersedes_of
from .store import AgentRecord, InboxEntry, Scene, StoredCell

__all__ = ["cell_dict", "inbox_dict", "scene_dict", "agent_dict"]


def cell_dict(cell: StoredCell, *, now: int, energy: EnergyModel, node_id: str) -> dict[str, Any]:
    """A cell with its energy at ``now`` and its provenance (``local``: stored by ``node_id``)."""
    forgotten_at = cell.forgotten_at
    return {
        "node_id": cell.node_id,
        "content": cell.content,
        "cell_type": cell.cell_type,
        "salience": cell.salience,
        "energy": 0.0 if forgotten_at else round(energy.at(cell.energy0, cell.cell_type, cell.created_at, now), 6),
        "layer": cell.layer,
        "tenant_id": cell.tenant_id,
        "source_agent": cell.source_agent,
        "origin_node": cell.origin_node,
        "project": cell.project,
        "scene_id": cell.scene_id,
        "session_id": cell.session_id,
        "source_ref": cell.source_ref,
        "metadata": cell.metadata,
        "created_at": cell.created_at,
        "embedding_space": cell.embedding_space,
        "forgotten_at": forgotten_at,
        # node.lifecycle: active, superseded (by superseded_by), stale (its file changed), forgotten
        "status": status_of(forgotten_at, cell.superseded_by, cell.stale_at),
        "superseded_by": cell.superseded_by,
        "supersedes": list(supersedes_of(cell.metadata)),
        "stale_reason": cell.stale_reason,
        "provenance": {
            "origin_node": cell.origin_node,
            "source_agent": cell.source_agent,
            "hops": cell.hops,
            "signed": cell.signed,
            "local": cell.origin_node == node_id,
            "forgotten_by": cell.forgotten_by,
        },
    }


def inbox_dict(entry: InboxEntry) -> dict[str, Any]:
    """One inbox item: the cell delivered, and which beacon matched it how closely."""
    return {
        "inbox_id": entry.seq,
        "node_id": entry.node_id,
        "content": entry.content,
        "cell_type": entry.cell_type,
        "salience": entry.salience,
        "source_agent": entry.source_agent,
        "origin_node": entry.origin_node,
        "project": entry.project,
        "scene_id": entry.scene_id,
        "source_ref": entry.source_ref,
        "metadata": entry.metadata,
        "created_at": entry.created_at,
        "received_at": entry.received_at,
        "beacon_id": entry.beacon_id,
        "similarity": round(entry.similarity, 6),
        "score": round(entry.score, 6),
        "why": entry.reason,
        "hops": entry.hops,
        "forgotten": entry.forgotten_at is not None,
        # node.lifecycle: "match" (a beacon caught it), "supersedes" (it replaces ``related``, a
        # cell that reached this inbox) or "possible_conflict" (with ``related``, your own cell)
        "kind": entry.kind,
        "related": entry.related,
        "supersedes": list(supersedes_of(entry.metadata)),
        "superseded_by": entry.superseded_by,
    }


def scene_dict(scene: Scene) -> dict[str, Any]:
    """A scene as an agent sees it (its tenant is the caller's own, so it is left out)."""
    return {
        "scene_id": scene.scene_id,
        "project": scene.project,
        "title": scene.title,
        "session_id": scene.session_id,
        "agent_id": scene.agent_id,
        "origin_node": scene.origin_node,
        "created_at": scene.created_at,
        "ended_at": scene.ended_at,
        "consolidated_at": scene.consolidated_at,
        "summary_node_id": scene.summary_node_id,
    }


def agent_dict(agent: AgentRecord) -> dict[str, Any]:
    return {
        "agent_id": agent.agent_id,
        "tenant_id": agent.tenant_id,
        "name": agent.name,
        "projects": agent.projects,
        "created_at": agent.created_at,
        "revoked_at": agent.revoked_at,
    }
