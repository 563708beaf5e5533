"""Synthetic interests: beacons and cells clustered around topics on the unit sphere.

Topic centres are random unit vectors. A beacon sits at cosine ``beacon_cos`` from the
centre of a topic drawn with Zipf skew; a cell sits at cosine ``cell_cos`` from the
centre of its own (Zipf-drawn) topic. Ground truth, the *interested set* of a cell, is
every node other than the origin with a beacon the routing rule sends it to (``cos ≥
τ − slack × E0 − route_margin`` and the filters; mesh.routing_rule), evaluated here with the same :class:`EnergyModel`
formulas and float32 arithmetic. That is measurement, not routing: strategies never
see it except the oracle, whose whole point is to know it.
"""

from __future__ import annotations

import dataclasses
from functools import cached_property

import numpy as np

from mesh.wire import BeaconPayload, CellPayload
from node.energy import CELL_TYPES, EnergyModel

__all__ = ["WorkloadSpec", "SimCell", "SimBeacon", "Workload", "TENANT"]

TENANT = "sim"


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    nodes: int = 20
    stores: int = 20
    dim: int = 384
    topics: int = 50
    beacons_per_node: int = 2
    zipf: float = 1.0  # topic popularity ~ 1 / rank^zipf (0 = uniform)
    threshold: tuple[float, float] = (0.70, 0.85)  # beacon τ, uniform
    beacon_cos: tuple[float, float] = (0.85, 0.98)  # beacon to its topic centre
    cell_cos: tuple[float, float] = (0.75, 0.98)  # cell to its topic centre
    salience: tuple[float, float] = (0.2, 1.0)  # uniform
    type_filter_share: float = 0.2  # beacons restricted to 3 cell types
    min_salience_share: float = 0.2  # beacons with min_salience 0.5
    store_interval_ms: int = 50  # one store every this long, origins at random
    # Knowledge that changes (mesh.lifecycle): this share of the stores supersede an earlier cell
    # (its author revises it: same origin, same topic, a new vector), and this share of the cells
    # are forgotten by their origin ``forget_after_ms`` after their store. 0: the workload as before.
    supersede_share: float = 0.0
    forget_share: float = 0.0
    forget_after_ms: int = 2_000

    def __post_init__(self) -> None:
        for name, least in _AT_LEAST.items():
            value = getattr(self, name)
            if value < least:
                raise ValueError(f"{name} must be at least {least}, not {value}")
        for name in ("supersede_share", "forget_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"{name} is a share in [0, 1], not {getattr(self, name)}")


# The smallest value each count of a workload may take.
_AT_LEAST = {
    "nodes": 2, "stores": 0, "dim": 2, "topics": 1, "beacons_per_node": 0, "store_interval_ms": 0,
    "forget_after_ms": 0,
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class SimBeacon:
    node: int
    topic: int
    payload: BeaconPayload


@dataclasses.dataclass(frozen=True)
class SimCell:
    index: int
    origin: int
    topic: int
    at_ms: int  # store-phase time
    salience: float
    cell_type: str
    vector: np.ndarray
    interested: frozenset[int]
    supersedes: tuple[int, ...] = ()  # the earlier cells (indexes) this one replaces
    forgotten_at_ms: int | None = None  # store-phase time its origin forgets it (None: never)

    @property
    def cell_id(self) -> str:
        return f"cell-{self.index}"

    def payload(self, created_at: int, dim: int) -> CellPayload:
        metadata = {"supersedes": [f"cell-{j}" for j in self.supersedes]} if self.supersedes else {}
        return CellPayload(
            self.cell_id, TENANT, agent(self.origin), f"synthetic cell {self.index} on topic {self.topic}",
            self.cell_type, self.salience, created_at, metadata=metadata, embedding=self.vector,
            embedding_space=space(dim),
        )  # fmt: skip


def agent(node: int) -> str:
    return f"agent-{node}"


def space(dim: int) -> str:
    return f"sim-unit-sphere-{dim}"


def _near(centre: np.ndarray, cos: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Unit vectors at exactly ``cos`` from ``centre`` (one per row of the result)."""
    noise = rng.standard_normal((len(cos), centre.shape[-1]))
    noise -= (noise * centre).sum(-1, keepdims=True) * centre
    noise /= np.linalg.norm(noise, axis=-1, keepdims=True)
    out = cos[:, None] * centre + np.sqrt(1 - cos * cos)[:, None] * noise
    return (out / np.linalg.norm(out, axis=-1, keepdims=True)).astype(np.float32)


class Workload:
    """Beacons per node, cells in store order, and each cell's interested set."""

    def __init__(self, spec: WorkloadSpec, seed: int, energy: EnergyModel) -> None:
        self.spec = spec
        self.energy = energy
        rng = np.random.default_rng([seed, 0x5EED])
        s = spec
        centres = rng.standard_normal((s.topics, s.dim))
        self.centres = (centres / np.linalg.norm(centres, axis=1, keepdims=True)).astype(np.float32)
        ranks = np.arange(1, s.topics + 1, dtype=float)
        weights = ranks**-s.zipf
        self.topic_weights = weights / weights.sum()
        nb = s.nodes * s.beacons_per_node
        b_node = np.repeat(np.arange(s.nodes), s.beacons_per_node)
        b_topic = rng.choice(s.topics, size=nb, p=self.topic_weights)
        b_vec = _near(self.centres[b_topic], rng.uniform(*s.beacon_cos, nb), rng)
        b_tau = rng.uniform(*s.threshold, nb).astype(np.float32)
        type_idx = np.array([rng.choice(len(CELL_TYPES), 3, replace=False) for _ in range(nb)]).reshape(nb, 3)
        typed = rng.random(nb) < s.type_filter_share
        min_sal = rng.random(nb) < s.min_salience_share
        self.beacons: list[SimBeacon] = []
        for j in range(nb):
            types = tuple(sorted(CELL_TYPES[k] for k in type_idx[j])) if typed[j] else None
            payload = BeaconPayload(
                f"beacon-{b_node[j]}-{j}", TENANT, agent(int(b_node[j])), f"synthetic interest in topic {b_topic[j]}",
                float(b_tau[j]), cell_types=types, min_salience=0.5 if min_sal[j] else None,
                embedding=b_vec[j], embedding_space=space(s.dim),
            )  # fmt: skip
            self.beacons.append(SimBeacon(int(b_node[j]), int(b_topic[j]), payload))
        # float32 columns, as the engine's index holds them
        self._b_node = b_node
        self._b_vec = b_vec
        self._b_tau = np.array([b.payload.threshold for b in self.beacons], np.float32)
        self._b_min_sal = np.array([-1.0 if b.payload.min_salience is None else b.payload.min_salience
                                    for b in self.beacons], np.float32)  # fmt: skip
        self._b_types = [b.payload.cell_types for b in self.beacons]

        c_origin = rng.integers(0, s.nodes, s.stores)
        c_topic = rng.choice(s.topics, size=s.stores, p=self.topic_weights)
        c_vec = _near(self.centres[c_topic], rng.uniform(*s.cell_cos, s.stores), rng)
        c_sal = np.round(rng.uniform(*s.salience, s.stores), 3)
        c_type = rng.integers(0, len(CELL_TYPES), s.stores)
        self.cells = [
            SimCell(
                i, int(c_origin[i]), int(c_topic[i]), i * s.store_interval_ms, float(c_sal[i]),
                CELL_TYPES[int(c_type[i])], c_vec[i],
                self._interested(int(c_origin[i]), c_vec[i], float(c_sal[i]), CELL_TYPES[int(c_type[i])]),
            )  # fmt: skip
            for i in range(s.stores)
        ]
        if s.supersede_share or s.forget_share:
            self._change_knowledge(np.random.default_rng([seed, 0x5EED, 2]))

    def _change_knowledge(self, rng: np.random.Generator) -> None:
        """Turn a share of the stores into revisions of earlier cells, and forget a share of the
        cells. A generator of its own: the cells' other draws are those of a run without it."""
        s = self.spec
        for i in range(1, len(self.cells)):
            if rng.random() >= s.supersede_share:
                continue
            old = self.cells[int(rng.integers(0, i))]
            c = self.cells[i]
            vector = _near(self.centres[old.topic][None, :], rng.uniform(*s.cell_cos, 1), rng)[0]
            self.cells[i] = dataclasses.replace(
                c, origin=old.origin, topic=old.topic, vector=vector, supersedes=(old.index,),
                interested=self._interested(old.origin, vector, c.salience, c.cell_type),
            )  # fmt: skip
        for i, c in enumerate(self.cells):
            if rng.random() < s.forget_share:
                self.cells[i] = dataclasses.replace(c, forgotten_at_ms=c.at_ms + s.forget_after_ms)

    def _interested(self, origin: int, vector: np.ndarray, salience: float, cell_type: str) -> frozenset[int]:
        if not self.beacons:
            return frozenset()
        ok = self._accepting(origin, vector, salience, cell_type)
        return frozenset(int(self._b_node[j]) for j in np.flatnonzero(ok).tolist())

    def _accepting(self, origin: int, vector: np.ndarray, salience: float, cell_type: str) -> np.ndarray:
        """Which beacons accept a cell (a mask over ``self.beacons``): the routing rule, the one
        place the ground truth writes it (the labelled workload reads it here too)."""
        e0 = self.energy.initial(salience, cell_type)
        ok = (self._b_vec @ vector) >= self.energy.route_threshold(self._b_tau, e0)
        ok &= self._b_min_sal <= np.float32(salience)
        ok &= self._b_node != origin
        for j in np.flatnonzero(ok).tolist():
            if self._b_types[j] is not None and cell_type not in self._b_types[j]:
                ok[j] = False
        return ok

    def beacons_of(self, node: int) -> list[BeaconPayload]:
        return self._by_node.get(node, [])

    @cached_property
    def _by_node(self) -> dict[int, list[BeaconPayload]]:
        out: dict[int, list[BeaconPayload]] = {}
        for b in self.beacons:
            out.setdefault(b.node, []).append(b.payload)
        return out

    # The nodes whose overlay a partial view's warm-up waits to settle (None: every node). A
    # labelled workload's team is a few nodes among idle relays, whose settling says nothing of it.
    watched_nodes: frozenset[int] | None = None

    def boot_peers(self, node: int) -> tuple[int, ...]:
        """Nodes ``node`` is told of at boot beside its random seeds (none here)."""
        return ()

    @cached_property
    def store_phase_ms(self) -> int:
        """The last store's time, or the last forget's, if later (the drain comes after both)."""
        last = [c.at_ms for c in self.cells[-1:]] + [c.forgotten_at_ms for c in self.cells if c.forgotten_at_ms]
        return max(last, default=0)

    def e0(self, cell: SimCell) -> float:
        return self.energy.initial(cell.salience, cell.cell_type)
