"""The sans-IO mesh engine: ``handle(event, now_ms) -> effects``.

Theory of operation
-------------------
The engine is a pure state machine. The runtime (trio + HTTP in production, the
virtual network in tests and the simulator) feeds it events and a clock reading and
carries out the effects it returns; the engine never reads a clock, never sleeps and
never touches a socket. Five parts, one module each:

* **membership** (:mod:`mesh.membership`): peers by id and address, the key ring of
  verified origins, and the alive/suspect/dead liveness table.
* **control plane** (:mod:`mesh.control`): ``peer``, ``beacon``/``unbeacon`` and
  ``scene`` diffs replicated to every member by Scuttlebutt push-pull anti-entropy
  with one random live peer every ``gossip_interval_ms``.
* **data plane** (:mod:`mesh.routing`, :mod:`mesh.outbox`): a stored cell becomes a
  signed diff; the origin matches it against every known beacon and pushes it to the
  owners, batched per peer, highest energy first, acknowledged and retransmitted. Where
  the runtime can answer a frame in its response (``FrameReceived.replies_ride``), a
  batch for that frame's sender rides back in it; the ack for a batch that came in a
  response (``in_response``) waits ``ack_delay_ms`` to ride on our next batch to its sender.
* **repair** (:mod:`mesh.repair`): on (re)connect, and periodically to each live peer
  in turn, ask a peer for what matches my beacons in its log after the position it
  last served me; a request left unanswered is sent again. The other way round, an
  origin keeps what it failed to deliver to a peer (:class:`Owed`) and offers it again
  when that peer comes back.
* **views**: ``view="full"`` (the LAN default) knows every member and beacon and
  routes with :class:`FullView`. ``view="partial"`` (large meshes) gossips with at most
  ``max_neighbours`` random neighbours plus ``interest_neighbours`` chosen each round as
  the known nodes whose beacons are nearest its own (T-Man style, so nodes of like
  interest end up within each other's radius; a gossip answer also offers the asker the nodes
  beyond its radius nearest its interest, T-Man's ranked exchange, so a rare interest finds its
  kind in a few rounds), replicates control diffs only ``interest_radius`` hops
  (:mod:`mesh.control`), pushes data straight to the beacon owners it knows (contacts
  from ``peer`` diffs within the radius); recipients relay to the interests they know,
  and only a walk toward unseen interest spends the hop budget (:class:`PartialView`);
  a relay that wanted the cell pushes along its links as they stand now, both ways
  (:mod:`mesh.links`). With ``lazy_push``, a relay's copies to a peer that was sent one it
  had go as announcements, asked for when no other copy comes (:mod:`mesh.lazy`). Its
  gossip round goes to the live neighbour silent the longest when one is due a probe, and
  is that probe (every partial-view node answers a round): no PING and PONG besides the
  gossip, as long as the neighbours are alive.
* **admission** (here): every frame is opened (AEAD), decoded (strict), checked for
  replay and clock skew; every diff for membership, signature and duplication. Each
  rejection is counted in ``counters.drops[reason]``; nothing raises out of ``handle``
  for bad input.

Timers are named (``gossip``, ``liveness``, ``repair``, ``outbox``, ``ack``, ``lazy``); each firing
re-arms its own timer, and ``SetTimer`` is emitted only when a deadline changes.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import random
from collections.abc import Callable
from typing import Any

from .config import EnergyParams, MeshConfig
from .control import ControlState, control_key
from .errors import MeshError, Reason
from .events import (
    ApplyRemoteBeacon, ApplyScene, ApplyTombstone, BeaconPlaced, BeaconRemoved, CellForgotten, CellStored,
    Effect, Event, FrameReceived, PeerDiscovered, PeerStateChanged, RemoveRemoteBeacon, SceneChanged,
    SendFailed, SendFrame, SetTimer, Started, StoreRemoteCell, TimerFired, FrameDelivered,
)  # fmt: skip
from .haves import HaveSet
from .identity import NodeIdentity, node_id_for
from .lazy import LazyPush
from .links import InboundLinks
from .membership import Keyring, Liveness, Peer, PeerState, PeerTable
from .memory import DiffLog
from .outbox import Batch, Outbox
from .repair import Owed, RepairClient, answer_repair
from .routing import BeaconIndex, FullView, PartialView, RoutingPolicy, beacon_closeness
from .team import FRAME_OVERHEAD, FrameSealer
from .told import MAX_TOLD, tell, told_name, told_names
from .wire import (
    CONTROL_KINDS, DATA_KINDS, BeaconPayload, CellPayload, DecodeCache, Diff, DiffKind, Envelope, MsgType, Payload,
    PeerPayload, ScenePayload, TombstonePayload, UnbeaconPayload, decode_envelope,
    encode_envelope, sign_diff,
)  # fmt: skip

__all__ = ["MeshEngine", "Counters"]

Signer = Callable[[bytes], bytes]
Verifier = Callable[[bytes, bytes, bytes], bool]  # (public_key, signature, message)

_GOSSIP, _LIVENESS, _REPAIR, _OUTBOX, _ACK, _LAZY = "gossip", "liveness", "repair", "outbox", "ack", "lazy"
_ACKS_HELD = 64  # delayed acks for one peer beyond this go at once
_OUT_OF_RADIUS = "out_of_radius"  # a control diff from farther than the interest radius (partial view)
_OFFER_DECLINED = "offer_declined"  # an offered node no nearer our interest than our chosen neighbours
# Membership and liveness: frames with no data diff in them and none asked for (see data_idle).
_CONTROL_PLANE = frozenset({MsgType.GOSSIP, MsgType.PING, MsgType.PONG})
_REPAIR_RESENDS = 2  # an unanswered repair request is sent again this often; then the periodic round covers
_GRAFT_UNKNOWN = "graft_unknown"  # a graft for a diff we no longer keep (or never announced)
_KIND_NAMES = {kind: kind.name.lower() for kind in DiffKind}  # counters' keys (looked up per diff accepted)
_RECEIPTS_KEPT = 1 << 16  # data diffs received, newest kept: where each origin's span of a have-set starts


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
    drops: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # by reason


class MeshEngine:
    """One node's protocol state. See the module docstring for how it works."""

    def __init__(
        self,
        identity_or_node_id: NodeIdentity | str,
        config: MeshConfig,
        store: DiffLog,
        *,
        energy: EnergyParams,
        signer: Signer | None = None,
        verifier: Verifier | None = None,
        public_key: bytes | None = None,
        sealer: FrameSealer | Any | None = None,
        rng: random.Random | None = None,
        router: Callable[["MeshEngine"], RoutingPolicy] | None = None,
        decode_cache: DecodeCache | None = None,
    ) -> None:
        if isinstance(identity_or_node_id, NodeIdentity):
            self.node_id = identity_or_node_id.node_id
            public_key = identity_or_node_id.public_key
            signer = signer or identity_or_node_id.sign
        else:
            self.node_id = identity_or_node_id
        if public_key is None or signer is None:
            raise ValueError("a bare node id needs public_key= and signer=")
        if node_id_for(public_key) != self.node_id:
            raise ValueError("node id does not match the public key")
        self.config = config
        self.store = store
        self.energy = energy
        self.public_key = public_key
        self._sign = signer
        self._verify = verifier or NodeIdentity.verify
        self._sealer = sealer or config.team.sealer()
        # What decoding keeps between frames: our own, unless the process runs many engines
        # that share one (a simulator's part).
        self._decode_cache = DecodeCache() if decode_cache is None else decode_cache
        self._rng = rng or random.Random(self.node_id)
        self._proof = config.team.membership_proof(public_key)
        self.keyring = Keyring(config.team.is_member)
        self.keyring.learn(self.node_id, public_key, self._proof)
        self.peers = PeerTable(self.node_id)
        self.control = ControlState()
        self.beacons = BeaconIndex()
        self.partial = config.view == "partial"
        self.control.distance[self.node_id] = 0
        self.contacts: dict[str, str] = {}  # partial view: node id -> address, from peer diffs within the radius
        self.own_beacons = BeaconIndex()
        # partial view: how close (cosine) a node must be to our beacons to displace one of our
        # chosen neighbours; a node offered from beyond our radius is kept only if that close
        self._interest_bar = -2.0
        # partial view: who holds us as a neighbour (the other end of our links), in-degree bounded
        self.inbound = InboundLinks(
            config.inbound_link_timeout_ms, config.max_inbound_links,
            lambda node_id: self.beacons.closeness(node_id, self.own_beacons.vectors()), self._neighbour,
        )  # fmt: skip
        if router is not None:
            self.router: RoutingPolicy = router(self)
        elif self.partial:
            self.router = PartialView(
                self.node_id, self.beacons, energy,
                lambda: [p.node_id for p in self.peers.neighbours(PeerState.ALIVE, PeerState.SUSPECT)], self._rng.choice,
                self.own_beacons, steer=config.steer_walk, near=self._near(config.relay_radius),
                widen_leaves=config.widen_leaves, walk_far=config.walk_far, origin_walks=config.origin_walks,
                reachable=self._reachable, leaf_walk=config.leaf_walk,
            )  # fmt: skip
        else:
            self.router = FullView(self.node_id, self.beacons, energy)
        limits = config.limits
        self._max_bytes = limits.max_frame_bytes - FRAME_OVERHEAD - 4096
        self.outbox = Outbox(
            queue_limit=config.send_queue_limit, max_inflight=config.max_inflight_batches,
            max_diffs=limits.max_diffs, max_bytes=self._max_bytes, pacing_ms=config.flush_interval_ms,
            ack_timeout_ms=config.ack_timeout_ms, max_attempts=config.max_attempts,
            busy_pacing_ms=config.busy_flush_interval_ms,
        )  # fmt: skip
        self.repair = RepairClient(config.repair_timeout_ms)
        # A graft unanswered in an ack timeout goes to the next announcer.
        self.lazy = LazyPush(config.lazy_announce_ms, config.lazy_graft_ms, config.ack_timeout_ms) if (
            self.partial and config.lazy_push
        ) else None  # fmt: skip
        self._prunes_due: set[str] = set()  # peers our next ack to asks to prune (lazy push)
        self.owed = Owed(config.send_queue_limit)  # dropped for a peer: offered again when it comes back
        self.counters = Counters()
        self._seq = store.max_seq(self.node_id)
        self._contacts: dict[str, int] = {}  # unauthenticated address -> next try
        self._repair_due: dict[str, int] = {}  # peer -> retry time after a not-ready reply
        self._receipts: collections.deque[tuple[int, str, int]] = collections.deque(maxlen=_RECEIPTS_KEPT)
        self._asked_at: dict[str, int] = {}  # peer -> when our last answered repair request went out
        self._repair_started: dict[str, int] = {}  # peer -> when our last repair request to it went out
        self._repair_unanswered: dict[str, int] = {}  # peer -> requests to it since its last reply
        self._repair_turn = ""  # the periodic round asks the first live peer after this one (by id)
        self._catching_up: set[str] = set()  # peers asked on (re)connect: asked once more when answered
        self._nonces: dict[bytes, int] = {}
        self._nonce_order: collections.deque[tuple[int, bytes]] = collections.deque()
        self._clock_offsets: dict[str, int] = {}  # sender -> its clock minus ours (ms), estimated
        self._timers: dict[str, int] = {}
        self._next_repair_at: int | None = None  # set by Started
        self._restored = False  # control state put back from the log (once, at the first Started)
        self._unheard: set[str] = set()  # peers put back from the log, not heard from since
        self._armed: dict[str, int] = {}
        self._ping_ids = 0
        self._acks_due: dict[str, list[int]] = {}  # peer -> batches received in responses, not yet acked
        self._data_plane_sent_at: int | None = None  # our last frame of the data plane (see data_idle)
        self._acks_at: int | None = None  # when the delayed acks go alone
        self._reply_peer: str | None = None  # the sender of the frame being handled, if replies ride its response
        self._in_response = False  # the frame being handled came back in a response to one of ours
        self._now = 0
        self._out: list[Effect] = []
        self._handlers: dict[type, Callable[[Any], None]] = {
            Started: self._on_started, CellStored: self._on_cell_stored, CellForgotten: self._on_cell_forgotten,
            BeaconPlaced: self._on_beacon_placed, BeaconRemoved: self._on_beacon_removed,
            SceneChanged: self._on_scene_changed, PeerDiscovered: self._on_peer_discovered,
            FrameReceived: self._on_frame_received, SendFailed: self._on_send_failed, TimerFired: self._on_timer,
            FrameDelivered: self._on_frame_delivered,
        }  # fmt: skip
        self._receivers: dict[MsgType, Callable[[Envelope, Peer], None]] = {
            MsgType.DATA: self._on_data, MsgType.ACK: self._on_ack, MsgType.GOSSIP: self._on_gossip,
            MsgType.REPAIR_REQUEST: self._on_repair_request, MsgType.REPAIR_REPLY: self._on_repair_reply,
            MsgType.PING: self._on_ping, MsgType.PONG: lambda env, peer: None,
            MsgType.IHAVE: self._on_ihave, MsgType.GRAFT: self._on_graft,
        }  # fmt: skip

    def _near(self, hops: int) -> Callable[[set[str]], set[str]] | None:
        """Partial view: of a set of nodes, those a relay that wanted a cell pushes it to. One
        hop: those linked to us now, either way (our neighbours, and the nodes that hold us,
        in-degree bounded); more: those known that near (None: no limit short of the radius)."""
        if hops == 1:
            return self._linked_of
        if hops >= self.config.interest_radius:
            return None
        distance = self.control.distance
        return lambda nodes: {n for n in nodes if distance.get(n, hops + 1) <= hops}

    def _told(self, sent_to: list[str], was_told: bytes) -> bytes:
        """Partial view: the told list our copies of a diff carry (:mod:`mesh.told`)."""
        if not self.partial or not self.config.told_limit:
            return b""
        return tell(sent_to, was_told, min(self.config.told_limit, MAX_TOLD))

    def _withdraw_copies(self, diff: Diff, sender_id: str) -> None:
        """A copy of a diff we hold came in: the copies we queued for its sender, and for the
        nodes it names as sent it, would be duplicates (partial view; those in flight are gone).

        With ``relay_hold_ms``, a told list withdraws only copies still in their hold: all of a
        relay's copies of a diff leave at the end of one hold, so until then no told list of ours
        names their peers. Past it, ours may have (naming a peer, then withdrawing the copy to
        it, could leave it with none: two holders each counting on the other)."""
        self.counters.data_diffs_withdrawn += self.outbox.withdraw(sender_id, diff.origin, diff.seq)
        if diff.told and self.outbox.ready:
            names = told_names(diff.told)
            held_at = self._now if self.config.relay_hold_ms else None
            for peer_id in [p for p in self.outbox.ready if told_name(p) in names]:
                self.counters.data_diffs_withdrawn += self.outbox.withdraw(peer_id, diff.origin, diff.seq, held_at)
        if self.lazy is not None:
            # Nor announce it to the sender. To the nodes named, yes: an announcement waits far
            # longer than a queued copy, time enough for the copies that named them to be
            # withdrawn in turn, and it is what lets them ask if none comes.
            self.lazy.withdraw(sender_id, (diff.origin, diff.seq))

    def _reachable(self, node_id: str) -> bool:
        """Partial view: a node we could send to now (see _enqueue)."""
        peer = self.peers.get(node_id)
        return node_id in self.contacts if peer is None else peer.state is not PeerState.DEAD

    def _neighbour(self, node_id: str) -> bool:
        peer = self.peers.get(node_id)
        return peer is not None and peer.neighbour

    def _linked_of(self, nodes: set[str]) -> set[str]:
        """Those of ``nodes`` linked to us now, either way (a relay runs this over every owner
        it matched: one pass, not a call per owner)."""
        peer_of = self.peers.get
        linked = {n for n in nodes if (peer := peer_of(n)) is not None and peer.neighbour}
        if len(linked) < len(nodes):  # asked only when needed: it also lets go of the stale
            holding = self.inbound.holding(self._now)
            linked.update(n for n in nodes if n in holding)
        return linked

    # -- the one entry point -----------------------------------------------------------

    def handle(self, event: Event, now_ms: int) -> list[Effect]:
        """Consume one event at ``now_ms``; return the effects to carry out, in order."""
        self._now = now_ms
        self._out = out = []
        self._handlers[type(event)](event)
        self._flush()
        self._reply_peer = None
        self._arm_timers()
        self._out = []
        return out

    # -- local events ------------------------------------------------------------------

    def _on_started(self, _: Started) -> None:
        now = self._now
        self._armed.clear()  # a new runtime knows no timers yet: arm them all again
        if not self._restored:
            self._restored = True
            for origin, public_key, proof in self.store.keys():
                self.keyring.learn(origin, public_key, proof)  # checked again: a rotated team drops old proofs
            if self.config.view != "partial":  # a partial view re-learns its neighbourhood instead
                self._restore_control()
        self._publish(PeerPayload(self.config.address))
        self._timers[_GOSSIP] = now
        self._timers[_LIVENESS] = now + self.config.probe_interval_ms // 2
        self._next_repair_at = now + self._jitter(self.config.repair_interval_ms)

    def _restore_control(self) -> None:
        """Put back the control plane held before a restart (members and where they listen,
        beacons, version vectors) from the log, so the first store after a restart reaches
        the nodes that want it instead of nobody until anti-entropy and repair catch up."""
        newest: dict[tuple[str, tuple[str, str]], Diff] = {}
        top: dict[str, int] = {}
        for diff in self.store.control_diffs():
            if diff.kind in CONTROL_KINDS:
                key = (diff.origin, control_key(diff))
                if key not in newest or diff.seq > newest[key].seq:
                    newest[key] = diff
                top[diff.origin] = max(top.get(diff.origin, 0), diff.seq)
        removed_before = self._now - self.config.control_tombstone_ttl_ms
        expired_before = self._now - self.config.max_clock_skew_ms
        for diff in sorted(newest.values(), key=lambda d: (d.origin, d.seq)):
            p = diff.payload
            stale = (isinstance(p, UnbeaconPayload) and diff.ts < removed_before) or (
                isinstance(p, BeaconPayload) and p.expires_at is not None and p.expires_at < expired_before
            )
            if stale and diff.seq < top[diff.origin]:
                continue  # garbage; the origin's newest entry still carries its version
            self.control.apply(diff)
        for origin in list(self.control.digest()):
            if origin == self.node_id:
                continue
            for diff in list(self.control.entries(origin)):
                p = diff.payload
                if isinstance(p, BeaconPayload):
                    self.beacons.add(p, origin, diff.ts)
                    self._out.append(ApplyRemoteBeacon(p, origin))
                elif isinstance(p, PeerPayload) and p.address and p.address != self.config.address:
                    peer, is_new = self.peers.learn(origin, p.address, self._now)
                    if is_new:
                        self._unheard.add(origin)
                        self._out.append(PeerStateChanged(origin, peer.address, peer.state.value))

    def _on_cell_stored(self, event: CellStored) -> None:
        cell = event.cell
        diff = self._sign_new(cell)
        self.store.put(diff, self._now)
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        wire = diff.routed(hops=1, ttl=self.energy.hop_budget(e0) - 1)
        targets = self.router.origin_targets(wire, cell, self._now)
        if told := self._told(sorted(targets), b""):
            wire = wire.routed(wire.hops, wire.ttl, told)
        for peer_id in targets:
            self._enqueue(peer_id, wire, e0)

    def _on_cell_forgotten(self, event: CellForgotten) -> None:
        ref = self.store.cell(event.node_id)
        payload = TombstonePayload(
            event.node_id, event.tenant_id, self._now, ref.origin if ref else None, ref.seq if ref else 0
        )
        diff = self._sign_new(payload)
        self.store.put(diff, self._now)
        if ref is None or not isinstance(ref.payload, CellPayload):
            return  # nobody was sent the cell by us; repair carries the tombstone to holders
        cell = ref.payload
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        wire = diff.routed(hops=1, ttl=self.energy.hop_budget(e0) - 1)
        targets = self.router.origin_targets(wire, cell, self._now)
        if ref.origin != self.node_id:
            targets.add(ref.origin)
        for peer_id in targets:
            self._enqueue(peer_id, wire, e0)

    def _on_beacon_placed(self, event: BeaconPlaced) -> None:
        self.own_beacons.add(event.beacon, self.node_id, self._now)
        self._publish(event.beacon)

    def _on_beacon_removed(self, event: BeaconRemoved) -> None:
        self.own_beacons.remove(event.beacon_id)
        self._publish(UnbeaconPayload(event.beacon_id, event.tenant_id))

    def _on_scene_changed(self, event: SceneChanged) -> None:
        scene = event.scene
        self._publish(ScenePayload(str(scene["scene_id"]), str(scene["tenant_id"]), dict(scene)))

    def _on_peer_discovered(self, event: PeerDiscovered) -> None:
        if event.address == self.config.address or self.peers.by_address(event.address):
            return
        if event.peer_id and (peer := self.peers.get(event.peer_id)) is not None:
            self.peers.learn(peer.node_id, event.address, self._now)
            return
        self._contacts[event.address] = self._now + self.config.dead_probe_interval_ms
        self._send_gossip(event.address)

    def _on_frame_delivered(self, event: FrameDelivered) -> None:
        if (peer := self.peers.by_address(event.address)) is not None:
            self.outbox.delivered(peer.node_id, event.batch_id, self._now)

    def _on_send_failed(self, event: SendFailed) -> None:
        peer = self.peers.by_address(event.address)
        if peer is not None:
            self._liveness(peer, Liveness.FAILED)

    # -- timers ------------------------------------------------------------------------

    def _on_timer(self, event: TimerFired) -> None:
        due = self._timers.get(event.name)
        if due is None or self._now < due:
            return  # stale or early: the current deadline is later
        if event.name == _GOSSIP:
            self._gossip_round()
            self._timers[_GOSSIP] = self._now + self._jitter(self.config.gossip_interval_ms)
        elif event.name == _LIVENESS:
            self._liveness_round()
            self._timers[_LIVENESS] = self._now + self.config.probe_interval_ms // 2
        elif event.name == _REPAIR:
            self._repair_round()
        elif event.name == _OUTBOX:
            self._expire_batches()
        elif event.name == _ACK:
            self._send_delayed_acks()
        elif event.name == _LAZY:
            self._lazy_round()

    def _arm_timers(self) -> None:
        # After every event (the deadlines move with almost every frame): kept lean.
        timers, armed = self._timers, self._armed
        timers[_OUTBOX] = self.outbox.next_deadline()  # type: ignore[assignment]
        timers[_ACK] = self._acks_at  # type: ignore[assignment]
        repair_at = self._next_repair_at
        if self._repair_due:
            due = min(self._repair_due.values())
            repair_at = due if repair_at is None else min(due, repair_at)
        timers[_REPAIR] = repair_at  # type: ignore[assignment]
        if self.lazy is not None:
            timers[_LAZY] = self.lazy.next_deadline()  # type: ignore[assignment]
        for name, at in timers.items():
            if at is not None and armed.get(name) != at:
                armed[name] = at
                self._out.append(SetTimer(name, at))

    def _jitter(self, interval: int) -> int:
        spread = self.config.gossip_jitter * interval
        return max(1, int(interval + self._rng.uniform(-spread, spread)))

    # -- publishing our own diffs ------------------------------------------------------

    def _sign_new(self, payload: Payload) -> Diff:
        self._seq += 1
        return sign_diff(payload, origin=self.node_id, seq=self._seq, ts=self._now, sign=self._sign)

    def _publish(self, payload: Payload) -> None:
        """A control diff of ours: record it; anti-entropy spreads it (start a round now)."""
        diff = self._sign_new(payload)
        self.control.apply(diff)
        self.store.put(diff, self._now)
        self._gossip_round()

    # -- sending -----------------------------------------------------------------------

    def _keys_for(self, diffs: tuple[Diff, ...] | list[Diff]) -> dict[str, tuple[bytes, bytes]]:
        keys = {self.node_id: (self.public_key, self._proof)}
        for diff in diffs:
            if diff.origin not in keys and (entry := self.keyring.get(diff.origin)) is not None:
                keys[diff.origin] = entry
        return keys

    def _send(
        self, address: str, mtype: MsgType, diffs: tuple[Diff, ...] = (), *, in_reply: bool = False, **fields: Any
    ) -> None:
        env = Envelope(
            mtype, self._now, self.config.address, self._keys_for(diffs) if diffs else self._keys_for(()),
            diffs, **fields,
        )  # fmt: skip
        frame = self._sealer.seal(self.node_id, encode_envelope(env))
        data_bytes = sum(d.size for d in diffs if d.kind in DATA_KINDS)
        lane = "data" if data_bytes else "control"
        self.counters.frames_sent[lane] += 1
        self.counters.bytes_sent[lane] += len(frame)
        if data_bytes:
            sent = sum(1 for d in diffs if d.kind in DATA_KINDS)
            self.counters.data_diffs_sent += sent
            if mtype is MsgType.REPAIR_REPLY:
                self.counters.repair_diffs_sent += sent
        batch_id = fields.get("batch_id", 0) if mtype is MsgType.DATA else 0
        if mtype not in _CONTROL_PLANE:
            self._data_plane_sent_at = self._now
        data_diffs = diffs if data_bytes else ()
        self._out.append(SendFrame(address, frame, data_bytes, not data_bytes, in_reply, batch_id, data_diffs))

    def _enqueue(self, peer_id: str, diff: Diff, energy: float, hold_until: int = 0) -> None:
        peer = self.peers.get(peer_id)
        if peer is None and peer_id in self.contacts:
            peer, _ = self.peers.learn(peer_id, self.contacts[peer_id], self._now)
            peer.neighbour = False
        if peer is None or peer.state is PeerState.DEAD:
            self._drop(Reason.PEER_DEAD)
            if peer is not None:
                self.owed.add(peer_id, diff, energy)
            return
        if self.outbox.enqueue(peer_id, diff, energy, hold_until=hold_until):
            self._drop(Reason.QUEUE_FULL)

    def _flush(self) -> None:
        if not self.outbox.ready:
            return
        for peer_id in sorted(self.outbox.ready):
            peer = self.peers.get(peer_id)
            if peer is None or peer.state is PeerState.DEAD:
                self._drop_for(peer_id)
                continue
            # What we have for the peer whose frame we are handling rides back in the response
            # to it: an exchange that happens anyway, so no pacing gap to wait for.
            free_ride = peer_id == self._reply_peer
            batch = self.outbox.take(peer_id, self._now, free_ride=free_ride)
            if batch is not None:
                self._send_batch(peer, batch, free_ride)

    def _send_batch(self, peer: Peer, batch: Batch, in_reply: bool = False) -> None:
        self.counters.data_diffs_resent += sum(1 for _, attempts, _ in batch.items if attempts > 1)
        self._send(
            peer.address, MsgType.DATA, tuple(d for _, _, d in batch.items), batch_id=batch.batch_id,
            acks=self._take_acks(peer.node_id), in_reply=in_reply, **self._lazy_riders(peer.node_id),
        )  # fmt: skip

    def _take_acks(self, peer_id: str) -> tuple[int, ...]:
        """The delayed acks for a peer, now riding on a frame to it."""
        acks = self._acks_due.pop(peer_id, None)
        if not self._acks_due:
            self._acks_at = None
        return tuple(acks) if acks else ()

    def _lazy_riders(self, peer_id: str) -> dict[str, Any]:
        """What rides on the acks now going to a peer (lazy push): a prune, if it sent us a copy
        we had, and our announcements waiting for it, which need no frame of their own now."""
        if self.lazy is None:
            return {}
        prune = peer_id in self._prunes_due
        if prune:
            self._prunes_due.discard(peer_id)
            self.counters.prunes_sent += 1
        refs = self.lazy.take_announcements_for(peer_id, self.config.limits.max_diffs)
        self.counters.diffs_announced += len(refs)
        return {"prune": prune, "refs": tuple(refs)}

    def _send_delayed_acks(self) -> None:
        """No data frame went to these peers in time for their acks to ride on: send them alone."""
        for peer_id in list(self._acks_due):
            peer = self.peers.get(peer_id)
            acks, riders = self._take_acks(peer_id), self._lazy_riders(peer_id)
            if peer is not None:
                self._send(peer.address, MsgType.ACK, acks=acks, **riders)
        self._acks_at = None

    def _drop_for(self, peer_id: str) -> None:
        """Empty a dead peer's queue; what was in it is owed to it if it comes back."""
        if self.peers.get(peer_id) is not None:
            for energy, diff in self.outbox.held(peer_id):
                self.owed.add(peer_id, diff, energy)
        self._drop(Reason.PEER_DEAD, self.outbox.drop_peer(peer_id))

    def _offer_owed(self, peer: Peer) -> None:
        """A peer back from suspect or dead: send what we failed to deliver to it, unless decayed."""
        for energy, diff in self.owed.take(peer.node_id):
            p = diff.payload
            if isinstance(p, CellPayload) and not self.energy.worth_repairing(
                energy, p.cell_type, p.created_at, self._now
            ):
                continue
            self._enqueue(peer.node_id, diff, energy)

    def _expire_batches(self) -> None:
        failing, gave_up = self.outbox.expire(self._now, self.owed.add)
        self._drop(Reason.GAVE_UP, gave_up)
        for peer_id in failing:
            if (peer := self.peers.get(peer_id)) is not None:
                self._liveness(peer, Liveness.FAILED)

    def _drop(self, reason: str, count: int = 1) -> None:
        if count:
            self.counters.drops[reason] += count

    # -- receiving: admission ----------------------------------------------------------

    def _on_frame_received(self, event: FrameReceived) -> None:
        self.counters.frames_received += 1
        self.counters.bytes_received += len(event.frame)
        try:
            sender_id, nonce, plaintext = self._sealer.open(event.frame)
            env = decode_envelope(plaintext, self.config.limits, self._decode_cache)
        except MeshError as exc:
            self._drop(exc.reason)
            return
        if sender_id == self.node_id or not self._fresh(env, nonce, sender_id):
            return
        entry = env.keys.get(sender_id)
        if self.keyring.get(sender_id) is None and (entry is None or not self._learn_key(sender_id, *entry)):
            self._drop(Reason.NOT_MEMBER)
            return
        peer = self._heard(sender_id, env.sender_address or event.address, event.address, env.type)
        if event.replies_ride:
            self._reply_peer = sender_id
        self._in_response = event.in_response
        self._receivers[env.type](env, peer)

    def _fresh(self, env: Envelope, nonce: bytes, sender_id: str) -> bool:
        """Reject frames from the future, frames too old, and frames seen before.

        ``sample`` is the sender's clock minus ours, less the transit time. A sender's first
        frame (or one whose clock jumped ahead) is judged against ``max_clock_skew_ms``; then
        its offset is tracked (the highest sample, followed slowly downward), and a frame older
        than ``frame_max_age_ms`` *by the sender's clock* is a replay. So a node 5 minutes
        behind is no replayer, and nonces need keeping for the replay window only.
        """
        cfg, now = self.config, self._now
        sample = env.sent_at - now
        offset = self._clock_offsets.get(sender_id)
        if offset is None or sample > offset + cfg.max_future_skew_ms:
            if sample > cfg.max_clock_skew_ms:
                self._drop(Reason.FUTURE)
                return False
            if sample < -cfg.max_clock_skew_ms - cfg.frame_max_age_ms:
                self._drop(Reason.REPLAY)
                return False
            offset = sample
        elif sample < offset - cfg.frame_max_age_ms:
            self._drop(Reason.REPLAY)
            return False
        if nonce in self._nonces:
            self._drop(Reason.REPLAY)
            return False
        self._clock_offsets[sender_id] = sample if sample > offset else offset + (sample - offset) // 64
        order = self._nonce_order
        while order and order[0][0] < now:
            del self._nonces[order.popleft()[1]]
        expires = now + cfg.frame_max_age_ms + cfg.max_future_skew_ms
        self._nonces[nonce] = expires
        order.append((max(expires, order[-1][0] if order else expires), nonce))
        return True

    def _heard(self, sender_id: str, address: str, source: str, mtype: MsgType = MsgType.GOSSIP) -> Peer:
        peer, is_new = self.peers.learn(sender_id, address, self._now)
        invited = self._contacts.pop(address, None) is not None
        invited = self._contacts.pop(source, None) is not None or invited
        if self.partial and (is_new or not peer.neighbour):
            # A neighbour is a seed we contacted, or a peer that gossips with us while there is room.
            peer.neighbour = invited or (
                mtype is MsgType.GOSSIP
                and sum(not p.chosen for p in self.peers.neighbours()) < self.config.max_neighbours
            )
        if is_new:
            self._out.append(PeerStateChanged(sender_id, peer.address, peer.state.value))
            if peer.neighbour:  # a partial view's data-only contacts are not asked: its neighbours are
                self._catch_up(peer)
        elif self._unheard and sender_id in self._unheard:
            self._unheard.discard(sender_id)
            self._catch_up(peer)  # first word since our restart: catch up on what we missed
        self._liveness(peer, Liveness.HEARD)
        return peer

    def _learn_key(self, origin: str, public_key: bytes, proof: bytes) -> bool:
        """Verify and keep a member's key; new ones go to the log too (see ``_on_started``)."""
        if not self.keyring.learn(origin, public_key, proof):
            return False
        self.store.put_key(origin, public_key, proof)
        return True

    def _admit(self, diff: Diff, env: Envelope) -> bool:
        """Timestamp, membership and signature of one diff."""
        if diff.ts > self._now + self.config.max_clock_skew_ms:
            self._drop(Reason.FUTURE)
            return False
        key = self.keyring.get(diff.origin)
        if key is None:
            entry = env.keys.get(diff.origin)
            if entry is None:
                self._drop(Reason.UNKNOWN_ORIGIN)
                return False
            if not self._learn_key(diff.origin, *entry):
                self._drop(Reason.NOT_MEMBER)
                return False
            key = entry
        if not self._verify(key[0], diff.signature, diff.signed):
            self._drop(Reason.BAD_SIGNATURE)
            return False
        return True

    # -- receiving: the data plane -----------------------------------------------------

    def _on_data(self, env: Envelope, peer: Peer) -> None:
        if env.acks or env.prune or env.refs:
            self._on_ack(env, peer)
        for diff in env.diffs:
            self._accept_data(diff, env, peer, relay=True)
        if not self._in_response:
            acks = (*self._take_acks(peer.node_id), env.batch_id)
            self._send(peer.address, MsgType.ACK, acks=acks, in_reply=True, **self._lazy_riders(peer.node_id))
            return
        # It came back in the response to one of ours: an ack now would be an exchange of its own,
        # so it waits a little to ride on our next data frame to that peer.
        due = self._acks_due.setdefault(peer.node_id, [])
        due.append(env.batch_id)
        if len(due) >= _ACKS_HELD:
            acks = self._take_acks(peer.node_id)
            self._send(peer.address, MsgType.ACK, acks=acks, **self._lazy_riders(peer.node_id))
        elif self._acks_at is None:
            self._acks_at = self._now + self.config.ack_delay_ms

    def _on_ack(self, env: Envelope, peer: Peer) -> None:
        for batch_id in env.acks:
            self.outbox.acked(peer.node_id, batch_id, self._now)
        if env.prune and self.lazy is not None:
            self.lazy.prune(peer.node_id)
        if env.refs:
            self._on_ihave(env, peer)

    def _accept_data(self, diff: Diff, env: Envelope, sender: Peer, relay: bool) -> None:
        if diff.kind not in DATA_KINDS:
            self._drop(Reason.MALFORMED)
            return
        if self.store.has(diff.origin, diff.seq) or diff.origin == self.node_id:
            self._drop(Reason.DUPLICATE)
            if self.partial:
                self._withdraw_copies(diff, sender.node_id)
            # A relay's copy we had: its link to us is one copy too many (not the origin's push,
            # nor a resend of the copy it sent first).
            if relay and self.lazy is not None and sender.node_id != diff.origin and (
                self.lazy.should_prune((diff.origin, diff.seq), sender.node_id)
            ):  # fmt: skip
                self._prunes_due.add(sender.node_id)
            return
        if not self._admit(diff, env):
            return
        if isinstance(diff.payload, TombstonePayload) and not self._forgets_own_cell(diff.origin, diff.payload):
            self._drop(Reason.NOT_ORIGIN)
            return
        self.store.put(diff, self._now)
        self._receipts.append((self._now, diff.origin, diff.seq))
        if self.lazy is not None:
            self.lazy.received((diff.origin, diff.seq), sender.node_id)
        self.counters.diffs_accepted[_KIND_NAMES[diff.kind]] += 1
        p = diff.payload
        cell: CellPayload | None = None
        if isinstance(p, CellPayload):
            cell = p
            self.counters.cells_delivered += 1
            self._out.append(StoreRemoteCell(p, diff.origin, diff.hops, diff.signature, diff.seq))
        elif isinstance(p, TombstonePayload):
            self._out.append(ApplyTombstone(p.cell_id, p.tenant_id, diff.origin, p.forgotten_at))
            ref = self.store.cell(p.cell_id)
            cell = ref.payload if ref is not None and isinstance(ref.payload, CellPayload) else None
        if relay and cell is not None:  # the router decides what a ttl of 0 still allows
            targets = self.router.relay_targets(diff, cell, sender.node_id, self._now)
            if targets:
                e0 = self.energy.initial(cell.salience, cell.cell_type)
                onward_to = sorted(targets - {diff.origin, sender.node_id, self.node_id})
                announce_to: list[str] = []
                if self.lazy is not None and self.lazy.lazy:  # a walk hop is the only copy on its way
                    walked, lazy = self.router.walked, self.lazy.lazy
                    announce_to = [p for p in onward_to if p in lazy and p not in walked]
                    if announce_to:
                        onward_to = [p for p in onward_to if p not in lazy or p in walked]
                told = self._told(onward_to, diff.told)
                # A push to known interest may meet other holders' copies (see _withdraw_copies);
                # a walk hop goes where none is known to be going: no hold.
                hold_until = self._now + self.config.relay_hold_ms if self.partial else 0
                copies: dict[int, Diff] = {}  # by ttl: the copies differ only there (a walk hop spends one)
                for peer_id in onward_to:
                    ttl = self.router.onward_ttl(diff, peer_id)
                    onward = copies.get(ttl)
                    if onward is None:
                        onward = copies[ttl] = diff.routed(diff.hops + 1, ttl, told)
                    self._enqueue(peer_id, onward, e0, 0 if peer_id in self.router.walked else hold_until)
                if announce_to:
                    ttl = self.router.onward_ttl(diff, announce_to[0])  # none is a walk hop: all alike
                    onward = diff.routed(hops=diff.hops + 1, ttl=ttl, told=told)
                    for peer_id in announce_to:
                        self.lazy.announce(peer_id, onward, e0, self._now)  # type: ignore[union-attr]

    def _forgets_own_cell(self, signer: str, tombstone: TombstonePayload) -> bool:
        """Only a cell's origin may forget it: the origin of the cell diff we hold, else the
        one the tombstone names (the node's facade checks its own row again)."""
        held = self.store.cell(tombstone.cell_id)
        origin = held.origin if held is not None else tombstone.cell_origin
        return origin is None or origin == signer

    # -- lazy push (mesh.lazy) -----------------------------------------------------------

    def _on_ihave(self, env: Envelope, peer: Peer) -> None:
        """A peer announces diffs it holds: await those we lack (a graft if no copy comes), and
        send it none of them ourselves."""
        if self.lazy is None:
            return  # we prune no link, so none should announce to us: its copies still come
        for ref in env.refs:
            self.lazy.withdraw(peer.node_id, ref)
            self.counters.data_diffs_withdrawn += self.outbox.withdraw(peer.node_id, *ref)
            if not self.store.has(*ref) and ref[0] != self.node_id:
                self.lazy.announced(ref, peer.node_id, self._now)

    def _on_graft(self, env: Envelope, peer: Peer) -> None:
        """A peer asks for diffs we announced to it: push them as any copy, and push to it again."""
        if self.lazy is None:
            return
        self.lazy.graft(peer.node_id)
        for ref in env.refs:
            kept = self.lazy.copy_for(ref)
            if kept is None:
                self._drop(_GRAFT_UNKNOWN)  # announced too long ago (or never): repair has it
                continue
            self._enqueue(peer.node_id, *kept)

    def _lazy_round(self) -> None:
        """Send the announcements that are due, and graft what was announced and did not come."""
        lazy, limit = self.lazy, self.config.limits.max_diffs
        assert lazy is not None
        for peer_id, refs in lazy.take_announcements(self._now):
            peer = self.peers.get(peer_id)
            if peer is None or peer.state is PeerState.DEAD:
                continue
            for k in range(0, len(refs), limit):
                self._send(peer.address, MsgType.IHAVE, refs=tuple(refs[k : k + limit]))
            self.counters.diffs_announced += len(refs)
        for peer_id, refs in lazy.take_grafts(self._now, self._graftable):
            peer = self.peers.get(peer_id)
            for k in range(0, len(refs), limit):
                self._send(peer.address, MsgType.GRAFT, refs=tuple(refs[k : k + limit]))  # type: ignore[union-attr]
            self.counters.diffs_grafted += len(refs)

    def _graftable(self, peer_id: str) -> bool:
        peer = self.peers.get(peer_id)
        return peer is not None and peer.state is not PeerState.DEAD

    # -- receiving: the control plane --------------------------------------------------

    def _on_gossip(self, env: Envelope, peer: Peer) -> None:
        if self.partial and peer.node_id in self.control.distance:
            # It gossips with us: one hop away, however far its diffs first came from (a
            # neighbour chosen for its interest was often known at two hops), so we share them.
            self.control.closer(peer.node_id, 1)
        if self.partial and env.reply_wanted:
            self.inbound.heard(peer.node_id, self._now)  # it holds us as a neighbour (or answers us)
        for diff in self._take_offers(env.diffs) if self.partial else env.diffs:
            self._accept_control(diff, env)
        if env.digest is None or not env.reply_wanted:
            return
        limits = self.config.limits
        share = self.config.interest_radius - 1 if self.partial else None
        delta = self.control.delta_for(env.digest, limits.max_diffs, self._max_bytes, share)
        if self.partial and self.config.interest_offers and self.config.interest_neighbours:
            delta += self._offers_for(peer.node_id, env.digest, {d.origin for d in delta},
                                      limits.max_diffs - len(delta), self._max_bytes - sum(d.size for d in delta))
        need = self.control.needs_from(env.digest, known_only=self.partial)
        if self.partial and not need and self.control.version(peer.node_id) < env.digest.get(peer.node_id, 0):
            need = True  # its own diffs, even new to us: it is one hop away (it may have chosen us)
        # A partial view always answers (even with nothing): the round may be the peer's liveness probe.
        if delta or need or self.partial:
            self._send(
                peer.address, MsgType.GOSSIP, tuple(delta),
                digest=self.control.digest() if need else None, reply_wanted=need, in_reply=True,
            )  # fmt: skip

    def _offers_for(
        self, peer_id: str, digest: dict[str, int], sending: set[str], max_diffs: int, max_bytes: int
    ) -> list[Diff]:
        """Partial view, T-Man's ranked exchange: the diffs (peer record and beacons) of up to
        ``interest_offers`` nodes we know, whatever their distance, whose beacons are nearest
        ``peer_id``'s, which its ``digest`` lacks and our answer is not ``sending`` it already.
        Ranked down our view by its interest, we stop at the ``interest_neighbours``-th node it
        knows (or is being sent): past that, as far as we can tell, none would be nearer than
        those it has, and it would decline them; nor does it keep those before it that are not
        nearer than it by ``choice_margin``, so they are left out too. So a converged overlay
        offers nothing. Marked one hop beyond the radius (``hops``), which a node without offers
        drops as out of radius."""
        probes = self.beacons.vectors_of(peer_id)
        if not probes:
            return []
        want, offers = self.config.interest_neighbours, self.config.interest_offers
        candidates: list[str] = []
        known = 0
        for node_id in self.beacons.nearest_owners(probes, want + offers + 1):
            if node_id == peer_id:
                continue
            if node_id in digest or node_id in sending:
                known += 1
                if known >= max(1, want):
                    # The asker's farthest chosen neighbour, as far as we can tell: it keeps only
                    # nodes nearer than that by the margin, so offering the rest would be wasted
                    # (and offered again every round, since its digest never shows them).
                    if margin := self.config.choice_margin:
                        bar = self.beacons.closeness(node_id, probes) + margin
                        candidates = [c for c in candidates if self.beacons.closeness(c, probes) > bar]
                    break
                continue
            if self._reachable(node_id):
                candidates.append(node_id)
        out: list[Diff] = []
        size, offered = 0, 0
        hops = self.config.interest_radius + 1
        for node_id in candidates:
            diffs = self.control.in_order(node_id, hops)
            cost = sum(d.size for d in diffs)
            if len(out) + len(diffs) > max_diffs or size + cost > max_bytes:
                break
            out += diffs
            size += cost
            offered += 1
            if offered == offers:
                break
        return out

    def _take_offers(self, diffs: tuple[Diff, ...]) -> list[Diff] | tuple[Diff, ...]:
        """Partial view: of the nodes offered from beyond our radius (``_offers_for``), keep those
        whose beacons are nearer our own than our chosen neighbours' (so ``_choose_neighbours``
        takes them next round), recorded at the edge of the radius: known, but not shared onward."""
        beyond = self.config.interest_radius + 1
        if not any(d.hops == beyond for d in diffs):
            return diffs
        probes, bar = self.own_beacons.vectors(), self._interest_bar
        nearer = {
            d.origin for d in diffs
            if d.hops == beyond and isinstance(d.payload, BeaconPayload) and beacon_closeness(d.payload, probes) > bar
        }  # fmt: skip
        out: list[Diff] = []
        for d in diffs:
            if d.hops != beyond:
                out.append(d)
            elif d.origin in nearer:
                out.append(d.routed(hops=beyond - 1, ttl=0))
            else:
                self._drop(_OFFER_DECLINED)
        return out

    def _accept_control(self, diff: Diff, env: Envelope) -> None:
        if diff.kind not in CONTROL_KINDS:
            self._drop(Reason.MALFORMED)
            return
        if self.partial and not 1 <= diff.hops <= self.config.interest_radius:
            self._drop(_OUT_OF_RADIUS)
            return
        if diff.origin == self.node_id or not self.control.is_new(diff):
            if self.partial and diff.origin in self.control.distance:
                self.control.closer(diff.origin, diff.hops)
            self._drop(Reason.STALE)
            return
        if not self._admit(diff, env):
            return
        self.control.apply(diff)
        if self.partial:
            self.control.closer(diff.origin, diff.hops)
        else:
            self.store.put(diff, self._now)  # so a restart starts from it (see _restore_control)
        self.counters.diffs_accepted[_KIND_NAMES[diff.kind]] += 1
        p, origin = diff.payload, diff.origin
        if isinstance(p, BeaconPayload):
            self.beacons.add(p, origin, diff.ts)
            self._out.append(ApplyRemoteBeacon(p, origin))
        elif isinstance(p, UnbeaconPayload):
            self.beacons.remove(p.beacon_id)
            self._out.append(RemoveRemoteBeacon(p.beacon_id, p.tenant_id, origin))
        elif isinstance(p, ScenePayload):
            self._out.append(ApplyScene(p.data, origin))
        elif isinstance(p, PeerPayload):
            if self.partial:
                self.contacts[origin] = p.address  # pushed to directly, not gossiped with
                if self.peers.get(origin) is not None:
                    self.peers.learn(origin, p.address, self._now)
                return
            known = self.peers.get(origin)
            moved = known is not None and known.address != p.address
            peer, is_new = self.peers.learn(origin, p.address, self._now)
            if is_new:
                self._out.append(PeerStateChanged(origin, peer.address, peer.state.value))
            elif moved and peer.state is not PeerState.ALIVE:
                self._send_gossip(peer.address)  # it restarted elsewhere: try there now, not at the next probe

    def _gossip_round(self) -> None:
        if self.partial and self.config.interest_neighbours:
            self._choose_neighbours()
        live = (self.peers.neighbours if self.partial else self.peers.in_state)(PeerState.ALIVE, PeerState.SUSPECT)
        if live:
            target = self._gossip_probe(live) if self.partial else None
            self._send_gossip((target or self._rng.choice(live)).address)
        now = self._now
        for address, due in list(self._contacts.items()):
            if due <= now:
                self._contacts[address] = now + self.config.dead_probe_interval_ms
                self._send_gossip(address)

    def _choose_neighbours(self) -> None:
        """Partial view, T-Man style: take as neighbours the known nodes whose beacons are nearest
        our own. Gossip with them brings their neighbourhoods' beacons within our radius, among
        them nearer nodes still, chosen next round: nodes of like interest draw together, so a
        cell that reaches one of them is within reach of the others. The random neighbours stay
        (the seeds are never let go), and keep the mesh connected across interests."""
        want, probes = self.config.interest_neighbours, self.own_beacons.vectors()
        chosen: list[Peer] = []
        for node_id in self.beacons.nearest_owners(probes, 2 * want) if probes else ():
            peer = self.peers.get(node_id)
            if peer is None:
                if node_id not in self.contacts:
                    continue
                peer, _ = self.peers.learn(node_id, self.contacts[node_id], self._now)
                peer.neighbour = False
            if peer.state is not PeerState.DEAD:
                chosen.append(peer)
                if len(chosen) == want:
                    break
        margin = self.config.choice_margin
        if margin and len(chosen) == want:
            chosen = self._keep_chosen(chosen, probes, margin)
        self._interest_bar = -2.0
        if len(chosen) == want:
            self._interest_bar = min(self.beacons.closeness(p.node_id, probes) for p in chosen) + margin
        keep = {p.node_id for p in chosen}
        for peer in self.peers.neighbours():
            if peer.chosen and peer.node_id not in keep:
                peer.chosen = peer.neighbour = False  # a data contact again
        for peer in chosen:
            if not peer.neighbour:  # one already a random neighbour stays one, and counts
                peer.neighbour = peer.chosen = True
                self.control.closer(peer.node_id, 1)  # a neighbour: what it signs we share onward

    def _keep_chosen(self, nearest: list[Peer], probes: dict, margin: float) -> list[Peer]:
        """Our chosen neighbours, each displaced (in ``nearest``'s order) only by a node nearer
        than the farthest of them by ``margin``: a popular interest has many nodes of nearly
        equal closeness, and each change of neighbour costs an exchange of two whole neighbourhoods."""
        closeness = self.beacons.closeness
        held = {p.node_id: closeness(p.node_id, probes) for p in self.peers.neighbours() if p.chosen
                and p.state is not PeerState.DEAD}  # fmt: skip
        for peer in nearest:
            if peer.node_id in held:
                continue
            near = closeness(peer.node_id, probes)
            if len(held) < len(nearest):
                held[peer.node_id] = near
                continue
            worst = min(held, key=lambda n: (held[n], n))
            if near <= held[worst] + margin:
                break  # nor will the rest, nearest first
            del held[worst]
            held[peer.node_id] = near
        peers = {p.node_id: p for p in nearest}
        ranked = sorted(held, key=lambda n: (-held[n], n))
        return [peers.get(n) or self.peers.get(n) for n in ranked]  # type: ignore[misc]

    def _gossip_probe(self, live: list[Peer]) -> Peer | None:
        """Partial view: the live neighbour silent the longest, if one is due a probe. The round
        goes to it and is its probe: a neighbour answers every gossip that asks for a reply, and
        any frame from it is the proof of life a ping would fetch (so no PING and PONG as well)."""
        now, limit = self._now, self.config.probe_interval_ms
        due = [p for p in live if p.state is PeerState.ALIVE and not p.ping_nonce and now - p.last_contact >= limit]
        if not due:
            return None
        peer = min(due, key=lambda p: p.last_contact)  # the first in table order among equals
        self._ping_ids += 1
        self.peers.pinged(peer, self._ping_ids, now)  # times out like a ping: FAILED, then suspect
        return peer

    def _send_gossip(self, address: str) -> None:
        self._send(address, MsgType.GOSSIP, digest=self.control.digest(), reply_wanted=True)

    # -- liveness ----------------------------------------------------------------------

    def _liveness(self, peer: Peer, event: Liveness) -> None:
        before = peer.state
        new = self.peers.apply(peer, event, self._now)
        if new is None:
            return
        self._out.append(PeerStateChanged(peer.node_id, peer.address, new.value))
        if new is PeerState.DEAD:
            self._drop_for(peer.node_id)
            if self.lazy is not None:
                self.lazy.forget(peer.node_id)
                self._prunes_due.discard(peer.node_id)
            self.repair.forget(peer.node_id)
            self._repair_unanswered.pop(peer.node_id, None)
            self._catching_up.discard(peer.node_id)
            self._clock_offsets.pop(peer.node_id, None)  # re-estimated from its next frame
            self._take_acks(peer.node_id)  # its batches will come again (or by repair)
        elif new is PeerState.ALIVE and before is not PeerState.ALIVE:
            self._repair_on_reconnect(peer)
            self._offer_owed(peer)

    def _repair_on_reconnect(self, peer: Peer) -> None:
        """Catch up on what we missed, at most once per ``repair_min_interval_ms`` per peer:
        a peer that flaps between suspect and alive under load must not cost a log scan each time."""
        last = self._repair_started.get(peer.node_id)
        due = self._now if last is None else last + self.config.repair_min_interval_ms
        if due <= self._now:
            self._catch_up(peer)
        else:
            self._catching_up.add(peer.node_id)
            self._repair_due[peer.node_id] = min(self._repair_due.get(peer.node_id, due), due)

    def _catch_up(self, peer: Peer) -> None:
        """Ask a peer for what we missed now, and once more when the reply is complete: its
        answer leaves out what the peer received in the last moments (a push to us may still
        be in flight), and after a crash or a partition that is exactly what may be missing."""
        self._catching_up.add(peer.node_id)
        self._request_repair(peer)

    def _liveness_round(self) -> None:
        """Time out pings and suspicion; probe the few peers silent the longest (SWIM-like)."""
        cfg, now = self.config, self._now
        due: list[Peer] = []
        # A full view visits only the peers with a ping out or under suspicion, then asks the
        # table for the most silent (no scan of every member); a partial view's neighbours are few.
        for peer in self.peers.neighbours() if self.partial else self.peers.watched():
            if peer.ping_nonce and now - peer.ping_sent_at >= cfg.ping_timeout_ms:
                peer.ping_nonce = 0
                self._liveness(peer, Liveness.FAILED)
            if peer.state is PeerState.SUSPECT and now - peer.changed_at >= cfg.suspect_timeout_ms:
                self._liveness(peer, Liveness.EXPIRED)
            # A partial view's live neighbours are probed by the gossip round (_gossip_probe);
            # suspects and the dead get pings.
            if self.partial and not peer.ping_nonce and peer.state is not PeerState.ALIVE:
                limit = cfg.dead_probe_interval_ms if peer.state is PeerState.DEAD else cfg.probe_interval_ms
                if now - peer.last_contact >= limit:
                    due.append(peer)
        probes = 1 if self.partial else cfg.max_probes_per_round  # a bounded view: one probe a round (SWIM)
        if not self.partial:
            due = self.peers.most_silent(now, probes, cfg.probe_interval_ms, cfg.dead_probe_interval_ms)
        elif len(due) > probes:
            due = heapq.nsmallest(probes, due, key=lambda p: p.last_contact)
        for peer in due:
            self._ping_ids += 1
            self.peers.pinged(peer, self._ping_ids, now)
            self._send(peer.address, MsgType.PING, nonce=self._ping_ids)

    def _on_ping(self, env: Envelope, peer: Peer) -> None:
        self._send(peer.address, MsgType.PONG, nonce=env.nonce, in_reply=True)

    # -- repair ------------------------------------------------------------------------

    def _repair_round(self) -> None:
        now = self._now
        for peer_id, due in list(self._repair_due.items()):
            if due <= now:
                del self._repair_due[peer_id]
                if (peer := self.peers.get(peer_id)) is not None and peer.state is not PeerState.DEAD:
                    self._request_repair(peer)
        if self._next_repair_at is not None and self._next_repair_at <= now:
            live = (self.peers.neighbours if self.partial else self.peers.in_state)(PeerState.ALIVE)
            if live:
                # Each live peer in turn, not a random one: whatever one holder alone has (a
                # cell its origin could not deliver) is asked for within one cycle.
                ids = sorted(p.node_id for p in live)
                turn = next((i for i in ids if i > self._repair_turn), ids[0])
                self._repair_turn = turn
                self._request_repair(self.peers.get(turn))  # type: ignore[arg-type]
            self._next_repair_at = now + self._jitter(self.config.repair_interval_ms)

    def _request_repair(self, peer: Peer) -> None:
        started = self.repair.start(peer.node_id, self._now)
        if started is None:  # one is in flight; keep its resend armed if a due time was used up
            sent_at = self.repair.sent_at(peer.node_id)
            if sent_at is not None and self._repair_unanswered.get(peer.node_id, 0) <= _REPAIR_RESENDS:
                self._repair_due.setdefault(peer.node_id, sent_at + self.config.repair_timeout_ms)
            return
        request_id, since = started
        # Sent again if unanswered (a lost frame, a timed-out reply), a few times in a row at most.
        unanswered = self._repair_unanswered.get(peer.node_id, 0) + 1
        self._repair_unanswered[peer.node_id] = unanswered
        if unanswered <= _REPAIR_RESENDS:
            resend_at = self._now + self.config.repair_timeout_ms
            self._repair_due[peer.node_id] = min(self._repair_due.get(peer.node_id, resend_at), resend_at)
        self._repair_started[peer.node_id] = self._now
        self.counters.repairs_requested += 1
        self._send(
            peer.address, MsgType.REPAIR_REQUEST, request_id=request_id, since=since,
            limit=self.config.repair_scan_limit, version=self.control.version(self.node_id),
            haves=self._haves(peer.node_id),
        )  # fmt: skip

    def _haves(self, peer_id: str) -> HaveSet:
        """What we hold of each origin we received from since our last answered request to
        this peer (less a settling margin): every seq from the lowest received then up to
        the origin's newest we hold, so diffs received before that count too."""
        asked = self._asked_at.get(peer_id)
        cutoff = None if asked is None else asked - 2 * self.config.ack_timeout_ms * self.config.max_attempts
        lows: dict[str, int] = {}
        for at, origin, seq in reversed(self._receipts):
            if cutoff is not None and at < cutoff:
                break
            if seq < lows.get(origin, seq + 1):
                lows[origin] = seq
        return HaveSet.build(lows, self.store.max_seq, self.store.has)

    def _on_repair_request(self, env: Envelope, peer: Peer) -> None:
        if self.control.version(peer.node_id) < env.version:
            # We have not yet seen all of its beacons: answer "not ready", gossip with it now.
            self._send(
                peer.address, MsgType.REPAIR_REPLY, request_id=env.request_id, upto=env.since, ready=False,
                in_reply=True,
            )  # fmt: skip
            self._send_gossip(peer.address)
            return
        answer = answer_repair(
            self.store, self.beacons.of_owner(peer.node_id), requester=peer.node_id, since=env.since,
            scan_limit=max(1, min(env.limit, self.config.repair_scan_limit)), max_diffs=self.config.limits.max_diffs,
            max_bytes=self._max_bytes, grace_ms=self.config.repair_grace_ms, energy=self.energy, now=self._now,
            settle_ms=self.config.ack_timeout_ms * self.config.max_attempts, haves=env.haves,
        )  # fmt: skip
        self._send(
            peer.address, MsgType.REPAIR_REPLY, tuple(answer.diffs), request_id=env.request_id,
            upto=answer.upto, more=answer.more, ready=True, in_reply=True,
        )  # fmt: skip

    def _on_repair_reply(self, env: Envelope, peer: Peer) -> None:
        for diff in env.diffs:
            self._accept_data(diff, env, peer, relay=False)
        sent_at = self.repair.sent_at(peer.node_id)
        if not self.repair.finish(peer.node_id, env.request_id, env.upto, env.ready):
            return
        self._repair_unanswered.pop(peer.node_id, None)
        if sent_at is not None and self._repair_due.get(peer.node_id) == sent_at + self.config.repair_timeout_ms:
            del self._repair_due[peer.node_id]  # answered: no resend
        if env.ready and not env.more and sent_at is not None:
            # A scan finished: what it covered was received before this request. The next
            # pages of an unfinished scan still cover older entries, so they keep the earlier
            # window of what we hold.
            self._asked_at[peer.node_id] = sent_at
        if not env.ready:
            self._repair_due[peer.node_id] = self._now + 2 * self.config.gossip_interval_ms
        elif env.more:
            self._request_repair(peer)
        elif peer.node_id in self._catching_up:
            self._catching_up.discard(peer.node_id)
            cfg = self.config
            again = self._now + cfg.ack_timeout_ms * (cfg.max_attempts + 1)  # once what it just received has settled
            self._repair_due[peer.node_id] = min(self._repair_due.get(peer.node_id, again), again)

    # -- status ------------------------------------------------------------------------

    def data_idle(self, now_ms: int, in_transit_ms: int) -> bool:
        """Is our part of the data plane done? Nothing queued or awaiting its ack, no ack held
        back, no announcement waiting, no announced diff awaited, no repair request awaiting
        its reply, and none of our data, ack, announcement, graft or repair frames sent within
        ``in_transit_ms`` (the longest a frame may take: one could still be on its way). A
        simulator whose every engine says so has seen the last of the cells' spread."""
        sent_at = self._data_plane_sent_at
        return (
            (sent_at is None or now_ms - sent_at > in_transit_ms) and self.outbox.idle and not self._acks_due
            and (self.lazy is None or self.lazy.idle) and not self.repair.in_flight(now_ms)
        )  # fmt: skip

    def status(self) -> dict[str, Any]:
        """Peers, queues and counters as plain data (for ``hyphae peers/status``)."""
        c = self.counters
        return {
            "node_id": self.node_id,
            "address": self.config.address,
            "peers": [
                {
                    "node_id": p.node_id, "address": p.address, "state": p.state.value, "heard_at": p.heard_at,
                    "queue_depth": self.outbox.depth(p.node_id), "inflight_batches": self.outbox.inflight(p.node_id),
                }  # fmt: skip
                for p in self.peers
            ],
            "beacons_known": len(self.beacons),
            "frames_sent": dict(c.frames_sent),
            "bytes_sent": dict(c.bytes_sent),
            "data_diffs_sent": c.data_diffs_sent,
            "data_diffs_resent": c.data_diffs_resent,
            "data_diffs_withdrawn": c.data_diffs_withdrawn,
            "repair_diffs_sent": c.repair_diffs_sent,
            "frames_received": c.frames_received,
            "bytes_received": c.bytes_received,
            "diffs_accepted": dict(c.diffs_accepted),
            "cells_delivered": c.cells_delivered,
            "repairs_requested": c.repairs_requested,
            "drops": dict(c.drops),
        }
