"""The facade's beacons and inbox: an agent's standing interests, and what they caught.

A beacon is placed with its query's vector and joins the node's
:class:`~node.delivery.BeaconBook` once it is durable; from then on every cell written
(local or from the mesh) is matched against it in its own write job, and a match is an
inbox row (:mod:`node.ingest`). Reading the inbox changes nothing; pulling it advances
a cursor the node keeps per agent, in the same job that reads the page, so concurrent
pulls never overlap. Beacons are told to the mesh, so teammates deliver to them too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from . import cells as v
from .delivery import Beacon, BeaconBook
from .embedding import Embedder
from .errors import Forbidden, NotFound
from .ids import new_id
from .principals import Principal
from .shaping import inbox_dict
from .store import Store, Transaction

if TYPE_CHECKING:
    from .service import MeshHooks

__all__ = ["Interests", "MAX_TTL_SECONDS"]

MAX_TTL_SECONDS = 10 * 365 * 86_400


class Interests:
    def __init__(
        self,
        *,
        node_id: str,
        store: Store,
        book: BeaconBook,
        embedder: Embedder,
        embed: Callable[[list[str]], Awaitable[np.ndarray]],
        default_threshold: float,
        clock: Callable[[], int],
        mesh: Callable[[], MeshHooks | None],
    ) -> None:
        self.node_id = node_id
        self._store = store
        self._book = book
        self._embedder = embedder
        self._embed = embed
        self._default_threshold = default_threshold
        self._clock = clock
        self._mesh = mesh  # the node's mesh hooks, once it is in a team

    # -- beacons ----------------------------------------------------------------------------

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
        query = v.check_text(query, "query", max_chars=v.MAX_QUERY_BYTES)
        threshold = self._default_threshold if threshold is None else v.check_unit_interval(threshold, "threshold")
        cell_types = v.check_cell_types(cell_types)
        project = v.check_project(project)
        min_salience = None if min_salience is None else v.check_unit_interval(min_salience, "min_salience")
        if ttl_seconds is not None:
            ttl_seconds = v.check_int(ttl_seconds, "ttl_seconds", low=1, high=MAX_TTL_SECONDS)
        if project is not None and not principal.may_read_project(project):
            raise Forbidden(f"this key may not read project {project!r}", field="project")
        vector = (await self._embed([query]))[0]
        now = self._clock()
        beacon = Beacon(
            beacon_id=new_id(),
            tenant_id=principal.tenant_id,
            agent_id=principal.agent_id,
            origin_node=self.node_id,
            query=query,
            threshold=threshold,
            embedding=vector,
            embedding_space=self._embedder.space,
            created_at=now,
            cell_types=cell_types,
            project=project,
            min_salience=min_salience,
            ttl_seconds=ttl_seconds,
            expires_at=None if ttl_seconds is None else now + ttl_seconds * 1000,
            owner_projects=principal.projects,
        )

        def job(tx: Transaction) -> None:
            self._store.beacons.insert(tx, beacon)
            tx.after_commit(lambda: self._book.add(beacon))

        await self._store.db.write(job)
        mesh = self._mesh()
        if mesh is not None:
            mesh.beacon_placed(beacon)
        return {"beacon_id": beacon.beacon_id}

    async def list_beacons(self, principal: Principal) -> dict[str, Any]:
        """The principal's live beacons."""
        beacons = sorted(self._book.of_agent(principal.agent_id, self._clock()), key=lambda b: b.created_at)
        return {"beacons": [b.public() for b in beacons]}

    async def remove_beacon(self, principal: Principal, *, beacon_id: Any) -> dict[str, Any]:
        beacon_id = v.check_uuid(beacon_id, "beacon_id")
        now = self._clock()
        beacons = self._store.beacons

        def job(tx: Transaction) -> dict[str, Any]:
            row = beacons.owner(tx, beacon_id)
            if row is None or row[0] != principal.agent_id:
                raise NotFound(f"no beacon {beacon_id} of yours", field="beacon_id")
            removed_at = row[1]
            if removed_at is None:
                removed_at = now
                beacons.mark_removed(tx, beacon_id, now)
                tx.after_commit(lambda: self._book.remove(beacon_id))
            return {"beacon_id": beacon_id, "removed_at": removed_at}

        result = await self._store.db.write(job)
        mesh = self._mesh()
        if mesh is not None and result["removed_at"] == now:
            mesh.beacon_removed(beacon_id, principal.tenant_id)
        return result

    # -- the inbox ----------------------------------------------------------------------------

    async def inbox(
        self, principal: Principal, *, since: Any = None, limit: Any = None, include_superseded: Any = False
    ) -> dict[str, Any]:
        """Diffs received after ``since`` (ms or RFC 3339), oldest first; reading changes nothing."""
        since = 0 if since is None else v.parse_time_ms(since, "since")
        limit = v.check_int(limit, "limit", low=1, high=v.MAX_PAGE, default=v.DEFAULT_PAGE)
        every = v.check_bool(include_superseded, "include_superseded")
        entries = self._store.inbox.since(principal.agent_id, since, limit, include_superseded=every)
        diffs = [inbox_dict(entry) for entry in entries]
        return {"diffs": diffs, "next_since": diffs[-1]["received_at"] if diffs else since}

    async def pull_inbox(
        self, principal: Principal, *, limit: Any = None, include_superseded: Any = False
    ) -> dict[str, Any]:
        """The next page after the server-kept cursor, which advances; concurrent pulls never overlap."""
        limit = v.check_int(limit, "limit", low=1, high=v.MAX_PAGE, default=v.DEFAULT_PAGE)
        every = v.check_bool(include_superseded, "include_superseded")

        def job(tx: Transaction) -> dict[str, Any]:
            entries, cursor, remaining = self._store.inbox.pull(tx, principal.agent_id, limit, include_superseded=every)
            return {"diffs": [inbox_dict(e) for e in entries], "cursor": cursor, "remaining": remaining}

        return await self._store.db.write(job)

    async def node_inbox(self, *, since: Any = None, limit: Any = None) -> dict[str, Any]:
        """Every agent's inbox on this node, merged in arrival order: the data dir owner's view
        (admin token), each item naming its agent."""
        since = 0 if since is None else v.parse_time_ms(since, "since")
        limit = v.check_int(limit, "limit", low=1, high=v.MAX_PAGE, default=v.DEFAULT_PAGE)
        rows = self._store.inbox.everyone_since(since, limit)
        diffs = [{"agent": name, "agent_id": agent_id, **inbox_dict(entry)} for name, agent_id, entry in rows]
        return {"diffs": diffs, "next_since": diffs[-1]["received_at"] if diffs else since}
