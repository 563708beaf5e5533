"""The memory-service facade: the one place where identity is stamped, read scope is
enforced and input is validated. Every surface (MCP, REST, CLI) calls it.

Every operation takes the authenticated :class:`~node.principals.Principal` first;
``tenant_id`` and ``source_agent`` always come from it, never from arguments. Results
are JSON-ready dicts shaped as the MCP tool table of DESIGN §7 (:mod:`node.shaping`).
Errors are :mod:`node.errors` with stable reason codes.

The facade decides; others do. The store (:mod:`node.store`) holds every SQL statement,
and writes go through its group committer (durable when they return); a cell's write
path is :mod:`node.ingest`; the agents' admin is :mod:`node.agents`; what the mesh and
imports bring in enters through :mod:`node.inbound`; when recall reinforcement is written
is :mod:`node.reinforcement`. The embedder and long index work run in worker threads, so
the trio loop stays free.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import trio

from mesh.identity import NodeIdentity

from . import cells as v
from .admission_rule import AdmissionRule, CosineJudge, Judge
from .agents import AgentAdmin
from .config import NodeConfig
from .data_dir import require_database
from .delivery import Beacon, BeaconBook
from .embedding import Embedder, load_embedder
from .embedding.worker import EmbeddingWorker
from .errors import ConfigError, Forbidden, InvalidArgument, NotFound, Unauthenticated, Unavailable
from .files import load_node_key
from .forgetting import Forgetting, Scrubber
from .ids import new_id
from .inbound import InboundPort
from .ingest import CellWrites
from .interests import Interests
from .judges import BACKGROUND_CELLS, Background, CalibratedJudge, TermStats, load_background_notes
from .layers import LayerSet
from .lifecycle import check_supersedes, file_digest, locate_file, revalidate, supersede_refusal
from .metrics import NodeMetrics, observed
from .principals import Principal
from .ratelimit import RateLimiter
from .reinforcement import RecallReinforcement, Scheduler, ThreadScheduler
from .retrieval import candidate_depth, cosine_distances, fuse
from .sessions import Sessions
from .shaping import cell_dict
from .store import PendingWrite, Store, StoredCell, Transaction
from .store.lifecycle import CellFacts
from .store.lexical import match_expression
from .waking import Waker

__all__ = ["MemoryService", "MeshHooks", "Clock"]

log = logging.getLogger("hyphae.service")

Clock = Callable[[], int]
MAX_QUERY_BYTES = v.MAX_QUERY_BYTES
# Recall reinforcement counts are written at most this often (seconds). Each write is a
# commit (an fsync and ~0.4 ms of CPU): under a stream of recalls, one per interval rather
# than one per writer batch, which had the writer committing hundreds of times a second.
RECALL_HITS_INTERVAL = 0.25
MAX_PAGE = v.MAX_PAGE
DEFAULT_PAGE = v.DEFAULT_PAGE


class MeshHooks(Protocol):
    """What the facade tells the mesh after a local change is durable."""

    def cell_stored(self, cell: v.Cell) -> None: ...

    def cell_forgotten(self, node_id: str, tenant_id: str, forgotten_at: int) -> None: ...

    def beacon_placed(self, beacon: Beacon) -> None: ...

    def beacon_removed(self, beacon_id: str, tenant_id: str) -> None: ...

    def scene_changed(self, scene: dict[str, Any]) -> None: ...


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class MemoryService:
    """The node core behind every surface. Open with :meth:`open`, close with :meth:`aclose`.

    ``clock`` gives the time stamped on records (ms since the epoch); ``monotonic`` and
    ``scheduler`` pace the reinforcement writes (real time and threads unless given).
    """

    def __init__(
        self,
        config: NodeConfig,
        store: Store,
        layers: LayerSet,
        embedder: Embedder,
        identity: NodeIdentity,
        clock: Clock,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        scheduler: Scheduler | None = None,
    ) -> None:
        self.config = config
        self.storage = store
        self.db = store.db  # the group committer: its counters, and tests' direct writes
        self.layers = layers
        self.embedder = embedder
        self.identity = identity
        self.node_id = identity.node_id
        self.energy = config.energy
        self.clock = clock
        self.beacons = BeaconBook(config.energy, AdmissionRule(config.energy, self._judge(config, embedder)))
        self._embedding = EmbeddingWorker(embedder)
        self.rate_limiter = RateLimiter(config.rate_limit, config.rate_burst)  # per agent, in authenticate
        self.agents = AgentAdmin(store, config.tenant_id, clock, self._agent_revoked)
        self.mesh: MeshHooks | None = None  # set by the daemon when the node is in a team
        self.mesh_status: Callable[[], dict[str, Any]] | None = None
        self.metrics = NodeMetrics()  # a registry per service: several in one process never collide
        self.metrics.watch(self)
        self._query_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self.writes = CellWrites(store, layers, self.beacons, self.energy, clock, conflict_cos=config.conflict_cos)
        self.inbound = InboundPort(
            node_id=self.node_id, tenant_id=config.tenant_id, store=store, writes=self.writes, layers=layers,
            beacons=self.beacons, embedder=embedder, embed=self._embed, clock=clock,
        )  # fmt: skip
        # Read at construction, so a test may change the module's interval before it opens a node.
        self.reinforcement = RecallReinforcement(
            interval=RECALL_HITS_INTERVAL, clock=monotonic, scheduler=scheduler or ThreadScheduler(),
            drain=self._queue_recall_hits,
        )  # fmt: skip
        self.sessions = Sessions(
            node_id=self.node_id, store=store, writes=self.writes, embedder=embedder, embed=self._embed,
            energy=self.energy, clock=clock, mesh=lambda: self.mesh,
        )  # fmt: skip
        self.scrubber = Scrubber(store, layers)
        store.erasure.on_erased = self.scrubber.request  # the diff log's erasures are scrubbed too
        self.forgetting = Forgetting(
            node_id=self.node_id, tenant_id=config.tenant_id, store=store, layers=layers, scrubber=self.scrubber,
            clock=clock, mesh=lambda: self.mesh, forgotten=self.writes.lifecycle.forgotten_row,
        )  # fmt: skip
        self.inbound.erase_cell = self.forgetting.erase
        self.interests = Interests(
            node_id=self.node_id, store=store, book=self.beacons, embedder=embedder, embed=self._embed,
            default_threshold=config.default_beacon_threshold, clock=clock, mesh=lambda: self.mesh,
        )  # fmt: skip

    @classmethod
    async def open(
        cls,
        config: NodeConfig,
        *,
        embedder: Embedder | None = None,
        clock: Clock | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        index_options: dict[str, int] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        scheduler: Scheduler | None = None,
    ) -> "MemoryService":
        """Open the data dir: database, embedder, indexes (caught up or rebuilt), beacons."""
        require_database(config)  # a lost database beside the key is refused, never re-created
        identity = load_node_key(config.key_path)
        if embedder is None:
            try:
                embedder = await trio.to_thread.run_sync(load_embedder, config.embedder)
            except ValueError as exc:
                raise ConfigError(f"{config.home / 'config.toml'} [embedder]: {exc}") from None
        store = await trio.to_thread.run_sync(
            lambda: Store.open(config.db_path, group_commit_window=config.group_commit_ms / 1000)
        )
        layers = LayerSet(
            store.members,
            config.index_dir,
            embedder.dim,
            embedder.space,
            near_duplicate_cos=config.energy.near_duplicate_cos,
            index_options=index_options,
        )
        await trio.to_thread.run_sync(layers.open, progress)
        service = cls(
            config, store, layers, embedder, identity, clock or wall_clock_ms, monotonic=monotonic, scheduler=scheduler
        )
        layers.set_near_duplicate_handler(service._reinforce_near_duplicates)
        layers.start_indexer()
        await trio.to_thread.run_sync(service.scrubber.start)
        await trio.to_thread.run_sync(service._load_beacons)
        return service

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.close)

    def close(self) -> None:
        self._embedding.close()
        self.flush_recall_hits()
        self.scrubber.close()  # a scrub still owed runs first, while the database is open
        self.storage.close()  # drains queued writes first
        self.layers.close()  # indexes what is left and saves

    @staticmethod
    def _judge(config: NodeConfig, embedder: Embedder) -> Judge:
        if config.admission_judge == "cosine":
            return CosineJudge(config.energy)
        return CalibratedJudge(
            config.energy, Background(embedder.dim), TermStats(load_background_notes()),
            default_threshold=config.default_beacon_threshold, z_floor=config.admission_z_floor,
            lexical_weight=config.admission_lexical_weight,
        )  # fmt: skip

    def _load_beacons(self) -> None:
        self.beacons.add_many(self.storage.beacons.live_local(self.node_id))
        self.layers.catalog.supersede_many(self.storage.lifecycle.superseded_rowids())
        # The newest cells held are the judge's background again (node.judges).
        for content, embedding in self.storage.cells.recent(self.embedder.space, BACKGROUND_CELLS):
            self.beacons.admission.observe(np.frombuffer(embedding, dtype=np.float32), content)

    # -- principals ---------------------------------------------------------------

    async def authenticate(self, api_key: str | None) -> Principal:
        """Resolve an API key to its principal; revocation is seen on the next call.

        Every surface authenticates each call here, so this is also where the per-key
        rate limit is taken (:class:`~node.ratelimit.RateLimited` when it is exhausted).
        """
        if not api_key:
            raise Unauthenticated("no API key given: set HYPHAE_API_KEY (stdio) or the x-hyphae-key header")
        principal = self.agents.principal(api_key)
        self.rate_limiter.check(principal.agent_id, f"the API key of agent {principal.name!r}")
        return principal

    async def add_agent(self, name: str, projects: list[str] | None = None) -> tuple[Principal, str]:
        """Create an agent and its key; the key is returned once and stored only hashed."""
        return await self.agents.add(name, projects)

    async def list_agents(self) -> list[dict[str, Any]]:
        return await self.agents.all_agents()

    async def revoke_agent(self, name: str) -> dict[str, Any]:
        return await self.agents.revoke(name)

    def _agent_revoked(self, agent_id: str) -> None:
        """After a revocation commits: the agent's beacons stop matching here and are
        withdrawn from the team, and its rate-limit bucket goes."""
        retired = self.beacons.of_agent(agent_id, 0)
        self.beacons.remove_agent(agent_id)
        if self.mesh is not None:
            for beacon in retired:
                self.mesh.beacon_removed(beacon.beacon_id, beacon.tenant_id)
        self.rate_limiter.forget(agent_id)

    # -- embedding ----------------------------------------------------------------

    async def _embed(self, texts: list[str]) -> np.ndarray:
        return await self._embedding.embed(texts)

    async def _embed_query(self, text: str) -> np.ndarray:
        """Query vectors are cached: agents repeat their questions, and a query is no record."""
        vector = self._query_cache.get(text)
        if vector is None:
            vector = (await self._embed([text]))[0]
            self._query_cache[text] = vector
            if len(self._query_cache) > 2048:
                self._query_cache.popitem(last=False)
        else:
            self._query_cache.move_to_end(text)
        return vector

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Vectors for ``texts`` in this node's space, through the node's embedding worker
        (for callers with content to embed again, such as an import from another space)."""
        return await self._embed(texts)

    # -- store --------------------------------------------------------------------

    @observed("store")
    async def store(
        self,
        principal: Principal,
        *,
        content: Any = None,
        cell_type: Any = None,
        salience: Any = None,
        scene_id: Any = None,
        source_ref: Any = None,
        metadata: Any = None,
        idempotency_key: Any = None,
        project: Any = None,
    ) -> dict[str, Any]:
        """Store a memory cell for the principal; returns ``{node_id}``."""
        content = v.check_content(content)
        cell_type = v.check_cell_type(cell_type)
        salience = v.check_salience(salience)
        source_ref = v.check_source_ref(source_ref)
        metadata = v.check_metadata(metadata)
        idempotency_key = v.check_idempotency_key(idempotency_key)
        project = v.check_project(project)
        if scene_id is not None:
            scene_id = v.check_uuid(scene_id, "scene_id")
        replaced = check_supersedes(metadata)

        if idempotency_key is not None:
            original = self.storage.cells.idempotent(principal.agent_id, idempotency_key)
            if original is not None:
                return {"node_id": original}
        session_id, scene_id, project = self.sessions.placement(principal, scene_id, project)
        self._check_replaceable(principal, replaced, project)
        source_hash = await self._source_hash(source_ref)
        idempotency = (principal.agent_id, idempotency_key)

        made: list[tuple[v.Cell, PendingWrite]] = []

        def commit(vectors: np.ndarray, waker: Waker) -> None:
            # On the embedding thread: the cell goes straight to the writer, and this task
            # is woken once, when it is durable (one trip through the loop, not two).
            cell = v.Cell(
                node_id=new_id(),
                tenant_id=principal.tenant_id,
                source_agent=principal.agent_id,
                origin_node=self.node_id,
                content=content,
                cell_type=cell_type,
                salience=salience,
                created_at=self.clock(),
                layer="L0",
                embedding=vectors[0],
                embedding_space=self.embedder.space,
                scene_id=scene_id,
                session_id=session_id,
                project=project,
                source_ref=source_ref,
                metadata=metadata,
                source_hash=source_hash,
            )
            write = PendingWrite(lambda tx: self.writes.write(tx, cell, idempotency=idempotency), waker)
            made.append((cell, write))  # before the hand-over: the writer may wake us at once
            self.db.enqueue(write)

        await self._embedding.embed_then([content], commit)
        cell, write = made[0]
        node_id = write.outcome()
        if node_id == cell.node_id and self.mesh is not None:
            self.mesh.cell_stored(cell)
        return {"node_id": node_id}

    def _check_replaceable(self, principal: Principal, replaced: tuple[str, ...], project: str | None) -> None:
        """Every cell a store names in ``metadata.supersedes`` is one this key reads and the
        supersede rule (node.lifecycle) lets it replace; else nothing is stored."""
        field = "metadata.supersedes"
        for old_id in replaced:
            old = self.storage.cells.by_node_id(old_id)
            if old is None or old.tenant_id != principal.tenant_id:
                raise NotFound(f"metadata.supersedes names no cell of yours: {old_id}", field=field)
            if not principal.may_read_project(old.project):
                raise Forbidden(
                    f"cell {old_id} (metadata.supersedes) is in project {old.project!r}, outside this key's scope",
                    field=field,
                )  # fmt: skip
            if old.forgotten_at is not None:
                raise InvalidArgument(f"cell {old_id} (metadata.supersedes) was forgotten", field=field)
            new = CellFacts(0, "", principal.tenant_id, principal.agent_id, self.node_id, project, "", 0, None, None)
            facts = CellFacts(
                old.rowid, old.node_id, old.tenant_id, old.source_agent, old.origin_node, old.project,
                old.cell_type, old.created_at, old.superseded_by, old.forgotten_at,
            )  # fmt: skip
            refusal = supersede_refusal(new, facts)
            if refusal is not None:
                raise Forbidden(refusal, field=field)

    async def _source_hash(self, source_ref: dict[str, str] | None) -> str | None:
        """The SHA-256 of a ``kind: file`` source found on this machine (for ``validate``)."""
        if source_ref is None or source_ref["kind"] != "file":
            return None

        def digest() -> str | None:
            path = locate_file(source_ref["locator"], self.config.file_roots)
            try:
                return file_digest(path) if path is not None else None
            except OSError:
                return None

        return await trio.to_thread.run_sync(digest)

    def _promote(self, tx: Transaction, rowid: int) -> None:
        self.writes.promote(tx, rowid)

    # -- recall / query / search --------------------------------------------------

    @observed("recall")
    async def recall(
        self, principal: Principal, *, query: Any = None, k: Any = None, cell_types: Any = None, project: Any = None,
        include_superseded: Any = False,
    ) -> dict[str, Any]:  # fmt: skip
        """The k nearest cells to a query at L0: ``{results: [{node_id, distance}]}``."""
        hits = await self._nearest(principal, query, "L0", k, cell_types, project, include_superseded)
        self.reinforcement.count([rowid for rowid, _ in hits[: self.energy.promote_recall_rank]])
        return {"results": [{"node_id": self.layers.catalog.node_id(r), "distance": d} for r, d in hits]}

    @observed("query")
    async def query(
        self, principal: Principal, *, query: Any = None, layer: Any = None, k: Any = None, cell_types: Any = None,
        project: Any = None, include_superseded: Any = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Like recall, against an explicit layer (L0, L1 or L2)."""
        layer = v.check_layer(layer)
        hits = await self._nearest(principal, query, layer, k, cell_types, project, include_superseded)
        return {"results": [{"node_id": self.layers.catalog.node_id(r), "distance": d} for r, d in hits]}

    @observed("search")
    async def search(
        self, principal: Principal, *, query: Any = None, layer: Any = "L0", k: Any = None, cell_types: Any = None,
        project: Any = None, include_superseded: Any = False,
    ) -> dict[str, Any]:  # fmt: skip
        """Recall with content: full cells with their distances (REST and CLI)."""
        layer = v.check_layer(layer)
        hits = await self._nearest(principal, query, layer, k, cell_types, project, include_superseded)
        if layer == "L0":
            self.reinforcement.count([rowid for rowid, _ in hits[: self.energy.promote_recall_rank]])
        cells = self.storage.cells.by_rowids([rowid for rowid, _ in hits])
        results = []
        for rowid, distance in hits:
            if rowid in cells:
                results.append({**self._cell_dict(cells[rowid]), "distance": distance})
        return {"results": results}

    async def _nearest(
        self, principal, query, layer, k, cell_types, project, include_superseded=False
    ) -> list[tuple[int, float]]:
        query = v.check_text(query, "query", max_chars=MAX_QUERY_BYTES)
        include_superseded = v.check_bool(include_superseded, "include_superseded")
        k = v.check_int(k, "k", low=1, high=100, default=10)
        cell_types = v.check_cell_types(cell_types)
        project = v.check_project(project)
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not read project {project!r}", field="project")
        vector = await self._embed_query(query)
        allowed = self.layers.catalog.mask_for(
            principal.tenant_id, principal.projects, cell_types, only_project=project,
            include_superseded=include_superseded,
        )  # fmt: skip
        expression = match_expression(query, stopwords=True) if self.config.hybrid_recall else None
        depth = k if expression is None else candidate_depth(k)
        dense = [(rowid, max(0.0, float(d))) for rowid, d in self.layers.search(layer, vector, depth, allowed)]
        if expression is None:
            return dense
        lexical = self.storage.lexical.search(
            expression, tenant_id=principal.tenant_id, layer=layer, space=self.embedder.space,
            projects=principal.projects, cell_types=cell_types, only_project=project, limit=depth,
            weighed=match_expression(query, stopwords=False),
        )  # fmt: skip
        if lexical:
            # The same scope mask as the dense side, over what SQL already scoped: one rule, applied twice.
            keep = allowed(np.array([rowid for rowid, _ in lexical], dtype=np.int64))
            lexical = [hit for hit, ok in zip(lexical, keep) if ok]

        def distances_of(rowids: list[int]) -> dict[int, float]:
            return cosine_distances(vector, self.storage.cells.vectors(rowids))

        return fuse(dense, lexical, k, distances_of, lexical_weight=self.config.lexical_weight)

    # -- reinforcement ------------------------------------------------------------

    def flush_recall_hits(self) -> None:
        """Queue the gathered reinforcement counts now (also at close, and by tests that read them)."""
        self.reinforcement.flush()

    def _queue_recall_hits(self) -> None:
        self._submit_quietly(self._write_recall_hits)

    def _write_recall_hits(self, tx: Transaction) -> None:
        """The drain job: write the gathered counts; a cell that reached the threshold is promoted."""
        for rowid, count in sorted(self.reinforcement.take().items()):
            if self.storage.cells.add_recall_hits(tx, rowid, count) >= self.energy.promote_recall_hits:
                self.writes.promote(tx, rowid)

    def _reinforce_near_duplicates(self, pairs: list[tuple[int, int, float]]) -> None:
        """A near-duplicate from another agent reinforces the earlier cell into L1 (indexer thread)."""
        earlier = sorted({old for new, old, _ in pairs if self.layers.catalog.same_tenant_other_agent(new, old)})
        if earlier:
            self._submit_quietly(lambda tx: [self.writes.promote(tx, rowid) for rowid in earlier])

    def _submit_quietly(self, job: Callable[[Transaction], Any]) -> None:
        """Bookkeeping writes nobody waits for; lost only if the node is shutting down."""
        try:
            self.db.submit(job)
        except Unavailable:
            log.info("skipped a bookkeeping write during shutdown")

    # -- cells --------------------------------------------------------------------

    def _cell_dict(self, cell: StoredCell) -> dict[str, Any]:
        return cell_dict(cell, now=self.clock(), energy=self.energy, node_id=self.node_id)

    def _cell_in_scope(self, principal: Principal, node_id: Any) -> StoredCell:
        node_id = v.check_uuid(node_id, "node_id")
        cell = self.storage.cells.by_node_id(node_id)
        if cell is None or cell.tenant_id != principal.tenant_id:
            raise NotFound(f"no cell {node_id}", field="node_id")
        if not principal.may_read_project(cell.project):
            raise Forbidden(f"cell {node_id} is in project {cell.project!r}, outside this key's scope", field="node_id")
        return cell

    async def get_cell(self, principal: Principal, *, node_id: Any) -> dict[str, Any]:
        """Hydrate one cell with its provenance."""
        return self._cell_dict(self._cell_in_scope(principal, node_id))

    async def forget(self, principal: Principal, *, node_id: Any) -> dict[str, Any]:
        """Turn the principal's own cell into a tombstone: content and vector erased from every
        file, the record kept (node.forgetting)."""
        return await self.forgetting.forget_own(principal, self._cell_in_scope(principal, node_id))

    async def admin_forget(self, node_ids: Any) -> dict[str, Any]:
        """The data dir's owner forgets cells of any agent of this node (never another tenant's,
        never one another node originated: that one is forgotten at its origin)."""
        if not isinstance(node_ids, list) or not node_ids:
            raise InvalidArgument("'node_ids' must be a non-empty list of cell ids", field="node_ids")
        return await self.forgetting.forget_as_admin([v.check_uuid(i, "node_ids") for i in node_ids])

    async def forgettable(self, *, agent: Any = None, project: Any = None) -> dict[str, Any]:
        """What a bulk forget by agent name and/or project would take (nothing is forgotten)."""
        agent_id = None
        if agent is not None:
            if not isinstance(agent, str) or not agent:
                raise InvalidArgument("'agent' must be an agent's name", field="agent")
            named = {a["name"]: a["agent_id"] for a in await self.agents.all_agents()}
            if agent not in named:
                raise NotFound(f"no agent named {agent!r} on this node (`hyphae agent list`)", field="agent")
            agent_id = named[agent]
        if project is not None and (not isinstance(project, str) or not project):
            raise InvalidArgument("'project' must be a project name", field="project")
        return self.forgetting.matching(agent_id, project)

    async def list_cells(
        self, principal: Principal, *, limit: Any = None, cursor: Any = None, include_superseded: Any = False
    ) -> dict[str, Any]:
        """The newest cells in the key's read scope, newest first (tombstones too, marked; superseded
        ones only when asked); ``cursor`` is the ``next_cursor`` of the page before."""
        limit = v.check_int(limit, "limit", low=1, high=MAX_PAGE, default=DEFAULT_PAGE)
        include_superseded = v.check_bool(include_superseded, "include_superseded")
        # ASCII digits only (str.isdigit also takes '²'), and no more than a rowid holds.
        if cursor is not None and (
            not isinstance(cursor, str) or not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 18
        ):
            raise InvalidArgument("'cursor' must be the next_cursor of an earlier page", field="cursor")
        before = int(cursor) if cursor is not None else 2**63 - 1
        cells = self.storage.cells.page(
            principal.tenant_id, principal.projects, before, limit, include_superseded=include_superseded
        )
        next_cursor = str(cells[-1].rowid) if len(cells) == limit else None
        return {"cells": [self._cell_dict(cell) for cell in cells], "next_cursor": next_cursor}

    # -- sessions and scenes (node.sessions) ---------------------------------------

    async def start_session(self, principal: Principal, *, project: Any = None, title: Any = None) -> dict[str, Any]:
        """Open a session (and its scene) in a project; stores default to them until it ends."""
        return await self.sessions.start(principal, project=project, title=title)

    async def end_session(self, principal: Principal, *, session_id: Any = None) -> dict[str, Any]:
        """Close a session and its scene. Ending it again answers the same."""
        return await self.sessions.end(principal, session_id=session_id)

    async def get_scene(self, principal: Principal, *, scene_id: Any) -> dict[str, Any]:
        """One scene with the ids of its cells."""
        return await self.sessions.get_scene(principal, scene_id=scene_id)

    async def list_scenes(
        self, principal: Principal, *, project: Any = None, limit: Any = None, cursor: Any = None
    ) -> dict[str, Any]:
        """Scenes in the principal's read scope, newest first, a page at a time."""
        return await self.sessions.list_scenes(principal, project=project, limit=limit, cursor=cursor)

    async def consolidate_scene(self, principal: Principal, *, scene_id: Any) -> dict[str, Any]:
        """Write an extractive summary of a scene as one L2 cell (REST and CLI only)."""
        return await self.sessions.consolidate(principal, scene_id=scene_id)

    # -- beacons and the inbox (node.interests) -------------------------------------

    async def place_beacon(
        self,
        principal: Principal,
        *,
        query: Any = None,
        threshold: Any = None,
        cell_types: Any = None,
        project: Any = None,
        min_salience: Any = None,
        ttl_seconds: Any = None,
    ) -> dict[str, Any]:
        """Place a standing interest; matching cells stored by others land in the inbox."""
        return await self.interests.place_beacon(
            principal, query=query, threshold=threshold, cell_types=cell_types, project=project,
            min_salience=min_salience, ttl_seconds=ttl_seconds,
        )  # fmt: skip

    async def list_beacons(self, principal: Principal) -> dict[str, Any]:
        """The principal's live beacons."""
        return await self.interests.list_beacons(principal)

    async def remove_beacon(self, principal: Principal, *, beacon_id: Any) -> dict[str, Any]:
        return await self.interests.remove_beacon(principal, beacon_id=beacon_id)

    async def inbox(
        self, principal: Principal, *, since: Any = None, limit: Any = None, include_superseded: Any = False
    ) -> dict[str, Any]:
        """Diffs received after ``since`` (ms or RFC 3339), oldest first; reading changes nothing."""
        return await self.interests.inbox(principal, since=since, limit=limit, include_superseded=include_superseded)

    async def pull_inbox(
        self, principal: Principal, *, limit: Any = None, include_superseded: Any = False
    ) -> dict[str, Any]:
        """The next page after the server-kept cursor, which advances; concurrent pulls never overlap."""
        return await self.interests.pull_inbox(principal, limit=limit, include_superseded=include_superseded)

    async def node_inbox(self, *, since: Any = None, limit: Any = None) -> dict[str, Any]:
        """Every agent's inbox on this node, merged in arrival order (the data dir owner's view)."""
        return await self.interests.node_inbox(since=since, limit=limit)

    # -- what arrives from elsewhere (node.inbound) -----------------------------------

    def cell_record(self, node_id: str) -> v.Cell:
        """A stored cell as the immutable record (for re-announcing it to the mesh)."""
        return self.inbound.cell_record(node_id)

    def live_local_beacons(self) -> list[Beacon]:
        """What the mesh must advertise for this node (replayed when the mesh starts)."""
        return self.inbound.live_local_beacons()

    async def ingest_remote(self, cell: v.Cell, *, re_embed: bool) -> str | None:
        """Store a cell that arrived over the mesh (provenance kept); None if it was known."""
        stored = await self.inbound.store_cells([cell], re_embed=[re_embed])
        return stored[0] if stored else None

    async def ingest_remote_many(self, cells: list[v.Cell], *, re_embed: list[bool]) -> list[str]:
        """Store the cells of one mesh batch as one write job; the ids that were new."""
        return await self.inbound.store_cells(cells, re_embed=re_embed)

    async def import_cells(self, cells: list[v.Cell]) -> int:
        """Store cells read from an export file in one transaction; how many were new."""
        return await self.inbound.import_cells(cells)

    async def import_beacons(self, beacons: list[tuple[Beacon, int | None]]) -> int:
        """Store beacons read from an export file in one transaction; how many were new."""
        return await self.inbound.import_beacons(beacons)

    async def apply_tombstone(self, node_id: str, origin_node: str, forgotten_at: int) -> bool:
        """A cell forgotten by its author elsewhere becomes a tombstone here too."""
        return await self.inbound.apply_tombstone(node_id, origin_node, forgotten_at)

    async def apply_scene(self, scene: dict[str, Any], origin_node: str) -> None:
        """Record a teammate's scene so get_scene and list_scenes can show it."""
        await self.inbound.apply_scene(scene, origin_node)

    # -- lifecycle (node.lifecycle) -------------------------------------------------

    async def validate_sources(self, *, project: Any = None) -> dict[str, Any]:
        """Hash again the files that this node's cells name as their source (``kind: file``) and
        mark the cells whose file changed or vanished stale (a file back as it was clears it).
        The data dir owner's operation: the files are this machine's."""
        project = v.check_project(project)
        refs = self.storage.lifecycle.file_refs(self.config.tenant_id, project, self.node_id)
        verdicts = await trio.to_thread.run_sync(revalidate, refs, list(self.config.file_roots))
        now = self.clock()
        lifecycle = self.storage.lifecycle
        stale: list[dict[str, str]] = []
        fresh: list[str] = []

        def job(tx: Transaction) -> None:
            for ref, why in verdicts:
                if why is not None:
                    stale.append({"node_id": ref.node_id, "locator": ref.locator, "reason": why})
                    lifecycle.mark_stale(tx, ref.rowid, ref.stale_at or now, why)
                elif ref.stale_at is not None:
                    fresh.append(ref.node_id)
                    lifecycle.mark_stale(tx, ref.rowid, None, None)

        await self.db.write(job)
        return {"checked": len(verdicts), "stale": stale, "fresh_again": fresh, "not_hashed": len(refs) - len(verdicts)}

    # -- node ---------------------------------------------------------------------

    def queue_depths(self) -> dict[str, int]:
        """Work accepted and not yet done: committed rows the indexes lack, embedding requests waiting."""
        return {"index_backlog": self.layers.backlog(), "embed_queue": self._embedding._queue.qsize()}

    async def stats(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "tenant_id": self.config.tenant_id,
            "cells": self.storage.cells.live_count(),
            "layers": self.layers.sizes(),
            "index_backlog": self.layers.backlog(),  # committed rows HNSW has not taken yet
            "embedding_space": self.embedder.space,
            "write_batches": self.db.batches,
            "write_jobs": self.db.jobs,
        }
