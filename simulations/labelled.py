"""A labelled workload: a team's own memories and beacons, with judgements of what each beacon wants.

The synthetic workload can only measure transport: its ground truth is the routing rule itself.
This one replays a *team stream* (``benchmarks/data/team_stream.json``, described in
``benchmarks/data/TEAM_STREAM.md``): memories with their author, cell type, salience, text and
time; beacons with their owner and query; and, beside them, the judgements by meaning of which
memories each beacon's owner would want. The routing oracle is still the rule (so transport is
still measured against it); the judgements let :mod:`.semantic` say how much of what routing
brings is wanted.

Theory of operation:

* **Vectors.** Memories and beacon queries are embedded once with the node's own embedder
  (``node.embedding.load_embedder()``, the daemon's default) and cached on disk under the file's
  sha256 and the embedder's space fingerprint, so a second run reads them back: a run is then a
  pure function of its config, as a synthetic one is.
* **Placement.** The team's people (authors and beacon owners are the same people) get one node
  each, drawn by seed among the N nodes; every other node is an idle relay, with no beacon and
  nothing to store. At N=10,000 the team is a small community inside a large mesh.
* **Time.** Memories are stored in timestamp order, one every ``store_interval_ms``, each from
  its author's node; beacons are placed at boot with the node's default threshold.

It reuses :class:`.workload.Workload` for everything the strategies read (cells, beacons per
node, the interested set by the same rule), so the strategies do not know which one they run.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mesh.wire import BeaconPayload, CellPayload
from node.energy import EnergyModel

from .workload import TENANT, SimBeacon, SimCell, Workload, WorkloadSpec

__all__ = [
    "TeamStream", "LabelledCell", "LabelledWorkload", "TextEmbedder", "DEFAULT_STREAM", "WORKLOADS",
    "parse_workload", "load_stream", "embed_stream", "place_team", "default_cache_dir", "build_labelled",
]  # fmt: skip

# The repository's own stream (read as data: the simulator imports nothing from benchmarks/).
DEFAULT_STREAM = Path(__file__).resolve().parents[1] / "benchmarks" / "data" / "team_stream.json"
WORKLOADS = ("synthetic", "team-stream")
NO_TOPIC = -1  # a labelled cell or beacon has no synthetic topic


class TextEmbedder(Protocol):
    """What the workload needs of an embedder (``node.embedding.Embedder`` is one)."""

    dim: int
    space: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def parse_workload(text: str) -> tuple[str, Path | None]:
    """``synthetic`` or ``team-stream[:PATH]`` -> (kind, path of the stream or None)."""
    kind, _, path = text.partition(":")
    if kind not in WORKLOADS:
        raise ValueError(f"workload is one of synthetic, team-stream[:PATH], not {text!r}")
    if kind == "synthetic":
        if path:
            raise ValueError("the synthetic workload takes no path")
        return kind, None
    stream = Path(path) if path else DEFAULT_STREAM
    if not stream.is_file():
        raise ValueError(f"no team stream at {stream}")
    return kind, stream


@dataclasses.dataclass(frozen=True)
class TeamStream:
    """A stream file as the simulator reads it: memories in timestamp order, beacons, judgements."""

    name: str  # the file's name (a summary records no machine path)
    sha256: str
    project: str | None
    memories: list[dict[str, Any]]
    beacons: list[dict[str, Any]]
    judgements: dict[str, frozenset[str]]  # beacon id -> relevant memory ids

    @property
    def people(self) -> list[str]:
        return sorted({m["author"] for m in self.memories} | {b["owner"] for b in self.beacons})


def load_stream(path: Path) -> TeamStream:
    raw = path.read_bytes()
    data = json.loads(raw)
    # Ties in time keep the file's order (a stable sort), as the authors wrote them.
    memories = sorted(data["memories"], key=lambda m: m["timestamp_ms"])
    ids = {m["id"] for m in memories}
    judgements = {b["id"]: frozenset(data.get("judgements", {}).get(b["id"], ())) for b in data["beacons"]}
    unknown = sorted(set().union(*judgements.values()) - ids) if judgements else []
    if unknown:
        raise ValueError(f"{path.name}: judgements name memories that are not in the stream: {', '.join(unknown[:5])}")
    return TeamStream(
        path.name, hashlib.sha256(raw).hexdigest(), data.get("project"), memories, list(data["beacons"]), judgements,
    )  # fmt: skip


def default_cache_dir() -> Path:
    """Where vectors are kept between runs: the user's cache directory."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "hyphae" / "simulations" / "embeddings"


def embed_stream(stream: TeamStream, embedder: TextEmbedder, cache_dir: Path | None) -> tuple[np.ndarray, np.ndarray]:
    """(memory vectors, beacon vectors) in the stream's order, float32 unit rows; read from
    ``cache_dir`` when this file was embedded in this space before, else embedded and kept there."""
    space_key = hashlib.blake2b(embedder.space.encode(), digest_size=8).hexdigest()
    cached = None if cache_dir is None else cache_dir / f"team-stream-{stream.sha256[:16]}-{space_key}.npz"
    memory_ids = [m["id"] for m in stream.memories]
    beacon_ids = [b["id"] for b in stream.beacons]
    if cached is not None and cached.is_file():
        with np.load(cached, allow_pickle=False) as kept:
            # The key names the file and space; the ids and space inside guard against a stale copy.
            if (str(kept["space"]) == embedder.space and kept["memory_ids"].tolist() == memory_ids
                    and kept["beacon_ids"].tolist() == beacon_ids):  # fmt: skip
                return kept["memories"].astype(np.float32), kept["beacons"].astype(np.float32)
    print(f"embedding {len(memory_ids)} memories and {len(beacon_ids)} beacon queries in {embedder.space}",
          file=sys.stderr, flush=True)  # fmt: skip
    memories = np.asarray(embedder.embed([m["content"] for m in stream.memories]), np.float32)
    beacons = np.asarray(embedder.embed([b["query"] for b in stream.beacons]), np.float32)
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp.npz")  # sweeps embed side by side: rename whole
        np.savez(partial, memories=memories, beacons=beacons, space=np.array(embedder.space),
                 memory_ids=np.array(memory_ids), beacon_ids=np.array(beacon_ids))  # fmt: skip
        os.replace(partial, cached)
    return memories, beacons


def place_team(people: Sequence[str], nodes: int, seed: int) -> dict[str, int]:
    """One node per person, drawn by seed among ``nodes`` (the same seed, the same places)."""
    if nodes < len(people):
        raise ValueError(f"the team stream has {len(people)} people: it needs at least {len(people)} nodes")
    picks = random.Random(f"{seed}:team").sample(range(nodes), len(people))
    return dict(zip(sorted(people), picks))


@dataclasses.dataclass(frozen=True)
class LabelledCell(SimCell):
    """A memory of the stream as a cell: its text, author and vector space ride along."""

    memory_id: str = ""
    author: str = ""
    content: str = ""
    space: str = ""
    project: str | None = None

    def payload(self, created_at: int, dim: int) -> CellPayload:
        return CellPayload(
            self.cell_id, TENANT, self.author, self.content, self.cell_type, self.salience, created_at,
            project=self.project, embedding=self.vector, embedding_space=self.space,
        )  # fmt: skip


class LabelledWorkload(Workload):
    """A team stream mapped onto ``nodes`` nodes, with its judgements kept for :mod:`.semantic`."""

    def __init__(
        self, stream: TeamStream, vectors: tuple[np.ndarray, np.ndarray], space: str, *, nodes: int, seed: int,
        energy: EnergyModel, threshold: float, store_interval_ms: int = 50, stores: int | None = None,
        team_peers: bool = False,
    ) -> None:  # fmt: skip
        memory_vectors, beacon_vectors = vectors
        kept = stream.memories if stores is None else stream.memories[:stores]
        self.stream = stream
        self.embedding_space = space
        self.threshold = threshold
        self.energy = energy
        self.team = place_team(stream.people, nodes, seed)  # person -> node
        self.watched_nodes = frozenset(self.team.values())
        self.team_peers = team_peers
        self.spec = WorkloadSpec(
            nodes=nodes, stores=len(kept), dim=int(memory_vectors.shape[1]), topics=1, beacons_per_node=0,
            store_interval_ms=store_interval_ms,
        )  # fmt: skip
        self.beacons = [
            SimBeacon(self.team[b["owner"]], NO_TOPIC, BeaconPayload(
                b["id"], TENANT, b["owner"], b["query"], float(np.float32(threshold)),
                embedding=beacon_vectors[j], embedding_space=space,
            ))
            for j, b in enumerate(stream.beacons)
        ]  # fmt: skip
        # The columns the routing rule reads (Workload._accepting), as for a synthetic workload.
        self._b_node = np.array([b.node for b in self.beacons], np.int64)
        self._b_vec = beacon_vectors.astype(np.float32)
        self._b_tau = np.full(len(self.beacons), threshold, np.float32)
        self._b_min_sal = np.full(len(self.beacons), -1.0, np.float32)
        self._b_types: list[tuple[str, ...] | None] = [None] * len(self.beacons)
        cells: list[LabelledCell] = []
        accepting: list[np.ndarray] = []
        for i, memory in enumerate(kept):
            origin, vector = self.team[memory["author"]], memory_vectors[i]
            salience, cell_type = float(memory["salience"]), memory["cell_type"]
            ok = self._accepting(origin, vector, salience, cell_type)
            accepting.append(ok)
            cells.append(LabelledCell(
                i, origin, NO_TOPIC, i * store_interval_ms, salience, cell_type, vector,
                frozenset(int(self._b_node[j]) for j in np.flatnonzero(ok).tolist()),
                memory_id=memory["id"], author=memory["author"], content=memory["content"], space=space,
                project=stream.project,
            ))  # fmt: skip
        self.stream_cells = cells  # the same cells, typed as memories (memory id, author)
        self.cells: list[SimCell] = list(cells)
        # accepts[b, i]: beacon b accepts cell i by the routing rule (what routing may deliver for it)
        self.accepts = np.array(accepting, bool).T if accepting else np.zeros((len(self.beacons), 0), bool)
        kept_ids = {m["id"] for m in kept}
        self.relevant: dict[str, frozenset[str]] = {  # owner -> the memories their beacons want
            owner: frozenset(
                m for b in stream.beacons if b["owner"] == owner for m in stream.judgements[b["id"]] if m in kept_ids
            )
            for owner in self.owners
        }  # fmt: skip

    def boot_peers(self, node: int) -> tuple[int, ...]:
        """With ``team_peers``, a teammate's node is told of every other teammate's at boot (a team
        whose members joined through each other); else only of its random seeds, like any node."""
        if not self.team_peers or node not in self.watched_nodes:
            return ()
        return tuple(sorted(self.watched_nodes - {node}))

    @property
    def owners(self) -> list[str]:
        return sorted({b["owner"] for b in self.stream.beacons})

    def describe(self) -> dict[str, Any]:
        """What ``summary.json`` says of the workload (no machine path: the file by name and hash)."""
        stored = {c.memory_id for c in self.stream_cells}
        return {
            "kind": "team-stream", "file": self.stream.name, "sha256": self.stream.sha256,
            "memories": len(self.cells), "beacons": len(self.beacons), "owners": len(self.owners),
            "people": len(self.team), "team_nodes": dict(sorted(self.team.items())),
            "embedding_space": self.embedding_space, "beacon_threshold": self.threshold,
            # (beacon, memory) pairs judged relevant, and (owner, memory) pairs after the union per owner
            "judged_pairs": sum(len(v & stored) for v in self.stream.judgements.values()),
            "owner_relevant_pairs": sum(len(v) for v in self.relevant.values()),
        }  # fmt: skip


def build_labelled(
    path: Path, *, nodes: int, seed: int, energy: EnergyModel, threshold: float, store_interval_ms: int,
    stores: int | None, embedder: TextEmbedder | None = None, cache_dir: Path | None = None, team_peers: bool = False,
) -> LabelledWorkload:  # fmt: skip
    """Read, embed (or read the cache) and place a team stream; ``embedder`` defaults to the node's."""
    stream = load_stream(path)
    if embedder is None:
        embedder = _node_embedder()
    vectors = embed_stream(stream, embedder, cache_dir)
    return LabelledWorkload(
        stream, vectors, embedder.space, nodes=nodes, seed=seed, energy=energy, threshold=threshold,
        store_interval_ms=store_interval_ms, stores=stores, team_peers=team_peers,
    )  # fmt: skip


def _node_embedder(settings: Mapping[str, Any] | None = None) -> TextEmbedder:
    # Loaded on first use: the weights take a second, and synthetic runs never need them.
    from node.embedding import load_embedder

    return load_embedder(settings)
