"""Liveness, the handlers: who we heard from, whom we probe, and what a peer's change of state sets off.

The state machine itself is a table in :mod:`mesh.membership` (alive, suspect, dead; heard,
failed, expired). Here is what feeds it and what follows from it:

* every authenticated frame is HEARD from its sender (a new member is announced, and asked
  for what we missed; so is one put back from the log at a restart, at its first word);
* a ping unanswered in ``ping_timeout_ms`` is FAILED, a suspect silent for
  ``suspect_timeout_ms`` is EXPIRED. Each round (every half ``probe_interval_ms``) the
  overlay says whose pings and suspicion to time out and whom to ping: SWIM-like over every
  member in a full view, the suspect and dead neighbours in a partial view (its gossip round
  probes the live ones, :mod:`mesh.overlay`);
* a peer gone dead loses its queue (owed to it if it comes back), its links, its repair
  requests and its clock offset; one back alive is asked for what we missed, and offered
  what we failed to deliver to it.
"""

from __future__ import annotations

from .admission import ReplayWindow
from .data_plane import DataPlane
from .events import PeerStateChanged
from .membership import Liveness, Peer, PeerState
from .overlay import Overlay
from .repair_plane import RepairPlane
from .state import NodeState
from .wire import Envelope, MsgType

__all__ = ["LivenessPlane"]


class LivenessPlane:
    """One node's liveness inputs and their consequences; see the module docstring."""

    def __init__(
        self, state: NodeState, overlay: Overlay, data: DataPlane, repair: RepairPlane, replay: ReplayWindow
    ) -> None:
        self.state = state
        self.config = state.config
        self.peers = state.peers
        self.overlay = overlay
        self.data = data
        self.repair = repair
        self.replay = replay
        self.unheard: set[str] = set()  # peers put back from the log, not heard from since

    def heard(self, sender_id: str, address: str, source: str, mtype: MsgType) -> Peer:
        """An authenticated frame from ``sender_id`` (at ``address``, as it says; over ``source``)."""
        state = self.state
        peer, is_new = self.peers.learn(sender_id, address, state.now)
        self.overlay.welcome(peer, is_new, address, source, mtype)
        if is_new:
            state.out.append(PeerStateChanged(sender_id, peer.address, peer.state.value))
            if peer.neighbour:  # a partial view's data-only contacts are not asked: its neighbours are
                self.repair.catch_up(peer)
        elif self.unheard and sender_id in self.unheard:
            self.unheard.discard(sender_id)
            self.repair.catch_up(peer)  # first word since our restart: catch up on what we missed
        self.apply(peer, Liveness.HEARD)
        return peer

    def apply(self, peer: Peer, event: Liveness) -> None:
        """Feed one input to ``peer``'s state machine; announce a change and act on it."""
        before = peer.state
        new = self.peers.apply(peer, event, self.state.now)
        if new is None:
            return
        self.state.out.append(PeerStateChanged(peer.node_id, peer.address, new.value))
        if new is PeerState.DEAD:
            self.data.peer_dead(peer.node_id)
            self.repair.peer_dead(peer.node_id)
            self.replay.forget(peer.node_id)  # re-estimated from its next frame
        elif new is PeerState.ALIVE and before is not PeerState.ALIVE:
            self.repair.reconnected(peer)
            self.data.offer_owed(peer)

    def round(self) -> None:
        """Time out pings and suspicion; probe the peers the overlay says are due (SWIM-like)."""
        cfg, now = self.config, self.state.now
        watched = self.overlay.watched()
        for peer in watched:
            if peer.ping_nonce and now - peer.ping_sent_at >= cfg.ping_timeout_ms:
                peer.ping_nonce = 0
                self.apply(peer, Liveness.FAILED)
            if peer.state is PeerState.SUSPECT and now - peer.changed_at >= cfg.suspect_timeout_ms:
                self.apply(peer, Liveness.EXPIRED)
        for peer in self.overlay.probes_due(watched, now):
            self.state.send(peer.address, MsgType.PING, nonce=self.state.probe(peer))

    def on_ping(self, env: Envelope, peer: Peer) -> None:
        self.state.send(peer.address, MsgType.PONG, nonce=env.nonce, in_reply=True)

    def on_pong(self, env: Envelope, peer: Peer) -> None:
        """Nothing more to do: the frame itself was the proof of life (see :meth:`heard`)."""
