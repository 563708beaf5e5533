"""The sans-IO mesh engine: ``handle(event, now_ms) -> effects``.

Theory of operation
-------------------
The engine is a pure state machine. The runtime (trio + HTTP in production, the
virtual network in tests and the simulator) feeds it events and a clock reading and
carries out the effects it returns; the engine never reads a clock, never sleeps and
never touches a socket. It only dispatches: each event to the part that handles it, each
frame (once admitted) to the part its type belongs to, each timer to its round. The parts,
one module each, share one :class:`~mesh.state.NodeState` and hold no reference to the engine:

* **admission** (:mod:`mesh.admission`): every frame is opened (AEAD), decoded (strict),
  bound to its sender (:mod:`mesh.frame_auth`), checked for replay and clock skew; every diff
  for membership, signature and duplication.
  Each rejection is counted in ``counters.drops[reason]``; nothing raises out of ``handle``
  for bad input.
* **membership** (:mod:`mesh.membership`): peers by id and address, the key ring of
  verified origins, and the alive/suspect/dead liveness table; **liveness**
  (:mod:`mesh.liveness`): what feeds that table, and what follows a peer's change of state.
* **overlay** (:mod:`mesh.overlay`): whom we gossip with, and the ``peer``,
  ``beacon``/``unbeacon`` and ``scene`` diffs replicated by Scuttlebutt push-pull
  anti-entropy (:mod:`mesh.control`). ``view="full"`` (the LAN default) knows every member
  and beacon; ``view="partial"`` (large meshes) gossips with a few neighbours, random and
  chosen for their interest (T-Man style), and knows what lies within ``interest_radius``
  hops. Each view brings its routing policy (:mod:`mesh.routing`).
* **data plane** (:mod:`mesh.data_plane`): a stored cell becomes a signed diff pushed to
  the owners of the beacons it matches, batched per peer (:mod:`mesh.outbox`), highest
  energy first, acknowledged and retransmitted; recipients relay it where the view says,
  lazily where a link keeps bringing copies already held (:mod:`mesh.lazy`).
* **repair** (:mod:`mesh.repair_plane`, :mod:`mesh.repair`): on (re)connect, and
  periodically to each live peer in turn, ask a peer for what matches my beacons in its log
  after the position it last served me; a request left unanswered is sent again. The other
  way round, an origin keeps what it failed to deliver to a peer and offers it again when
  that peer comes back.

* **older protocols** (:mod:`mesh.outdated`): a member still on the previous release is
  dropped (``old_version``), and named once, so a half-upgraded team is told, not quiet.
* **identity** (:mod:`mesh.identity_guard`, :mod:`mesh.incarnation`): each start signs in a
  new incarnation of our seq space, above anything an earlier run signed whatever the log
  remembers; a node id used by two nodes (a copied ``node.key``) is found in what comes in
  (diffs under our id we did not sign, forked seqs, frames under our id from elsewhere) and
  reported, and the node that came later stops taking part.

Timers are named (``gossip``, ``liveness``, ``repair``, ``outbox``, ``ack``, ``lazy``); each firing
re-arms its own timer, and ``SetTimer`` is emitted only when a deadline changes.
"""

from __future__ import annotations

import operator
import random
from collections.abc import Callable
from typing import Any

from .admission import OWN_FRAME, ReplayWindow, Verifier, admit_frame
from .config import EnergyParams, MeshConfig
from .data_plane import DataPlane
from .diffs import DecodeCache, PeerPayload, ScenePayload, UnbeaconPayload
from .errors import Reason
from .events import (
    BeaconPlaced, BeaconRemoved, CellForgotten, CellStored, Effect, Event, FrameDelivered, FrameReceived,
    PeerDiscovered, SceneChanged, SendFailed, SetTimer, Started, TimerFired,
)  # fmt: skip
from .frame_auth import KeyAgreement
from .identity import NodeIdentity, node_id_for
from .identity_guard import IdentityGuard
from .liveness import LivenessPlane
from .membership import Liveness, Peer
from .memory import DiffLog
from .outdated import OutdatedPeers
from .overlay import FullOverlay, Overlay, PartialOverlay
from .repair_plane import RepairPlane
from .routing import RoutingPolicy
from .state import Counters, NodeState, Signer
from .team import FrameSealer
from .wire import Envelope, MsgType

__all__ = ["MeshEngine", "Counters"]

_GOSSIP, _LIVENESS, _REPAIR, _OUTBOX, _ACK, _LAZY = "gossip", "liveness", "repair", "outbox", "ack", "lazy"


def _shared(path: str) -> property:
    """A read-only view of a part's table, under the name the engine's callers have used."""
    return property(operator.attrgetter(path))


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
        key_agreement: KeyAgreement | None = None,
        sealer: FrameSealer | Any | None = None,
        rng: random.Random | None = None,
        router: Callable[["MeshEngine"], RoutingPolicy] | None = None,
        decode_cache: DecodeCache | None = None,
    ) -> None:
        if isinstance(identity_or_node_id, NodeIdentity):
            node_id = identity_or_node_id.node_id
            public_key = identity_or_node_id.public_key
            signer = signer or identity_or_node_id.sign
            key_agreement = key_agreement or identity_or_node_id.agree
        else:
            node_id = identity_or_node_id
        if public_key is None or signer is None or key_agreement is None:
            raise ValueError("a bare node id needs public_key=, signer= and key_agreement=")
        if node_id_for(public_key) != node_id:
            raise ValueError("node id does not match the public key")
        self.node_id = node_id
        self.config = config
        self.state = state = NodeState(
            node_id, config, store, energy, public_key=public_key, proof=config.team.membership_proof(public_key),
            sign=signer, verify=verifier or NodeIdentity.verify, agree=key_agreement,
            sealer=sealer or config.team.sealer(),
            rng=rng or random.Random(node_id),
            # What decoding keeps between frames: our own, unless the process runs many
            # engines that share one (a simulator's part).
            decode_cache=DecodeCache() if decode_cache is None else decode_cache,
        )  # fmt: skip
        self.partial = config.view == "partial"
        self._overlay: Overlay = PartialOverlay(state) if self.partial else FullOverlay(state)
        self.router: RoutingPolicy = router(self) if router is not None else self._overlay.view()
        self._data_plane = DataPlane(state, self.router, partial=self.partial)
        self._repair_plane = RepairPlane(state, self._data_plane, self._overlay)
        self._replay = ReplayWindow(
            config.max_clock_skew_ms, config.max_future_skew_ms, config.frame_max_age_ms,
            offset_samples=config.clock_offset_samples, offset_step_ms=config.clock_offset_step_ms,
        )  # fmt: skip
        self._liveness = LivenessPlane(state, self._overlay, self._data_plane, self._repair_plane, self._replay)
        self._guard = state.guard = IdentityGuard(state, lambda: self._overlay.publish(PeerPayload(config.address)))
        self._outdated = OutdatedPeers(state)
        self._timers: dict[str, int] = {}
        self._armed: dict[str, int] = {}
        self._restored = False  # control state put back from the log (once, at the first Started)
        self._reply_peer: str | None = None  # the sender of the frame being handled, if replies ride its response
        self._handlers: dict[type, Callable[[Any], None]] = {
            Started: self._on_started, CellStored: self._on_cell_stored, CellForgotten: self._on_cell_forgotten,
            BeaconPlaced: self._on_beacon_placed, BeaconRemoved: self._on_beacon_removed,
            SceneChanged: self._on_scene_changed, PeerDiscovered: self._overlay.discover,
            FrameReceived: self._on_frame_received, SendFailed: self._on_send_failed, TimerFired: self._on_timer,
            FrameDelivered: self._on_frame_delivered,
        }  # fmt: skip
        data, repair, liveness = self._data_plane, self._repair_plane, self._liveness
        self._receivers: dict[MsgType, Callable[[Envelope, Peer], None]] = {
            MsgType.DATA: data.on_data, MsgType.ACK: data.on_ack, MsgType.GOSSIP: self._overlay.on_gossip,
            MsgType.REPAIR_REQUEST: repair.on_request, MsgType.REPAIR_REPLY: repair.on_reply,
            MsgType.PING: liveness.on_ping, MsgType.PONG: liveness.on_pong,
            MsgType.IHAVE: data.on_ihave, MsgType.GRAFT: data.on_graft,
        }  # fmt: skip

    # The parts' tables, as the engine's callers (status pages, tests, the simulator) read them.
    store = _shared("state.store")
    energy = _shared("state.energy")
    public_key = _shared("state.public_key")
    keyring = _shared("state.keyring")
    peers = _shared("state.peers")
    control = _shared("state.control")
    beacons = _shared("state.beacons")
    own_beacons = _shared("state.own_beacons")
    contacts = _shared("state.contacts")
    counters = _shared("state.counters")
    inbound = _shared("_overlay.inbound")
    outbox = _shared("_data_plane.outbox")
    lazy = _shared("_data_plane.lazy")
    owed = _shared("_data_plane.owed")
    repair = _shared("_repair_plane.client")
    # ... and, for a test or a benchmark that rebuilds an engine or reads its frames, its identity
    # as given, the addresses it was told of (-> next try) and its peers' clock offsets.
    _sign = _shared("state.sign")
    _verify = _shared("state.verify")
    _agree = _shared("state.binding._agree")
    _sealer = _shared("state.sealer")
    _proof = _shared("state.proof")
    _contacts = _shared("_overlay.invited")
    _clock_offsets = _shared("_replay.offsets")

    # -- the one entry point -----------------------------------------------------------

    def handle(self, event: Event, now_ms: int) -> list[Effect]:
        """Consume one event at ``now_ms``; return the effects to carry out, in order."""
        state = self.state
        state.now = now_ms
        if self._guard.stopped:  # our id is in use elsewhere and we came later: we take no part
            self._guard.refuse(event)
            return []
        state.out = out = []
        self._handlers[type(event)](event)
        data = self._data_plane
        if data.outbox.ready:
            data.flush(self._reply_peer)
        self._reply_peer = None
        self._arm_timers()
        state.out = []
        return out

    # -- local events ------------------------------------------------------------------

    def _on_started(self, _: Started) -> None:
        state, now = self.state, self.state.now
        state.begin_incarnation()
        self._armed.clear()  # a new runtime knows no timers yet: arm them all again
        if not self._restored:
            self._restored = True
            for origin, public_key, proof in state.store.keys():
                state.keyring.learn(origin, public_key, proof)  # checked again: a rotated team drops old proofs
            self._liveness.unheard |= self._overlay.restore()
        recorded = next((d.payload.address for d in state.control.entries(self.node_id)
                         if isinstance(d.payload, PeerPayload)), None)  # fmt: skip
        self._overlay.publish(PeerPayload(self.config.address))
        self._guard.started(recorded)
        self._timers[_GOSSIP] = now
        self._timers[_LIVENESS] = now + self.config.probe_interval_ms // 2
        self._repair_plane.next_round_at = now + state.jitter(self.config.repair_interval_ms)

    def _on_cell_stored(self, event: CellStored) -> None:
        self._data_plane.push_cell(event.cell)

    def _on_cell_forgotten(self, event: CellForgotten) -> None:
        self._data_plane.push_tombstone(event.node_id, event.tenant_id)

    def _on_beacon_placed(self, event: BeaconPlaced) -> None:
        self.state.own_beacons.add(event.beacon, self.node_id, self.state.now)
        self._overlay.publish(event.beacon)

    def _on_beacon_removed(self, event: BeaconRemoved) -> None:
        self.state.own_beacons.remove(event.beacon_id, self.node_id)
        self._overlay.publish(UnbeaconPayload(event.beacon_id, event.tenant_id))

    def _on_scene_changed(self, event: SceneChanged) -> None:
        scene = event.scene
        self._overlay.publish(ScenePayload(str(scene["scene_id"]), str(scene["tenant_id"]), dict(scene)))

    def _on_frame_delivered(self, event: FrameDelivered) -> None:
        if (peer := self.state.peers.by_address(event.address)) is not None:
            self._data_plane.outbox.delivered(peer.node_id, event.batch_id, self.state.now)

    def _on_send_failed(self, event: SendFailed) -> None:
        peer = self.state.peers.by_address(event.address)
        if peer is not None:
            self._liveness.apply(peer, Liveness.FAILED)

    def _on_frame_received(self, event: FrameReceived) -> None:
        state = self.state
        counters = state.counters
        counters.frames_received += 1
        counters.bytes_received += len(event.frame)
        verdict = admit_frame(
            event.frame, state.now, self_id=self.node_id, sealer=state.sealer, limits=self.config.limits,
            cache=state.decode_cache, replay=self._replay, keyring=state.keyring, learn_key=state.learn_key,
            binding=state.binding, drop=state.drop, self_address=self.config.address,
        )  # fmt: skip
        if verdict.__class__ is not tuple:
            if verdict is not OWN_FRAME:
                counters.drops[verdict] += 1  # type: ignore[index]
                if verdict == Reason.OLD_VERSION:  # a member of the previous release: say who, once
                    self._outdated.heard(event.frame, event.address)
            return
        sender_id, env = verdict  # type: ignore[misc]
        if sender_id == self.node_id:  # under our id, from elsewhere: a copy of our key at work?
            self._guard.own_frame(env)
            return
        self._guard.heard(sender_id, env.sender_address)
        peer = self._liveness.heard(sender_id, env.sender_address or event.address, event.address, env.type)
        if event.replies_ride:
            self._reply_peer = sender_id
        state.in_response = event.in_response
        self._receivers[env.type](env, peer)

    # -- timers ------------------------------------------------------------------------

    def _on_timer(self, event: TimerFired) -> None:
        now = self.state.now
        due = self._timers.get(event.name)
        if due is None or now < due:
            return  # stale or early: the current deadline is later
        if event.name == _GOSSIP:
            self._overlay.gossip_round()
            self._guard.tick()
            self._timers[_GOSSIP] = now + self.state.jitter(self.config.gossip_interval_ms)
        elif event.name == _LIVENESS:
            self._liveness.round()
            self._timers[_LIVENESS] = now + self.config.probe_interval_ms // 2
        elif event.name == _REPAIR:
            self._repair_plane.round()
        elif event.name == _OUTBOX:
            for peer_id in self._data_plane.expire_batches():
                if (peer := self.state.peers.get(peer_id)) is not None:
                    self._liveness.apply(peer, Liveness.FAILED)
        elif event.name == _ACK:
            self._data_plane.send_delayed_acks()
        elif event.name == _LAZY:
            self._data_plane.lazy_round()

    def _arm_timers(self) -> None:
        # After every event (the deadlines move with almost every frame): kept lean.
        timers, armed, data = self._timers, self._armed, self._data_plane
        timers[_OUTBOX] = data.outbox.next_deadline()  # type: ignore[assignment]
        timers[_ACK] = data.acks_at  # type: ignore[assignment]
        timers[_REPAIR] = self._repair_plane.next_deadline()  # type: ignore[assignment]
        if data.lazy is not None:
            timers[_LAZY] = data.lazy.next_deadline()  # type: ignore[assignment]
        for name, at in timers.items():
            if at is not None and armed.get(name) != at:
                armed[name] = at
                self.state.out.append(SetTimer(name, at))

    # -- status ------------------------------------------------------------------------

    def data_idle(self, now_ms: int, in_transit_ms: int) -> bool:
        """Is our part of the data plane done? Nothing queued or awaiting its ack, no ack held
        back, no announcement waiting, no announced diff awaited, no repair request awaiting
        its reply, and none of our data, ack, announcement, graft or repair frames sent within
        ``in_transit_ms`` (the longest a frame may take: one could still be on its way). A
        simulator whose every engine says so has seen the last of the cells' spread."""
        return self._data_plane.idle(now_ms, in_transit_ms) and not self._repair_plane.client.in_flight(now_ms)

    def status(self) -> dict[str, Any]:
        """Peers, queues and counters as plain data (for ``hyphae peers/status``)."""
        c, outbox = self.state.counters, self._data_plane.outbox
        return {
            "node_id": self.node_id,
            "address": self.config.address,
            "peers": [
                {
                    "node_id": p.node_id, "address": p.address, "state": p.state.value, "heard_at": p.heard_at,
                    "queue_depth": outbox.depth(p.node_id), "inflight_batches": outbox.inflight(p.node_id),
                }  # fmt: skip
                for p in self.state.peers
            ],
            "beacons_known": len(self.state.beacons),
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
            "identity": self._guard.status(),
            "outdated_peers": self._outdated.status(),
        }
