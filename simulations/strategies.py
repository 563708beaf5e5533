"""Dissemination strategies, side by side on one workload and one link model.

``hyphae`` is the production :class:`mesh.engine.MeshEngine`, one per node, on a
:class:`SimNetwork`; this module only boots nodes, injects the workload's events and
watches effects. The other three are *yardsticks*, not protocol code: a few lines of
message passing over the same :class:`LinkModel` (latency, loss, partition, churn).

* ``flood``: every node forwards a new cell once to all its overlay neighbours.
* ``random_push``: infect-and-die push gossip to ``fanout`` random members, ``ttl`` hops.
* ``oracle``: the origin sends one lossless message straight to each interested node.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import hashlib
import heapq
import itertools
import random
from typing import Any, Callable, Protocol

from mesh.events import ApplyTombstone, CellForgotten, CellStored, Effect, FrameReceived, SendFrame, StoreRemoteCell
from mesh.team import FRAME_OVERHEAD, Team
from mesh.testing import START_MS, Host
from mesh.wire import CellPayload, Envelope, MsgType, TombstonePayload, encode_envelope, sign_diff
from node.energy import EnergyModel

from .metrics import Recorder
from .network import LinkModel, SimNetwork, address, index_of, max_latency_ms, min_latency_ms
from .shards import Shard, Shards, open_shards
from .workload import TENANT, SimCell, Workload

__all__ = [
    "Context", "Outcome", "Step", "Strategy", "Hyphae", "Flood", "RandomPush", "Oracle", "STRATEGIES", "sim_network",
    "boot_nodes",
]


@dataclasses.dataclass
class Context:
    """Everything a strategy may use. ``interested`` ground truth is for the oracle only."""

    workload: Workload
    model: LinkModel
    seed: int
    energy: EnergyModel
    drain_ms: int = 10_000  # virtual time to run after the last store
    # ... or less: the drain ends once no data frame has been sent for this long (0: never)
    quiet_ms: int = 0
    view: str = "full"
    mesh_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    warmup_max_ms: int = 120_000
    seeds_per_node: int = 2
    partial_seeds: int = 3  # partial view: random members each node is told about (mean degree ~2x)
    degree: int = 8  # flood overlay
    fanout: int = 4  # random push
    ttl: int = 6  # random push
    skipped: frozenset[int] = frozenset()  # cells whose origin is down at store time
    crypto: str = "sim"  # the engines' signature and frame suite (network.CRYPTO_SUITES)
    on_step: Callable[["Step"], None] | None = None  # told where a long run is (see Step)
    processes: int = 1  # processes the engines run on (simulations.shards); the results do not depend on it


@dataclasses.dataclass(frozen=True)
class Step:
    """Where a long run is, once per virtual second: a progress line, not a result (a run
    that reports steps runs the same events in the same order as one that does not)."""

    strategy: str
    phase: str  # "warm-up", "stores" or "drain"
    at_ms: int  # virtual time into the phase
    of_ms: int  # the phase's length (warm-up and drain: at most; they may end sooner)
    frames: int  # frames sent so far, data and control
    peak_rss_kb: int = 0  # the run's processes' peak resident sets, added up (0: not known)


# Called with (phase, at_ms, of_ms) after each virtual second of a phase.
Report = Callable[[str, int, int], None]


@dataclasses.dataclass
class Outcome:
    recorder: Recorder
    origin_ms: int  # absolute time of store-phase 0
    end_ms: int
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)


class Strategy(Protocol):
    name: str

    def run(self, ctx: Context) -> Outcome: ...


def _cell_index(cell_id: str) -> int:
    return int(cell_id.rsplit("-", 1)[1])


# -- hyphae: the production engine ------------------------------------------------------


class Hyphae:
    """The real engine on every node, in the view the run asks for (``MeshConfig.view``)."""

    name = "hyphae"

    def run(self, ctx: Context) -> Outcome:
        # Every engine still decodes every frame; the diffs they relay share one decoding per part
        # (SimNetwork.decode_cache).
        shards = open_shards(ctx.processes, lambda index, count: _HyphaeShard(ctx, index, count))
        watched = ctx.workload.watched_nodes
        try:
            return self._run(ctx, _Parts(shards, START_MS, len(watched) if watched else ctx.workload.spec.nodes))
        finally:
            shards.close()

    def _run(self, ctx: Context, parts: "_Parts") -> Outcome:
        w = ctx.workload

        def report(phase: str, at_ms: int, of_ms: int) -> None:
            ctx.on_step(Step(self.name, phase, at_ms, of_ms, parts.frames_sent, parts.peak_rss_kb))  # type: ignore[misc]

        parts.call("boot")
        warm_up = _warm_up_partial if ctx.view == "partial" else _warm_up
        steps = report if ctx.on_step is not None else None
        warmup_ms, converged = warm_up(parts, ctx.warmup_max_ms, report=steps)
        origin_ms = parts.now
        ctx.model.bind(origin_ms)
        parts.call("start_stores", origin_ms)
        end_ms = _drain(parts, origin_ms + w.store_phase_ms, ctx, steps)
        results = parts.call("result")
        rec = Recorder(len(w.cells))
        drops: collections.Counter[str] = collections.Counter()
        stats: collections.Counter[str] = collections.Counter()
        for part in results:
            rec.merge(part["recorder"])
            drops.update(part["drops"])
            stats.update(part["network"])
        extras = {
            "warmup_ms": warmup_ms, "warmup_converged": converged,
            "drain_ms": end_ms - origin_ms - w.store_phase_ms,
            "warmup_control_messages": sum(p["warmup_control_messages"] for p in results),
            "warmup_control_bytes": sum(p["warmup_control_bytes"] for p in results),
            "engine_drops": dict(sorted(drops.items())), "restarts": sum(p["restarts"] for p in results),
            "repairs_requested": sum(p["repairs_requested"] for p in results),
            "network": dict(sorted(stats.items())),
        }  # fmt: skip
        return Outcome(rec, origin_ms, end_ms, extras)


class _Parts:
    """The run's parts (:mod:`.shards`) as the phases below drive them: run to a time, ask
    each part, keep the figures a progress line shows."""

    def __init__(self, shards: Shards, now: int, nodes: int) -> None:
        self.shards = shards
        self.now = now
        self.nodes = nodes  # those the partial warm-up watches settle (the workload's watched nodes)
        self.frames_sent = 0
        self.last_data_ms = 0
        self.peak_rss_kb = 0

    def call(self, method: str, *args: Any) -> list[Any]:
        return self.shards.call(method, *args)

    def run_until(self, until_ms: int) -> None:
        answers = self.shards.call("step", until_ms)
        self.now = until_ms
        self.frames_sent = sum(a[0] for a in answers)
        self.last_data_ms = max(a[1] for a in answers)
        self.peak_rss_kb = sum(a[2] for a in answers)

    def run_for(self, ms: int) -> None:
        self.run_until(self.now + ms)


class _HyphaeShard(Shard):
    """The engines of the nodes one process runs (all of them, unless the run is split), the
    workload's events for them, and the harness's watch on their effects."""

    def __init__(self, ctx: Context, index: int, count: int) -> None:
        net = sim_network(ctx)
        super().__init__(net, index, count, min_latency_ms(ctx.model.latency))
        if count > 1:
            net.local = frozenset(address(i) for i in range(ctx.workload.spec.nodes) if self.owns(i))
        self.ctx = ctx
        self.rec = Recorder(len(ctx.workload.cells))
        # id(frame) -> [frame, cells, copies still to arrive] of data frames, dropped at the last arrival
        self.in_flight: dict[int, list] = {}
        self.storing = False
        self.last_data_ms = 0
        self.warmup = {"control_messages": 0, "control_bytes": 0}
        self.linked: dict[str, frozenset[str]] = {}  # partial view: each node's neighbours at the last look
        self.pending: list[Host] | None = None  # full view: nodes still learning the mesh
        watched = ctx.workload.watched_nodes  # partial view: whose overlay the warm-up waits for
        self.watched = None if watched is None else frozenset(address(i) for i in watched)
        net.on_effect = self._on_effect
        net.on_frame = self._on_frame

    # -- asked by the run --------------------------------------------------------------

    def boot(self) -> None:
        boot_nodes(self.ctx, self.net, self.owns)
        # The engines live until the run ends: the collector need not rescan them (a full
        # collection of a part holding 10,000 engines takes seconds). The run unfreezes.
        gc.freeze()

    def step(self, until_ms: int) -> tuple[int, int, int]:
        self.run_until(until_ms)
        return self.net.stats["frames_sent"], self.last_data_ms, self.peak_rss_kb()

    def data_idle(self, in_transit_ms: int) -> bool:
        """Is every live engine of ours done with the data plane (``MeshEngine.data_idle``)?"""
        net = self.net
        return all(h.engine.data_idle(net.now, in_transit_ms) for a, h in net.hosts.items() if a not in net.down)

    def overlay_sample(self) -> tuple[int, int]:
        """Partial view: what our nodes know (beacons and contacts), and how many changed
        their gossip neighbours since the last look."""
        known = moved = 0
        for host in self.net.hosts.values():
            if self.watched is not None and host.address not in self.watched:
                continue
            engine = host.engine
            known += len(engine.beacons) + len(engine.contacts)
            now_linked = frozenset(p.node_id for p in engine.peers.neighbours())
            moved += now_linked != self.linked.get(host.address, frozenset())
            self.linked[host.address] = now_linked
        return known, moved

    def still_learning(self) -> int:
        """Full view: how many of our nodes do not yet know every peer and every other beacon."""
        w, n = self.ctx.workload, self.ctx.workload.spec.nodes
        hosts = self.pending if self.pending is not None else list(self.net.hosts.values())
        self.pending = [
            h for h in hosts
            if len(h.engine.peers) < n - 1 or len(h.engine.beacons) < len(w.beacons) - len(w.beacons_of(index_of(h.address)))
        ]  # fmt: skip
        return len(self.pending)

    def start_stores(self, origin_ms: int) -> None:
        gc.freeze()  # ... nor what they learned in the warm-up
        ctx, net = self.ctx, self.net
        ctx.model.bind(origin_ms)
        net.schedule_outages()
        self.storing = True
        for cell in ctx.workload.cells:
            if cell.index not in ctx.skipped:  # scheduled by every part alike (see SimNetwork.schedule)
                at = origin_ms + cell.at_ms
                net.schedule(at, address(cell.origin), CellStored(cell.payload(at, ctx.workload.spec.dim)))
                if cell.forgotten_at_ms is not None:  # its origin forgets it (a node down then forgets nothing)
                    net.schedule(origin_ms + cell.forgotten_at_ms, address(cell.origin), CellForgotten(cell.cell_id, TENANT))

    def result(self) -> dict[str, Any]:
        hosts = self.net.hosts.values()
        drops: collections.Counter[str] = collections.Counter()
        for host in hosts:
            drops.update(host.engine.counters.drops)
        return {
            "recorder": self.rec, "drops": dict(drops), "network": dict(self.net.stats), "restarts": self.net.restarts,
            "repairs_requested": sum(h.engine.counters.repairs_requested for h in hosts),
            "warmup_control_messages": self.warmup["control_messages"],
            "warmup_control_bytes": self.warmup["control_bytes"],
        }  # fmt: skip

    # -- the harness's watch -------------------------------------------------------------

    def _on_effect(self, host: Host, effect: Effect) -> None:
        net, rec = self.net, self.rec
        if isinstance(effect, StoreRemoteCell):
            rec.deliver(_cell_index(effect.cell.node_id), index_of(host.address), net.now, effect.hops)
        elif isinstance(effect, ApplyTombstone):
            rec.tombstone(_cell_index(effect.cell_id), index_of(host.address), net.now)
        elif isinstance(effect, SendFrame):
            if effect.data_bytes:
                self.last_data_ms = net.now
                payloads = [d.payload for d in effect.data_diffs]
                cells = [_cell_index(p.node_id) for p in payloads if isinstance(p, CellPayload)]
                for p in payloads:
                    if isinstance(p, TombstonePayload):
                        rec.tombstones_sent[_cell_index(p.cell_id)] += 1
                rec.data_frames += 1
                for cell in cells:
                    rec.sent(cell, index_of(host.address), len(effect.frame) // max(1, len(cells)))
                if net.last_copies:  # the network has just scheduled them (or lost the frame)
                    self.in_flight[id(effect.frame)] = [effect.frame, cells, net.last_copies]
                for entry in net.last_remote:  # ... or they wait for another part's nodes
                    entry[5] = cells
            elif self.storing:
                rec.control(len(effect.frame))
            else:
                self.warmup["control_messages"] += 1
                self.warmup["control_bytes"] += len(effect.frame)

    def _on_frame(self, addr: str, event: FrameReceived) -> None:
        found = self.in_flight.get(id(event.frame))
        if found is not None and found[0] is event.frame:
            for cell in found[1]:
                self.rec.arrived(cell, index_of(addr))
            found[2] -= 1
            if not found[2]:
                del self.in_flight[id(event.frame)]

    def receive(self, entries: list[list]) -> None:
        super().receive(entries)
        for entry in entries:
            if entry[5]:
                frame = entry[4]
                found = self.in_flight.get(id(frame))
                if found is not None and found[0] is frame:  # both copies of a duplicated frame
                    found[2] += 1
                else:
                    self.in_flight[id(frame)] = [frame, entry[5], 1]


def _drain(parts: _Parts, stores_end_ms: int, ctx: Context, report: Report | None = None) -> int:
    """Run the store phase, then past the last store for ``ctx.drain_ms`` or, with
    ``ctx.quiet_ms`` (a run without loss, partitions or churn), until the data plane is done:
    what is left then is the control plane's steady gossip, which at N=10,000 costs ~10 s of
    wall time per virtual second and delivers nothing. Done is when every engine says its part
    is (``MeshEngine.data_idle``), or, where a frame may take any time (lognormal latency),
    when no data frame has been sent for ``ctx.quiet_ms``. Returns where the run ended."""
    end_ms = stores_end_ms + ctx.drain_ms
    after_step = None if report is None else _phase_reporter(report, stores_end_ms, ctx)
    _run_until(parts, stores_end_ms, after_step)
    if ctx.quiet_ms:
        longest = max_latency_ms(ctx.model.latency)
        if longest is not None:
            done = _until_idle(parts, end_ms, longest, after_step)
        else:
            done = _until_quiet(parts, stores_end_ms, end_ms, ctx.quiet_ms, after_step)
        if done is not None:
            return done
    _run_until(parts, end_ms, after_step)
    return end_ms


def _until_idle(parts: _Parts, end_ms: int, longest_ms: int, after_step: Callable[[_Parts], None] | None) -> int | None:
    """Look every ``longest_ms`` (the longest a frame takes) whether every engine's data plane
    is done; when it is, or None at ``end_ms``."""
    while parts.now < end_ms:
        if all(parts.call("data_idle", longest_ms)):
            return parts.now
        step_end = min(end_ms, parts.now + longest_ms)
        second_ends = step_end // 1000 > parts.now // 1000
        parts.run_until(step_end)
        if after_step is not None and second_ends:
            after_step(parts)
    return None


def _until_quiet(
    parts: _Parts, stores_end_ms: int, end_ms: int, quiet_ms: int, after_step: Callable[[_Parts], None] | None
) -> int | None:
    """Run until no data frame has been sent for ``quiet_ms``; when, or None at ``end_ms``."""
    while True:
        quiet_at = max(stores_end_ms, parts.last_data_ms) + quiet_ms
        if quiet_at >= end_ms:
            return None
        if parts.now >= quiet_at:
            return parts.now
        _run_until(parts, quiet_at, after_step)


def _phase_reporter(report: Report, stores_end_ms: int, ctx: Context) -> Callable[[_Parts], None]:
    stores_ms = ctx.workload.store_phase_ms

    def after_step(parts: _Parts) -> None:
        if parts.now <= stores_end_ms:
            report("stores", parts.now - (stores_end_ms - stores_ms), stores_ms)
        else:
            report("drain", parts.now - stores_end_ms, ctx.drain_ms)

    return after_step


def _run_until(parts: _Parts, until_ms: int, after_step: Callable[[_Parts], None] | None) -> None:
    """``parts.run_until``, one virtual second at a time when someone wants to hear after each
    (the same events in the same order: a step only pauses the queue between two of them)."""
    while True:
        step_end = until_ms if after_step is None else min(until_ms, parts.now + 1000)
        parts.run_until(step_end)
        if after_step is not None:
            after_step(parts)
        if step_end >= until_ms:
            return


def sim_network(ctx: Context) -> SimNetwork:
    """The simulated network the engines run on, no node added yet."""
    team = Team("simulation", hashlib.blake2b(f"team:{ctx.seed}".encode(), digest_size=32).digest())
    config = {"view": ctx.view, **ctx.mesh_config}
    return SimNetwork(ctx.model, seed=ctx.seed, team=team, energy=ctx.energy, crypto=ctx.crypto, **config)


def boot_nodes(ctx: Context, net: SimNetwork, owns: Callable[[int], bool] = lambda node: True) -> None:
    """One engine per node (each node ``owns`` keeps: a split run's part holds some), its
    beacons and its seed peers, then ``Started`` on each."""
    w, n = ctx.workload, ctx.workload.spec.nodes
    seed_rng = random.Random(f"{ctx.seed}:seeds")
    for i in range(n):
        if ctx.view == "partial":  # a few random members each (discovery's job): a random overlay
            picks = seed_rng.sample(range(n - 1), min(n - 1, ctx.partial_seeds))
            seeds = sorted({j if j < i else j + 1 for j in picks})
        else:  # a few earlier members each: the full view learns the rest by gossip
            seeds = sorted(set(seed_rng.sample(range(i), min(i, ctx.seeds_per_node))))
        seeds = sorted(set(seeds) | set(w.boot_peers(i)))
        if owns(i):  # every part draws every node's seeds, so that the draws are the same
            addr = address(i)
            net.add(net.build(addr))
            net.own_beacons[addr] = w.beacons_of(i)
            net.seeds[addr] = [address(j) for j in seeds]
    for i in range(n):
        if owns(i):
            net.boot(address(i))


def _warm_up(parts: _Parts, max_ms: int, step_ms: int = 500, report: Report | None = None) -> tuple[int, bool]:
    """Run until every node knows every peer and every other node's beacons (or ``max_ms``)."""
    start = parts.now
    while True:
        pending = sum(parts.call("still_learning"))
        if not pending or parts.now - start >= max_ms:
            return parts.now - start, not pending
        parts.run_for(step_ms)
        if report is not None:
            report("warm-up", parts.now - start, max_ms)


def _warm_up_partial(
    parts: _Parts, max_ms: int, step_ms: int = 1000, settled_share: float = 0.01, report: Report | None = None
) -> tuple[int, bool]:
    """Run until the interest overlay has settled (or ``max_ms``): for two steps running, no
    node learned a new beacon or contact, or at most ``settled_share`` of the nodes changed
    their gossip neighbours. Known sets grow long after the overlay has formed (offers, nodes
    at the edge of a radius), so the first test alone held a run of 1,000 nodes for the whole
    default 120 s; the neighbours settle in about 20 (BENCHMARKS.md)."""
    start = parts.now
    last, calm = -1, 0
    while parts.now - start < max_ms:
        parts.run_for(step_ms)
        if report is not None:
            report("warm-up", parts.now - start, max_ms)
        samples = parts.call("overlay_sample")
        known, moved = sum(k for k, _ in samples), sum(m for _, m in samples)
        calm = calm + 1 if known == last or moved <= settled_share * parts.nodes else 0
        last = known
        if calm >= 2:
            return parts.now - start, True
    return parts.now - start, False


# -- yardsticks -------------------------------------------------------------------------


def message_bytes(cell: SimCell, dim: int) -> int:
    """A cell in a one-diff data frame, as the engine's codec would size it."""
    payload = cell.payload(START_MS, dim)
    diff = sign_diff(payload, origin="00" * 16, seq=1, ts=START_MS, sign=lambda m: bytes(64), hops=1, ttl=5)
    env = Envelope(MsgType.DATA, START_MS, "n0", {"00" * 16: (bytes(32), bytes(32))}, (diff,), batch_id=1)
    return len(encode_envelope(env)) + FRAME_OVERHEAD


class _MessagePassing:
    """A heap of in-flight messages over the link model; ``forward`` decides who sends what next."""

    name = "yardstick"

    def targets(self, ctx: Context, cell: SimCell, rng: random.Random) -> list[int]:
        raise NotImplementedError

    lossless = False

    def forward(self, ctx: Context, node: int, cell: SimCell, hops: int, sender: int, rng: random.Random) -> list[int]:
        return []

    def run(self, ctx: Context) -> Outcome:
        w, model = ctx.workload, ctx.model
        rng = random.Random(f"{ctx.seed}:{self.name}")
        origin_ms = START_MS
        model.bind(origin_ms)
        rec = Recorder(len(w.cells))
        sizes = [message_bytes(c, w.spec.dim) for c in w.cells]
        order = itertools.count()
        queue: list[tuple[int, int, int, int, int, int, int]] = []  # (at, order, kind, node, cell, hops, sender)
        STORE, ARRIVE = 0, 1
        for cell in w.cells:
            if cell.index not in ctx.skipped:
                heapq.heappush(queue, (origin_ms + cell.at_ms, next(order), STORE, cell.origin, cell.index, 0, -1))

        def send(src: int, dst: int, cell: int, hops: int, now: int) -> None:
            rec.sent(cell, src, sizes[cell])
            if not model.is_up(dst, now) or not model.connected(src, dst, now):
                return
            delays = [model.latency.sample(rng)] if self.lossless else model.transmit(rng)
            for delay in delays:
                heapq.heappush(queue, (now + delay, next(order), ARRIVE, dst, cell, hops, src))

        end_ms = origin_ms + w.store_phase_ms + ctx.drain_ms
        while queue and queue[0][0] <= end_ms:
            now, _, kind, node, index, hops, sender = heapq.heappop(queue)
            cell = w.cells[index]
            if kind == STORE:
                for dst in self.targets(ctx, cell, rng):
                    send(node, dst, index, 1, now)
                continue
            if not model.is_up(node, now):
                continue
            rec.arrived(index, node)
            if node == cell.origin or node in rec.delivered[index]:
                continue
            rec.deliver(index, node, now, hops)
            for dst in self.forward(ctx, node, cell, hops, sender, rng):
                send(node, dst, index, hops + 1, now)
        return Outcome(rec, origin_ms, end_ms, {})


class Flood(_MessagePassing):
    """Forward every new cell once to all overlay neighbours (random graph, mean degree ``degree``)."""

    name = "flood"

    def _overlay(self, ctx: Context) -> list[list[int]]:
        if getattr(self, "_graph", None) is None:
            n = ctx.workload.spec.nodes
            rng = random.Random(f"{ctx.seed}:overlay")
            links: list[set[int]] = [set() for _ in range(n)]
            for i in range(n):  # a ring keeps it connected; random chords give the degree
                links[i].add((i + 1) % n)
                links[(i + 1) % n].add(i)
            for i in range(n):
                for j in rng.sample(range(n), min(n, max(0, ctx.degree // 2 - 1))):
                    if j != i:
                        links[i].add(j)
                        links[j].add(i)
            self._graph = [sorted(s) for s in links]
        return self._graph

    def targets(self, ctx: Context, cell: SimCell, rng: random.Random) -> list[int]:
        return self._overlay(ctx)[cell.origin]

    def forward(self, ctx: Context, node: int, cell: SimCell, hops: int, sender: int, rng: random.Random) -> list[int]:
        return [j for j in self._overlay(ctx)[node] if j != sender and j != cell.origin]


class RandomPush(_MessagePassing):
    """Push to ``fanout`` random members; each first receiver pushes on while hops < ``ttl``."""

    name = "random_push"

    def _pick(self, ctx: Context, node: int, rng: random.Random) -> list[int]:
        n = ctx.workload.spec.nodes
        picks = rng.sample(range(n - 1), min(ctx.fanout, n - 1))
        return [p if p < node else p + 1 for p in picks]

    def targets(self, ctx: Context, cell: SimCell, rng: random.Random) -> list[int]:
        return self._pick(ctx, cell.origin, rng)

    def forward(self, ctx: Context, node: int, cell: SimCell, hops: int, sender: int, rng: random.Random) -> list[int]:
        return self._pick(ctx, node, rng) if hops < ctx.ttl else []


class Oracle(_MessagePassing):
    """One lossless message from the origin to each interested node (reachable at send time)."""

    name = "oracle"
    lossless = True

    def targets(self, ctx: Context, cell: SimCell, rng: random.Random) -> list[int]:
        return sorted(cell.interested)


STRATEGIES: dict[str, Callable[[], Strategy]] = {
    "hyphae": Hyphae, "flood": Flood, "random_push": RandomPush, "oracle": Oracle,
}  # fmt: skip
