"""A malicious member on the virtual network: the insider of the issue "Trust no member".

An :class:`Insider` is a member in good standing: a real node key with the team's proof, the
team key, and an engine of its own that takes part in the mesh like any other. On command it
also does what a modified node (or a member's compromised machine) could:

* **forge**: frames in another member's name (the team key seals them; the sender tag is its
  own pair key with the recipient, its own signature, or none: all it has), a beacon that reuses
  another member's beacon id, the removal of another member's beacon;
* **replay**: frames it saw on the wire (:class:`InsiderNetwork` taps every frame, as an insider
  on the path would), to their recipient or to another member;
* **flood**: control state past its quota (beacons of any size, signed by itself, its engine's
  own check bypassed), and data (cells that honest beacons want);
* **poison**: diffs it signs that are wrong: a malformed body, an oversized vector, a stamp an
  hour ahead, a tombstone for another member's cell, a diff in another's name, data in gossip
  and control in data frames;
* **withhold**: drop frames it should send (relays, acks, gossip answers), while it still answers
  pings, so that its peers keep counting on it.

What it must never achieve (``tests/mesh/test_insider.py`` holds the mesh to it): anything
beyond spam within its quota. It never removes, rewrites or blocks another member's data:
honest members deliver to each other as well with it as without it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import msgpack
import numpy as np

from .config import EnergyParams, MeshConfig
from .diffs import (
    BeaconPayload, CellPayload, Diff, DiffKind, Payload, TombstonePayload, UnbeaconPayload, id_bytes, sign_diff,
)  # fmt: skip
from .engine import MeshEngine
from .errors import Reason
from .events import CellStored, FrameReceived, SendFrame
from .memory import MemoryDiffLog
from .team import AUTH_SIGNED, FrameAuth, Team
from .testing import VirtualNetwork, seeded_identity
from .wire import Envelope, MsgType, decode_envelope, encode_envelope

__all__ = ["InsiderNetwork", "Insider", "LIVENESS", "seeded_engine"]

LIVENESS = frozenset({MsgType.PING, MsgType.PONG})  # what a withholding insider still sends
_ALL = frozenset(MsgType)


def seeded_engine(address: str, team: Team, energy: EnergyParams, *, seed: int = 0, **config: Any) -> MeshEngine:
    """An engine with the real crypto and an identity drawn from ``seed`` and ``address``: the same
    node ids every run, so a run with an insider and one without follow the same seed."""
    identity = seeded_identity(random.Random(f"{seed}:{address}:identity"))
    cfg = MeshConfig(team=team, address=address, **config)
    return MeshEngine(identity, cfg, MemoryDiffLog(), energy=energy, rng=random.Random(f"{seed}:{address}"))


class InsiderNetwork(VirtualNetwork):
    """A :class:`VirtualNetwork` on which insiders see every frame and may hold back their own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tapped: list[tuple[str, str, bytes]] = []  # (from, to, frame), while ``tap`` is on
        self.tap = False
        self.withheld: dict[str, frozenset[MsgType]] = {}  # insider address -> the frame types it drops

    def _send(self, src: str, effect: SendFrame) -> None:
        if self.tap:
            self.tapped.append((src, effect.address, effect.frame))
        held = self.withheld.get(src)
        if held and self._type_of(src, effect.frame) in held:
            self.stats["frames_withheld"] += 1
            return
        super()._send(src, effect)

    def _type_of(self, src: str, frame: bytes) -> MsgType:
        _, _, plaintext = self.hosts[src].engine.state.sealer.open(frame)  # its own frame: it can read it
        return decode_envelope(plaintext).type


class Insider:
    """A member that misbehaves on command; see the module docstring."""

    def __init__(self, net: InsiderNetwork, address: str) -> None:
        self.net = net
        self.address = address
        self.engine = net.hosts[address].engine
        self.state = self.engine.state
        self._nonces = iter(range(1 << 30, 1 << 31))

    @property
    def node_id(self) -> str:
        return self.engine.node_id

    def member(self, address: str) -> MeshEngine:
        return self.net.hosts[address].engine

    # -- frames as it likes them -----------------------------------------------------------

    def envelope(self, mtype: MsgType, diffs: Iterable[Diff] = (), *, sent_at: int | None = None,
                 as_id: str | None = None, **fields: Any) -> Envelope:  # fmt: skip
        """An envelope as its engine would make one now: with the keys and proofs of the diffs'
        origins and of the sender it claims to be (all public: they ride in every frame)."""
        diffs = tuple(diffs)
        keys = self.state.keys_for(diffs)
        if as_id is not None and (entry := self.state.keyring.get(as_id)) is not None:
            keys[as_id] = entry
        at = self.net.now if sent_at is None else sent_at
        return Envelope(mtype, at, self.engine.config.address, keys, diffs, **fields)

    def seal(self, to: str, env: Envelope, *, as_id: str | None = None, tag: str = "own") -> bytes:
        """``env`` sealed under the team key, naming ``as_id`` (default: itself) as its sender and
        tagged ``"own"`` (its pair key with ``to``: the best a forger has), ``"signed"`` (its own
        signature) or ``"none"``."""
        binding, recipient = self.state.binding, self.member(to)
        auth = {
            "own": lambda: binding.auth_for(recipient.node_id, recipient.public_key),
            "signed": lambda: FrameAuth(AUTH_SIGNED, self.state.sign),
            "none": lambda: None,
        }[tag]()
        return self.state.sealer.seal(as_id or self.node_id, encode_envelope(env), auth)

    def send(self, to: str, env: Envelope, *, as_id: str | None = None, tag: str = "own") -> None:
        """Deliver a frame of ``env`` to ``to`` now (see :meth:`seal`)."""
        self.deliver(to, self.seal(to, env, as_id=as_id, tag=tag))

    def deliver(self, to: str, frame: bytes) -> None:
        """Hand ``to`` a frame now, lost never (the insider's best case), unless a partition cuts it off."""
        if not self.net.connected(self.address, to):
            self.net.stats["frames_cut"] += 1
            return
        self.net.inject(to, FrameReceived(self.address, frame))

    # -- forge -------------------------------------------------------------------------------

    def forge_ping(self, victim: str, as_member: str, ahead_ms: int = 0, tag: str = "own") -> None:
        """A PING "from" ``as_member`` to ``victim``, stamped ``ahead_ms`` into the future."""
        claimed = self.member(as_member)
        env = self.envelope(MsgType.PING, sent_at=self.net.now + ahead_ms, nonce=next(self._nonces))
        env.keys = {claimed.node_id: (claimed.public_key, claimed._proof)}
        env.sender_address = claimed.config.address
        self.send(victim, env, as_id=claimed.node_id, tag=tag)

    def claim_beacon(self, beacon: BeaconPayload, vector: np.ndarray) -> Diff:
        """A beacon of its own under another member's beacon id, pointing elsewhere."""
        stolen = BeaconPayload(beacon.beacon_id, beacon.tenant_id, "insider", "query", 0.5, embedding=vector,
                               embedding_space=beacon.embedding_space)  # fmt: skip
        return self.publish(stolen)

    def remove_beacon(self, beacon_id: str, tenant_id: str) -> Diff:
        """The removal of a beacon id that another member placed."""
        return self.publish(UnbeaconPayload(beacon_id, tenant_id))

    # -- replay ------------------------------------------------------------------------------

    def replay(self, frames: Iterable[tuple[str, str, bytes]], to: str | None = None) -> int:
        """Send tapped frames again: to their recipient, or to ``to``. Returns how many."""
        count = 0
        for src, dst, frame in frames:
            if src != self.address and dst != self.address:
                self.net.inject(to or dst, FrameReceived(src, frame))
                count += 1
        return count

    # -- flood -------------------------------------------------------------------------------

    def flood_beacons(self, count: int, query_bytes: int = 4096, *, dim: int = 16, seed: int = 0) -> list[Diff]:
        """``count`` beacons of its own of ``query_bytes`` each, past its quota, pushed to every member."""
        rng = np.random.default_rng(seed)
        diffs = []
        for i in range(count):
            vector = rng.standard_normal(dim).astype(np.float32)
            payload = BeaconPayload(f"flood-{seed}-{i}", "t", "spam", "x" * query_bytes, 0.99,
                                    embedding=vector / np.linalg.norm(vector), embedding_space="space")  # fmt: skip
            diffs.append(self.publish(payload))
        self.push(diffs)
        return diffs

    def flood_cells(self, cells: Iterable[CellPayload]) -> None:
        """Store cells through its own engine: pushed, like any member's, to the beacons they match."""
        for cell in cells:
            self.net.inject(self.address, CellStored(cell))

    # -- poison ------------------------------------------------------------------------------

    def poison(self, to: str, victim_cell: Diff | None = None) -> dict[str, int]:
        """Send ``to`` one frame per kind of wrong diff, each well sealed and tagged as its own;
        returns the drops they must each be counted as."""
        now, state, expected = self.net.now, self.state, {}

        def signed(kind: DiffKind, body: list, ts: int = now) -> Diff:
            state.seq += 1
            raw = msgpack.packb([1, int(kind), id_bytes(self.node_id), state.seq, ts, body], use_bin_type=True)
            return Diff(kind, self.node_id, state.seq, ts, None, raw, state.sign(raw), 1, 0)  # type: ignore[arg-type]

        vector = np.ones(8, np.float32) / np.sqrt(8)
        beacon = BeaconPayload("poison", "t", "spam", "q", 0.5, embedding=vector, embedding_space="space")
        bad = [
            (MsgType.GOSSIP, signed(DiffKind.BEACON, ["not", "a", "beacon"]), Reason.MALFORMED),
            (MsgType.GOSSIP, self.sign(BeaconPayload("big", "t", "s", "q", 0.5, embedding=np.zeros(5000, np.float32),
                                                     embedding_space="space")), Reason.CONTENT_TOO_LARGE),
            (MsgType.GOSSIP, self.sign(beacon, ts=now + 3_600_000), Reason.FUTURE),
            (MsgType.DATA, self.sign(beacon), Reason.MALFORMED),  # control in a data frame
            (MsgType.GOSSIP, self.sign(CellPayload("c", "t", "a", "x", "Fact", 0.5, now, embedding=vector,
                                                   embedding_space="space")), Reason.MALFORMED),  # data in gossip
            (MsgType.DATA, self._in_name_of(to, CellPayload("c2", "t", "a", "x", "Fact", 0.5, now, embedding=vector,
                                                            embedding_space="space")), Reason.BAD_SIGNATURE),
        ]  # fmt: skip
        if victim_cell is not None:
            p: Any = victim_cell.payload
            tomb = TombstonePayload(p.node_id, p.tenant_id, now, victim_cell.origin, victim_cell.seq)
            bad.append((MsgType.DATA, self.sign(tomb), Reason.NOT_ORIGIN))
        for mtype, diff, reason in bad:
            fields = {"batch_id": next(self._nonces)} if mtype is MsgType.DATA else {"reply_wanted": False}
            self.send(to, self.envelope(mtype, (diff,), **fields))
            expected[reason] = expected.get(reason, 0) + 1
        return expected

    def _in_name_of(self, to: str, payload: Payload) -> Diff:
        """A diff that names a third member as its origin, signed with our own key."""
        other = next(h.engine for a, h in self.net.hosts.items() if a not in (to, self.address))
        return sign_diff(payload, origin=other.node_id, seq=10**6, ts=self.net.now, sign=self.state.sign, hops=1)

    # -- withhold ----------------------------------------------------------------------------

    def withhold(self, types: Iterable[MsgType] = _ALL - LIVENESS) -> None:
        """From now on drop every frame of these types it would send (default: all but PING and PONG)."""
        self.net.withheld[self.address] = frozenset(types)

    def stop_withholding(self) -> None:
        self.net.withheld.pop(self.address, None)

    # -- its own control diffs, unchecked --------------------------------------------------------

    def sign(self, payload: Payload, ts: int | None = None) -> Diff:
        """A diff of its own (next seq), signed and not recorded."""
        state = self.state
        state.seq += 1
        return sign_diff(payload, origin=self.node_id, seq=state.seq, ts=self.net.now if ts is None else ts,
                         sign=state.sign, hops=1)  # fmt: skip

    def publish(self, payload: Payload) -> Diff:
        """A control diff of its own, recorded in its control state with no quota (a modified
        node): its anti-entropy serves it to every member that asks."""
        state = self.state
        state.now = self.net.now
        diff = state.sign_new(payload)
        self.engine.control.apply(diff)
        state.store.put(diff, state.now)
        return diff

    def push(self, diffs: list[Diff], to: Iterable[str] | None = None) -> None:
        """Push control diffs in GOSSIP frames, as many as a frame may hold, to every member (one
        hop away, as a partial view's radius counts)."""
        diffs = [d.routed(hops=1, ttl=0) for d in diffs]
        targets = list(to) if to is not None else [a for a in self.net.hosts if a != self.address]
        limit = self.engine.config.limits.max_diffs
        budget = self.state.max_bytes
        for address in targets:
            chunk: list[Diff] = []
            size = 0
            for diff in diffs:
                if len(chunk) == limit or size + diff.size > budget:
                    self.send(address, self.envelope(MsgType.GOSSIP, chunk))
                    chunk, size = [], 0
                chunk.append(diff)
                size += diff.size
            if chunk:
                self.send(address, self.envelope(MsgType.GOSSIP, chunk))
