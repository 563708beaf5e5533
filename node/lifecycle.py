"""Knowledge that stays true: a cell may replace others, may contradict another, may go stale.

Cells never change; what changes is what a node says about them. Three rules live here, and
every cell written (a local store, a cell from the mesh, an import) passes through them in
its own write job (:meth:`Lifecycle.after_write`), so a node applies them the same way
whichever order the mesh brings the cells in.

**Supersede.** A cell names the cells it replaces in ``metadata.supersedes`` (at most
:data:`MAX_SUPERSEDES` ids). The replaced cells stay (the history is the audit trail) with
``status: superseded`` and ``superseded_by``; recall, query, search, listings and the inbox
leave them out unless asked. Who may supersede what (:func:`supersede_refusal`): a cell may
replace a cell of its own tenant that its own author stored, or one in the same project as
itself (the tenant-wide cells, with no project, count as one project); never another
tenant's. The link is kept whichever cell arrives first and applied when both are here. When
several cells replace one, its successor is the one with the greatest id (ids are time-
ordered), so every node names the same successor whatever the order; a successor that is
forgotten takes its links with it (the cell it replaced falls back to another successor, or
is current again), because a node that got the tombstone first never learnt the link. Every agent whose inbox
received the replaced cell gets the successor as news (``kind: supersedes``).

**Possible conflicts.** A Decision or Constraint that is very close in meaning (cosine at
least ``conflict_cos``) to a current Decision or Constraint of the same project by another
agent, and does not replace it, puts a ``possible_conflict`` entry in the inbox of each of
the two authors that is an agent of this node, naming the other cell. Each node tells its
own agents, so both authors hear of it once both cells have reached their nodes.

**Staleness.** A cell whose ``source_ref`` is a file (``kind: file``, locator
``path[:line]``) records the file's SHA-256 when it is stored; ``hyphae validate`` hashes
the files again on this node and marks the cells whose file changed or vanished stale
(and clears the mark when the file is back as it was).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from mesh import lifecycle as mesh_lifecycle
from mesh.errors import CellRuleError
from mesh.lifecycle import MAX_SUPERSEDES, SUPERSEDES_KEY

from .cells import Cell, check_uuid
from .errors import InvalidArgument
from .store import Transaction
from .store.lifecycle import CellFacts, FileRef, LifecycleStore

__all__ = [
    "Lifecycle", "MAX_SUPERSEDES", "RULINGS", "check_supersedes", "supersedes_of", "supersede_refusal",
    "status_of", "file_digest", "locate_file", "revalidate",
]  # fmt: skip

log = logging.getLogger("hyphae.lifecycle")

RULINGS = ("Decision", "Constraint")  # the cell types a possible conflict is looked for between
_LINE_SUFFIX = re.compile(r":\d+(-\d+)?$")  # path:12 or path:12-40


def check_supersedes(metadata: dict[str, Any]) -> tuple[str, ...]:
    """The ids a stored cell's ``metadata.supersedes`` names, checked (local input): the mesh's
    rule for the list (:mod:`mesh.lifecycle`), and each entry a UUID, as the node's ids are."""
    if metadata.get(SUPERSEDES_KEY) is None:
        return ()
    field = f"metadata.{SUPERSEDES_KEY}"
    try:
        ids = mesh_lifecycle.check_supersedes(metadata[SUPERSEDES_KEY])
    except CellRuleError as exc:
        raise InvalidArgument(exc.message, field=field) from None
    if not ids:
        raise InvalidArgument(f"'{field}' must name at least one cell (node_id UUIDs)", field=field)
    return tuple(dict.fromkeys(check_uuid(item, field) for item in ids))


def supersedes_of(metadata: dict[str, Any], cell_id: str = "") -> tuple[str, ...]:
    """The ids a cell names as replaced, by the mesh's rule; a list that breaks it names none
    (the cell itself is still a good cell: what it says of others is simply not taken)."""
    return mesh_lifecycle.supersedes(metadata, cell_id) or ()


def supersede_refusal(new: CellFacts, old: CellFacts) -> str | None:
    """Why ``new`` may not replace ``old`` (None: it may). See the module docstring."""
    if old.tenant_id != new.tenant_id:
        return "a cell may only supersede cells of its own tenant"
    if old.node_id == new.node_id:
        return "a cell cannot supersede itself"
    if (old.source_agent, old.origin_node) == (new.source_agent, new.origin_node) or old.project == new.project:
        return None
    where = f"project {old.project!r}" if old.project is not None else "no project (tenant-wide)"
    return (
        f"cell {old.node_id} is in {where} and was stored by another agent: only its author, "
        "or a cell of the same project, may supersede it"
    )


def status_of(forgotten_at: int | None, superseded_by: str | None, stale_at: int | None) -> str:
    if forgotten_at is not None:
        return "forgotten"
    if superseded_by is not None:
        return "superseded"
    return "stale" if stale_at is not None else "active"


class Lifecycle:
    """The rules above, applied inside write jobs (the writer thread)."""

    def __init__(
        self, store: LifecycleStore, *, conflict_cos: float, next_received: Callable[[], int],
        superseded: Callable[[int, bool], None],
    ) -> None:  # fmt: skip
        self.store = store
        self.conflict_cos = conflict_cos
        self._next_received = next_received  # an inbox time after every earlier one
        self._superseded = superseded  # after commit: the catalogue's filter, (rowid, current again?)
        self.refused = 0  # supersede links the rule refused (counted; the cells themselves stand)

    def after_write(self, tx: Transaction, cell: Cell, rowid: int, now: int) -> None:
        """A live cell was just written as ``rowid``: apply the links it makes and the ones
        waiting for it, then look for a possible conflict."""
        replaced = supersedes_of(cell.metadata, cell.node_id)
        for old_id in replaced:
            self.store.link(tx, old_id, cell.node_id)
            if cell.node_id in self._settle(tx, old_id, now):
                self.refused += 1
        if self.store.successors(tx, cell.node_id):
            self.refused += len(self._settle(tx, cell.node_id, now))
        if cell.cell_type in RULINGS and cell.layer != "L2" and self.conflict_cos <= 1.0:
            self._look_for_conflicts(tx, cell, rowid, set(replaced), now)

    def forgotten(self, tx: Transaction, node_id: str, now: int) -> None:
        """A cell was forgotten (here, or by a tombstone): the cells it replaced fall back to
        their other successors, or are current again. A node that got the tombstone before the
        cell never learnt the link; for every order to end alike, the link dies with the cell."""
        for old_id in self.store.replaced_by(tx, node_id):
            self._settle(tx, old_id, now)

    def forgotten_row(self, tx: Transaction, rowid: int, now: int) -> None:
        """:meth:`forgotten`, for the erase path, which knows the row."""
        node_id = self.store.node_id_of(tx, rowid)
        if node_id is not None:
            self.forgotten(tx, node_id, now)

    def _settle(self, tx: Transaction, old_id: str, now: int) -> set[str]:
        """Give a held cell the successor its links name now: the greatest id among the live
        cells held here that replace it by the rule, or none. Returns the ids the rule refused."""
        old = self.store.facts(tx, old_id)
        if old is None:
            return set()
        refused: set[str] = set()
        live: list[CellFacts] = []
        for new_id in self.store.successors(tx, old_id):
            new = self.store.facts(tx, new_id)
            if new is None or new.forgotten_at is not None:
                continue
            refusal = supersede_refusal(new, old)
            if refusal is not None:
                refused.add(new_id)
                log.info("supersede link %s -> %s not applied: %s", old_id, new_id, refusal)
                continue
            live.append(new)
        successor = max(live, key=lambda c: c.node_id) if live else None
        successor_id = successor.node_id if successor is not None else None
        if successor_id == old.superseded_by:
            return refused
        self.store.mark_superseded(tx, old.rowid, successor_id, now if successor_id else None)
        tx.after_commit(lambda rowid=old.rowid, current=successor_id is None: self._superseded(rowid, current))
        if successor is not None and old.forgotten_at is None:
            self._tell_receivers(tx, old, successor)
        return refused

    def _tell_receivers(self, tx: Transaction, old: CellFacts, new: CellFacts) -> None:
        """Every agent whose inbox received ``old`` gets its successor as news."""
        for agent_id, beacon_id, similarity, score, hops in self.store.receivers(tx, old.rowid):
            if agent_id == new.source_agent:
                continue  # its own author knows
            self.store.tell(
                tx, agent_id, new.rowid, kind="supersedes", related=old.node_id,
                reason=f"supersedes {old.node_id}, which reached your inbox", beacon_id=beacon_id,
                similarity=similarity, score=score, received_at=self._next_received(), hops=hops,
            )  # fmt: skip

    def _look_for_conflicts(self, tx: Transaction, cell: Cell, rowid: int, replaced: set[str], now: int) -> None:
        rulings = [
            r for r in self.store.active_rulings(tx, cell.tenant_id, cell.project, cell.embedding_space)
            if r[0] != rowid and r[1] not in replaced and r[2] != cell.source_agent and r[4]
        ]  # fmt: skip
        if not rulings:
            return
        vectors = np.stack([np.frombuffer(r[4], dtype=np.float32) for r in rulings])
        if vectors.shape[1] != cell.embedding.shape[0]:
            return
        sims = vectors @ np.asarray(cell.embedding, dtype=np.float32)
        for i in np.flatnonzero(sims >= self.conflict_cos).tolist():
            other_rowid, other_id, other_agent, _, _ = rulings[i]
            similarity = float(sims[i])
            reason = f"possible conflict: very close in meaning to {{}} (cosine {similarity:.2f})"
            if self.store.local_author(tx, other_agent):
                self._tell_conflict(tx, other_agent, rowid, other_id, reason.format(f"your cell {other_id}"), similarity)
            if self.store.local_author(tx, cell.source_agent):
                self._tell_conflict(tx, cell.source_agent, other_rowid, cell.node_id,
                                    reason.format(f"your cell {cell.node_id}"), similarity)  # fmt: skip

    def _tell_conflict(self, tx: Transaction, agent_id: str, rowid: int, related: str, reason: str, sim: float) -> None:
        self.store.tell(
            tx, agent_id, rowid, kind="possible_conflict", related=related, reason=reason, beacon_id="",
            similarity=sim, score=sim, received_at=self._next_received(), hops=0,
        )  # fmt: skip


# -- staleness ---------------------------------------------------------------------------------


def locate_file(locator: str, roots: Iterable[Path]) -> Path | None:
    """The file a ``kind: file`` locator names (``path``, ``path:line`` or ``path:a-b``): an
    absolute path as it is, a relative one under the first root that has it; None if none does."""
    for text in dict.fromkeys((locator, _LINE_SUFFIX.sub("", locator))):
        path = Path(text).expanduser()
        for candidate in [path] if path.is_absolute() else [Path(root) / path for root in roots]:
            if candidate.is_file():
                return candidate
    return None


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def revalidate(refs: list[FileRef], roots: list[Path]) -> list[tuple[FileRef, str | None]]:
    """For each file-sourced cell, why it is stale now (None: its file is as it was). Blocking:
    run it on a worker thread. Cells stored without a hash (the file was not found then) are
    left out."""
    verdicts = []
    for ref in refs:
        if ref.source_hash is None:
            continue
        path = locate_file(ref.locator, roots)
        if path is None:
            verdicts.append((ref, "file vanished"))
            continue
        try:
            same = file_digest(path) == ref.source_hash
        except OSError as exc:
            verdicts.append((ref, f"file unreadable: {exc.strerror or exc}"))
            continue
        verdicts.append((ref, None if same else "file changed"))
    return verdicts
