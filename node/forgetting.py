"""Forgetting: a cell's content and vector gone from every file of the data dir, not hidden.

Who may forget: the agent that stored a cell (its author), or the owner of the data dir
with the admin token, for any cell of the node's tenant that this node originated. A cell
that came from another node is forgotten only by its origin, whose signed tombstone then
reaches every holder (the mesh drops one signed by anybody else); here it is refused with
the node to ask.

How: one write job turns the row into a tombstone (:meth:`~node.store.cells.CellStore.erase`:
content, vector, metadata and the lexical entry go); after it commits the vector leaves the
layer indexes, overwritten with zeros before it is marked deleted (:mod:`node.index`), and
the mesh is told, whose tombstone erases the diff log's copy (:mod:`node.store.diff_log`).
What the files still hold afterwards is the :class:`Scrubber`'s: a thread that, once a burst
of forgets has settled, merges the lexical index (FTS5 keeps removed words in old segments),
saves the layer indexes (the files on disk still hold the vectors until then) and truncates
the WAL with a checkpoint (:mod:`node.store.erasure`). Nothing of this runs on the trio loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import Forbidden, InvalidArgument, NotFound
from .layers import LayerSet
from .principals import Principal
from .store import Store, StoredCell, Transaction

__all__ = ["MAX_FORGET_IDS", "Forgetting", "Scrubber"]

log = logging.getLogger("hyphae.forget")

MAX_FORGET_IDS = 10_000  # ids in one admin request (a bulk forget pages through them)
_JOB_CELLS = 500  # cells erased per write job


class Scrubber:
    """One background thread that scrubs the files after forgets (see the module docstring).

    ``request`` (any thread, after a commit that erased something) wakes it; it waits until
    no new request came for ``settle_interval`` seconds, so a bulk forget costs one pass,
    then runs :meth:`scrub`. A pass that could not finish (a reader held the WAL, a save
    failed) is tried again after ``retry_interval``, doubled after each failure up to
    ``max_retry_interval``: a checkpoint that waits for a reader holds writers back meanwhile,
    so a long reader (an export's snapshot) must not meet one every few seconds.
    """

    def __init__(
        self, store: Store, layers: LayerSet, *, settle_interval: float = 0.2, retry_interval: float = 2.0,
        max_retry_interval: float = 60.0,
    ) -> None:  # fmt: skip
        self.store = store
        self.layers = layers
        self.settle_interval = settle_interval
        self.retry_interval = retry_interval
        self.max_retry_interval = max_retry_interval
        self._cond = threading.Condition()
        self._requests = 0  # requests made so far
        self._scrubbed = 0  # requests covered by a finished pass
        self._closing = False
        self._thread: threading.Thread | None = None
        self.passes = 0
        self.failed_passes = 0
        self.last_pass_seconds = 0.0
        self.secure_delete = False  # FTS5 erases in place (SQLite 3.44+)

    def start(self) -> None:
        """Set FTS5's secure-delete where SQLite has it, erase what an earlier version left in
        the diff log, and start the thread (one pass at once when anything was forgotten)."""
        lexical, erasure = self.store.lexical, self.store.erasure
        self.secure_delete = self.store.db.write_sync(lexical.enable_secure_delete)
        swept = self.store.db.write_sync(erasure.sweep_log)
        self._thread = threading.Thread(target=self._run, name="hyphae-scrubber", daemon=True)
        self._thread.start()
        if swept or erasure.forgotten_count():
            self.request()

    def request(self) -> None:
        with self._cond:
            self._requests += 1
            self._cond.notify_all()

    def pending(self) -> bool:
        with self._cond:
            return self._scrubbed < self._requests

    def wait(self, timeout: float | None = None) -> bool:
        """Block until every request made so far is covered by a finished pass (tests, admin)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            target = self._requests
            while self._scrubbed < target:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """Stop the thread; a pass still owed runs first (before the database closes)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        delay = self.retry_interval
        while True:
            with self._cond:
                while self._scrubbed >= self._requests and not self._closing:
                    self._cond.wait()
                if self._scrubbed >= self._requests:
                    return  # closing, nothing owed
                seen = -1
                while seen != self._requests and not self._closing:  # let a burst settle
                    seen = self._requests
                    self._cond.wait(self.settle_interval)
                covered = self._requests
            ok = self._pass()
            with self._cond:
                if ok:
                    self._scrubbed = max(self._scrubbed, covered)
                    self._cond.notify_all()
                    delay = self.retry_interval
                elif not self._closing:
                    self._cond.wait(delay)
                    delay = min(2 * delay, self.max_retry_interval)
                else:
                    return

    def _pass(self) -> bool:
        try:
            return self.scrub()
        except Exception:  # the data is erased in its rows; the files are retried
            self.failed_passes += 1
            log.exception("scrubbing after forgets failed; retrying")
            return False

    def scrub(self) -> bool:
        """Merge the lexical index, save the layer indexes, truncate the WAL (blocking). False
        when the indexes could not be saved or the WAL not truncated: the caller tries again."""
        started = time.monotonic()
        self.store.db.write_sync(self.store.lexical.purge)
        saved = self.layers.save()
        truncated = self.store.erasure.checkpoint()
        self.passes += 1
        self.last_pass_seconds = time.monotonic() - started
        if not (saved and truncated):
            self.failed_passes += 1
            log.info("scrub after forgets incomplete (indexes saved: %s, WAL truncated: %s); retrying", saved, truncated)
        return saved and truncated


class Forgetting:
    """The forget operations of the facade: the author's, and the data dir owner's (admin)."""

    def __init__(
        self,
        *,
        node_id: str,
        tenant_id: str,
        store: Store,
        layers: LayerSet,
        scrubber: Scrubber,
        clock: Callable[[], int],
        mesh: Callable[[], Any],
        forgotten: Callable[[Transaction, int, int], None] | None = None,
    ) -> None:
        self.node_id = node_id
        self.tenant_id = tenant_id
        self._store = store
        self._cells = store.cells
        self._layers = layers
        self._scrubber = scrubber
        self._clock = clock
        self._mesh = mesh  # the facade's MeshHooks when the node is in a team, else None
        self._forgotten = forgotten  # node.lifecycle: what the cell replaced is current again

    # -- the one erase path ------------------------------------------------------------------

    def erase(self, tx: Transaction, rowid: int, forgotten_at: int, forgotten_by: str | None = None) -> None:
        """Make a stored cell a tombstone in this job; after commit its vector leaves the layer
        indexes and the scrubber is woken. Every forget (local, admin, from the mesh) comes here."""
        self._cells.erase(tx, rowid, forgotten_at, forgotten_by)
        if self._forgotten is not None:
            self._forgotten(tx, rowid, forgotten_at)
        tx.after_commit(lambda: self._layers.remove(rowid))
        tx.after_commit(self._scrubber.request)

    async def _erase_cells(self, cells: list[StoredCell], forgotten_by: str | None) -> list[tuple[str, int]]:
        """Erase ``cells`` (stored here, live when read), a few hundred per write job; the
        ``(node_id, forgotten_at)`` of each, told to the mesh when this forget made it."""
        done: list[tuple[str, int]] = []
        for start in range(0, len(cells), _JOB_CELLS):
            chunk = cells[start : start + _JOB_CELLS]
            now = self._clock()

            def job(tx: Transaction, chunk: list[StoredCell] = chunk, now: int = now) -> list[tuple[str, int, bool]]:
                out = []
                for cell in chunk:
                    earlier = self._cells.forgotten_at(tx, cell.rowid)
                    if earlier is not None:
                        out.append((cell.node_id, earlier, False))
                        continue
                    self.erase(tx, cell.rowid, now, forgotten_by or cell.source_agent)
                    if self._mesh() is None:  # no engine to put a tombstone: erase the log's copy here
                        from .store.diff_log import erase_cell_diffs

                        erase_cell_diffs(tx, cell.node_id, cell.origin_node)
                    out.append((cell.node_id, now, True))
                return out

            for node_id, forgotten_at, fresh in await self._store.db.write(job):
                done.append((node_id, forgotten_at))
                mesh = self._mesh()
                if fresh and mesh is not None:
                    mesh.cell_forgotten(node_id, self.tenant_id, forgotten_at)
        return done

    # -- the author ----------------------------------------------------------------------------

    async def forget_own(self, principal: Principal, cell: StoredCell) -> dict[str, Any]:
        """The principal's own cell (already scope-checked by the facade) becomes a tombstone."""
        if cell.source_agent != principal.agent_id:
            raise Forbidden(
                f"cell {cell.node_id} was stored by another agent; only the agent that stored a cell may forget "
                "it (the data dir's owner can, with `hyphae forget --by-agent` or the admin API)",
                field="node_id",
            )
        [(node_id, forgotten_at)] = await self._erase_cells([cell], principal.agent_id)
        return {"node_id": node_id, "forgotten_at": forgotten_at}

    # -- the data dir's owner (admin) ------------------------------------------------------------

    def _own_cell(self, node_id: str) -> StoredCell:
        """A cell of this node's tenant that this node originated, or the error saying why not."""
        cell = self._cells.by_node_id(node_id)
        if cell is None or cell.tenant_id != self.tenant_id:
            raise NotFound(f"no cell {node_id}", field="node_id")
        if cell.origin_node != self.node_id:
            raise Forbidden(
                f"cell {node_id} came from node {cell.origin_node}; only its origin can forget it for the team: "
                "forget it there",
                field="node_id",
            )
        return cell

    async def forget_as_admin(self, node_ids: list[str]) -> dict[str, Any]:
        """Forget cells of any agent of this node (each checked first: an unknown or remote id
        forgets nothing, and is named in ``refused`` with why)."""
        if len(node_ids) > MAX_FORGET_IDS:
            raise InvalidArgument(f"at most {MAX_FORGET_IDS} ids per request, got {len(node_ids)}", field="node_ids")
        cells, refused = [], []
        for node_id in dict.fromkeys(node_ids):
            try:
                cells.append(self._own_cell(node_id))
            except (NotFound, Forbidden) as exc:
                refused.append({"node_id": node_id, "reason": exc.reason, "message": exc.message})
        done = await self._erase_cells(cells, None)
        return {
            "forgotten": [{"node_id": node_id, "forgotten_at": at} for node_id, at in done],
            "count": len(done),
            "refused": refused,
        }

    def matching(self, agent_id: str | None, project: str | None) -> dict[str, Any]:
        """What a bulk forget by agent and/or project would take: this node's live cells that
        match (ids, oldest first) and how many matching cells came from other nodes."""
        if agent_id is None and project is None:
            raise InvalidArgument("a bulk forget needs an agent, a project or both", field="agent")
        own, remote = self._cells.forgettable(self.tenant_id, self.node_id, agent_id=agent_id, project=project)
        return {"node_ids": own, "count": len(own), "from_other_nodes": remote}

    def scrubbed(self, timeout: float | None = None) -> bool:
        """Wait until the files no longer hold what was forgotten so far (blocking)."""
        return self._scrubber.wait(timeout)
