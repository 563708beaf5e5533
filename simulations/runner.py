"""One simulation run: build the workload and schedules, run each strategy, write the results.

The summary is a pure function of the :class:`RunConfig` (seed included): same config,
byte-identical ``summary.json`` and ``cells.csv``. Wall-clock times go to
``timing.json`` only.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import gc
import json
import multiprocessing
import os
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mesh.config import MeshConfig
from mesh.team import Team
from node.config import DEFAULT_BEACON_THRESHOLD
from node.energy import EnergyModel

from .labelled import LabelledWorkload, TextEmbedder, build_labelled, default_cache_dir, parse_workload
from .lifecycle import lifecycle_summary
from .metrics import CELL_COLUMNS, summarise
from .network import CRYPTO_SUITES, ChurnSpec, Latency, LinkModel, PartitionSpec, churn_schedule, departures
from .semantic import Admit, admission_name, fresh, load_admission, rule_summary, semantic_summary
from .strategies import STRATEGIES, Context, Step
from .workload import Workload, WorkloadSpec

__all__ = ["RunConfig", "RunResult", "run", "write", "ALL_STRATEGIES"]

ALL_STRATEGIES = ("hyphae", "flood", "random_push", "oracle")

# The smallest value each count or duration of a run may take (the workload's: WorkloadSpec).
_AT_LEAST = {"drain_ms": 0, "degree": 1, "fanout": 1, "ttl": 0, "warmup_max_ms": 0, "processes": 0}
# What --mesh may override: the engine's settings, less those the harness sets per node.
_MESH_SETTINGS = {f.name for f in dataclasses.fields(MeshConfig)} - {"team", "address", "view"}
_REPAIR_INTERVAL_MS = next(f.default for f in dataclasses.fields(MeshConfig) if f.name == "repair_interval_ms")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    nodes: int = 20
    stores: int | None = 20  # a labelled workload: the first this many memories (None: all)
    seed: int = 0
    view: str = "full"
    loss: float = 0.0
    duplicate: float = 0.0
    latency: str = "uniform:5:25"
    partition: str | None = None
    churn: str | None = None
    strategies: tuple[str, ...] = ALL_STRATEGIES
    dim: int = 384
    topics: int = 50
    beacons_per_node: int = 2
    zipf: float = 1.0
    store_interval_ms: int = 50
    drain_ms: int | None = None  # default: 10 s, or 75 s (two repair rounds) when frames can go missing or cells are forgotten
    degree: int = 8
    fanout: int = 4
    ttl: int = 6
    warmup_max_ms: int = 120_000
    mesh: tuple[tuple[str, Any], ...] = ()  # MeshConfig overrides, e.g. (("repair_interval_ms", 10000),)
    energy: tuple[tuple[str, Any], ...] = ()  # EnergyModel overrides, e.g. (("max_hops", 12),)
    crypto: str = "sim"  # the engines' crypto: "sim" (keyed hashes, same sizes) or "real" (Ed25519, ChaCha20)
    # Processes the engines of the hyphae strategy run on (0: one per core). The results are the
    # same on any number, so it is left out of the summary.
    processes: int = 1
    # "synthetic" (topic clusters) or "team-stream[:PATH]" (a labelled stream, simulations.labelled).
    # The fields below serve the labelled one only, and a synthetic run's summary leaves them out.
    workload: str = "synthetic"
    beacon_threshold: float = DEFAULT_BEACON_THRESHOLD  # every labelled beacon's τ: the node's default
    embed_cache: str | None = None  # where labelled vectors are kept between runs (None: the user's cache)
    admission: str | None = None  # MODULE:NAME of an admission stage (None: admit what routing delivered)
    team_peers: bool = False  # teammates' nodes are told of each other at boot (simulations.labelled)
    # Synthetic only: shares of the stores that supersede an earlier cell, and of the cells forgotten
    # (simulations.lifecycle: the stale exposure). 0 and 0: the summary is as before they existed.
    supersede: float = 0.0
    forget: float = 0.0

    def __post_init__(self) -> None:
        kind, _ = parse_workload(self.workload)
        if kind == "synthetic":
            self.workload_spec()  # its own limits
        elif self.stores is not None and self.stores < 0:
            raise ValueError(f"stores must be at least 0, not {self.stores}")
        if not 0 <= self.beacon_threshold <= 1:
            raise ValueError("beacon_threshold is a cosine in [0, 1]")
        load_admission(self.admission)
        for name, least in _AT_LEAST.items():
            value = getattr(self, name)
            if value is not None and value < least:
                raise ValueError(f"{name} must be at least {least}, not {value}")
        unknown_mesh = sorted({key for key, _ in self.mesh} - _MESH_SETTINGS)
        if unknown_mesh:
            raise ValueError(f"unknown mesh setting(s): {', '.join(unknown_mesh)} (known: {', '.join(sorted(_MESH_SETTINGS))})")
        unknown = sorted(set(self.strategies) - set(STRATEGIES))
        if unknown:
            raise ValueError(f"unknown strategy: {', '.join(unknown)} (known: {', '.join(STRATEGIES)})")
        if not 0 <= self.loss < 1 or not 0 <= self.duplicate < 1:
            raise ValueError("loss and duplicate are probabilities in [0, 1)")
        if self.view not in ("full", "partial"):
            raise ValueError("view is full or partial")
        if self.processes != 1 and "fork" not in multiprocessing.get_all_start_methods():
            raise ValueError("processes other than 1 need processes started by fork (Linux, macOS)")
        if self.crypto not in CRYPTO_SUITES:
            raise ValueError(f"crypto is one of {', '.join(CRYPTO_SUITES)}")
        Latency.parse(self.latency)
        if self.partition:
            PartitionSpec.parse(self.partition)
        if self.churn:
            ChurnSpec.parse(self.churn)
        EnergyModel.from_config(dict(self.energy))
        # The engine's own rules for the values, before any strategy has run.
        MeshConfig(team=Team("check", bytes(32)), address="n0", view=self.view, **dict(self.mesh))  # type: ignore[arg-type]

    def workload_spec(self) -> WorkloadSpec:
        if self.stores is None:
            raise ValueError("a synthetic workload needs a number of stores")
        return WorkloadSpec(
            nodes=self.nodes, stores=self.stores, dim=self.dim, topics=self.topics,
            beacons_per_node=self.beacons_per_node, zipf=self.zipf, store_interval_ms=self.store_interval_ms,
            supersede_share=self.supersede, forget_share=self.forget,
        )  # fmt: skip

    @property
    def hostile(self) -> bool:
        return bool(self.loss > 0 or self.partition or self.churn)

    @property
    def waits_on_repair(self) -> bool:
        """Does the outcome wait on repair rounds? Lost frames do; so do forgets: a tombstone
        reaches by repair the holders its push can no longer name (the revision's old cell it
        followed is erased from every log, with its vector)."""
        return self.hostile or self.forget > 0

    def effective_drain_ms(self) -> int:
        if self.drain_ms is not None:
            return self.drain_ms
        return 75_000 if self.waits_on_repair else 10_000

    def quiet_ms(self) -> int:
        """The default drain of a run without loss, partitions or churn ends once the data plane
        is done (see ``strategies._drain``), or where link delays have no bound, once no data
        frame has been sent for this long (retries wait 1 s for an ack); a given ``drain_ms``
        runs in full (0)."""
        return 0 if self.drain_ms is not None or self.waits_on_repair else 2_000

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["strategies"] = list(self.strategies)
        out["mesh"] = dict(self.mesh)
        out["energy"] = dict(self.energy)
        out["drain_ms"] = self.effective_drain_ms()
        del out["processes"]
        if self.labelled:  # what the stream decides is in summary["workload"]; no machine path here
            for name in ("dim", "topics", "beacons_per_node", "zipf", "embed_cache", "workload"):
                del out[name]
            out["workload"] = "team-stream"
        else:  # a synthetic run's summary stays as it was before labelled workloads
            for name in ("workload", "beacon_threshold", "embed_cache", "admission", "team_peers"):
                del out[name]
        if not self.supersede and not self.forget:
            del out["supersede"], out["forget"]
        return out

    @property
    def changes_knowledge(self) -> bool:
        return bool(self.supersede or self.forget) and not self.labelled

    @property
    def labelled(self) -> bool:
        return parse_workload(self.workload)[0] != "synthetic"

    def process_count(self) -> int:
        return self.processes or os.cpu_count() or 1


@dataclasses.dataclass
class RunResult:
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    wall_s: dict[str, float]


def run(
    cfg: RunConfig, *, progress: Any = None, on_step: Callable[[Step], None] | None = None,
    admit: Admit | None = None, embedder: TextEmbedder | None = None,
) -> RunResult:  # fmt: skip
    """Run every requested strategy on the same workload and outages. ``progress(name, wall_s)``
    hears when each strategy is done; ``on_step`` where a long one is (:class:`Step`). A labelled
    workload is embedded by ``embedder`` (default: the node's own) and its inboxes pass ``admit``
    (default: ``cfg.admission``, else everything routing delivered)."""
    energy = EnergyModel.from_config(dict(cfg.energy))
    t0 = time.perf_counter()
    workload = _workload(cfg, energy, embedder)
    wall = {"workload": round(time.perf_counter() - t0, 3)}
    labelled = workload if isinstance(workload, LabelledWorkload) else None
    if admit is None:
        admit = load_admission(cfg.admission)
    partition = PartitionSpec.parse(cfg.partition) if cfg.partition else None
    churn = ChurnSpec.parse(cfg.churn) if cfg.churn else None
    outages = churn_schedule(churn, cfg.nodes, workload.store_phase_ms, random.Random(f"{cfg.seed}:churn"))
    probe = LinkModel(cfg.nodes, outages=outages)
    skipped = frozenset(c.index for c in workload.cells if not probe.stores_at(c.origin, c.at_ms))
    gone = departures(outages)
    strategies: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    for name in cfg.strategies:
        model = LinkModel(
            cfg.nodes, latency=Latency.parse(cfg.latency), loss=cfg.loss, duplicate=cfg.duplicate,
            partition=partition, outages=outages, seed=cfg.seed,
        )  # fmt: skip
        ctx = Context(
            workload, model, cfg.seed, energy, drain_ms=cfg.effective_drain_ms(), quiet_ms=cfg.quiet_ms(), view=cfg.view,
            mesh_config=dict(cfg.mesh), warmup_max_ms=cfg.warmup_max_ms, degree=cfg.degree, fanout=cfg.fanout,
            ttl=cfg.ttl, skipped=skipped, crypto=cfg.crypto, on_step=on_step, processes=cfg.process_count(),
        )  # fmt: skip
        t0 = time.perf_counter()
        with _fewer_collections():
            outcome = STRATEGIES[name]().run(ctx)
        summary, cell_rows = summarise(
            name, outcome.recorder, workload, outcome.origin_ms, outcome.end_ms,
            heal_ms=partition.heal if partition else None, skipped=skipped, gone=gone,
        )  # fmt: skip
        summary.update(outcome.extras)
        if cfg.changes_knowledge and name == "hyphae":  # the yardsticks carry no supersede or forget
            summary["lifecycle"] = lifecycle_summary(
                outcome.recorder, workload, outcome.origin_ms, skipped=skipped, gone=gone,
                whole_within_ms=int(dict(cfg.mesh).get("repair_interval_ms", _REPAIR_INTERVAL_MS)),
            )  # fmt: skip
        if labelled is not None:
            delivered = outcome.recorder.delivered
            summary["semantic"] = semantic_summary(labelled, delivered, outcome.origin_ms, fresh(admit), skipped)
        strategies[name] = summary
        rows += cell_rows
        wall[name] = round(time.perf_counter() - t0, 3)
        if progress is not None:
            progress(name, wall[name])
    config = cfg.as_dict()
    config["outages"] = len(outages)
    config["skipped_stores"] = len(skipped)
    config["departed_nodes"] = len(gone)
    summary = {"strategies": strategies, "config": config}
    if labelled is not None:
        config["stores"] = len(labelled.cells)
        config["admission"] = admission_name(admit)
        summary["workload"] = {**labelled.describe(), "rule": rule_summary(labelled, skipped)}
    return RunResult(summary, rows, wall)


def _workload(cfg: RunConfig, energy: EnergyModel, embedder: TextEmbedder | None) -> Workload:
    kind, path = parse_workload(cfg.workload)
    if kind == "synthetic":
        return Workload(cfg.workload_spec(), cfg.seed, energy)
    assert path is not None
    return build_labelled(
        path, nodes=cfg.nodes, seed=cfg.seed, energy=energy, threshold=cfg.beacon_threshold,
        store_interval_ms=cfg.store_interval_ms, stores=cfg.stores, embedder=embedder,
        cache_dir=Path(cfg.embed_cache) if cfg.embed_cache else default_cache_dir(), team_peers=cfg.team_peers,
    )  # fmt: skip


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """A run makes millions of objects that live until it ends (engines' state, frames in
    flight, per-cell records), and the collector's default thresholds rescan them again and
    again: 11 % of the CPU time at N=1,000. Collecting the young generation every 50,000
    allocations instead of 700 leaves fewer of them for the full collections."""
    before = gc.get_threshold()
    gc.set_threshold(50_000, 20, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()  # a strategy may freeze what it keeps for the run (see strategies)


def write(result: RunResult, out: Path) -> None:
    """``summary.json``, ``cells.csv`` and ``timing.json`` into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2, sort_keys=True) + "\n")
    with open(out / "cells.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CELL_COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(result.rows)
    (out / "timing.json").write_text(json.dumps({"wall_s": result.wall_s}, indent=2, sort_keys=True) + "\n")
