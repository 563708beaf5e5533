"""Repair, the exchanges: when a node asks its peers for what it missed, and how it answers them.

What a request and an answer hold is :mod:`mesh.repair`'s (pure: the marks, the log scan, what
is owed); here is when they go and what follows them. A node asks a peer on (re)connect (at
most once per ``repair_min_interval_ms``: a peer that flaps between suspect and alive under
load must not cost a log scan each time), once more when that answer is complete (it leaves
out what the peer received in the last moments, and after a crash or a partition that is
exactly what may be missing), again when a request goes unanswered for
``repair_timeout_ms`` (twice in a row at most; then the periodic round covers it), and every
``repair_interval_ms`` to the next live peer in turn, so any holder is asked within one cycle.
With each request goes what we hold (a :class:`~mesh.haves.HaveSet`), so an answer carries
only what we lack. A peer that does not yet know our beacons answers "not ready"; we gossip
with it and ask again two gossip intervals later.
"""

from __future__ import annotations

from .diffs import Diff
from .data_plane import DataPlane
from .haves import HaveSet
from .membership import Peer, PeerState
from .overlay import Overlay
from .repair import RepairClient, answer_repair
from .state import NodeState
from .wire import Envelope, MsgType

__all__ = ["RepairPlane"]

_REPAIR_RESENDS = 2  # an unanswered repair request is sent again this often; then the periodic round covers


class RepairPlane:
    """One node's repair requests in flight and due, and its answers to others'."""

    def __init__(self, state: NodeState, data: DataPlane, overlay: Overlay) -> None:
        cfg = state.config
        self.state = state
        self.config = cfg
        self.peers = state.peers
        self.data = data
        self.overlay = overlay
        self.client = RepairClient(cfg.repair_timeout_ms)
        self.next_round_at: int | None = None  # set when the engine starts
        self._due: dict[str, int] = {}  # peer -> when to ask it (again)
        self._asked_at: dict[str, int] = {}  # peer -> when our last answered repair request went out
        self._started: dict[str, int] = {}  # peer -> when our last repair request to it went out
        self._unanswered: dict[str, int] = {}  # peer -> requests to it since its last reply
        self._turn = ""  # the periodic round asks the first live peer after this one (by id)
        self._catching_up: set[str] = set()  # peers asked on (re)connect: asked once more when answered

    def next_deadline(self) -> int | None:
        """When :meth:`round` is next due (None: never)."""
        at = self.next_round_at
        if self._due:
            due = min(self._due.values())
            at = due if at is None else min(due, at)
        return at

    def round(self) -> None:
        """Ask the peers whose requests are due, and the next live peer in turn if the
        periodic round is."""
        state, now = self.state, self.state.now
        for peer_id, due in list(self._due.items()):
            if due <= now:
                del self._due[peer_id]
                if (peer := self.peers.get(peer_id)) is not None and peer.state is not PeerState.DEAD:
                    self.request(peer)
        if self.next_round_at is not None and self.next_round_at <= now:
            live = self.overlay.linked(PeerState.ALIVE)
            if live:
                # Each live peer in turn, not a random one: whatever one holder alone has (a
                # cell its origin could not deliver) is asked for within one cycle.
                ids = sorted(p.node_id for p in live)
                turn = next((i for i in ids if i > self._turn), ids[0])
                self._turn = turn
                self.request(self.peers.get(turn))  # type: ignore[arg-type]
            self.next_round_at = now + state.jitter(self.config.repair_interval_ms)

    def reconnected(self, peer: Peer) -> None:
        """A peer came back (alive after suspect or dead): catch up on what we missed, at most
        once per ``repair_min_interval_ms``."""
        now = self.state.now
        last = self._started.get(peer.node_id)
        due = now if last is None else last + self.config.repair_min_interval_ms
        if due <= now:
            self.catch_up(peer)
        else:
            self._catching_up.add(peer.node_id)
            self._due[peer.node_id] = min(self._due.get(peer.node_id, due), due)

    def catch_up(self, peer: Peer) -> None:
        """Ask a peer for what we missed now, and once more when the reply is complete."""
        self._catching_up.add(peer.node_id)
        self.request(peer)

    def peer_dead(self, peer_id: str) -> None:
        self.client.forget(peer_id)
        self._unanswered.pop(peer_id, None)
        self._catching_up.discard(peer_id)

    def request(self, peer: Peer) -> None:
        state, cfg, now = self.state, self.config, self.state.now
        started = self.client.start(peer.node_id, now)
        if started is None:  # one is in flight; keep its resend armed if a due time was used up
            sent_at = self.client.sent_at(peer.node_id)
            if sent_at is not None and self._unanswered.get(peer.node_id, 0) <= _REPAIR_RESENDS:
                self._due.setdefault(peer.node_id, sent_at + cfg.repair_timeout_ms)
            return
        request_id, since = started
        # Sent again if unanswered (a lost frame, a timed-out reply), a few times in a row at most.
        unanswered = self._unanswered.get(peer.node_id, 0) + 1
        self._unanswered[peer.node_id] = unanswered
        if unanswered <= _REPAIR_RESENDS:
            resend_at = now + cfg.repair_timeout_ms
            self._due[peer.node_id] = min(self._due.get(peer.node_id, resend_at), resend_at)
        self._started[peer.node_id] = now
        state.counters.repairs_requested += 1
        state.send(
            peer.address, MsgType.REPAIR_REQUEST, request_id=request_id, since=since,
            limit=cfg.repair_scan_limit, version=state.control.version(state.node_id),
            haves=self._haves(peer.node_id),
        )  # fmt: skip

    def _haves(self, peer_id: str) -> HaveSet:
        """What we hold of each origin we received from since our last answered request to
        this peer (less a settling margin): every seq from the lowest received then up to
        the origin's newest we hold, so diffs received before that count too."""
        asked = self._asked_at.get(peer_id)
        cutoff = None if asked is None else asked - 2 * self.config.ack_timeout_ms * self.config.max_attempts
        lows: dict[str, int] = {}
        for at, origin, seq in reversed(self.data.receipts):
            if cutoff is not None and at < cutoff:
                break
            if seq < lows.get(origin, seq + 1):
                lows[origin] = seq
        store = self.state.store
        return HaveSet.build(lows, store.max_seq, store.has)

    def on_request(self, env: Envelope, peer: Peer) -> None:
        state, cfg = self.state, self.config
        if state.control.version(peer.node_id) < env.version:
            # We have not yet seen all of its beacons: answer "not ready", gossip with it now.
            state.send(
                peer.address, MsgType.REPAIR_REPLY, request_id=env.request_id, upto=env.since, ready=False,
                in_reply=True,
            )  # fmt: skip
            self.overlay.send_gossip(peer.address)
            return
        answer = answer_repair(
            state.store, state.beacons.of_owner(peer.node_id), requester=peer.node_id, since=env.since,
            scan_limit=max(1, min(env.limit, cfg.repair_scan_limit)), max_diffs=cfg.limits.max_diffs,
            max_bytes=state.max_bytes, grace_ms=cfg.repair_grace_ms, energy=state.energy, now=state.now,
            settle_ms=cfg.ack_timeout_ms * cfg.max_attempts, haves=env.haves,
        )  # fmt: skip
        diffs: tuple[Diff, ...] = tuple(answer.diffs)
        state.send(
            peer.address, MsgType.REPAIR_REPLY, diffs, request_id=env.request_id,
            upto=answer.upto, more=answer.more, ready=True, in_reply=True,
        )  # fmt: skip

    def on_reply(self, env: Envelope, peer: Peer) -> None:
        accept = self.data.accept
        for diff in env.diffs:
            accept(diff, env, peer, relay=False)
        cfg, now = self.config, self.state.now
        sent_at = self.client.sent_at(peer.node_id)
        if not self.client.finish(peer.node_id, env.request_id, env.upto, env.ready):
            return
        self._unanswered.pop(peer.node_id, None)
        if sent_at is not None and self._due.get(peer.node_id) == sent_at + cfg.repair_timeout_ms:
            del self._due[peer.node_id]  # answered: no resend
        if env.ready and not env.more and sent_at is not None:
            # A scan finished: what it covered was received before this request. The next
            # pages of an unfinished scan still cover older entries, so they keep the earlier
            # window of what we hold.
            self._asked_at[peer.node_id] = sent_at
        if not env.ready:
            self._due[peer.node_id] = now + 2 * cfg.gossip_interval_ms
        elif env.more:
            self.request(peer)
        elif peer.node_id in self._catching_up:
            self._catching_up.discard(peer.node_id)
            again = now + cfg.ack_timeout_ms * (cfg.max_attempts + 1)  # once what it just received has settled
            self._due[peer.node_id] = min(self._due.get(peer.node_id, again), again)
