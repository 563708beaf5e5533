"""Who wants a cell: the beacon index, and the routing policies built on it.

:class:`BeaconIndex` keeps the beacons of *other* nodes as one float32 matrix per
(tenant, embedding space), with the filters as parallel numpy columns, so matching a
cell against thousands of beacons is one matrix-vector product and a few vectorised
comparisons. Rows are appended into doubling buffers; removals clear a flag and the
group is compacted when half its rows are dead.

Routing policies decide where a diff goes:

* :class:`FullView` (every member knows every beacon): the origin pushes straight to
  the owners of matching beacons; nobody relays.
* :class:`PartialView` (large meshes): a node knows the beacons of the nodes within its
  interest radius only (the control plane replicates that far). The origin pushes to
  the owners of the matching beacons it knows; every node that receives the cell does
  the same with *its* known beacons, so the cell travels from interest to interest.
  Those pushes follow known interest and spend none of the hop budget (``ttl``): they
  end by themselves, since each goes to a node that wants the cell and a node relays a
  cell once, on first receipt. Where a node knows no matching beacon and wanted the
  cell no more than its origin did, it hands the cell to one neighbour (a walk toward
  interest it cannot see); only these hops spend the budget. The walk is steered: to the
  node whose beacon is nearest the cell of all it knows (``walk_far``; else of its
  neighbours; the engine also chooses some neighbours for interest like its own, so that
  heads into the cell's community). A relay that wanted the
  cell pushes only along its links (``near``: the engine's links as they stand now, both
  ways, :mod:`mesh.links`), since interest farther off is as near to other holders; unless
  none of its links leads to interest: then it is a leaf of the spread, and pushes to all
  the interest it knows, or the spread would end there. A relay pushes to none of the nodes
  its copy names as already sent it (:mod:`mesh.told`), nor walks to them.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable
from typing import Protocol

import numpy as np

from .config import EnergyParams
from .diffs import BeaconPayload, CellPayload, Diff
from .routing_rule import BeaconColumns, Codes, accepts, routed_rows
from .told import told_name, told_names

__all__ = ["BeaconIndex", "FullView", "IndexedBeacon", "PartialView", "RoutingPolicy", "accepts", "beacon_closeness"]

_WORST = float("-inf")  # below any similarity (a probe need not be a unit vector)


@dataclasses.dataclass(frozen=True, slots=True)
class IndexedBeacon:
    beacon: BeaconPayload
    owner: str
    placed_at: int


class BeaconIndex:
    """Remote beacons, matched in bulk. A beacon is named by its owner and its id: a beacon id
    is scoped by the node that placed it, so no member's beacon can replace or remove another's."""

    def __init__(self) -> None:
        self._groups: dict[tuple[str, str], BeaconColumns] = {}
        self._where: dict[tuple[str, str], tuple[BeaconColumns, int]] = {}  # (owner, beacon id) -> its row
        self._ids: collections.Counter[str] = collections.Counter()  # beacon id -> owners holding one of that id
        self._by_owner: dict[str, dict[str, IndexedBeacon]] = {}
        self._codes = Codes()
        self._vectors: dict[tuple[str, str], np.ndarray] | None = None  # vectors(), until a change
        self._vectors_of: dict[str, dict[tuple[str, str], np.ndarray]] = {}  # vectors_of(), per owner likewise

    def __len__(self) -> int:
        return len(self._where)

    def add(self, beacon: BeaconPayload, owner: str, placed_at: int) -> None:
        """Add ``owner``'s beacon, in place of the one of the same id it held (if any)."""
        self.remove(beacon.beacon_id, owner)
        self._vectors = None
        self._vectors_of.pop(owner, None)
        vector = np.asarray(beacon.embedding, np.float32)
        key = (beacon.tenant_id, beacon.embedding_space)
        group = self._groups.get(key)
        if group is None or group.dim != vector.shape[0]:
            group = self._groups[key] = BeaconColumns(vector.shape[0])
        entry = IndexedBeacon(beacon, owner, placed_at)
        self._where[(owner, beacon.beacon_id)] = (group, group.append(entry, entry.beacon, self._codes.owner(entry.owner), self._codes))
        self._ids[beacon.beacon_id] += 1
        self._by_owner.setdefault(owner, {})[beacon.beacon_id] = entry

    def held_by_another(self, beacon_id: str, owner: str) -> bool:
        """Does a node other than ``owner`` hold a beacon of this id?"""
        return self._ids.get(beacon_id, 0) > ((owner, beacon_id) in self._where)

    def remove(self, beacon_id: str, owner: str) -> IndexedBeacon | None:
        """Take out ``owner``'s beacon of this id (another owner's of the same id stays)."""
        found = self._where.pop((owner, beacon_id), None)
        if found is None:
            return None
        if self._ids[beacon_id] > 1:
            self._ids[beacon_id] -= 1
        else:
            del self._ids[beacon_id]
        self._vectors = None
        group, row = found
        entry = group.kill(row)
        if entry is not None:
            self._vectors_of.pop(entry.owner, None)
            owned = self._by_owner.get(entry.owner, {})
            owned.pop(beacon_id, None)
            if not owned:
                self._by_owner.pop(entry.owner, None)
        if group.dead * 2 > group.n:
            self._compact(group)
        return entry

    def _compact(self, group: BeaconColumns) -> None:
        live = [e for e in group.entries if e is not None]
        key = next(k for k, g in self._groups.items() if g is group)
        fresh = self._groups[key] = BeaconColumns(group.dim)
        for entry in live:
            self._where[(entry.owner, entry.beacon.beacon_id)] = (fresh, fresh.append(entry, entry.beacon, self._codes.owner(entry.owner), self._codes))

    def of_owner(self, owner: str) -> list[IndexedBeacon]:
        return list(self._by_owner.get(owner, {}).values())

    def owners(self) -> set[str]:
        return set(self._by_owner)

    def vectors(self) -> dict[tuple[str, str], np.ndarray]:
        """The live beacon vectors per (tenant, space), one row each. Kept until the index
        changes (a node's own beacons are its probes in every gossip round): do not modify."""
        if self._vectors is None:
            self._vectors = {key: g.matrix[: g.n][g.alive[: g.n]] for key, g in self._groups.items() if g.n > g.dead}
        return self._vectors

    def vectors_of(self, owner: str) -> dict[tuple[str, str], np.ndarray]:
        """``owner``'s beacon vectors per (tenant, space), one row each (as ``vectors``, kept
        until its beacons change: a node's offers to a peer rank by them every round)."""
        cached = self._vectors_of.get(owner)
        if cached is not None:
            return cached
        rows: dict[tuple[str, str], list[np.ndarray]] = {}
        for e in self._by_owner.get(owner, {}).values():
            rows.setdefault((e.beacon.tenant_id, e.beacon.embedding_space), []).append(e.beacon.embedding)
        cached = {key: np.stack(vectors).astype(np.float32, copy=False) for key, vectors in rows.items()}
        if rows:  # an owner we know no beacon of is not kept
            self._vectors_of[owner] = cached
        return cached

    def nearest_owners(self, probes: dict[tuple[str, str], np.ndarray], count: int) -> list[str]:
        """Up to ``count`` owners, ranked by their beacon most similar to any ``probes`` vector of
        the same (tenant, space), best first; ties by owner id, so the order is reproducible.
        Vectorised (it runs every gossip round): only each group's top rows are looked at, a few
        per wanted owner, which may return fewer than ``count`` when owners hold many beacons."""
        best: dict[int, float] = {}  # by owner code
        for key, probe in probes.items():
            group = self._groups.get(key)
            if group is None or group.n == group.dead or probe.shape[1] != group.dim:
                continue
            if group.dead:
                rows = np.flatnonzero(group.alive[: group.n])
                sims = (group.matrix[rows] @ probe.T).max(axis=1)
                owners = group.owner[rows]
            else:  # the usual case: every row, no copy of the matrix
                sims = (group.matrix[: group.n] @ probe.T).max(axis=1)
                owners = group.owner[: group.n]
            top = min(len(sims), 4 * count)
            picked = np.argpartition(-sims, top - 1)[:top]
            for owner, sim in zip(owners[picked].tolist(), sims[picked].tolist()):
                if sim > best.get(owner, _WORST):
                    best[owner] = sim
        ids = self._codes.owner_ids
        return [owner for _, owner in sorted((-sim, ids[code]) for code, sim in best.items())[:count]]

    def closeness(self, owner: str, probes: dict[tuple[str, str], np.ndarray]) -> float:
        """How close ``owner``'s nearest beacon is to any ``probes`` vector of its (tenant, space)
        (cosine; -2 if we know none)."""
        return max((beacon_closeness(e.beacon, probes) for e in self._by_owner.get(owner, {}).values()), default=-2.0)

    def likeness(self, owner: str, cell: CellPayload) -> float:
        """How close ``owner``'s nearest beacon is to ``cell`` (cosine; -2 if we know none)."""
        sims = [
            float(e.beacon.embedding @ cell.embedding) for e in self._by_owner.get(owner, {}).values()
            if e.beacon.tenant_id == cell.tenant_id and e.beacon.embedding_space == cell.embedding_space
            and e.beacon.embedding.shape == cell.embedding.shape
        ]  # fmt: skip
        return max(sims, default=-2.0)

    def match(self, cell: CellPayload, e0: float, now: int, energy: EnergyParams) -> list[IndexedBeacon]:
        """Every live beacon the routing rule (:mod:`mesh.routing_rule`) sends ``cell`` to."""
        group = self._group_for(cell)
        if group is None:
            return []
        return [group.entries[row] for row in routed_rows(group, cell, e0, now, energy, self._codes)]

    def match_owners(self, cell: CellPayload, e0: float, now: int, energy: EnergyParams) -> set[str]:
        """The owners of the beacons :meth:`match` returns (routing needs no more, and reads the
        owners off a column instead of visiting each beacon: a relay matches dozens)."""
        group = self._group_for(cell)
        if group is None:
            return set()
        if cell.project is not None and group.scoped:
            return {e.owner for e in self.match(cell, e0, now, energy)}
        ok = group.matching(cell, e0, now, energy, self._codes)
        return set(map(self._codes.owner_ids.__getitem__, group.owner[: group.n][ok].tolist()))

    def _group_for(self, cell: CellPayload) -> BeaconColumns | None:
        group = self._groups.get((cell.tenant_id, cell.embedding_space))
        if group is None or group.n == group.dead or cell.embedding.shape != (group.dim,):
            return None
        return group


def beacon_closeness(beacon: BeaconPayload, probes: dict[tuple[str, str], np.ndarray]) -> float:
    """How close ``beacon`` is to the nearest ``probes`` vector of its (tenant, space) (cosine;
    -2 if there is none of its space and size)."""
    probe = probes.get((beacon.tenant_id, beacon.embedding_space))
    if probe is None or probe.shape[1] != beacon.embedding.shape[0]:
        return -2.0
    sims = probe @ beacon.embedding
    return float(sims[0]) if len(sims) == 1 else float(sims.max())  # one probe: no reduction to call


class RoutingPolicy(Protocol):
    """Where data diffs go. Return node ids; the engine queues and sends."""

    walked: frozenset[str]  # the walk hops among the last relay targets returned

    def origin_targets(self, diff: Diff, cell: CellPayload, now: int) -> set[str]: ...

    def relay_targets(self, diff: Diff, cell: CellPayload | None, sender: str, now: int) -> set[str]: ...

    def onward_ttl(self, diff: Diff, target: str) -> int:
        """The ``ttl`` of the relayed copy to ``target``, one of the last relay targets."""
        ...


class FullView:
    """Every member knows every beacon: push straight to the owners, never relay."""

    walked: frozenset[str] = frozenset()  # it never walks

    def __init__(self, self_id: str, index: BeaconIndex, energy: EnergyParams) -> None:
        self.self_id = self_id
        self.index = index
        self.energy = energy

    def origin_targets(self, diff: Diff, cell: CellPayload, now: int) -> set[str]:
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        return self.index.match_owners(cell, e0, now, self.energy) - {self.self_id}

    def relay_targets(self, diff: Diff, cell: CellPayload | None, sender: str, now: int) -> set[str]:
        return set()

    def onward_ttl(self, diff: Diff, target: str) -> int:
        return diff.ttl - 1


class PartialView:
    """Interests known within a radius; recipients relay to the interests they know.

    ``mine`` holds this node's own beacons; ``neighbours()`` returns the live gossip
    neighbours (node ids); ``choose`` picks one (the engine's seeded rng) for the walk.
    """

    def __init__(
        self, self_id: str, index: BeaconIndex, energy: EnergyParams, neighbours: Callable[[], list[str]],
        choose: Callable[[list[str]], str], mine: BeaconIndex | None = None, steer: bool = False,
        near: Callable[[set[str]], set[str]] | None = None, widen_leaves: bool = True, walk_far: bool = False,
        reachable: Callable[[str], bool] = lambda node_id: True, origin_walks: int = 1, leaf_walk: bool = False,
    ) -> None:  # fmt: skip
        self.self_id = self_id
        self.index = index
        self.energy = energy
        self.neighbours = neighbours
        self.choose = choose
        self.mine = mine if mine is not None else BeaconIndex()
        self.steer = steer  # walk toward the neighbour whose beacon is nearest the cell, not at random
        # A relay that wanted the cell itself pushes only to the owners ``near`` keeps (of a set:
        # its own neighbourhood): interest beyond it is as near to other holders, and each push
        # there from every holder that knows it was a duplicate. None: to every owner it knows.
        self.near = near
        self.widen_leaves = widen_leaves
        # Steered walks go to the known node nearest the cell, not only to a neighbour (one we
        # can ``reachable``: we know its address).
        self.walk_far = walk_far
        self.reachable = reachable
        # An origin that sees no interest starts this many such walks (walk_far only): few
        # want its cell, and one walk often misses them (model, N=1,000: 0.991 -> 0.995 with 2).
        self.origin_walks = origin_walks
        # A relay that wanted the cell and knows no other interest at all walks on while its
        # ttl lasts, as one that did not want it does (else the spread ends there).
        self.leaf_walk = leaf_walk

        self.walked: frozenset[str] = frozenset()  # the walk hops among the last targets returned

    def _targets(
        self, cell: CellPayload, now: int, exclude: set[str], budget: int, relay: bool, told: bytes = b""
    ) -> set[str]:
        self.walked = frozenset()
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        owners = self.index.match_owners(cell, e0, now, self.energy) - exclude
        wanted = relay and bool(self.mine.match_owners(cell, e0, now, self.energy))
        if wanted and self.near is not None:
            # A leaf of the spread (no interest linked to it) pushes to all it knows: else
            # the spread would end here, and few-wanted cells are where it ends (at N=1,000,
            # 0.68 of the interested pairs of cells wanted by fewer than 10 were reached).
            linked = self.near(owners)
            if linked or not self.widen_leaves:
                owners = linked
        # Interest in sight, even if all of it was sent the cell already, ends the walk here.
        sent = told_names(told) if told else set()
        if owners or budget <= 0 or (wanted and not self.leaf_walk):
            return {o for o in owners if told_name(o) not in sent} if sent else owners
        # No interest in sight: a neighbour we hand it to sees another radius (its own
        # neighbours' interests we already know, so only worth it if it may relay on).
        if self.steer and self.walk_far:
            far = self._nearest_known(cell, exclude, sent, 1 if relay else self.origin_walks)
            if far:
                self.walked = frozenset(far)
                return set(far)
        candidates = sorted(n for n in set(self.neighbours()) - exclude if not sent or told_name(n) not in sent)
        if not candidates:
            return set()
        self.walked = frozenset({self._walk_to(candidates, cell)})
        return set(self.walked)

    def _nearest_known(self, cell: CellPayload, exclude: set[str], sent: set[bytes], count: int) -> list[str]:
        """Up to ``count`` nodes whose beacons are nearest the cell among all we know (within the
        radius), that we can reach: a walk hop there sees a radius around it, farther on than a
        neighbour's (at N=1,000 in the model, delivery 0.983 -> 0.991 for the same messages)."""
        probe = {(cell.tenant_id, cell.embedding_space): cell.embedding[None, :]}
        ranked = self.index.nearest_owners(probe, len(exclude) + len(sent) + count + 4)
        fit = [o for o in ranked if o not in exclude and told_name(o) not in sent and self.reachable(o)]
        return fit[:count]

    def _walk_to(self, candidates: list[str], cell: CellPayload) -> str:
        """Steered: the neighbour whose beacon is nearest the cell (on an overlay that links
        nodes of like interest, that heads into the cell's community); else, or when no
        neighbour's beacon is known, one at random."""
        if self.steer:
            likeness = {c: self.index.likeness(c, cell) for c in candidates}
            best = max(candidates, key=lambda c: likeness[c])  # the first of equals: candidates are sorted
            if likeness[best] > -2.0:
                return best
        return self.choose(candidates)

    def origin_targets(self, diff: Diff, cell: CellPayload, now: int) -> set[str]:
        """``diff`` as it goes out: its ``ttl`` is what the first receiver may still spend."""
        return self._targets(cell, now, {self.self_id}, diff.ttl + 1, relay=False)

    def relay_targets(self, diff: Diff, cell: CellPayload | None, sender: str, now: int) -> set[str]:
        """Known interest at any ``ttl``; a walk hop only while ``ttl`` lasts (see :meth:`onward_ttl`)."""
        if cell is None:
            return set()
        return self._targets(cell, now, {self.self_id, sender, diff.origin}, diff.ttl, relay=True, told=diff.told)

    def onward_ttl(self, diff: Diff, target: str) -> int:
        """The ``ttl`` a copy of ``diff`` carries to ``target`` from the last targets returned:
        a walk hop spends one, a push to a known interest none."""
        return diff.ttl - 1 if target in self.walked else diff.ttl
