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

import dataclasses
import hashlib
import heapq
import itertools
import random
from typing import Any, Callable, Protocol

from mesh.events import CellStored, Effect, FrameReceived, SendFrame, StoreRemoteCell
from mesh.team import FRAME_OVERHEAD, Team
from mesh.testing import START_MS, Host
from mesh.wire import (
    CellPayload, Envelope, MsgType, decode_signed, encode_envelope, envelope_diffs, share_data_payloads,
    sign_diff,
)  # fmt: skip
from node.energy import EnergyModel

from .metrics import Recorder
from .network import LinkModel, SimNetwork, address, index_of
from .workload import SimCell, Workload

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


@dataclasses.dataclass(frozen=True)
class Step:
    """Where a long run is, once per virtual second: a progress line, not a result (a run
    that reports steps runs the same events in the same order as one that does not)."""

    strategy: str
    phase: str  # "warm-up", "stores" or "drain"
    at_ms: int  # virtual time into the phase
    of_ms: int  # the phase's length (warm-up and drain: at most; they may end sooner)
    frames: int  # frames sent so far, data and control


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
        # Every engine still decodes every frame; the cell diffs they relay share one decoding.
        with share_data_payloads():
            return self._run(ctx)

    def _run(self, ctx: Context) -> Outcome:
        w = ctx.workload
        net = sim_network(ctx)
        rec = Recorder(len(w.cells))
        opener = net.opener()
        limits = net.build(address(0)).config.limits
        # id(frame) -> [frame, cells, copies still to arrive] of data frames, dropped at the last arrival
        in_flight: dict[int, list] = {}
        cells_by_diff: dict[bytes, int | None] = {}  # a data diff's signed bytes -> its cell (None: a tombstone)
        phase = {"store": False, "last_data_ms": 0}
        warmup = {"control_messages": 0, "control_bytes": 0}

        def on_effect(host: Host, effect: Effect) -> None:
            if isinstance(effect, StoreRemoteCell):
                rec.deliver(_cell_index(effect.cell.node_id), index_of(host.address), net.now, effect.hops)
            elif isinstance(effect, SendFrame):
                if effect.data_bytes:
                    phase["last_data_ms"] = net.now
                    _, _, plain = opener.open(effect.frame)
                    cells = [c for c in map(cell_of, envelope_diffs(plain)) if c is not None]
                    rec.data_frames += 1
                    for cell in cells:
                        rec.sent(cell, index_of(host.address), len(effect.frame) // max(1, len(cells)))
                    if net.last_copies:  # the network has just scheduled them (or lost the frame)
                        in_flight[id(effect.frame)] = [effect.frame, cells, net.last_copies]
                elif phase["store"]:
                    rec.control(len(effect.frame))
                else:
                    warmup["control_messages"] += 1
                    warmup["control_bytes"] += len(effect.frame)

        def cell_of(raw: list) -> int | None:
            # The receiving engine decodes and checks every frame; the harness only names the
            # cells in each data frame it counts, once per distinct diff.
            signed = raw[0]
            cell = cells_by_diff.get(signed, -1)
            if cell == -1:
                payload = decode_signed(*raw[:4], limits=limits).payload  # raw[4]: a told list, if any
                cell = _cell_index(payload.node_id) if isinstance(payload, CellPayload) else None
                cells_by_diff[signed] = cell
            return cell

        def on_frame(addr: str, event: FrameReceived) -> None:
            found = in_flight.get(id(event.frame))
            if found is not None and found[0] is event.frame:
                for cell in found[1]:
                    rec.arrived(cell, index_of(addr))
                found[2] -= 1
                if not found[2]:
                    del in_flight[id(event.frame)]

        def report(phase: str, at_ms: int, of_ms: int) -> None:
            ctx.on_step(Step(self.name, phase, at_ms, of_ms, net.stats["frames_sent"]))  # type: ignore[misc]

        net.on_effect = on_effect
        net.on_frame = on_frame
        boot_nodes(ctx, net)
        warm_up = _warm_up_partial if ctx.view == "partial" else _warm_up
        steps = report if ctx.on_step is not None else None
        warmup_ms, converged = warm_up(net, w, ctx.warmup_max_ms, report=steps)
        origin_ms = net.now
        ctx.model.bind(origin_ms)
        net.schedule_outages()
        phase["store"] = True
        for cell in w.cells:
            if cell.index not in ctx.skipped:
                at = origin_ms + cell.at_ms
                net.schedule(at, address(cell.origin), CellStored(cell.payload(at, w.spec.dim)))
        end_ms = _drain(net, origin_ms + w.store_phase_ms, ctx, lambda: phase["last_data_ms"], steps)
        drops: dict[str, int] = {}
        for host in net.hosts.values():
            for reason, count in host.engine.counters.drops.items():
                drops[reason] = drops.get(reason, 0) + count
        extras = {
            "warmup_ms": warmup_ms, "warmup_converged": converged,
            "drain_ms": end_ms - origin_ms - w.store_phase_ms,
            "warmup_control_messages": warmup["control_messages"], "warmup_control_bytes": warmup["control_bytes"],
            "engine_drops": dict(sorted(drops.items())), "restarts": net.restarts,
            "repairs_requested": sum(h.engine.counters.repairs_requested for h in net.hosts.values()),
            "network": dict(sorted(net.stats.items())),
        }  # fmt: skip
        return Outcome(rec, origin_ms, end_ms, extras)


def _drain(
    net: SimNetwork, stores_end_ms: int, ctx: Context, last_data_ms: Callable[[], int], report: Report | None = None
) -> int:
    """Run the store phase, then past the last store for ``ctx.drain_ms``, or until no data
    frame has been sent for ``ctx.quiet_ms`` (the data plane is done: what is left is the
    control plane's steady gossip, which at N=10,000 costs ~25 CPU s per virtual second and
    delivers nothing). Returns where the run ended."""
    end_ms = stores_end_ms + ctx.drain_ms
    after_step = None if report is None else _phase_reporter(report, stores_end_ms, ctx)
    _run_until(net, stores_end_ms, after_step)
    while ctx.quiet_ms:
        quiet_at = max(stores_end_ms, last_data_ms()) + ctx.quiet_ms
        if quiet_at >= end_ms:
            break
        if net.now >= quiet_at:
            return net.now
        _run_until(net, quiet_at, after_step)
    _run_until(net, end_ms, after_step)
    return end_ms


def _phase_reporter(report: Report, stores_end_ms: int, ctx: Context) -> Callable[[SimNetwork], None]:
    stores_ms = ctx.workload.store_phase_ms

    def after_step(net: SimNetwork) -> None:
        if net.now <= stores_end_ms:
            report("stores", net.now - (stores_end_ms - stores_ms), stores_ms)
        else:
            report("drain", net.now - stores_end_ms, ctx.drain_ms)

    return after_step


def _run_until(net: SimNetwork, until_ms: int, after_step: Callable[[SimNetwork], None] | None) -> None:
    """``net.run_until``, one virtual second at a time when someone wants to hear after each
    (the same events in the same order: a step only pauses the queue between two of them)."""
    while True:
        step_end = until_ms if after_step is None else min(until_ms, net.now + 1000)
        net.run_until(step_end)
        if after_step is not None:
            after_step(net)
        if step_end >= until_ms:
            return


def sim_network(ctx: Context) -> SimNetwork:
    """The simulated network the engines run on, no node added yet."""
    team = Team("simulation", hashlib.blake2b(f"team:{ctx.seed}".encode(), digest_size=32).digest())
    config = {"view": ctx.view, **ctx.mesh_config}
    return SimNetwork(ctx.model, seed=ctx.seed, team=team, energy=ctx.energy, crypto=ctx.crypto, **config)


def boot_nodes(ctx: Context, net: SimNetwork) -> None:
    """One engine per node, its beacons and its seed peers, then ``Started`` on each."""
    w, n = ctx.workload, ctx.workload.spec.nodes
    seed_rng = random.Random(f"{ctx.seed}:seeds")
    for i in range(n):
        addr = address(i)
        net.add(net.build(addr))
        net.own_beacons[addr] = w.beacons_of(i)
        if ctx.view == "partial":  # a few random members each (discovery's job): a random overlay
            picks = seed_rng.sample(range(n - 1), min(n - 1, ctx.partial_seeds))
            seeds = sorted({j if j < i else j + 1 for j in picks})
        else:  # a few earlier members each: the full view learns the rest by gossip
            seeds = sorted(set(seed_rng.sample(range(i), min(i, ctx.seeds_per_node))))
        net.seeds[addr] = [address(j) for j in seeds]
    for i in range(n):
        net.boot(address(i))


def _warm_up(
    net: SimNetwork, w: Workload, max_ms: int, step_ms: int = 500, report: Report | None = None
) -> tuple[int, bool]:
    """Run until every node knows every peer and every other node's beacons (or ``max_ms``)."""
    n = w.spec.nodes
    want = {address(i): len(w.beacons) - len(w.beacons_of(i)) for i in range(n)}
    start = net.now
    hosts = list(net.hosts.values())
    while True:
        pending = [h for h in hosts if len(h.engine.peers) < n - 1 or len(h.engine.beacons) < want[h.address]]
        if not pending or net.now - start >= max_ms:
            return net.now - start, not pending
        hosts = pending
        net.run_for(step_ms)
        if report is not None:
            report("warm-up", net.now - start, max_ms)


def _warm_up_partial(
    net: SimNetwork, w: Workload, max_ms: int, step_ms: int = 1000, settled_share: float = 0.01,
    report: Report | None = None,
) -> tuple[int, bool]:
    """Run until the interest overlay has settled (or ``max_ms``): for two steps running, no
    node learned a new beacon or contact, or at most ``settled_share`` of the nodes changed
    their gossip neighbours. Known sets grow long after the overlay has formed (offers, nodes
    at the edge of a radius), so the first test alone held a run of 1,000 nodes for the whole
    default 120 s; the neighbours settle in about 20 (BENCHMARKS.md)."""
    start = net.now
    hosts = list(net.hosts.values())
    last, calm = -1, 0
    linked = [frozenset() for _ in hosts]
    while net.now - start < max_ms:
        net.run_for(step_ms)
        if report is not None:
            report("warm-up", net.now - start, max_ms)
        known = moved = 0
        for i, host in enumerate(hosts):
            engine = host.engine
            known += len(engine.beacons) + len(engine.contacts)
            now_linked = frozenset(p.node_id for p in engine.peers.neighbours())
            moved += now_linked != linked[i]
            linked[i] = now_linked
        calm = calm + 1 if known == last or moved <= settled_share * len(hosts) else 0
        last = known
        if calm >= 2:
            return net.now - start, True
    return net.now - start, False


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
