"""What the engine's parts share: one node's tables, the clock reading, and the acts all of them do.

The engine (:mod:`mesh.engine`) only dispatches events and keeps the timers; the protocol is
in its parts, one module each: admission (:mod:`mesh.admission`), the data plane
(:mod:`mesh.data_plane`), the overlay (:mod:`mesh.overlay`), repair (:mod:`mesh.repair_plane`)
and liveness (:mod:`mesh.liveness`). No part holds the engine. Each owns its own tables and
is handed, at construction, the parts it calls (they form a chain: liveness calls repair,
the data plane and the overlay; repair calls the data plane and the overlay) and this
:class:`NodeState`, which holds what more than one of them reads or writes:

* the node's identity, configuration, log, energy model and random generator;
* the tables: members and their keys (:mod:`mesh.membership`), the control state
  (:mod:`mesh.control`), the beacon indexes (:mod:`mesh.routing`), the partial view's
  contacts, and the :class:`Counters`;
* ``now``, the clock reading of the event being handled, and ``out``, the effects it
  produces (both set by the engine for each event: time is passed in, never read), and
  whether the frame being handled came in a response to one of ours (``in_response``);
* the acts every part performs: sign a diff of ours (one seq counter, in this run's
  incarnation: :mod:`mesh.incarnation`), admit a diff (timestamp, membership, signature),
  send a frame (sealed, tagged as ours for its recipient by the
  :class:`~mesh.frame_auth.SenderBinding`, counted), count a drop.
"""

from __future__ import annotations

import collections
import dataclasses
import random
from collections.abc import Callable, Mapping
from typing import Any

from .admission import Verifier, admit_diff
from .config import EnergyParams, MeshConfig
from .control import ControlState
from .diffs import DATA_KINDS, DecodeCache, Diff, Payload, sign_diff
from .events import Effect, SendFrame
from .frame_auth import KeyAgreement, SenderBinding
from .incarnation import resume_after
from .membership import Keyring, Peer, PeerTable
from .memory import DiffLog
from .routing import BeaconIndex
from .team import FRAME_OVERHEAD
from .wire import Envelope, MsgType, encode_envelope

__all__ = ["NodeState", "Counters", "Signer"]

Signer = Callable[[bytes], bytes]

# Membership and liveness: frames with no data diff in them and none asked for (see data_sent_at).
_CONTROL_PLANE = frozenset({MsgType.GOSSIP, MsgType.PING, MsgType.PONG})


@dataclasses.dataclass
class Counters:
    """What ``hyphae peers/status`` and the simulator read. Plain numbers only."""

    frames_sent: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # data/control
    bytes_sent: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # data/control
    data_diffs_sent: int = 0
    data_diffs_resent: int = 0  # of those, sent again (no ack in time)
    data_diffs_withdrawn: int = 0  # queued for a peer, dropped unsent: the peer had it (partial view)
    repair_diffs_sent: int = 0  # of those, in repair replies
    frames_received: int = 0
    bytes_received: int = 0
    diffs_accepted: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by kind
    cells_delivered: int = 0
    repairs_requested: int = 0
    # lazy push (mesh.lazy)
    prunes_sent: int = 0  # acks that asked their peer to announce to us instead
    diffs_announced: int = 0  # (origin, seq) announced, in IHAVE frames or riding on acks
    diffs_grafted: int = 0  # (origin, seq) asked for in GRAFT frames
    supersedes_ignored: int = 0  # cells whose supersedes list broke the rule: routed as superseding nothing
    beacon_ids_reused: int = 0  # beacons whose id another member's beacon has (kept apart, by origin)
    drops: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by reason


class NodeState:
    """One node's shared tables and acts; see the module docstring."""

    def __init__(
        self, node_id: str, config: MeshConfig, store: DiffLog, energy: EnergyParams, *, public_key: bytes,
        proof: bytes, sign: Signer, verify: Verifier, agree: KeyAgreement, sealer: Any, decode_cache: DecodeCache,
        rng: random.Random,
    ) -> None:  # fmt: skip
        self.node_id = node_id
        self.config = config
        self.store = store
        self.energy = energy
        self.public_key = public_key
        self.proof = proof
        self.sign = sign
        self.verify = verify
        self.sealer = sealer
        self.binding = SenderBinding(node_id, sign=sign, verify=verify, agree=agree, salt=config.team.pair_key_salt())
        self.decode_cache = decode_cache
        self.rng = rng
        self.keyring = Keyring(config.team.is_member)
        self.keyring.learn(node_id, public_key, proof)
        self.peers = PeerTable(node_id)
        self.control = ControlState()
        self.control.distance[node_id] = 0
        self.beacons = BeaconIndex()
        self.own_beacons = BeaconIndex()
        self.contacts: dict[str, str] = {}  # partial view: node id -> address, from peer diffs within the radius
        self.counters = Counters()
        # What a frame's diffs may take: the frame limit less the seal and room for the envelope.
        self.max_bytes = config.limits.max_frame_bytes - FRAME_OVERHEAD - 4096
        self.now = 0
        self.out: list[Effect] = []
        self.in_response = False  # the frame being handled came back in a response to one of ours
        self.seq = store.max_seq(node_id)  # our latest seq: the log's until this run's incarnation begins
        self.started_at: int | None = None  # when it began (the first Started or signature of this engine)
        self.run_base = self.seq  # this run signs above it: every seq of ours above it is this run's
        self.guard: Any = None  # the engine's IdentityGuard (mesh.identity_guard): told of diffs under our id, and forks
        self.data_sent_at: int | None = None  # our last frame of the data plane (see MeshEngine.data_idle)
        self.ping_ids = 0
        self._own_key = (public_key, proof)

    def begin_incarnation(self) -> None:
        """Once per engine: go on above anything of ours any earlier run signed, whatever the
        log remembers (:mod:`mesh.incarnation`)."""
        if self.started_at is None:
            self.started_at = self.now
            self.seq = self.run_base = resume_after(self.now, self.seq)

    def sign_new(self, payload: Payload) -> Diff:
        """A diff of ours, with the next seq."""
        if self.started_at is None:
            self.begin_incarnation()
        self.seq += 1
        return sign_diff(payload, origin=self.node_id, seq=self.seq, ts=self.now, sign=self.sign)

    def drop(self, reason: str, count: int = 1) -> None:
        if count:
            self.counters.drops[reason] += count

    def jitter(self, interval: int) -> int:
        spread = self.config.gossip_jitter * interval
        return max(1, int(interval + self.rng.uniform(-spread, spread)))

    def probe(self, peer: Peer) -> int:
        """Count a probe of ``peer`` (a ping, or a gossip round that is one): it times out like a
        ping. Returns its nonce."""
        self.ping_ids += 1
        self.peers.pinged(peer, self.ping_ids, self.now)
        return self.ping_ids

    # -- admitting a diff --------------------------------------------------------------

    def learn_key(self, origin: str, public_key: bytes, proof: bytes) -> bool:
        """Verify and keep a member's key; new ones go to the log too (a restart reads them back)."""
        if not self.keyring.learn(origin, public_key, proof):
            return False
        self.store.put_key(origin, public_key, proof)
        return True

    def admit(self, diff: Diff, keys: Mapping[str, tuple[bytes, bytes]]) -> bool:
        """Timestamp, membership and signature of one diff (:func:`mesh.admission.admit_diff`);
        a rejection is counted."""
        reason = admit_diff(
            diff, keys, self.now, self.keyring, self.verify, self.learn_key, self.config.max_clock_skew_ms
        )
        if reason is None:
            return True
        self.counters.drops[reason] += 1
        return False

    # -- sending -----------------------------------------------------------------------

    def keys_for(self, diffs: tuple[Diff, ...] | list[Diff]) -> dict[str, tuple[bytes, bytes]]:
        """Our key, and those of the diffs' origins: what the envelope carries so each checks out."""
        keys = {self.node_id: self._own_key}
        for diff in diffs:
            if diff.origin not in keys and (entry := self.keyring.get(diff.origin)) is not None:
                keys[diff.origin] = entry
        return keys

    def _auth_to(self, address: str) -> Any:
        """How a frame to ``address`` says it is ours: with the key we share with the member
        there, or signed if we know none there yet."""
        peer = self.peers.by_address(address)
        entry = self.keyring.get(peer.node_id) if peer is not None else None
        if entry is None:
            return self.binding.signed
        return self.binding.auth_for(peer.node_id, entry[0])  # type: ignore[union-attr]

    def send(
        self, address: str, mtype: MsgType, diffs: tuple[Diff, ...] = (), *, in_reply: bool = False, **fields: Any
    ) -> None:
        """Seal one frame to ``address``, count it, and put it out (``in_reply``: it may ride
        in the response to the frame being handled)."""
        now = self.now
        env = Envelope(mtype, now, self.config.address, self.keys_for(diffs), diffs, **fields)
        frame = self.sealer.seal(self.node_id, encode_envelope(env), self._auth_to(address))
        data_bytes = sum(d.size for d in diffs if d.kind in DATA_KINDS)
        lane = "data" if data_bytes else "control"
        counters = self.counters
        counters.frames_sent[lane] += 1
        counters.bytes_sent[lane] += len(frame)
        if data_bytes:
            sent = sum(1 for d in diffs if d.kind in DATA_KINDS)
            counters.data_diffs_sent += sent
            if mtype is MsgType.REPAIR_REPLY:
                counters.repair_diffs_sent += sent
        batch_id = fields.get("batch_id", 0) if mtype is MsgType.DATA else 0
        if mtype not in _CONTROL_PLANE:
            self.data_sent_at = now
        data_diffs = diffs if data_bytes else ()
        self.out.append(SendFrame(address, frame, data_bytes, not data_bytes, in_reply, batch_id, data_diffs))
