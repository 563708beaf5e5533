"""The data plane: cells and tombstones pushed to the nodes that want them, acked, resent.

A stored cell becomes a signed diff; its origin matches it against the beacons it knows
(the routing policy, :mod:`mesh.routing`) and queues it for their owners. The queues
(:mod:`mesh.outbox`) are flushed after every event into DATA batches, highest energy first,
each acknowledged by its peer and sent again when the ack does not come. Where the runtime
can answer a frame in its response (``FrameReceived.replies_ride``), a batch for that frame's
sender rides back in it; the ack for a batch that came in a response (``in_response``) waits
``ack_delay_ms`` to ride on our next batch to its sender, or goes alone.

A node that accepts a data diff relays it where the policy says (the partial view: to the
interest it knows; the full view never relays). Partial view only: each copy names the nodes
already sent it (:mod:`mesh.told`), a copy that comes in withdraws the ones we queued for the
nodes it names, and a relay's onward copies may wait ``relay_hold_ms`` for such copies. With
``lazy_push`` a relay's copies to a peer that was sent one it had go as announcements, asked
for when no other copy comes (:mod:`mesh.lazy`: IHAVE, GRAFT, and prunes riding on acks).

A cell that supersedes others (:mod:`mesh.lifecycle`) also goes where each of them went: its
origin adds the targets each superseded cell it holds would be routed to, and that cell's own
origin; a relay adds each one's relay targets (a walk hop among them spends the new diff's
budget). Every holder of the old cell is sent the new one, once. A cell whose tombstone (by its
origin) we hold is not logged, handed to the node or relayed, whichever came first.

What a peer going dead leaves in its queue is owed to it (:class:`mesh.repair.Owed`) and
offered again when it comes back. Every frame goes out through
:meth:`~mesh.state.NodeState.send`.
"""

from __future__ import annotations

import collections
from typing import Any

from .diffs import DATA_KINDS, CellPayload, Diff, DiffKind, TombstonePayload
from .errors import Reason
from .events import ApplyTombstone, StoreRemoteCell
from .lazy import LazyPush
from .lifecycle import supersedes
from .membership import Peer, PeerState
from .outbox import Batch, Outbox
from .repair import Owed
from .routing import RoutingPolicy
from .state import NodeState
from .told import MAX_TOLD, tell, told_name, told_names
from .wire import Envelope, MsgType

__all__ = ["DataPlane"]

_ACKS_HELD = 64  # delayed acks for one peer beyond this go at once
_GRAFT_UNKNOWN = "graft_unknown"  # a graft for a diff we no longer keep (or never announced)
_KIND_NAMES = {kind: kind.name.lower() for kind in DiffKind}  # counters' keys (looked up per diff accepted)
_RECEIPTS_KEPT = 1 << 16  # data diffs received, newest kept: where each origin's span of a have-set starts
_CHAIN_CELLS = 64  # cells a superseding cell's routing looks at, down its chain of revisions


class DataPlane:
    """One node's sending queues, acks and relays. See the module docstring."""

    def __init__(self, state: NodeState, router: RoutingPolicy, *, partial: bool) -> None:
        cfg = state.config
        self.state = state
        self.router = router
        self.config = cfg
        self.peers = state.peers
        self.store = state.store
        self.energy = state.energy
        self.counters = state.counters
        self.outbox = Outbox(
            queue_limit=cfg.send_queue_limit, max_inflight=cfg.max_inflight_batches,
            max_diffs=cfg.limits.max_diffs, max_bytes=state.max_bytes, pacing_ms=cfg.flush_interval_ms,
            ack_timeout_ms=cfg.ack_timeout_ms, max_attempts=cfg.max_attempts,
            busy_pacing_ms=cfg.busy_flush_interval_ms,
        )  # fmt: skip
        # A graft unanswered in an ack timeout goes to the next announcer.
        self.lazy = LazyPush(cfg.lazy_announce_ms, cfg.lazy_graft_ms, cfg.ack_timeout_ms) if (
            partial and cfg.lazy_push
        ) else None  # fmt: skip
        self.owed = Owed(cfg.send_queue_limit)  # dropped for a peer: offered again when it comes back
        self.receipts: collections.deque[tuple[int, str, int]] = collections.deque(maxlen=_RECEIPTS_KEPT)
        self.acks_due: dict[str, list[int]] = {}  # peer -> batches received in responses, not yet acked
        self.acks_at: int | None = None  # when the delayed acks go alone
        self._prunes_due: set[str] = set()  # peers our next ack to asks to prune (lazy push)
        # Partial view only: the copies a relay sends name whom they went to, a copy we had
        # withdraws those queued, and a relay's copies to known interest may wait for that.
        self._told_limit = min(cfg.told_limit, MAX_TOLD) if partial else 0
        self._withdraws = partial
        self._relay_hold_ms = cfg.relay_hold_ms if partial else 0

    # -- our own cells -----------------------------------------------------------------

    def push_cell(self, cell: CellPayload) -> None:
        """A cell stored here: sign it, log it, and queue it for the owners of the beacons it matches."""
        state = self.state
        diff = state.sign_new(cell)
        self.store.put(diff, state.now)
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        wire = diff.routed(hops=1, ttl=self.energy.hop_budget(e0) - 1)
        extra, _ = self._superseded_targets(wire, cell, None)
        targets = self.router.origin_targets(wire, cell, state.now) | extra
        if told := self._told(sorted(targets), b""):
            wire = wire.routed(wire.hops, wire.ttl, told)
        for peer_id in targets:
            self.enqueue(peer_id, wire, e0)

    def _superseded_targets(
        self, diff: Diff, cell: CellPayload, sender: str | None
    ) -> tuple[set[str], frozenset[str]]:
        """Where the cells ``cell`` supersedes, those we hold, went from here: as their origin
        (``sender`` None: their routing targets and their origins) or as a relay (their relay
        targets), each with the cells it superseded in turn (a chain of revisions: the holders of
        the first were sent the second), at most ``_CHAIN_CELLS`` cells in all; and which of those
        are walk hops (partial view: a steered walk goes the same way for the same cell, and spends
        the new diff's budget, so it ends where the old cell's did). Asked before the new cell's
        own targets, which leave the router's walk hops as the new cell's."""
        ids = supersedes(cell.metadata, cell.node_id)
        if ids is None:
            self.counters.supersedes_ignored += 1
            return set(), frozenset()
        out: set[str] = set()
        walked: set[str] = set()
        known: set[str] = set()  # a known interest of one old cell is not a walk hop
        router, now = self.router, self.state.now
        todo, seen = list(ids), {cell.node_id, *ids}
        while todo and len(seen) <= _CHAIN_CELLS:
            ref = self.store.cell(todo.pop(0))
            if ref is None or not isinstance(ref.payload, CellPayload):
                continue
            old = ref.payload
            if sender is None:
                found = router.origin_targets(diff, old, now)
            else:
                found = router.relay_targets(diff, old, sender, now)
            out |= found
            walked |= router.walked
            known |= found - router.walked
            if sender is None:
                out.add(ref.origin)
            for older in supersedes(old.metadata, old.node_id) or ():
                if older not in seen:
                    seen.add(older)
                    todo.append(older)
        out.discard(self.state.node_id)
        return out, frozenset(walked - known)

    def push_tombstone(self, cell_id: str, tenant_id: str) -> None:
        """A cell forgotten here: the tombstone goes where the cell went (and to its origin),
        the holders of the cells it superseded included."""
        state = self.state
        ref = self.store.cell(cell_id)
        payload = TombstonePayload(cell_id, tenant_id, state.now, ref.origin if ref else None, ref.seq if ref else 0)
        diff = state.sign_new(payload)
        self.store.put(diff, state.now)
        if ref is None or not isinstance(ref.payload, CellPayload):
            return  # nobody was sent the cell by us; repair carries the tombstone to holders
        cell = ref.payload
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        wire = diff.routed(hops=1, ttl=self.energy.hop_budget(e0) - 1)
        extra, _ = self._superseded_targets(wire, cell, None)  # it went to the holders of what it superseded
        targets = self.router.origin_targets(wire, cell, state.now) | extra
        if ref.origin != state.node_id:
            targets.add(ref.origin)
        for peer_id in targets:
            self.enqueue(peer_id, wire, e0)

    # -- queues and batches ------------------------------------------------------------

    def enqueue(self, peer_id: str, diff: Diff, energy: float, hold_until: int = 0) -> None:
        peer = self.peers.get(peer_id)
        if peer is None and peer_id in self.state.contacts:
            peer, _ = self.peers.learn(peer_id, self.state.contacts[peer_id], self.state.now)
            peer.neighbour = False
        if peer is None or peer.state is PeerState.DEAD:
            self.state.drop(Reason.PEER_DEAD)
            if peer is not None:
                self.owed.add(peer_id, diff, energy)
            return
        if self.outbox.enqueue(peer_id, diff, energy, hold_until=hold_until):
            self.state.drop(Reason.QUEUE_FULL)

    def flush(self, reply_peer: str | None) -> None:
        """Send every batch that may leave now; the one for ``reply_peer`` rides in its response."""
        outbox, now = self.outbox, self.state.now
        for peer_id in sorted(outbox.ready):
            peer = self.peers.get(peer_id)
            if peer is None or peer.state is PeerState.DEAD:
                self._drop_for(peer_id)
                continue
            # What we have for the peer whose frame we are handling rides back in the response
            # to it: an exchange that happens anyway, so no pacing gap to wait for.
            free_ride = peer_id == reply_peer
            batch = outbox.take(peer_id, now, free_ride=free_ride)
            if batch is not None:
                self._send_batch(peer, batch, free_ride)

    def _send_batch(self, peer: Peer, batch: Batch, in_reply: bool = False) -> None:
        self.counters.data_diffs_resent += sum(1 for _, attempts, _ in batch.items if attempts > 1)
        self.state.send(
            peer.address, MsgType.DATA, tuple(d for _, _, d in batch.items), batch_id=batch.batch_id,
            acks=self._take_acks(peer.node_id), in_reply=in_reply, **self._lazy_riders(peer.node_id),
        )  # fmt: skip

    def _take_acks(self, peer_id: str) -> tuple[int, ...]:
        """The delayed acks for a peer, now riding on a frame to it."""
        acks = self.acks_due.pop(peer_id, None)
        if not self.acks_due:
            self.acks_at = None
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

    def send_delayed_acks(self) -> None:
        """No data frame went to these peers in time for their acks to ride on: send them alone."""
        for peer_id in list(self.acks_due):
            peer = self.peers.get(peer_id)
            acks, riders = self._take_acks(peer_id), self._lazy_riders(peer_id)
            if peer is not None:
                self.state.send(peer.address, MsgType.ACK, acks=acks, **riders)
        self.acks_at = None

    def expire_batches(self) -> list[str]:
        """Put back (or give up) the batches not acked in time; the peers found failing."""
        failing, gave_up = self.outbox.expire(self.state.now, self.owed.add)
        self.state.drop(Reason.GAVE_UP, gave_up)
        return failing

    def _drop_for(self, peer_id: str) -> None:
        """Empty a dead peer's queue; what was in it is owed to it if it comes back."""
        if self.peers.get(peer_id) is not None:
            for energy, diff in self.outbox.held(peer_id):
                self.owed.add(peer_id, diff, energy)
        self.state.drop(Reason.PEER_DEAD, self.outbox.drop_peer(peer_id))

    def peer_dead(self, peer_id: str) -> None:
        """A peer went dead: its queue is owed to it, its links and acks are let go (its
        batches will come again, or by repair)."""
        self._drop_for(peer_id)
        if self.lazy is not None:
            self.lazy.forget(peer_id)
            self._prunes_due.discard(peer_id)
        self._take_acks(peer_id)

    def offer_owed(self, peer: Peer) -> None:
        """A peer back from suspect or dead: send what we failed to deliver to it, unless decayed."""
        now = self.state.now
        for energy, diff in self.owed.take(peer.node_id):
            p = diff.payload
            if isinstance(p, CellPayload) and not self.energy.worth_repairing(energy, p.cell_type, p.created_at, now):
                continue
            self.enqueue(peer.node_id, diff, energy)

    def idle(self, now_ms: int, in_transit_ms: int) -> bool:
        """Nothing queued or awaiting its ack, no ack held back, no announcement waiting nor
        announced diff awaited, and none of our data-plane frames sent within ``in_transit_ms``."""
        sent_at = self.state.data_sent_at
        return (
            (sent_at is None or now_ms - sent_at > in_transit_ms) and self.outbox.idle and not self.acks_due
            and (self.lazy is None or self.lazy.idle)
        )  # fmt: skip

    # -- receiving ---------------------------------------------------------------------

    def on_data(self, env: Envelope, peer: Peer) -> None:
        if env.acks or env.prune or env.refs:
            self.on_ack(env, peer)
        for diff in env.diffs:
            self.accept(diff, env, peer, relay=True)
        state = self.state
        if not state.in_response:
            acks = (*self._take_acks(peer.node_id), env.batch_id)
            state.send(peer.address, MsgType.ACK, acks=acks, in_reply=True, **self._lazy_riders(peer.node_id))
            return
        # It came back in the response to one of ours: an ack now would be an exchange of its own,
        # so it waits a little to ride on our next data frame to that peer.
        due = self.acks_due.setdefault(peer.node_id, [])
        due.append(env.batch_id)
        if len(due) >= _ACKS_HELD:
            acks = self._take_acks(peer.node_id)
            state.send(peer.address, MsgType.ACK, acks=acks, **self._lazy_riders(peer.node_id))
        elif self.acks_at is None:
            self.acks_at = state.now + self.config.ack_delay_ms

    def on_ack(self, env: Envelope, peer: Peer) -> None:
        for batch_id in env.acks:
            self.outbox.acked(peer.node_id, batch_id, self.state.now)
        if env.prune and self.lazy is not None:
            self.lazy.prune(peer.node_id)
        if env.refs:
            self.on_ihave(env, peer)

    def accept(self, diff: Diff, env: Envelope, sender: Peer, relay: bool) -> None:
        """One data diff from ``sender``: log it, hand it to the node, and (``relay``: it was
        pushed, not a repair reply) send it on where the routing policy says."""
        state = self.state
        if diff.kind not in DATA_KINDS:
            state.drop(Reason.MALFORMED)
            return
        if self.store.has(diff.origin, diff.seq) or diff.origin == state.node_id:
            if state.guard.refused(diff, env.keys):
                return  # a fork, or a diff under our id that is not ours: counted and reported there
            state.drop(Reason.DUPLICATE)
            if self._withdraws:
                self._withdraw_copies(diff, sender.node_id)
            # A relay's copy we had: its link to us is one copy too many (not the origin's push,
            # nor a resend of the copy it sent first).
            if relay and self.lazy is not None and sender.node_id != diff.origin and (
                self.lazy.should_prune((diff.origin, diff.seq), sender.node_id)
            ):  # fmt: skip
                self._prunes_due.add(sender.node_id)
            return
        if not state.admit(diff, env.keys):
            return
        if isinstance(diff.payload, TombstonePayload) and not self._forgets_own_cell(diff.origin, diff.payload):
            state.drop(Reason.NOT_ORIGIN)
            return
        if isinstance(diff.payload, CellPayload) and self.store.forgotten(diff.payload.node_id, diff.origin):
            state.drop(Reason.FORGOTTEN)  # its tombstone came first: the cell stays forgotten
            return
        now = state.now
        self.store.put(diff, now)
        self.receipts.append((now, diff.origin, diff.seq))
        if self.lazy is not None:
            self.lazy.received((diff.origin, diff.seq), sender.node_id)
        self.counters.diffs_accepted[_KIND_NAMES[diff.kind]] += 1
        p = diff.payload
        cell: CellPayload | None = None
        if isinstance(p, CellPayload):
            cell = p
            self.counters.cells_delivered += 1
            state.out.append(StoreRemoteCell(p, diff.origin, diff.hops, diff.signature, diff.seq))
        elif isinstance(p, TombstonePayload):
            state.out.append(ApplyTombstone(p.cell_id, p.tenant_id, diff.origin, p.forgotten_at))
            ref = self.store.cell(p.cell_id)
            cell = ref.payload if ref is not None and isinstance(ref.payload, CellPayload) else None
        if relay and cell is not None:  # the router decides what a ttl of 0 still allows
            self._relay(diff, cell, sender)

    def _forgets_own_cell(self, signer: str, tombstone: TombstonePayload) -> bool:
        """Only a cell's origin may forget it: the origin of the cell diff we hold, else the
        one the tombstone names (the node's facade checks its own row again)."""
        held = self.store.cell(tombstone.cell_id)
        origin = held.origin if held is not None else tombstone.cell_origin
        return origin is None or origin == signer

    def _relay(self, diff: Diff, cell: CellPayload, sender: Peer) -> None:
        router, now = self.router, self.state.now
        extra, old_walks = self._superseded_targets(diff, cell, sender.node_id)  # (a tombstone's: its cell's)
        own = router.relay_targets(diff, cell, sender.node_id, now)
        targets = own | extra
        if old_walks:  # the old cells' walk hops spend this diff's budget too (unless the new cell's interest)
            router.walked = router.walked | (old_walks - (own - router.walked))
        if not targets:
            return
        e0 = self.energy.initial(cell.salience, cell.cell_type)
        onward_to = sorted(targets - {diff.origin, sender.node_id, self.state.node_id})
        announce_to: list[str] = []
        if self.lazy is not None and self.lazy.lazy:  # a walk hop is the only copy on its way
            walked, lazy = router.walked, self.lazy.lazy
            announce_to = [p for p in onward_to if p in lazy and p not in walked]
            if announce_to:
                onward_to = [p for p in onward_to if p not in lazy or p in walked]
        told = self._told(onward_to, diff.told)
        # A push to known interest may meet other holders' copies (see _withdraw_copies);
        # a walk hop goes where none is known to be going: no hold.
        hold_until = now + self._relay_hold_ms if self._withdraws else 0
        copies: dict[int, Diff] = {}  # by ttl: the copies differ only there (a walk hop spends one)
        for peer_id in onward_to:
            ttl = router.onward_ttl(diff, peer_id)
            onward = copies.get(ttl)
            if onward is None:
                onward = copies[ttl] = diff.routed(diff.hops + 1, ttl, told)
            self.enqueue(peer_id, onward, e0, 0 if peer_id in router.walked else hold_until)
        if announce_to:
            ttl = router.onward_ttl(diff, announce_to[0])  # none is a walk hop: all alike
            onward = diff.routed(hops=diff.hops + 1, ttl=ttl, told=told)
            for peer_id in announce_to:
                self.lazy.announce(peer_id, onward, e0, now)  # type: ignore[union-attr]

    def _told(self, sent_to: list[str], was_told: bytes) -> bytes:
        """Partial view: the told list our copies of a diff carry (:mod:`mesh.told`)."""
        if not self._told_limit:
            return b""
        return tell(sent_to, was_told, self._told_limit)

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
            held_at = self.state.now if self.config.relay_hold_ms else None
            for peer_id in [p for p in self.outbox.ready if told_name(p) in names]:
                self.counters.data_diffs_withdrawn += self.outbox.withdraw(peer_id, diff.origin, diff.seq, held_at)
        if self.lazy is not None:
            # Nor announce it to the sender. To the nodes named, yes: an announcement waits far
            # longer than a queued copy, time enough for the copies that named them to be
            # withdrawn in turn, and it is what lets them ask if none comes.
            self.lazy.withdraw(sender_id, (diff.origin, diff.seq))

    # -- lazy push (mesh.lazy) -----------------------------------------------------------

    def on_ihave(self, env: Envelope, peer: Peer) -> None:
        """A peer announces diffs it holds: await those we lack (a graft if no copy comes), and
        send it none of them ourselves."""
        if self.lazy is None:
            return  # we prune no link, so none should announce to us: its copies still come
        now, node_id = self.state.now, self.state.node_id
        for ref in env.refs:
            self.lazy.withdraw(peer.node_id, ref)
            self.counters.data_diffs_withdrawn += self.outbox.withdraw(peer.node_id, *ref)
            if not self.store.has(*ref) and ref[0] != node_id:
                self.lazy.announced(ref, peer.node_id, now)

    def on_graft(self, env: Envelope, peer: Peer) -> None:
        """A peer asks for diffs we announced to it: push them as any copy, and push to it again."""
        if self.lazy is None:
            return
        self.lazy.graft(peer.node_id)
        for ref in env.refs:
            kept = self.lazy.copy_for(ref)
            if kept is None:
                self.state.drop(_GRAFT_UNKNOWN)  # announced too long ago (or never): repair has it
                continue
            self.enqueue(peer.node_id, *kept)

    def lazy_round(self) -> None:
        """Send the announcements that are due, and graft what was announced and did not come."""
        lazy, limit, state = self.lazy, self.config.limits.max_diffs, self.state
        assert lazy is not None
        for peer_id, refs in lazy.take_announcements(state.now):
            peer = self.peers.get(peer_id)
            if peer is None or peer.state is PeerState.DEAD:
                continue
            for k in range(0, len(refs), limit):
                state.send(peer.address, MsgType.IHAVE, refs=tuple(refs[k : k + limit]))
            self.counters.diffs_announced += len(refs)
        for peer_id, refs in lazy.take_grafts(state.now, self._graftable):
            peer = self.peers.get(peer_id)
            for k in range(0, len(refs), limit):
                state.send(peer.address, MsgType.GRAFT, refs=tuple(refs[k : k + limit]))  # type: ignore[union-attr]
            self.counters.diffs_grafted += len(refs)

    def _graftable(self, peer_id: str) -> bool:
        peer = self.peers.get(peer_id)
        return peer is not None and peer.state is not PeerState.DEAD
