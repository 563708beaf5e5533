"""The memory-service facade: the one place where identity is stamped, read scope is
enforced and input is validated. Every surface (MCP, REST, CLI) calls it.

Every operation takes the authenticated :class:`~node.principals.Principal` first;
``tenant_id`` and ``source_agent`` always come from it, never from arguments. Results
are JSON-ready dicts shaped as the MCP tool table of DESIGN §7. Errors are
:mod:`node.errors` with stable reason codes.

Writes go through the database's group committer (durable when they return); the
embedder and long index work run in worker threads, so the trio loop stays free.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import random
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
import trio

from mesh.identity import NodeIdentity

from . import cells as v
from .config import NodeConfig
from .store.database import Database, PendingWrite, Transaction
from .delivery import Beacon, BeaconBook, CellFacts
from .embedding import Embedder, load_embedder
from .embedding.worker import EmbeddingWorker
from .errors import ConfigError, Conflict, Forbidden, InvalidArgument, NotFound, Unauthenticated, Unavailable
from .layers import LayerSet
from .metrics import NodeMetrics, observed
from .principals import Principal, PrincipalCache, hash_api_key, new_api_key
from .ratelimit import RateLimiter
from .waking import Waker
from .scenes import consolidate, encode_cursor, decode_cursor, scene_row_to_dict, SCENE_COLUMNS

__all__ = ["MemoryService", "MeshHooks", "Clock"]

log = logging.getLogger("hyphae.service")

Clock = Callable[[], int]
MAX_QUERY_BYTES = 8 * 1024
# Recall reinforcement counts are written at most this often (seconds). Each write is a
# commit (an fsync and ~0.4 ms of CPU): under a stream of recalls, one per interval rather
# than one per writer batch, which had the writer committing hundreds of times a second.
RECALL_HITS_INTERVAL = 0.25
MAX_PAGE = 500
DEFAULT_PAGE = 50
MAX_TTL_SECONDS = 10 * 365 * 86_400
_AGENT_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")

_CELL_COLUMNS = (
    "rowid, node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, energy0, "
    "scene_id, session_id, project, source_ref, metadata, created_at, layer, embedding_space, hops, "
    "signature IS NOT NULL, forgotten_at, forgotten_by"
)


class MeshHooks(Protocol):
    """What the facade tells the mesh after a local change is durable."""

    def cell_stored(self, cell: v.Cell) -> None: ...

    def cell_forgotten(self, node_id: str, tenant_id: str, forgotten_at: int) -> None: ...

    def beacon_placed(self, beacon: Beacon) -> None: ...

    def beacon_removed(self, beacon_id: str, tenant_id: str) -> None: ...

    def scene_changed(self, scene: dict[str, Any]) -> None: ...


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


_ids = random.Random(int.from_bytes(os.urandom(16), "big"))


# The version (7) and variant (RFC 9562) bits, set in the 80 bits under the timestamp.
_UUID7_CLEAR = ~((0xF << 76) | (0x3 << 62))
_UUID7_SET = (0x7 << 76) | (0x2 << 62)


def new_id() -> str:
    """A time-ordered (version 7) UUID: 48 bits of Unix milliseconds, then random bits.

    Time order is for the database: the unique index on ``node_id`` then grows at its end,
    so a commit of 128 stores writes a few index pages to the WAL rather than one random
    page per id (random ids: 4.5 KB of WAL per stored cell at 10k cells, these: 3.0). Ids
    are names, not secrets: a seeded PRNG is enough, and os.urandom per id costs more than
    the rest of a store on some VMs. Formatted by hand: ``str(uuid.UUID(int=...))`` costs
    ten times the random bits.
    """
    bits = (time.time_ns() // 1_000_000) << 80 | (_ids.getrandbits(80) & _UUID7_CLEAR | _UUID7_SET)
    h = f"{bits:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


class MemoryService:
    """The node core behind every surface. Open with :meth:`open`, close with :meth:`aclose`."""

    def __init__(
        self,
        config: NodeConfig,
        db: Database,
        layers: LayerSet,
        embedder: Embedder,
        identity: NodeIdentity,
        clock: Clock,
    ) -> None:
        self.config = config
        self.db = db
        self.layers = layers
        self.embedder = embedder
        self.identity = identity
        self.node_id = identity.node_id
        self.energy = config.energy
        self.clock = clock
        self.beacons = BeaconBook(config.energy)
        self._embedding = EmbeddingWorker(embedder)
        self.rate_limiter = RateLimiter(config.rate_limit, config.rate_burst)  # per agent, in authenticate
        self._principals = PrincipalCache()  # emptied by every revocation
        self.mesh: MeshHooks | None = None  # set by the daemon when the node is in a team
        self.mesh_status: Callable[[], dict[str, Any]] | None = None
        self.metrics = NodeMetrics()  # a registry per service: several in one process never collide
        self.metrics.watch(self)
        self._query_cache: OrderedDict[str, np.ndarray] = OrderedDict()
        # Top-3 recall hits not yet written: recalls add here, one writer job drains them all.
        self._recall_hits: Counter[int] = Counter()
        self._recall_hits_lock = threading.Lock()
        self._recall_hits_drained_at = 0.0  # time.monotonic() of the last drain
        self._recall_hits_timer: threading.Timer | None = None  # a drain scheduled for later
        # Open sessions by agent: sessions are local, so this mirror of the table is exact.
        self._open_sessions: dict[str, tuple[str, str, str]] = {}
        for session_id, scene_id, project, agent_id in db.query(
            "SELECT session_id, scene_id, project, agent_id FROM sessions WHERE ended_at IS NULL ORDER BY started_at"
        ):
            self._open_sessions[agent_id] = (session_id, scene_id, project)
        (last,) = db.query_one("SELECT COALESCE(MAX(received_at), 0) FROM inbox") or (0,)
        self._last_received = last  # touched only by the writer thread

    @classmethod
    async def open(
        cls,
        config: NodeConfig,
        *,
        embedder: Embedder | None = None,
        clock: Clock | None = None,
        progress: Callable[[str, int, int], None] | None = None,
        index_options: dict[str, int] | None = None,
    ) -> "MemoryService":
        """Open the data dir: database, embedder, indexes (caught up or rebuilt), beacons."""
        identity = NodeIdentity.load(config.key_path)
        if embedder is None:
            try:
                embedder = await trio.to_thread.run_sync(load_embedder, config.embedder)
            except ValueError as exc:
                raise ConfigError(f"{config.home / 'config.toml'} [embedder]: {exc}") from None
        db = await trio.to_thread.run_sync(
            lambda: Database(config.db_path, group_commit_window=config.group_commit_ms / 1000)
        )
        layers = LayerSet(
            db,
            config.index_dir,
            embedder.dim,
            embedder.space,
            near_duplicate_cos=config.energy.near_duplicate_cos,
            index_options=index_options,
        )
        await trio.to_thread.run_sync(layers.open, progress)
        service = cls(config, db, layers, embedder, identity, clock or wall_clock_ms)
        layers.set_near_duplicate_handler(service._reinforce_near_duplicates)
        layers.start_indexer()
        await trio.to_thread.run_sync(service._load_beacons)
        return service

    async def aclose(self) -> None:
        await trio.to_thread.run_sync(self.close)

    def close(self) -> None:
        self._embedding.close()
        self.flush_recall_hits()
        self.db.close()  # drains queued writes first
        self.layers.close()  # indexes what is left and saves

    def _load_beacons(self) -> None:
        rows = self.db.query(
            f"SELECT {_BEACON_COLUMNS}, p.projects FROM beacons b JOIN principals p ON p.agent_id = b.agent_id "
            "WHERE b.removed_at IS NULL AND p.revoked_at IS NULL AND b.origin_node = ?",
            (self.node_id,),
        )
        self.beacons.add_many(_beacon_from_row(r[:-1], tuple(json.loads(r[-1]))) for r in rows)

    # -- principals ---------------------------------------------------------------

    async def authenticate(self, api_key: str | None) -> Principal:
        """Resolve an API key to its principal; revocation is seen on the next call.

        Every surface authenticates each call here, so this is also where the per-key
        rate limit is taken (:class:`~node.ratelimit.RateLimited` when it is exhausted).
        """
        if not api_key:
            raise Unauthenticated("no API key given: set HYPHAE_API_KEY (stdio) or the x-hyphae-key header")
        key_hash = hash_api_key(api_key)
        principal = self._principals.get(key_hash)
        if principal is None:
            generation = self._principals.generation
            row = self.db.query_one(
                "SELECT tenant_id, agent_id, name, projects FROM principals WHERE key_hash = ? AND revoked_at IS NULL",
                (key_hash,),
            )
            if row is None:
                raise Unauthenticated("the API key is not valid (unknown or revoked)")
            principal = Principal(row[0], row[1], row[2], tuple(json.loads(row[3])))
            self._principals.put(key_hash, principal, generation)
        self.rate_limiter.check(principal.agent_id, f"the API key of agent {principal.name!r}")
        return principal

    async def add_agent(self, name: str, projects: list[str] | None = None) -> tuple[Principal, str]:
        """Create an agent and its key; the key is returned once and stored only hashed."""
        if not isinstance(name, str) or not 1 <= len(name) <= 64 or set(name) - _AGENT_NAME_CHARS:
            raise InvalidArgument("agent name must be 1-64 letters, digits, '.', '_' or '-'", field="name")
        projects = sorted({v.check_text(p, "project") for p in projects or ()})
        api_key = new_api_key()
        principal = Principal(self.config.tenant_id, new_id(), name, tuple(projects))
        now = self.clock()

        def job(tx: Transaction) -> None:
            if tx.execute("SELECT 1 FROM principals WHERE name = ?", (name,)).fetchone():
                raise Conflict(f"an agent named {name!r} already exists", field="name")
            tx.execute(
                "INSERT INTO principals (agent_id, tenant_id, name, key_hash, projects, created_at) VALUES (?,?,?,?,?,?)",
                (principal.agent_id, principal.tenant_id, name, hash_api_key(api_key), json.dumps(projects), now),
            )

        await self.db.write(job)
        return principal, api_key

    async def list_agents(self) -> list[dict[str, Any]]:
        rows = self.db.query(
            "SELECT agent_id, tenant_id, name, projects, created_at, revoked_at FROM principals ORDER BY created_at, name"
        )
        return [
            {
                "agent_id": r[0],
                "tenant_id": r[1],
                "name": r[2],
                "projects": json.loads(r[3]),
                "created_at": r[4],
                "revoked_at": r[5],
            }
            for r in rows
        ]

    async def revoke_agent(self, name: str) -> dict[str, Any]:
        now = self.clock()

        def job(tx: Transaction) -> dict[str, Any]:
            row = tx.execute("SELECT agent_id, revoked_at FROM principals WHERE name = ?", (name,)).fetchone()
            if row is None:
                raise NotFound(f"no agent named {name!r}", field="name")
            agent_id, revoked_at = row
            if revoked_at is None:
                tx.execute("UPDATE principals SET revoked_at = ? WHERE agent_id = ?", (now, agent_id))
                tx.after_commit(self._principals.invalidate)  # before the revocation is acknowledged
                tx.after_commit(lambda: self._retire_beacons_of(agent_id))
                tx.after_commit(lambda: self.rate_limiter.forget(agent_id))
                revoked_at = now
            return {"name": name, "agent_id": agent_id, "revoked_at": revoked_at}

        return await self.db.write(job)

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

    # -- store / ingest -----------------------------------------------------------

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

        if idempotency_key is not None:
            original = self._idempotent_hit(principal, idempotency_key)
            if original is not None:
                return {"node_id": original}
        session_id, scene_id, project = self._placement(principal, scene_id, project)
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
            )
            write = PendingWrite(lambda tx: self._ingest(tx, cell, idempotency=idempotency), waker)
            made.append((cell, write))  # before the hand-over: the writer may wake us at once
            self.db.enqueue(write)

        await self._embedding.embed_then([content], commit)
        cell, write = made[0]
        node_id = write.outcome()
        if node_id == cell.node_id and self.mesh is not None:
            self.mesh.cell_stored(cell)
        return {"node_id": node_id}

    def _idempotent_hit(self, principal: Principal, key: str) -> str | None:
        row = self.db.query_one(
            "SELECT node_id FROM idempotency WHERE agent_id = ? AND key = ?", (principal.agent_id, key)
        )
        return row[0] if row else None

    def _placement(
        self, principal: Principal, scene_id: str | None, project: str | None
    ) -> tuple[str | None, str | None, str | None]:
        """Where a new cell belongs: its session, scene and project."""
        if scene_id is not None:
            scene = self._scene_in_scope(principal, scene_id)
            if project is not None and project != scene["project"]:
                raise InvalidArgument(
                    f"scene {scene_id} belongs to project {scene['project']!r}, not {project!r}", field="project"
                )
            return scene["session_id"], scene_id, scene["project"]
        session = self._open_sessions.get(principal.agent_id)
        if session is not None and project in (None, session[2]):
            return session
        if project is None:
            if len(principal.projects) == 1:
                project = principal.projects[0]
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not write to project {project!r}", field="project")
        return None, None, project

    def _ingest(
        self,
        tx: Transaction,
        cell: v.Cell,
        *,
        idempotency: tuple[str, str | None] = ("", None),
    ) -> str:
        """Write one cell with its layer memberships and inbox deliveries (writer thread).

        Local stores and cells from the mesh take this same path.
        """
        agent_id, key = idempotency
        if key is not None:
            row = tx.execute("SELECT node_id FROM idempotency WHERE agent_id = ? AND key = ?", (agent_id, key)).fetchone()
            if row is not None:
                return row[0]
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        layer = cell.layer
        if layer == "L0" and self.energy.promoted_on_arrival(e0):
            layer = "L1"
        now = self.clock()
        rowid = tx.execute(
            "INSERT INTO cells (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, energy0, "
            "scene_id, session_id, project, source_ref, metadata, created_at, stored_at, layer, embedding, "
            "embedding_space, hops, signature) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                cell.node_id, cell.tenant_id, cell.source_agent, cell.origin_node, cell.content, cell.cell_type,
                cell.salience, e0, cell.scene_id, cell.session_id, cell.project,
                json.dumps(cell.source_ref) if cell.source_ref else None,
                json.dumps(cell.metadata, separators=(",", ":")) if cell.metadata else "{}", cell.created_at, now, layer,
                np.asarray(cell.embedding, dtype=np.float32).tobytes(), cell.embedding_space, cell.hops, cell.signature,
            ),
        ).lastrowid
        if key is not None:
            tx.execute(
                "INSERT INTO idempotency (agent_id, key, node_id, created_at) VALUES (?,?,?,?)",
                (agent_id, key, cell.node_id, now),
            )
        tx.after_commit_gathered(
            self._rows_committed,
            ((rowid, cell.node_id, cell.tenant_id, cell.project, cell.cell_type, cell.source_agent, True), None),
        )
        layers = ["L2"] if layer == "L2" else ["L0", "L1"] if layer == "L1" else ["L0"]
        for name in layers:
            self._join_layer(tx, name, rowid, cell.embedding)
        facts = CellFacts(
            cell.tenant_id, cell.source_agent, cell.cell_type, cell.salience, cell.project,
            cell.embedding, cell.embedding_space,
        )
        for delivery in self.beacons.match(facts, now):
            received_at = max(now, self._last_received + 1)
            inserted = tx.execute(
                "INSERT OR IGNORE INTO inbox (agent_id, cell_rowid, beacon_id, similarity, received_at, hops) "
                "VALUES (?,?,?,?,?,?)",
                (delivery.agent_id, rowid, delivery.beacon_id, delivery.similarity, received_at, cell.hops),
            ).rowcount
            if inserted:
                self._last_received = received_at
        return cell.node_id

    def _join_layer(self, tx: Transaction, layer: str, rowid: int, vector: np.ndarray) -> None:
        seq = tx.execute(
            "INSERT OR IGNORE INTO layer_members (layer, cell_rowid) VALUES (?, ?)", (layer, rowid)
        ).lastrowid
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

    def _promote(self, tx: Transaction, rowid: int) -> None:
        row = tx.execute("SELECT layer, embedding, forgotten_at FROM cells WHERE rowid = ?", (rowid,)).fetchone()
        if row is None or row[0] != "L0" or row[2] is not None:
            return
        tx.execute("UPDATE cells SET layer = 'L1' WHERE rowid = ?", (rowid,))
        self._join_layer(tx, "L1", rowid, np.frombuffer(row[1], dtype=np.float32))

    # -- recall / query / search --------------------------------------------------

    @observed("recall")
    async def recall(self, principal: Principal, *, query: Any = None, k: Any = None, cell_types: Any = None, project: Any = None) -> dict[str, Any]:
        """The k nearest cells to a query at L0: ``{results: [{node_id, distance}]}``."""
        hits = await self._nearest(principal, query, "L0", k, cell_types, project)
        self._reinforce([rowid for rowid, _ in hits[: self.energy.promote_recall_rank]])
        return {"results": [{"node_id": self.layers.catalog.node_id(r), "distance": d} for r, d in hits]}

    @observed("query")
    async def query(self, principal: Principal, *, query: Any = None, layer: Any = None, k: Any = None, cell_types: Any = None, project: Any = None) -> dict[str, Any]:
        """Like recall, against an explicit layer (L0, L1 or L2)."""
        layer = v.check_layer(layer)
        hits = await self._nearest(principal, query, layer, k, cell_types, project)
        return {"results": [{"node_id": self.layers.catalog.node_id(r), "distance": d} for r, d in hits]}

    @observed("search")
    async def search(self, principal: Principal, *, query: Any = None, layer: Any = "L0", k: Any = None, cell_types: Any = None, project: Any = None) -> dict[str, Any]:
        """Recall with content: full cells with their distances (REST and CLI)."""
        layer = v.check_layer(layer)
        hits = await self._nearest(principal, query, layer, k, cell_types, project)
        if layer == "L0":
            self._reinforce([rowid for rowid, _ in hits[: self.energy.promote_recall_rank]])
        rows = self._cell_rows([rowid for rowid, _ in hits])
        results = []
        for rowid, distance in hits:
            if rowid in rows:
                results.append({**self._cell_dict(rows[rowid]), "distance": distance})
        return {"results": results}

    async def _nearest(self, principal, query, layer, k, cell_types, project) -> list[tuple[int, float]]:
        query = v.check_text(query, "query", max_chars=MAX_QUERY_BYTES)
        k = v.check_int(k, "k", low=1, high=100, default=10)
        cell_types = v.check_cell_types(cell_types)
        project = v.check_project(project)
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not read project {project!r}", field="project")
        vector = await self._embed_query(query)
        allowed = self.layers.catalog.mask_for(
            principal.tenant_id, principal.projects, cell_types, only_project=project
        )
        hits = self.layers.search(layer, vector, k, allowed)
        return [(rowid, max(0.0, float(distance))) for rowid, distance in hits]

    def _reinforce(self, rowids: list[int]) -> None:
        """Count top-ranked recalls; the third promotes a cell to L1. Not awaited.

        Counts gather in memory and one queued writer job drains whatever has gathered by the
        time it runs; a drain within RECALL_HITS_INTERVAL of the last one waits out the rest
        of it, so a stream of recalls costs a few commits a second, not one per writer batch.
        Counts not yet written when the node crashes are lost (they are bookkeeping, not an
        acknowledged write); a clean close writes them.
        """
        if not rowids:
            return
        with self._recall_hits_lock:
            first = not self._recall_hits  # otherwise a drain is queued or scheduled already
            self._recall_hits.update(rowids)
            if not first:
                return
            wait = self._recall_hits_drained_at + RECALL_HITS_INTERVAL - time.monotonic()
            if wait > 0:  # drained moments ago: gather until the interval is up
                self._recall_hits_timer = threading.Timer(wait, self.flush_recall_hits)
                self._recall_hits_timer.daemon = True
                self._recall_hits_timer.start()
                return
        self._submit_quietly(self._write_recall_hits)

    def flush_recall_hits(self) -> None:
        """Queue the gathered reinforcement counts now (the scheduled drain's job; also
        called at close, and by tests that read the counts)."""
        with self._recall_hits_lock:
            if self._recall_hits_timer is not None:
                self._recall_hits_timer.cancel()
                self._recall_hits_timer = None
            if not self._recall_hits:
                return
        self._submit_quietly(self._write_recall_hits)

    def _write_recall_hits(self, tx: Transaction) -> None:
        with self._recall_hits_lock:
            hits, self._recall_hits = self._recall_hits, Counter()
            self._recall_hits_drained_at = time.monotonic()
        for rowid, count in sorted(hits.items()):
            tx.execute("UPDATE cells SET recall_hits = recall_hits + ? WHERE rowid = ?", (count, rowid))
            (total,) = tx.execute("SELECT recall_hits FROM cells WHERE rowid = ?", (rowid,)).fetchone()
            if total >= self.energy.promote_recall_hits:
                self._promote(tx, rowid)

    def _reinforce_near_duplicates(self, pairs: list[tuple[int, int, float]]) -> None:
        """A near-duplicate from another agent reinforces the earlier cell into L1 (indexer thread)."""
        earlier = sorted({old for new, old, _ in pairs if self.layers.catalog.same_tenant_other_agent(new, old)})
        if earlier:
            self._submit_quietly(lambda tx: [self._promote(tx, rowid) for rowid in earlier])

    def _submit_quietly(self, job: Callable[[Transaction], Any]) -> None:
        """Bookkeeping writes nobody waits for; lost only if the node is shutting down."""
        try:
            self.db.submit(job)
        except Unavailable:
            log.info("skipped a bookkeeping write during shutdown")

    # -- cells --------------------------------------------------------------------

    def _cell_rows(self, rowids: list[int]) -> dict[int, tuple]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self.db.query(f"SELECT {_CELL_COLUMNS} FROM cells WHERE rowid IN ({marks})", rowids)
        return {r[0]: r for r in rows}

    def _cell_dict(self, row: tuple) -> dict[str, Any]:
        (_, node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, e0, scene_id, session_id,
         project, source_ref, metadata, created_at, layer, space, hops, signed, forgotten_at, forgotten_by) = row
        now = self.clock()
        return {
            "node_id": node_id,
            "content": content,
            "cell_type": cell_type,
            "salience": salience,
            "energy": 0.0 if forgotten_at else round(self.energy.at(e0, cell_type, created_at, now), 6),
            "layer": layer,
            "tenant_id": tenant_id,
            "source_agent": source_agent,
            "origin_node": origin_node,
            "project": project,
            "scene_id": scene_id,
            "session_id": session_id,
            "source_ref": json.loads(source_ref) if source_ref else None,
            "metadata": json.loads(metadata),
            "created_at": created_at,
            "embedding_space": space,
            "forgotten_at": forgotten_at,
            "provenance": {
                "origin_node": origin_node,
                "source_agent": source_agent,
                "hops": hops,
                "signed": bool(signed),
                "local": origin_node == self.node_id,
                "forgotten_by": forgotten_by,
            },
        }

    def _cell_in_scope(self, principal: Principal, node_id: Any) -> tuple:
        node_id = v.check_uuid(node_id, "node_id")
        row = self.db.query_one(f"SELECT {_CELL_COLUMNS} FROM cells WHERE node_id = ?", (node_id,))
        if row is None or row[2] != principal.tenant_id:
            raise NotFound(f"no cell {node_id}", field="node_id")
        if not principal.may_read_project(row[11]):
            raise Forbidden(f"cell {node_id} is in project {row[11]!r}, outside this key's scope", field="node_id")
        return row

    async def get_cell(self, principal: Principal, *, node_id: Any) -> dict[str, Any]:
        """Hydrate one cell with its provenance."""
        return self._cell_dict(self._cell_in_scope(principal, node_id))

    async def forget(self, principal: Principal, *, node_id: Any) -> dict[str, Any]:
        """Turn the principal's own cell into a tombstone: content and vector erased, record kept."""
        row = self._cell_in_scope(principal, node_id)
        rowid, node_id = row[0], row[1]
        if row[3] != principal.agent_id:
            raise Forbidden("only the agent that stored a cell may forget it", field="node_id")
        now = self.clock()

        def job(tx: Transaction) -> int:
            (forgotten_at,) = tx.execute("SELECT forgotten_at FROM cells WHERE rowid = ?", (rowid,)).fetchone()
            if forgotten_at is not None:
                return forgotten_at
            tx.execute(
                "UPDATE cells SET content = '', embedding = x'', forgotten_at = ?, forgotten_by = ? WHERE rowid = ?",
                (now, principal.agent_id, rowid),
            )
            tx.after_commit(lambda: self.layers.remove(rowid))
            return now

        forgotten_at = await self.db.write(job)
        if self.mesh is not None and forgotten_at == now:
            self.mesh.cell_forgotten(node_id, principal.tenant_id, forgotten_at)
        return {"node_id": node_id, "forgotten_at": forgotten_at}

    # -- sessions and scenes -----------------------------------------------------

    async def start_session(self, principal: Principal, *, project: Any = None, title: Any = None) -> dict[str, Any]:
        """Open a session (and its scene) in a project; stores default to them until it ends."""
        project = v.check_text(project, "project")
        title = None if title is None else v.check_text(title, "title", max_chars=500)
        if not principal.may_read_project(project):
            raise Forbidden(f"this key may not work in project {project!r}", field="project")
        session_id, scene_id, now = new_id(), new_id(), self.clock()

        def job(tx: Transaction) -> None:
            tx.after_commit(lambda: self._open_sessions.__setitem__(principal.agent_id, (session_id, scene_id, project)))
            tx.execute(
                f"INSERT INTO scenes ({SCENE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,NULL,NULL,NULL)",
                (scene_id, principal.tenant_id, principal.agent_id, project, title, session_id, self.node_id, now),
            )
            tx.execute(
                "INSERT INTO sessions (session_id, tenant_id, agent_id, project, title, scene_id, started_at) "
                "VALUES (?,?,?,?,?,?,?)",
                (session_id, principal.tenant_id, principal.agent_id, project, title, scene_id, now),
            )

        await self.db.write(job)
        self._scene_changed(scene_id)
        return {"session_id": session_id, "scene_id": scene_id}

    async def end_session(self, principal: Principal, *, session_id: Any = None) -> dict[str, Any]:
        """Close a session and its scene. Ending it again answers the same."""
        session_id = v.check_uuid(session_id, "session_id")
        row = self.db.query_one(
            "SELECT tenant_id, agent_id, scene_id FROM sessions WHERE session_id = ?", (session_id,)
        )
        if row is None or row[0] != principal.tenant_id:
            raise NotFound(f"no session {session_id}", field="session_id")
        if row[1] != principal.agent_id:
            raise Forbidden("only the agent that started a session may end it", field="session_id")
        scene_id, now = row[2], self.clock()

        def job(tx: Transaction) -> dict[str, Any]:
            (ended_at,) = tx.execute("SELECT ended_at FROM sessions WHERE session_id = ?", (session_id,)).fetchone()
            if ended_at is None:
                ended_at = now
                tx.execute("UPDATE sessions SET ended_at = ? WHERE session_id = ?", (now, session_id))
                tx.after_commit(lambda: self._forget_open_session(principal.agent_id, session_id))
                tx.execute("UPDATE scenes SET ended_at = ? WHERE scene_id = ? AND ended_at IS NULL", (now, scene_id))
            (count,) = tx.execute("SELECT COUNT(*) FROM cells WHERE session_id = ? AND layer != 'L2'", (session_id,)).fetchone()
            return {"session_id": session_id, "ended_at": ended_at, "cell_count": count}

        result = await self.db.write(job)
        if result["ended_at"] == now:
            self._scene_changed(scene_id)
        return result

    def _forget_open_session(self, agent_id: str, session_id: str) -> None:
        if self._open_sessions.get(agent_id, ("",))[0] == session_id:
            row = self.db.reader().execute(
                "SELECT session_id, scene_id, project FROM sessions WHERE agent_id = ? AND ended_at IS NULL "
                "ORDER BY started_at DESC LIMIT 1",
                (agent_id,),
            ).fetchone()
            if row is None:
                del self._open_sessions[agent_id]
            else:
                self._open_sessions[agent_id] = tuple(row)

    def _scene_in_scope(self, principal: Principal, scene_id: str) -> dict[str, Any]:
        row = self.db.query_one(f"SELECT {SCENE_COLUMNS} FROM scenes WHERE scene_id = ?", (scene_id,))
        if row is None or row[1] != principal.tenant_id:
            raise NotFound(f"no scene {scene_id}", field="scene_id")
        scene = scene_row_to_dict(row)
        if not principal.may_read_project(scene["project"]):
            raise Forbidden(f"scene {scene_id} is outside this key's projects", field="scene_id")
        return scene

    async def get_scene(self, principal: Principal, *, scene_id: Any) -> dict[str, Any]:
        """One scene with the ids of its cells."""
        scene = self._scene_in_scope(principal, v.check_uuid(scene_id, "scene_id"))
        ids = [r[0] for r in self.db.query(
            "SELECT node_id FROM cells WHERE scene_id = ? AND layer != 'L2' ORDER BY rowid", (scene["scene_id"],)
        )]
        return {**scene, "cell_count": len(ids), "cell_ids": ids}

    async def list_scenes(self, principal: Principal, *, project: Any = None, limit: Any = None, cursor: Any = None) -> dict[str, Any]:
        """Scenes in the principal's read scope, newest first, a page at a time."""
        project = v.check_project(project)
        limit = v.check_int(limit, "limit", low=1, high=MAX_PAGE, default=DEFAULT_PAGE)
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not read project {project!r}", field="project")
        where, params = ["s.tenant_id = ?"], [principal.tenant_id]
        if project is not None:
            where.append("s.project = ?")
            params.append(project)
        elif principal.projects:
            where.append(f"(s.project IS NULL OR s.project IN ({','.join('?' * len(principal.projects))}))")
            params.extend(principal.projects)
        if cursor is not None:
            created_at, scene_id = decode_cursor(cursor)
            where.append("(s.created_at < ? OR (s.created_at = ? AND s.scene_id < ?))")
            params.extend([created_at, created_at, scene_id])
        columns = ", ".join(f"s.{c.strip()}" for c in SCENE_COLUMNS.split(","))
        rows = self.db.query(
            f"SELECT {columns}, (SELECT COUNT(*) FROM cells c WHERE c.scene_id = s.scene_id AND c.layer != 'L2') "
            f"FROM scenes s WHERE {' AND '.join(where)} ORDER BY s.created_at DESC, s.scene_id DESC LIMIT ?",
            [*params, limit + 1],
        )
        page = rows[:limit]
        scenes = [{**scene_row_to_dict(r[:-1]), "cell_count": r[-1]} for r in page]
        next_cursor = encode_cursor(page[-1][7], page[-1][0]) if len(rows) > limit else None
        return {"scenes": scenes, "next_cursor": next_cursor}

    async def consolidate_scene(self, principal: Principal, *, scene_id: Any) -> dict[str, Any]:
        """Write an extractive summary of a scene as one L2 cell (REST and CLI only)."""
        scene = self._scene_in_scope(principal, v.check_uuid(scene_id, "scene_id"))
        if scene["consolidated_at"] is not None:
            raise Conflict(
                f"scene {scene['scene_id']} was already consolidated into {scene['summary_node_id']}",
                field="scene_id",
                summary_node_id=scene["summary_node_id"],
            )
        rows = self.db.query(
            "SELECT node_id, content, cell_type, salience, energy0, created_at, embedding FROM cells "
            "WHERE scene_id = ? AND forgotten_at IS NULL AND layer != 'L2' AND embedding_space = ? ORDER BY rowid",
            (scene["scene_id"], self.embedder.space),
        )
        if not rows:
            raise Conflict(f"scene {scene['scene_id']} has no cells to consolidate", field="scene_id")
        summary = consolidate(rows, self.energy, self.clock(), dim=self.embedder.dim)
        vector = (await self._embed([summary.content]))[0]
        now = self.clock()
        cell = v.Cell(
            node_id=new_id(),
            tenant_id=principal.tenant_id,
            source_agent=principal.agent_id,
            origin_node=self.node_id,
            content=summary.content,
            cell_type=summary.cell_type,
            salience=summary.salience,
            created_at=now,
            layer="L2",
            embedding=vector,
            embedding_space=self.embedder.space,
            scene_id=scene["scene_id"],
            session_id=scene["session_id"],
            project=scene["project"],
            source_ref={"kind": "scene", "locator": scene["scene_id"]},
            metadata={"consolidates_scene": scene["scene_id"], "source_cells": summary.source_ids},
        )

        def job(tx: Transaction) -> str:
            (done,) = tx.execute("SELECT consolidated_at FROM scenes WHERE scene_id = ?", (scene["scene_id"],)).fetchone()
            if done is not None:
                raise Conflict(f"scene {scene['scene_id']} was already consolidated", field="scene_id")
            node_id = self._ingest(tx, cell)
            tx.execute(
                "UPDATE scenes SET consolidated_at = ?, summary_node_id = ? WHERE scene_id = ?",
                (now, node_id, scene["scene_id"]),
            )
            return node_id

        node_id = await self.db.write(job)
        if self.mesh is not None:
            self.mesh.cell_stored(cell)
        self._scene_changed(scene["scene_id"])
        return {
            "scene_id": scene["scene_id"],
            "node_id": node_id,
            "cell_count": len(summary.source_ids),
            "source_count": len(rows),
        }

    # -- beacons ------------------------------------------------------------------

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
        query = v.check_text(query, "query", max_chars=MAX_QUERY_BYTES)
        threshold = self.config.default_beacon_threshold if threshold is None else v.check_unit_interval(threshold, "threshold")
        cell_types = v.check_cell_types(cell_types)
        project = v.check_project(project)
        min_salience = None if min_salience is None else v.check_unit_interval(min_salience, "min_salience")
        ttl_seconds = None if ttl_seconds is None else v.check_int(ttl_seconds, "ttl_seconds", low=1, high=MAX_TTL_SECONDS)
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not read project {project!r}", field="project")
        vector = (await self._embed([query]))[0]
        now = self.clock()
        beacon = Beacon(
            beacon_id=new_id(),
            tenant_id=principal.tenant_id,
            agent_id=principal.agent_id,
            origin_node=self.node_id,
            query=query,
            threshold=threshold,
            embedding=vector,
            embedding_space=self.embedder.space,
            created_at=now,
            cell_types=cell_types,
            project=project,
            min_salience=min_salience,
            ttl_seconds=ttl_seconds,
            expires_at=None if ttl_seconds is None else now + ttl_seconds * 1000,
            owner_projects=principal.projects,
        )

        def job(tx: Transaction) -> None:
            tx.execute(
                f"INSERT INTO beacons ({_BEACON_COLUMNS.replace('b.', '')}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    beacon.beacon_id, beacon.tenant_id, beacon.agent_id, beacon.origin_node, beacon.query,
                    beacon.threshold, json.dumps(list(cell_types)) if cell_types else None, project, min_salience,
                    ttl_seconds, now, beacon.expires_at, vector.astype(np.float32).tobytes(), beacon.embedding_space,
                ),
            )
            tx.after_commit(lambda: self.beacons.add(beacon))

        await self.db.write(job)
        if self.mesh is not None:
            self.mesh.beacon_placed(beacon)
        return {"beacon_id": beacon.beacon_id}

    async def list_beacons(self, principal: Principal) -> dict[str, Any]:
        """The principal's live beacons."""
        beacons = sorted(self.beacons.of_agent(principal.agent_id, self.clock()), key=lambda b: b.created_at)
        return {"beacons": [b.public() for b in beacons]}

    async def remove_beacon(self, principal: Principal, *, beacon_id: Any) -> dict[str, Any]:
        beacon_id = v.check_uuid(beacon_id, "beacon_id")
        now = self.clock()

        def job(tx: Transaction) -> dict[str, Any]:
            row = tx.execute("SELECT agent_id, removed_at FROM beacons WHERE beacon_id = ?", (beacon_id,)).fetchone()
            if row is None or row[0] != principal.agent_id:
                raise NotFound(f"no beacon {beacon_id} of yours", field="beacon_id")
            removed_at = row[1]
            if removed_at is None:
                removed_at = now
                tx.execute("UPDATE beacons SET removed_at = ? WHERE beacon_id = ?", (now, beacon_id))
                tx.after_commit(lambda: self.beacons.remove(beacon_id))
            return {"beacon_id": beacon_id, "removed_at": removed_at}

        result = await self.db.write(job)
        if self.mesh is not None and result["removed_at"] == now:
            self.mesh.beacon_removed(beacon_id, principal.tenant_id)
        return result

    # -- inbox --------------------------------------------------------------------

    async def inbox(self, principal: Principal, *, since: Any = None, limit: Any = None) -> dict[str, Any]:
        """Diffs received after ``since`` (ms or RFC 3339), oldest first; reading changes nothing."""
        since = 0 if since is None else v.parse_time_ms(since, "since")
        limit = v.check_int(limit, "limit", low=1, high=MAX_PAGE, default=DEFAULT_PAGE)
        rows = self.db.query(
            f"SELECT {_INBOX_COLUMNS} FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid "
            "WHERE i.agent_id = ? AND i.received_at > ? ORDER BY i.received_at LIMIT ?",
            (principal.agent_id, since, limit),
        )
        diffs = [_diff_dict(r) for r in rows]
        return {"diffs": diffs, "next_since": diffs[-1]["received_at"] if diffs else since}

    async def pull_inbox(self, principal: Principal, *, limit: Any = None) -> dict[str, Any]:
        """The next page after the server-kept cursor, which advances; concurrent pulls never overlap."""
        limit = v.check_int(limit, "limit", low=1, high=MAX_PAGE, default=DEFAULT_PAGE)

        def job(tx: Transaction) -> dict[str, Any]:
            row = tx.execute("SELECT last_seq FROM pull_cursors WHERE agent_id = ?", (principal.agent_id,)).fetchone()
            cursor = row[0] if row else 0
            rows = tx.execute(
                f"SELECT {_INBOX_COLUMNS} FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid "
                "WHERE i.agent_id = ? AND i.seq > ? ORDER BY i.seq LIMIT ?",
                (principal.agent_id, cursor, limit),
            ).fetchall()
            if rows:
                cursor = rows[-1][0]
                tx.execute(
                    "INSERT INTO pull_cursors (agent_id, last_seq) VALUES (?, ?) "
                    "ON CONFLICT (agent_id) DO UPDATE SET last_seq = excluded.last_seq",
                    (principal.agent_id, cursor),
                )
            (remaining,) = tx.execute(
                "SELECT COUNT(*) FROM inbox WHERE agent_id = ? AND seq > ?", (principal.agent_id, cursor)
            ).fetchone()
            return {"diffs": [_diff_dict(r) for r in rows], "cursor": cursor, "remaining": remaining}

        return await self.db.write(job)

    # -- the mesh -----------------------------------------------------------------

    def _retire_beacons_of(self, agent_id: str) -> None:
        """A revoked agent's beacons stop matching here and are withdrawn from the team."""
        retired = self.beacons.of_agent(agent_id, 0)
        self.beacons.remove_agent(agent_id)
        if self.mesh is not None:
            for beacon in retired:
                self.mesh.beacon_removed(beacon.beacon_id, beacon.tenant_id)

    def _scene_changed(self, scene_id: str) -> None:
        if self.mesh is None:
            return
        row = self.db.query_one(f"SELECT {SCENE_COLUMNS} FROM scenes WHERE scene_id = ?", (scene_id,))
        if row is not None:
            self.mesh.scene_changed({**scene_row_to_dict(row), "tenant_id": row[1]})

    def cell_record(self, node_id: str) -> v.Cell:
        """A stored cell as the immutable record (for re-announcing it to the mesh)."""
        row = self.db.query_one(
            "SELECT node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, created_at, layer, "
            "embedding, embedding_space, scene_id, session_id, project, source_ref, metadata, hops, signature "
            "FROM cells WHERE node_id = ?",
            (node_id,),
        )
        if row is None:
            raise NotFound(f"no cell {node_id}", field="node_id")
        (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, created_at, layer, embedding,
         space, scene_id, session_id, project, source_ref, metadata, hops, signature) = row
        return v.Cell(
            node_id=node_id, tenant_id=tenant_id, source_agent=source_agent, origin_node=origin_node,
            content=content, cell_type=cell_type, salience=salience, created_at=created_at, layer=layer,
            embedding=np.frombuffer(embedding, dtype=np.float32), embedding_space=space, scene_id=scene_id,
            session_id=session_id, project=project, source_ref=json.loads(source_ref) if source_ref else None,
            metadata=json.loads(metadata), hops=hops, signature=signature,
        )  # fmt: skip

    def live_local_beacons(self) -> list[Beacon]:
        """What the mesh must advertise for this node (replayed when the mesh starts)."""
        return self.beacons.all_live(self.clock())

    async def ingest_remote(self, cell: v.Cell, *, re_embed: bool) -> str | None:
        """Store a cell that arrived over the mesh (provenance kept); None if it was known.

        Cells from another embedding space are embedded again here from their content,
        so one index never mixes spaces.
        """
        stored = await self.ingest_remote_many([cell], re_embed=[re_embed])
        return stored[0] if stored else None

    async def ingest_remote_many(self, cells: list[v.Cell], *, re_embed: list[bool]) -> list[str]:
        """Store the cells of one mesh batch as one write job; the ids that were new.

        One job, not one per cell: a batch of remote cells costs one future and one wake-up,
        and the known-cell check runs inside the job (a cell is checked before it is embedded
        again only when it needs that). If the job fails, each cell is tried alone, so one bad
        cell cannot hold back the others.
        """
        fresh: list[v.Cell] = []
        for cell, again in zip(cells, re_embed):
            if cell.tenant_id != self.config.tenant_id:
                log.warning("dropped a cell of another tenant (%s) from %s", cell.tenant_id, cell.origin_node)
                continue
            if again:
                if self.db.query_one("SELECT 1 FROM cells WHERE node_id = ?", (cell.node_id,)):
                    continue
                vector = (await self._embed([cell.content]))[0]
                cell = dataclasses.replace(cell, embedding=vector, embedding_space=self.embedder.space)
            fresh.append(cell)

        def ingest(batch: list[v.Cell]) -> Callable[[Transaction], list[str]]:
            def job(tx: Transaction) -> list[str]:
                return [
                    self._ingest(tx, cell) for cell in batch
                    if not tx.execute("SELECT 1 FROM cells WHERE node_id = ?", (cell.node_id,)).fetchone()
                ]  # fmt: skip

            return job

        if len(fresh) <= 1:
            return await self.db.write(ingest(fresh)) if fresh else []
        try:
            return await self.db.write(ingest(fresh))
        except Exception:
            log.exception("ingesting a batch of %d remote cells failed; trying them one by one", len(fresh))
        stored: list[str] = []
        for cell in fresh:
            try:
                stored.extend(await self.db.write(ingest([cell])))
            except Exception:
                log.exception("ingesting remote cell %s failed", cell.node_id)
        return stored

    async def import_cells(self, cells: list[v.Cell]) -> int:
        """Store cells read from an export file (``node.transfer``) in one transaction, with
        their provenance; returns how many were new. Known ids are skipped, so importing a
        file twice stores nothing the second time. A tombstone (``forgotten_at`` set) is
        recorded as one, with no content, vector or index entry. Nothing is gossiped."""

        def job(tx: Transaction) -> int:
            stored = 0
            for cell in cells:
                if tx.execute("SELECT 1 FROM cells WHERE node_id = ?", (cell.node_id,)).fetchone():
                    continue
                stored += 1
                if cell.forgotten_at is None:
                    self._ingest(tx, cell)
                    continue
                tx.execute(
                    "INSERT INTO cells (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, "
                    "energy0, scene_id, session_id, project, source_ref, metadata, created_at, stored_at, layer, "
                    "embedding, embedding_space, hops, signature, forgotten_at, forgotten_by) "
                    "VALUES (?,?,?,?,'',?,?,?,?,?,?,?,?,?,?,?,x'',?,?,?,?,?)",
                    (
                        cell.node_id, cell.tenant_id, cell.source_agent, cell.origin_node, cell.cell_type,
                        cell.salience, self.energy.initial(cell.salience, cell.cell_type), cell.scene_id,
                        cell.session_id, cell.project, json.dumps(cell.source_ref) if cell.source_ref else None,
                        json.dumps(cell.metadata, separators=(",", ":")), cell.created_at, self.clock(), cell.layer,
                        cell.embedding_space, cell.hops, cell.signature, cell.forgotten_at, cell.source_agent,
                    ),
                )  # fmt: skip
            return stored

        return await self.db.write(job)

    async def apply_tombstone(self, node_id: str, origin_node: str, forgotten_at: int) -> bool:
        """A cell forgotten by its author elsewhere becomes a tombstone here too."""

        def job(tx: Transaction) -> bool:
            row = tx.execute(
                "SELECT rowid, origin_node, forgotten_at FROM cells WHERE node_id = ?", (node_id,)
            ).fetchone()
            if row is None or row[1] != origin_node or row[2] is not None:
                return False
            tx.execute(
                "UPDATE cells SET content = '', embedding = x'', forgotten_at = ?, forgotten_by = source_agent "
                "WHERE rowid = ?",
                (forgotten_at, row[0]),
            )
            tx.after_commit(lambda: self.layers.remove(row[0]))
            return True

        return await self.db.write(job)

    async def apply_scene(self, scene: dict[str, Any], origin_node: str) -> None:
        """Record a teammate's scene so get_scene and list_scenes can show it."""
        if scene.get("tenant_id") != self.config.tenant_id or not scene.get("scene_id"):
            return
        values = (
            scene["scene_id"], scene["tenant_id"], scene.get("agent_id", ""), scene.get("project"),
            scene.get("title"), scene.get("session_id"), origin_node, int(scene.get("created_at") or 0),
            scene.get("ended_at"), scene.get("consolidated_at"), scene.get("summary_node_id"),
        )

        def job(tx: Transaction) -> None:
            tx.execute(
                f"INSERT INTO scenes ({SCENE_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?) "
                "ON CONFLICT (scene_id) DO UPDATE SET ended_at = excluded.ended_at, "
                "consolidated_at = excluded.consolidated_at, summary_node_id = excluded.summary_node_id "
                "WHERE scenes.origin_node = excluded.origin_node",
                values,
            )

        await self.db.write(job)

    # -- node ---------------------------------------------------------------------

    async def list_cells(self, principal: Principal, *, limit: Any = None, cursor: Any = None) -> dict[str, Any]:
        """The newest cells in the key's read scope, newest first (tombstones too, marked); ``cursor``
        is the ``next_cursor`` of the page before."""
        limit = v.check_int(limit, "limit", low=1, high=MAX_PAGE, default=DEFAULT_PAGE)
        # ASCII digits only (str.isdigit also takes '²'), and no more than a rowid holds.
        if cursor is not None and (
            not isinstance(cursor, str) or not (cursor.isascii() and cursor.isdigit()) or len(cursor) > 18
        ):
            raise InvalidArgument("'cursor' must be the next_cursor of an earlier page", field="cursor")
        before = int(cursor) if cursor is not None else 2**63 - 1
        scope, projects = "", list(principal.projects)
        if projects:
            scope = f" AND (project IS NULL OR project IN ({','.join('?' * len(projects))}))"
        rows = self.db.query(
            f"SELECT {_CELL_COLUMNS} FROM cells WHERE tenant_id = ? AND rowid < ?{scope} ORDER BY rowid DESC LIMIT ?",
            (principal.tenant_id, before, *projects, limit),
        )
        next_cursor = str(rows[-1][0]) if len(rows) == limit else None
        return {"cells": [self._cell_dict(row) for row in rows], "next_cursor": next_cursor}

    async def node_inbox(self, *, since: Any = None, limit: Any = None) -> dict[str, Any]:
        """Every agent's inbox on this node, merged in arrival order: the data dir owner's view
        (admin token), each item naming its agent."""
        since = 0 if since is None else v.parse_time_ms(since, "since")
        limit = v.check_int(limit, "limit", low=1, high=MAX_PAGE, default=DEFAULT_PAGE)
        rows = self.db.query(
            f"SELECT p.name, i.agent_id, {_INBOX_COLUMNS} FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid "
            "JOIN principals p ON p.agent_id = i.agent_id WHERE i.received_at > ? ORDER BY i.received_at LIMIT ?",
            (since, limit),
        )
        diffs = [{"agent": r[0], "agent_id": r[1], **_diff_dict(r[2:])} for r in rows]
        return {"diffs": diffs, "next_since": diffs[-1]["received_at"] if diffs else since}

    def queue_depths(self) -> dict[str, int]:
        """Work accepted and not yet done: committed rows the indexes lack, embedding requests waiting."""
        return {"index_backlog": self.layers.backlog(), "embed_queue": self._embedding._queue.qsize()}

    async def stats(self) -> dict[str, Any]:
        (cells,) = self.db.query_one("SELECT COUNT(*) FROM cells WHERE forgotten_at IS NULL")
        return {
            "node_id": self.node_id,
            "tenant_id": self.config.tenant_id,
            "cells": cells,
            "layers": self.layers.sizes(),
            "index_backlog": self.layers.backlog(),  # committed rows HNSW has not taken yet
            "embedding_space": self.embedder.space,
            "write_batches": self.db.batches,
            "write_jobs": self.db.jobs,
        }


_BEACON_COLUMNS = (
    "b.beacon_id, b.tenant_id, b.agent_id, b.origin_node, b.query, b.threshold, b.cell_types, b.project, "
    "b.min_salience, b.ttl_seconds, b.created_at, b.expires_at, b.embedding, b.embedding_space"
)

_INBOX_COLUMNS = (
    "i.seq, c.node_id, c.content, c.cell_type, c.salience, c.source_agent, c.origin_node, c.project, c.scene_id, "
    "c.source_ref, c.metadata, c.created_at, i.received_at, i.beacon_id, i.similarity, i.hops, c.forgotten_at"
)


def _beacon_from_row(row: tuple, owner_projects: tuple[str, ...]) -> Beacon:
    (beacon_id, tenant_id, agent_id, origin_node, query, threshold, cell_types, project, min_salience,
     ttl_seconds, created_at, expires_at, embedding, space) = row
    return Beacon(
        beacon_id=beacon_id,
        tenant_id=tenant_id,
        agent_id=agent_id,
        origin_node=origin_node,
        query=query,
        threshold=threshold,
        embedding=np.frombuffer(embedding, dtype=np.float32),
        embedding_space=space,
        created_at=created_at,
        cell_types=tuple(json.loads(cell_types)) if cell_types else None,
        project=project,
        min_salience=min_salience,
        ttl_seconds=ttl_seconds,
        expires_at=expires_at,
        owner_projects=owner_projects,
    )


def _diff_dict(row: tuple) -> dict[str, Any]:
    (seq, node_id, content, cell_type, salience, source_agent, origin_node, project, scene_id, source_ref,
     metadata, created_at, received_at, beacon_id, similarity, hops, forgotten_at) = row
    return {
        "inbox_id": seq,
        "node_id": node_id,
        "content": content,
        "cell_type": cell_type,
        "salience": salience,
        "source_agent": source_agent,
        "origin_node": origin_node,
        "project": project,
        "scene_id": scene_id,
        "source_ref": json.loads(source_ref) if source_ref else None,
        "metadata": json.loads(metadata),
        "created_at": created_at,
        "received_at": received_at,
        "beacon_id": beacon_id,
        "similarity": round(similarity, 6),
        "hops": hops,
        "forgotten": forgotten_at is not None,
    }
