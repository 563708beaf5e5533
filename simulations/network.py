"""The simulated network: link model, partition and churn schedules, and the engine host.

One :class:`LinkModel` answers "does this frame arrive, when, how often?" for every
strategy alike: the real engines (through :class:`SimNetwork`, a
:class:`mesh.testing.VirtualNetwork` whose send path asks the model) and the baselines
(which ask it directly). Partitions and churn are *schedules* fixed up front from the
seed, so every strategy faces the same outages at the same virtual times. Times in a
schedule are relative to the start of the store phase; :meth:`LinkModel.bind` pins
them to a network's clock.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable

from mesh.config import EnergyParams, MeshConfig
from mesh.engine import MeshEngine
from mesh.events import BeaconPlaced, Event, FrameReceived, PeerDiscovered, SendFailed, SendFrame, Started
from mesh.memory import MemoryDiffLog
from mesh.team import FrameSealer, Team
from mesh.testing import PlainSealer, VirtualNetwork, fast_crypto, seeded_identity
from mesh.wire import BeaconPayload, DecodeCache

__all__ = [
    "Latency", "PartitionSpec", "ChurnSpec", "CHURN_MODES", "Outage", "LinkModel", "SimNetwork", "parse_spec",
    "departures", "CRYPTO_SUITES",
]  # fmt: skip

# "sim": keyed BLAKE2b signatures (64 bytes) and a checksummed plaintext frame (16-byte tag):
# the same sizes on the wire and the same checks, at a microsecond each. "real": Ed25519 and
# ChaCha20-Poly1305, as deployed. Who gets what does not depend on the suite.
CRYPTO_SUITES = ("sim", "real")


def parse_spec(text: str) -> dict[str, str]:
    """``"at=5000,heal=20000,split=0.5"`` -> ``{"at": "5000", ...}``."""
    out: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected key=value, got {part!r} in {text!r}")
        out[key.strip()] = value.strip()
    return out


def _take(fields: dict[str, str], allowed: set[str], what: str) -> None:
    unknown = sorted(set(fields) - allowed)
    if unknown:
        raise ValueError(f"unknown {what} setting(s): {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")


@dataclasses.dataclass(frozen=True)
class Latency:
    """One-way link latency in ms: ``uniform`` (low..high), ``lognormal`` (median, sigma) or ``constant``."""

    kind: str = "uniform"
    low: float = 5.0
    high: float = 25.0
    median: float = 12.0
    sigma: float = 0.5

    @classmethod
    def parse(cls, text: str) -> "Latency":
        """``uniform:5:25``, ``lognormal:12:0.5`` or ``constant:10``."""
        kind, *args = text.split(":")
        nums = [float(a) for a in args]
        if kind == "uniform" and len(nums) == 2:
            return cls("uniform", low=nums[0], high=nums[1])
        if kind == "lognormal" and len(nums) == 2:
            return cls("lognormal", median=nums[0], sigma=nums[1])
        if kind == "constant" and len(nums) == 1:
            return cls("constant", low=nums[0], high=nums[0])
        raise ValueError(f"latency must be uniform:LOW:HIGH, lognormal:MEDIAN:SIGMA or constant:MS, not {text!r}")

    def sample(self, rng: random.Random) -> int:
        if self.kind == "lognormal":
            return max(1, round(rng.lognormvariate(math.log(self.median), self.sigma)))
        if self.kind == "constant":
            return max(1, round(self.low))
        return max(1, round(rng.uniform(self.low, self.high)))


@dataclasses.dataclass(frozen=True)
class PartitionSpec:
    """Split the nodes into two sides at ``at`` ms; heal at ``heal`` ms (store-phase time)."""

    at: int
    heal: int
    split: float = 0.5

    @classmethod
    def parse(cls, text: str) -> "PartitionSpec":
        fields = parse_spec(text)
        _take(fields, {"at", "heal", "split"}, "partition")
        spec = cls(int(fields["at"]), int(fields["heal"]), float(fields.get("split", 0.5)))
        if not 0 <= spec.at < spec.heal or not 0 < spec.split < 1:
            raise ValueError("partition needs 0 <= at < heal and 0 < split < 1")
        return spec


CHURN_MODES = ("rejoin", "crash", "leave")
FOREVER = 2**62  # an outage that never ends


@dataclasses.dataclass(frozen=True)
class ChurnSpec:
    """Node departures as a Poisson process: ``rate`` per node per minute between ``start`` and ``stop``.

    ``mode`` says how a node goes and whether it comes back:

    * ``rejoin`` (default): it crashes, and ``down_ms`` later restarts with its data (same
      identity and diff log, a fresh engine), as many times as the process draws;
    * ``crash``: it crashes once and never returns (queued and in-flight diffs are lost);
    * ``leave``: it leaves gracefully once: its agents stop storing at once, the node keeps
      running ``grace_ms`` to finish sending and acknowledging what it queued, then goes for good.

    A node that has left or crashed for good is no longer a member: cells stored after it
    went do not count it as interested.
    """

    rate: float
    down_ms: int = 10_000
    start: int = 0
    stop: int | None = None  # default: the end of the store phase
    mode: str = "rejoin"
    grace_ms: int = 2_000

    @classmethod
    def parse(cls, text: str) -> "ChurnSpec":
        fields = parse_spec(text)
        _take(fields, {"rate", "down_ms", "start", "stop", "mode", "grace_ms"}, "churn")
        stop = fields.get("stop")
        spec = cls(float(fields["rate"]), int(fields.get("down_ms", 10_000)), int(fields.get("start", 0)),
                   None if stop is None else int(stop), fields.get("mode", "rejoin"),
                   int(fields.get("grace_ms", 2_000)))  # fmt: skip
        if spec.mode not in CHURN_MODES:
            raise ValueError(f"churn mode must be one of {', '.join(CHURN_MODES)}, not {spec.mode!r}")
        return spec


@dataclasses.dataclass(frozen=True, slots=True)
class Outage:
    """``node`` stops storing at ``down_at``, is off the network from ``down_at + grace`` until ``up_at``."""

    node: int
    down_at: int
    up_at: int  # FOREVER: it never comes back
    grace: int = 0  # graceful leave: still on the network this long after down_at

    @property
    def off_at(self) -> int:
        return self.down_at + self.grace

    @property
    def permanent(self) -> bool:
        return self.up_at >= FOREVER


def churn_schedule(spec: ChurnSpec | None, nodes: int, stop_default: int, rng: random.Random) -> list[Outage]:
    """Outages per node, non-overlapping, in time order (store-phase ms)."""
    if spec is None or spec.rate <= 0:
        return []
    stop = spec.stop if spec.stop is not None else stop_default
    per_ms = spec.rate / 60_000
    out: list[Outage] = []
    for node in range(nodes):
        t = spec.start + rng.expovariate(per_ms)
        while t < stop:
            if spec.mode == "rejoin":
                out.append(Outage(node, int(t), int(t) + spec.down_ms))
                t += spec.down_ms + rng.expovariate(per_ms)
                continue
            out.append(Outage(node, int(t), FOREVER, spec.grace_ms if spec.mode == "leave" else 0))
            break
    out.sort(key=lambda o: (o.down_at, o.node))
    return out


def departures(outages: list[Outage]) -> dict[int, int]:
    """Node -> store-phase ms from which it is no longer a member (left or crashed for good)."""
    return {o.node: o.down_at for o in outages if o.permanent}


class LinkModel:
    """Latency, loss, duplication, one scheduled partition and churn, over node indices."""

    def __init__(
        self, nodes: int, *, latency: Latency = Latency(), loss: float = 0.0, duplicate: float = 0.0,
        partition: PartitionSpec | None = None, outages: list[Outage] | None = None, seed: int = 0,
    ) -> None:  # fmt: skip
        self.nodes = nodes
        self.latency = latency
        self.loss = loss
        self.duplicate = duplicate
        self.partition = partition
        self.outages = outages or []
        self.origin_ms = 0  # absolute time of store-phase 0
        side_rng = random.Random(f"{seed}:partition")
        order = list(range(nodes))
        side_rng.shuffle(order)
        cut = round(nodes * partition.split) if partition else 0
        self.side = [0] * nodes
        for i in order[:cut]:
            self.side[i] = 1
        self._down: dict[int, list[tuple[int, int]]] = {}  # off the network
        self._away: dict[int, list[tuple[int, int]]] = {}  # not storing
        for o in self.outages:
            self._down.setdefault(o.node, []).append((o.off_at, o.up_at))
            self._away.setdefault(o.node, []).append((o.down_at, o.up_at))

    def bind(self, origin_ms: int) -> None:
        self.origin_ms = origin_ms

    def split_at(self, now: int) -> bool:
        p = self.partition
        return p is not None and p.at <= now - self.origin_ms < p.heal

    def connected(self, a: int, b: int, now: int) -> bool:
        return not self.split_at(now) or self.side[a] == self.side[b]

    def is_up(self, node: int, now: int) -> bool:
        """On the network at absolute time ``now``."""
        rel = now - self.origin_ms
        return not any(down <= rel < up for down, up in self._down.get(node, ()))

    def stores_at(self, node: int, rel: int) -> bool:
        """Do the node's agents store at store-phase time ``rel`` (not crashed, not leaving)?"""
        return not any(down <= rel < up for down, up in self._away.get(node, ()))

    def transmit(self, rng: random.Random) -> list[int]:
        """Delays of the copies that arrive (empty: lost)."""
        if self.loss and rng.random() < self.loss:
            return []
        copies = 2 if self.duplicate and rng.random() < self.duplicate else 1
        return [self.latency.sample(rng) for _ in range(copies)]


_PER_CAUSE = 1 << 40  # an event's key: its cause times this, plus how many that cause made before


def min_latency_ms(latency: Latency) -> int:
    """The least delay a frame can take (Latency.sample's floor): what a process running
    some of the nodes can run ahead of the others without missing a frame from them."""
    if latency.kind == "lognormal":
        return 1
    return max(1, math.floor(latency.low))


def max_latency_ms(latency: Latency) -> int | None:
    """The longest delay a frame can take (Latency.sample's ceiling); None if unbounded."""
    if latency.kind == "lognormal":
        return None
    return max(1, math.ceil(latency.high))


def address(index: int) -> str:
    return f"n{index}"


def index_of(addr: str) -> int:
    return int(addr[1:])


class SimNetwork(VirtualNetwork):
    """:class:`VirtualNetwork` whose links, outages and partitions follow a :class:`LinkModel`.

    A down node gets no events (frames to it are cut, its timers lapse); at ``up_at`` (if
    its outage ends) it restarts like a crashed daemon: a fresh engine over the same identity and diff log,
    ``Started``, its own beacons placed again, and its seed peers.
    """

    def __init__(
        self, model: LinkModel, *, seed: int, team: Team, energy: EnergyParams, crypto: str = "sim", **config: object
    ) -> None:
        super().__init__(seed=seed, report_send_failures=True, record=False)  # the harness reads on_effect
        if crypto not in CRYPTO_SUITES:
            raise ValueError(f"crypto is one of {', '.join(CRYPTO_SUITES)}, not {crypto!r}")
        self.model = model
        self.seed = seed
        self.team = team
        self.crypto = crypto
        self._frame_sealer = team.sealer() if crypto == "real" else None  # stateless: one for every engine
        # One decode cache for all our engines (one per part of a split run): thousands of engines
        # decode the same diffs, and share one decoding of each, cells too (nothing here edits a
        # payload it was handed).
        self.decode_cache = DecodeCache(share_data=True)
        self.energy = energy
        self.config = config
        self.down: set[str] = set()
        self.addresses = frozenset(address(i) for i in range(model.nodes))
        self.own_beacons: dict[str, list[BeaconPayload]] = {}
        self.seeds: dict[str, list[str]] = {}
        self._incarnation: dict[str, int] = {}
        self.restarts = 0
        self.on_restart: Callable[[str], None] | None = None
        self.on_frame: Callable[[str, FrameReceived], None] | None = None  # a frame reaches a live node
        self.last_copies = 0  # copies of the last frame sent that are on their way here (0: cut or lost)
        # Run on several processes (simulations.shards), this one holds the engines of the nodes
        # in ``local`` only (None: of all), and frames to the others wait in ``remote``:
        # ``[at, key, dst, src, frame, cells]`` each (``cells`` is the harness's to fill in), those
        # of the last frame sent in ``last_remote``.
        self.local: frozenset[str] | None = None
        self.remote: list[list] = []
        self.last_remote: list[list] = []
        # Events are ordered by time, then by who caused them (a node, or the harness for the
        # events it schedules) and in what order: not by when this process queued them, so a
        # run on several processes handles every node's events in the same order as on one.
        self._cause = 0  # 0: the harness; i + 1: node i, while it handles an event
        self._cause_of = {address(i): i + 1 for i in range(model.nodes)}
        self._caused = [0] * (model.nodes + 1)  # events caused so far, per cause
        self._link_rngs: dict[str, random.Random] = {}  # per sender: its frames' fates

    def build(self, addr: str) -> MeshEngine:
        """An engine for ``addr`` (same identity every incarnation, fresh rng each time)."""
        identity_rng = random.Random(f"{self.seed}:{addr}")
        n = self._incarnation.get(addr, 0)
        rng = random.Random(f"{self.seed}:{addr}:{n}")
        host = self.hosts.get(addr)
        store = host.engine.store if host is not None else MemoryDiffLog()
        cfg = MeshConfig(team=self.team, address=addr, **self.config)  # type: ignore[arg-type]
        if self.crypto == "real":  # what `hyphae up` runs: Ed25519 diffs, ChaCha20-Poly1305 frames
            identity = seeded_identity(identity_rng)
            return MeshEngine(
                identity, cfg, store, energy=self.energy, sealer=self._frame_sealer, rng=rng,
                decode_cache=self.decode_cache,
            )  # fmt: skip
        node_id, public_key, sign, verify, agree = fast_crypto(identity_rng)
        return MeshEngine(
            node_id, cfg, store, energy=self.energy, signer=sign, verifier=verify, public_key=public_key,
            key_agreement=agree, sealer=PlainSealer(self.team, rng), rng=rng, decode_cache=self.decode_cache,
        )  # fmt: skip

    def opener(self) -> PlainSealer | FrameSealer:
        """A sealer that opens the engines' frames (the harness reads the data frames it counts)."""
        return self._frame_sealer or PlainSealer(self.team, random.Random(0))

    def boot(self, addr: str) -> None:
        """``Started``, own beacons, seed peers: what ``hyphae up`` does."""
        self.inject(addr, Started())
        for beacon in self.own_beacons.get(addr, ()):
            self.inject(addr, BeaconPlaced(beacon))
        for peer in self.seeds.get(addr, ()):
            self.inject(addr, PeerDiscovered(peer))

    def schedule_outages(self) -> None:
        for o in self.model.outages:
            at = self.model.origin_ms
            self.schedule(at + o.off_at, address(o.node), _Crash())
            if not o.permanent:
                self.schedule(at + o.up_at, address(o.node), _Restart())

    def inject(self, addr: str, event: Event) -> list:  # type: ignore[override]
        if isinstance(event, _Crash):
            self.down.add(addr)
            return []
        if isinstance(event, _Restart):
            self.down.discard(addr)
            if self.local is not None and addr not in self.local:
                return []  # its own process restarts it; this one only knows it is up again
            self._incarnation[addr] = self._incarnation.get(addr, 0) + 1
            self.hosts[addr].engine = self.build(addr)
            self.restarts += 1
            if self.on_restart is not None:
                self.on_restart(addr)
            self.boot(addr)
            return []
        if addr in self.down:
            return []
        if self.on_frame is not None and isinstance(event, FrameReceived):
            self.on_frame(addr, event)
        cause, self._cause = self._cause, self._cause_of[addr]
        effects = super().inject(addr, event)
        self._cause = cause
        return effects

    def schedule(self, at: int, addr: str, event: Event) -> None:
        """Queue ``event`` for ``addr`` (if its node is here: the harness schedules every node's
        events in every process, so that each process numbers them alike)."""
        key = self._next_key()
        if self.local is None or addr in self.local or isinstance(event, (_Crash, _Restart)):
            self._push(at, key, addr, event)

    def _next_key(self) -> int:
        cause, caused = self._cause, self._caused
        n = caused[cause]
        caused[cause] = n + 1
        return cause * _PER_CAUSE + n

    def take_remote(self) -> list[list]:
        """The frames sent to nodes of other processes since the last call."""
        out, self.remote = self.remote, []
        return out

    def put_remote(self, entries: list[list]) -> None:
        """Frames from nodes of other processes, to nodes of this one."""
        push = self._push
        for at, key, dst, src, frame, _ in entries:
            push(at, key, dst, FrameReceived(src, frame))

    def _send(self, src: str, effect: SendFrame) -> None:
        dst = effect.address
        self.stats["frames_sent"] += 1
        self.stats["data_frames_sent" if not effect.is_control else "control_frames_sent"] += 1
        now = self.now
        model = self.model
        self.last_copies = 0
        if self.last_remote:
            self.last_remote = []
        if dst not in self.addresses or dst in self.down or (
            model.partition is not None and not model.connected(index_of(src), index_of(dst), now)
        ):
            self.stats["frames_cut"] += 1
            self.schedule(now + self.send_failure_after_ms, src, SendFailed(dst))
            return
        rng = self._link_rngs.get(src)
        if rng is None:
            rng = self._link_rngs[src] = random.Random(f"{self.seed}:link:{src}")
        delays = self.model.transmit(rng)
        if not delays:
            self.stats["frames_lost"] += 1
        self.stats["frames_duplicated"] += max(0, len(delays) - 1)
        here = self.local is None or dst in self.local
        for delay in delays:
            key = self._next_key()
            if here:
                self._push(now + delay, key, dst, FrameReceived(src, effect.frame))
                self.last_copies += 1
            else:
                entry = [now + delay, key, dst, src, effect.frame, None]
                self.remote.append(entry)
                self.last_remote.append(entry)


@dataclasses.dataclass(frozen=True, slots=True)
class _Crash:
    """Harness event: the node goes down (never reaches an engine)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Restart:
    """Harness event: the node comes back as a fresh engine over its old log."""

