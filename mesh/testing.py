"""An in-memory network on a virtual clock that staples engines together.

:class:`VirtualNetwork` carries :class:`SendFrame` effects between engines through a
heap-ordered event queue, under a seeded ``random.Random``: per-link latency (which
also reorders), loss, duplication and partitions. Timers are virtual too, so an hour
of protocol time runs in well under a second. The simulator in ``simulations/``
reuses it (add hosts, set link conditions, read ``stats`` and each host's records).

:func:`fast_crypto` gives a keyed-hash signature scheme and key agreement, and
:class:`PlainSealer` a frame "sealer" without encryption: real integrity checks of the real
sizes that cost about a microsecond, for simulations only (anyone who knows a public key can
forge). :mod:`mesh.insider` puts a malicious member on this network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq
import itertools
import random
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from .config import EnergyParams, MeshConfig
from .engine import MeshEngine
from .errors import Reason, SealError
from .events import (
    ApplyRemoteBeacon, ApplyScene, ApplyTombstone, Effect, Event, FrameReceived, PeerStateChanged,
    RemoveRemoteBeacon, SendFailed, SendFrame, SetTimer, Started, StoreRemoteCell, TimerFired,
)  # fmt: skip
from .identity import NodeIdentity, node_id_for
from .lifecycle import statuses, supersedes
from .memory import MemoryDiffLog
from .team import AUTH_NONE, FRAME_VERSION, SENDER_TAG_BYTES, FrameAuth, Team, Unsealed
from .diffs import id_bytes, id_hex
from .wire import Envelope, encode_envelope

__all__ = [
    "LinkConditions", "VirtualNetwork", "Host", "PlainSealer", "fast_crypto", "seeded_identity", "make_engine",
    "sealed_by",
]  # fmt: skip

START_MS = 1_780_000_000_000


@dataclasses.dataclass(frozen=True)
class LinkConditions:
    latency_ms: tuple[int, int] = (5, 25)  # uniform; the spread reorders frames
    loss: float = 0.0
    duplicate: float = 0.0


@dataclasses.dataclass
class Host:
    """One engine on the network, and what it was told to do."""

    address: str
    engine: MeshEngine
    cells: dict[str, StoreRemoteCell] = dataclasses.field(default_factory=dict)
    tombstones: dict[str, ApplyTombstone] = dataclasses.field(default_factory=dict)
    remote_beacons: dict[str, ApplyRemoteBeacon] = dataclasses.field(default_factory=dict)
    scenes: dict[str, ApplyScene] = dataclasses.field(default_factory=dict)
    peer_states: dict[str, str] = dataclasses.field(default_factory=dict)
    state_log: list[PeerStateChanged] = dataclasses.field(default_factory=list)

    @property
    def node_id(self) -> str:
        return self.engine.node_id

    def statuses(self) -> dict[str, str]:
        """Each cell's status here, as a node keeps it (:func:`mesh.lifecycle.statuses`): the
        supersede links of the cells it holds, applied whichever came first, and its tombstones."""
        links = {cid: supersedes(e.cell.metadata, cid) or () for cid, e in self.cells.items()}
        return statuses(links, self.tombstones)

    def record(self, effect: Effect) -> None:
        if isinstance(effect, StoreRemoteCell):
            self.cells.setdefault(effect.cell.node_id, effect)
        elif isinstance(effect, ApplyTombstone):
            self.tombstones[effect.cell_id] = effect
        elif isinstance(effect, ApplyRemoteBeacon):
            # By id, as its first owner placed it: another member's beacon of the same id is its own.
            held = self.remote_beacons.get(effect.beacon.beacon_id)
            if held is None or held.origin_node == effect.origin_node:
                self.remote_beacons[effect.beacon.beacon_id] = effect
        elif isinstance(effect, RemoveRemoteBeacon):
            held = self.remote_beacons.get(effect.beacon_id)
            if held is not None and held.origin_node == effect.origin_node:
                del self.remote_beacons[effect.beacon_id]
        elif isinstance(effect, ApplyScene):
            self.scenes[str(effect.scene.get("scene_id"))] = effect
        elif isinstance(effect, PeerStateChanged):
            self.peer_states[effect.peer_id] = effect.state
            self.state_log.append(effect)


class VirtualNetwork:
    """Engines, a virtual clock and a hostile-on-request network between them."""

    def __init__(
        self, *, seed: int = 0, link: LinkConditions | None = None, start_ms: int = START_MS,
        report_send_failures: bool = False, send_failure_after_ms: int = 1000, record: bool = True,
    ) -> None:  # fmt: skip
        self.rng = random.Random(seed)
        self.now = start_ms
        self.link = link or LinkConditions()
        self.links: dict[tuple[str, str], LinkConditions] = {}
        self.report_send_failures = report_send_failures
        self.send_failure_after_ms = send_failure_after_ms
        # Each host keeps what it was told to do (tests read it); a simulator that watches
        # ``on_effect`` instead turns it off: at N=10,000 that is millions of kept effects.
        self.record = record
        self.hosts: dict[str, Host] = {}
        self.stats: Counter[str] = Counter()
        self.on_effect: Callable[[Host, Effect], None] | None = None
        # Events by time: virtual ms -> a heap of (order, address, event), and a heap of those
        # times. Many events share a millisecond, so each pop sifts a small heap, not one
        # holding every pending event of a 10,000-node run.
        self._queue: dict[int, list[tuple[int, str, Event]]] = {}
        self._times: list[int] = []
        self._order = itertools.count()
        self._timers: dict[tuple[str, str], int] = {}
        self._group: dict[str, int] = {}

    # -- topology --------------------------------------------------------------------

    def add(self, engine: MeshEngine) -> Host:
        host = Host(engine.config.address, engine)
        self.hosts[host.address] = host
        return host

    def partition(self, *groups: Iterable[str]) -> None:
        """Cut the network: frames cross only within a group; unnamed hosts stay together."""
        self._group = {address: i + 1 for i, group in enumerate(groups) for address in group}

    def heal(self) -> None:
        self._group = {}

    def connected(self, a: str, b: str) -> bool:
        return self._group.get(a, 0) == self._group.get(b, 0)

    # -- driving ---------------------------------------------------------------------

    def start(self, *addresses: str) -> None:
        for address in addresses or tuple(self.hosts):
            self.inject(address, Started())

    def inject(self, address: str, event: Event) -> list[Effect]:
        """Hand an event to one engine now, and carry out its effects."""
        host = self.hosts[address]
        effects = host.engine.handle(event, self.now)
        for effect in effects:
            self._carry_out(host, effect)
        return effects

    def schedule(self, at: int, address: str, event: Event) -> None:
        self._push(at, next(self._order), address, event)

    def _push(self, at: int, order: int, address: str, event: Event) -> None:
        """Queue ``event`` at ``at``; events of one time are handled by ``order``."""
        bucket = self._queue.get(at)
        if bucket is None:
            self._queue[at] = [(order, address, event)]
            heapq.heappush(self._times, at)
        else:
            heapq.heappush(bucket, (order, address, event))

    def run_for(self, ms: int) -> None:
        self.run_until(self.now + ms)

    def run_until(self, until_ms: int, stop: Callable[[], bool] | None = None) -> bool:
        """Process events up to ``until_ms``; returns True if ``stop()`` became true."""
        queue, times = self._queue, self._times
        while times and times[0] <= until_ms:
            at = times[0]
            bucket = queue[at]
            if not bucket:
                heapq.heappop(times)
                del queue[at]
                continue
            _, address, event = heapq.heappop(bucket)
            if isinstance(event, TimerFired) and self._timers.get((address, event.name)) != at:
                continue  # replaced by a later SetTimer
            self.now = max(self.now, at)
            self.inject(address, event)
            if stop is not None and stop():
                return True
        self.now = max(self.now, until_ms)
        return stop() if stop is not None else False

    def _carry_out(self, host: Host, effect: Effect) -> None:
        if isinstance(effect, SendFrame):
            self._send(host.address, effect)
        elif isinstance(effect, SetTimer):
            self._timers[(host.address, effect.name)] = effect.at_ms
            self.schedule(effect.at_ms, host.address, TimerFired(effect.name))
        elif self.record:
            host.record(effect)
        if self.on_effect is not None:
            self.on_effect(host, effect)

    def _send(self, src: str, effect: SendFrame) -> None:
        dst = effect.address
        self.stats["frames_sent"] += 1
        self.stats["data_frames_sent" if not effect.is_control else "control_frames_sent"] += 1
        link = self.links.get((src, dst), self.link)
        if dst not in self.hosts or not self.connected(src, dst):
            self.stats["frames_cut"] += 1
            if self.report_send_failures:
                self.schedule(self.now + self.send_failure_after_ms, src, SendFailed(dst))
            return
        rng = self.rng
        if link.loss and rng.random() < link.loss:
            self.stats["frames_lost"] += 1
            return
        copies = 2 if link.duplicate and rng.random() < link.duplicate else 1
        self.stats["frames_duplicated"] += copies - 1
        low, high = link.latency_ms
        for _ in range(copies):
            self.schedule(self.now + rng.randint(low, high), dst, FrameReceived(src, effect.frame))


# -- cheap crypto for simulations -------------------------------------------------------


# (node id, public key, signer, verifier, key agreement)
FastCrypto = tuple[
    str, bytes, Callable[[bytes], bytes], Callable[[bytes, bytes, bytes], bool], Callable[[bytes], bytes]
]


def fast_crypto(rng: random.Random) -> FastCrypto:
    """``(node_id, public_key, signer, verifier, key_agreement)`` with a keyed BLAKE2b
    "signature" and a hash of the two public keys for the "agreed" secret."""
    public_key = rng.randbytes(32)

    def sign(message: bytes) -> bytes:
        return hashlib.blake2b(message, key=public_key).digest()

    def agree(peer_public_key: bytes) -> bytes:
        low, high = sorted((public_key, peer_public_key))
        return hashlib.blake2b(low + high, digest_size=32).digest()

    return node_id_for(public_key), public_key, sign, _fast_verify, agree


def seeded_identity(rng: random.Random) -> NodeIdentity:
    """A real Ed25519 identity drawn from ``rng``: the same node id every run of a seed."""
    return NodeIdentity(Ed25519PrivateKey.from_private_bytes(rng.randbytes(32)))


def _fast_verify(public_key: bytes, signature: bytes, message: bytes) -> bool:
    return hashlib.blake2b(message, key=public_key).digest() == signature


_VERSION_BYTE = bytes([FRAME_VERSION])


class PlainSealer:
    """Frame layout of :class:`mesh.team.FrameSealer`, with a checksum and no secrecy."""

    def __init__(self, team: Team, rng: random.Random) -> None:
        self._tag = hashlib.sha256(team.team_key).digest()[:16]
        self._rng = rng

    def seal(self, sender_id: str, plaintext: bytes, auth: FrameAuth | Any = None) -> bytes:
        kind = AUTH_NONE if auth is None else auth.kind
        header = _VERSION_BYTE + id_bytes(sender_id) + self._rng.randbytes(12) + bytes((kind,))
        check = hashlib.blake2b(header, key=self._tag, digest_size=16)
        check.update(plaintext)  # no copy of the plaintext to hash it
        body = b"".join((header, plaintext, check.digest()))
        return body if auth is None else body + auth.tag(body)

    def unseal(self, frame: bytes) -> Unsealed:
        if len(frame) < 46 or frame[0] != FRAME_VERSION:
            old = len(frame) >= 46 and 0 < frame[0] < FRAME_VERSION
            raise SealError(Reason.OLD_VERSION if old else Reason.MALFORMED, "not a frame of ours")
        tag_bytes = SENDER_TAG_BYTES.get(frame[29])
        if tag_bytes is None or len(frame) < 46 + tag_bytes:
            raise SealError(Reason.MALFORMED, "not a frame")
        end = len(frame) - tag_bytes
        body = memoryview(frame)[:end]
        if hashlib.blake2b(body[:-16], key=self._tag, digest_size=16).digest() != body[-16:]:
            raise SealError(Reason.DECRYPT_FAILED, "frame does not check out under the team key")
        return Unsealed(id_hex(frame[1:17]), frame[17:29], frame[30 : end - 16], frame[29], body, frame[end:])

    def protocol_1_sender(self, frame: bytes) -> str | None:
        return None  # no engine here speaks protocol 1 (tests/mesh/test_mixed_versions.py runs a real one)

    def open(self, frame: bytes) -> tuple[str, bytes, bytes]:
        opened = self.unseal(frame)
        return opened.sender_id, opened.nonce, opened.plaintext


def sealed_by(engine: MeshEngine, env: Envelope, to: MeshEngine | None = None) -> bytes:
    """``env`` in a frame sealed as ``engine`` seals its own: tagged with the key it shares
    with ``to``, or signed (as to a member it does not know yet)."""
    binding = engine.state.binding
    auth = binding.signed if to is None else binding.auth_for(to.node_id, to.public_key)
    return engine.state.sealer.seal(engine.node_id, encode_envelope(env), auth)


def make_engine(
    address: str, team: Team, energy: EnergyParams, *, seed: int = 0, fast: bool = False, **config: Any
) -> MeshEngine:
    """An engine over a :class:`MemoryDiffLog`; ``fast`` swaps in the cheap crypto."""
    rng = random.Random(f"{seed}:{address}")
    cfg = MeshConfig(team=team, address=address, **config)
    if fast:
        node_id, public_key, sign, verify, agree = fast_crypto(rng)
        return MeshEngine(
            node_id, cfg, MemoryDiffLog(), energy=energy, signer=sign, verifier=verify, public_key=public_key,
            key_agreement=agree, sealer=PlainSealer(team, rng), rng=rng,
        )  # fmt: skip
    return MeshEngine(NodeIdentity.generate(), cfg, MemoryDiffLog(), energy=energy, rng=rng)
