"""The overlay: whom a node gossips with, and the control diffs that gossip replicates.

Control diffs (``peer``, ``beacon``/``unbeacon``, ``scene``) are replicated by Scuttlebutt
push-pull anti-entropy (:mod:`mesh.control`): every ``gossip_interval_ms`` a node sends one
peer its digest, and each side answers with what the other lacks. The two views differ in
whom they gossip with and how far their control diffs go, behind one interface, chosen once:

* :class:`FullOverlay` (``view="full"``, the LAN default): every member knows every member
  and beacon, gossips with one random live member per round and routes with
  :class:`~mesh.routing.FullView`. Liveness is SWIM-like over all members: the peers silent
  the longest get pings. The control state is logged, so a restart routes from its first store.
* :class:`PartialOverlay` (``view="partial"``, large meshes): at most ``max_neighbours``
  random neighbours plus ``interest_neighbours`` chosen each round as the known nodes whose
  beacons are nearest its own (T-Man style, so nodes of like interest end up within each
  other's radius; a gossip answer also offers the asker the nodes beyond its radius nearest
  its interest, T-Man's ranked exchange, so a rare interest finds its kind in a few rounds).
  Control diffs replicate only ``interest_radius`` hops; ``peer`` diffs within it give the
  contacts that data is pushed to directly. It routes with :class:`~mesh.routing.PartialView`,
  wired to its links as they stand now, both ways (:mod:`mesh.links`). Its gossip round goes
  to the live neighbour silent the longest when one is due a probe, and is that probe (every
  partial-view node answers a round): no PING and PONG besides the gossip, as long as the
  neighbours are alive; only suspects and the dead are pinged.

Both also keep the addresses we were told of (discovery, seeds) but have not yet heard from:
each is sent a gossip round at once and every ``dead_probe_interval_ms`` after, until its
node speaks.

A control diff changes only its own origin's state: beacons are named by (origin, id), so a
removal signed by another member removes nothing (``not_owner``), and a beacon reusing
another's id is a beacon of its own origin's. What one origin may make us hold is bounded
(:mod:`mesh.quota`), checked before a diff is recorded, so before anyone is served it.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Protocol

from .control import control_key
from .diffs import (
    CONTROL_KINDS, BeaconPayload, Diff, DiffKind, Payload, PeerPayload, ScenePayload, UnbeaconPayload, sign_diff,
)  # fmt: skip
from .errors import Reason
from .events import ApplyRemoteBeacon, ApplyScene, PeerDiscovered, PeerStateChanged, RemoveRemoteBeacon
from .links import InboundLinks
from .membership import Peer, PeerState
from .quota import ControlQuota
from .routing import FullView, PartialView, RoutingPolicy, beacon_closeness
from .state import NodeState
from .wire import Envelope, MsgType

__all__ = ["Overlay", "FullOverlay", "PartialOverlay"]

_OUT_OF_RADIUS = "out_of_radius"  # a control diff from farther than the interest radius (partial view)
_OFFER_DECLINED = "offer_declined"  # an offered node no nearer our interest than our chosen neighbours
_KIND_NAMES = {kind: kind.name.lower() for kind in DiffKind}  # counters' keys


def _UNSIGNED(message: bytes) -> bytes:
    return bytes(64)  # a signature's size: what a diff of ours would take, before signing it


class Overlay(Protocol):
    """What the engine and the other parts ask of either view."""

    invited: dict[str, int]  # addresses told of, not yet heard from -> when to try again
    inbound: InboundLinks  # the nodes that hold us as a neighbour (partial view)

    def view(self) -> RoutingPolicy: ...

    def linked(self, *states: PeerState) -> list[Peer]: ...

    def watched(self) -> list[Peer]: ...

    def probes_due(self, watched: list[Peer], now: int) -> list[Peer]: ...

    def welcome(self, peer: Peer, is_new: bool, address: str, source: str, mtype: MsgType) -> None: ...

    def restore(self) -> set[str]: ...

    def discover(self, event: PeerDiscovered) -> None: ...

    def publish(self, payload: Payload) -> None: ...

    def gossip_round(self) -> None: ...

    def send_gossip(self, address: str) -> None: ...

    def on_gossip(self, env: Envelope, peer: Peer) -> None: ...


class FullOverlay:
    """Every member and every beacon known; see the module docstring."""

    def __init__(self, state: NodeState) -> None:
        cfg = state.config
        self.state = state
        self.config = cfg
        self.peers = state.peers
        self.control = state.control
        self.beacons = state.beacons
        self.counters = state.counters
        self.quota = ControlQuota.of(cfg)
        self.invited: dict[str, int] = {}  # unauthenticated address -> next try
        # Partial view: who holds us as a neighbour (the other end of our links), in-degree bounded.
        self.inbound = InboundLinks(
            cfg.inbound_link_timeout_ms, cfg.max_inbound_links,
            lambda node_id: self.beacons.closeness(node_id, state.own_beacons.vectors()), self._neighbour,
        )  # fmt: skip

    # -- the view ----------------------------------------------------------------------

    def view(self) -> RoutingPolicy:
        """The routing policy for this view (unless the engine was given another)."""
        return FullView(self.state.node_id, self.beacons, self.state.energy)

    def linked(self, *states: PeerState) -> list[Peer]:
        """The peers we gossip with and ask for repair, in these states."""
        return self.peers.in_state(*states)

    def watched(self) -> list[Peer]:
        """The peers whose pings and suspicion the liveness round times out, in table order."""
        return self.peers.watched()

    def probes_due(self, watched: list[Peer], now: int) -> list[Peer]:
        """The peers the liveness round pings now (``watched``: after their time-outs)."""
        cfg = self.config
        return self.peers.most_silent(now, cfg.max_probes_per_round, cfg.probe_interval_ms, cfg.dead_probe_interval_ms)

    def welcome(self, peer: Peer, is_new: bool, address: str, source: str, mtype: MsgType) -> None:
        """A frame from ``peer`` (from ``address``, as it says, over ``source``): an address we
        invited is answered."""
        self.invited.pop(address, None)
        self.invited.pop(source, None)

    def restore(self) -> set[str]:
        """Put back the control plane held before a restart (members and where they listen,
        beacons, version vectors) from the log, so the first store after a restart reaches
        the nodes that want it instead of nobody until anti-entropy and repair catch up.
        Returns the members put back (not heard from since)."""
        state, now = self.state, self.state.now
        newest: dict[tuple[str, tuple[str, str]], Diff] = {}
        top: dict[str, int] = {}
        for diff in state.store.control_diffs():
            if diff.kind in CONTROL_KINDS:
                key = (diff.origin, control_key(diff))
                if key not in newest or diff.seq > newest[key].seq:
                    newest[key] = diff
                top[diff.origin] = max(top.get(diff.origin, 0), diff.seq)
        removed_before = now - self.config.control_tombstone_ttl_ms
        expired_before = now - self.config.max_clock_skew_ms
        for diff in sorted(newest.values(), key=lambda d: (d.origin, d.seq)):
            p = diff.payload
            stale = (isinstance(p, UnbeaconPayload) and diff.ts < removed_before) or (
                isinstance(p, BeaconPayload) and p.expires_at is not None and p.expires_at < expired_before
            )
            if stale and diff.seq < top[diff.origin]:
                continue  # garbage; the origin's newest entry still carries its version
            if self.quota.make_room(self.control, diff) is None:
                self.control.skip(diff.origin, diff.seq)  # a quota made smaller since
                continue
            self.control.apply(diff)
        unheard: set[str] = set()
        for origin in list(self.control.digest()):
            if origin == state.node_id:
                continue
            for diff in list(self.control.entries(origin)):
                p = diff.payload
                if isinstance(p, BeaconPayload):
                    self.beacons.add(p, origin, diff.ts)
                    state.out.append(ApplyRemoteBeacon(p, origin))
                elif isinstance(p, PeerPayload) and p.address and p.address != self.config.address:
                    peer, is_new = self.peers.learn(origin, p.address, now)
                    if is_new:
                        unheard.add(origin)
                        state.out.append(PeerStateChanged(origin, peer.address, peer.state.value))
        return unheard

    # -- gossip ------------------------------------------------------------------------

    def discover(self, event: PeerDiscovered) -> None:
        """An address to try (discovery, a seed): invite it with a gossip round."""
        now = self.state.now
        if event.address == self.config.address or self.peers.by_address(event.address):
            return
        if event.peer_id and (peer := self.peers.get(event.peer_id)) is not None:
            self.peers.learn(peer.node_id, event.address, now)
            return
        self.invited[event.address] = now + self.config.dead_probe_interval_ms
        self.send_gossip(event.address)

    def publish(self, payload: Payload) -> None:
        """A control diff of ours: record it; anti-entropy spreads it (start a round now). One
        past our quota is not published (every member would refuse it), counted ``quota``."""
        state = self.state
        unsigned = sign_diff(payload, origin=state.node_id, seq=state.seq + 1, ts=state.now, sign=_UNSIGNED)
        room = self.quota.make_room(self.control, unsigned)
        if room is None:
            state.drop(Reason.QUOTA)
            return
        state.drop(Reason.QUOTA, room)
        diff = state.sign_new(payload)
        self.control.apply(diff)
        state.store.put(diff, state.now)
        self.gossip_round()

    def gossip_round(self) -> None:
        live = self.linked(PeerState.ALIVE, PeerState.SUSPECT)
        if live:
            self.send_gossip(self._gossip_target(live).address)
        now = self.state.now
        for address, due in list(self.invited.items()):
            if due <= now:
                self.invited[address] = now + self.config.dead_probe_interval_ms
                self.send_gossip(address)

    def _gossip_target(self, live: list[Peer]) -> Peer:
        return self.state.rng.choice(live)

    def send_gossip(self, address: str) -> None:
        self.state.send(address, MsgType.GOSSIP, digest=self.control.digest(), reply_wanted=True)

    def on_gossip(self, env: Envelope, peer: Peer) -> None:
        for diff in env.diffs:
            self.accept_control(diff, env)
        if env.digest is None or not env.reply_wanted:
            return
        limits = self.config.limits
        delta = self.control.delta_for(env.digest, limits.max_diffs, self.state.max_bytes)
        need = self.control.needs_from(env.digest)
        if delta or need:
            self._answer(peer, delta, need)

    def _answer(self, peer: Peer, delta: list[Diff], need: bool) -> None:
        self.state.send(
            peer.address, MsgType.GOSSIP, tuple(delta),
            digest=self.control.digest() if need else None, reply_wanted=need, in_reply=True,
        )  # fmt: skip

    # -- control diffs -----------------------------------------------------------------

    def accept_control(self, diff: Diff, env: Envelope) -> None:
        state = self.state
        if diff.kind not in CONTROL_KINDS:
            state.drop(Reason.MALFORMED)
            return
        if not self._admissible(diff, env) or not state.admit(diff, env.keys):
            return
        room = self.quota.make_room(self.control, diff)
        if room is None:
            self.control.skip(diff.origin, diff.seq)
            state.drop(Reason.QUOTA)
            return
        state.drop(Reason.QUOTA, room)
        self.control.apply(diff)
        self._recorded(diff)
        self.counters.diffs_accepted[_KIND_NAMES[diff.kind]] += 1
        p, origin = diff.payload, diff.origin
        if isinstance(p, BeaconPayload):
            if self.beacons.held_by_another(p.beacon_id, origin):
                self.counters.beacon_ids_reused += 1  # kept apart, under its own origin
            self.beacons.add(p, origin, diff.ts)
            state.out.append(ApplyRemoteBeacon(p, origin))
        elif isinstance(p, UnbeaconPayload):
            if self.beacons.remove(p.beacon_id, origin) is None and self.beacons.held_by_another(p.beacon_id, origin):
                state.drop(Reason.NOT_OWNER)  # another member's beacon: not ours to remove
                return
            state.out.append(RemoveRemoteBeacon(p.beacon_id, p.tenant_id, origin))
        elif isinstance(p, ScenePayload):
            state.out.append(ApplyScene(p.data, origin))
        elif isinstance(p, PeerPayload):
            self._peer_record(origin, p.address)

    def _admissible(self, diff: Diff, env: Envelope) -> bool:
        """Newer than what we hold of its origin (not ours); a rejection is counted."""
        if diff.origin == self.state.node_id or not self.control.is_new(diff):
            if not self.state.guard.refused(diff, env.keys):  # else a fork, or not ours: counted there
                self.state.drop(Reason.STALE)
            return False
        return True

    def _recorded(self, diff: Diff) -> None:
        """A control diff applied: logged, so a restart starts from it (see :meth:`restore`)."""
        self.state.store.put(diff, self.state.now)

    def _peer_record(self, origin: str, address: str) -> None:
        """A member says where it listens."""
        state = self.state
        known = self.peers.get(origin)
        moved = known is not None and known.address != address
        peer, is_new = self.peers.learn(origin, address, state.now)
        if is_new:
            state.out.append(PeerStateChanged(origin, peer.address, peer.state.value))
        elif moved and peer.state is not PeerState.ALIVE:
            self.send_gossip(peer.address)  # it restarted elsewhere: try there now, not at the next probe

    def _neighbour(self, node_id: str) -> bool:
        peer = self.peers.get(node_id)
        return peer is not None and peer.neighbour


class PartialOverlay(FullOverlay):
    """Neighbours, a radius, and interest; see the module docstring."""

    def __init__(self, state: NodeState) -> None:
        super().__init__(state)
        self.radius = self.config.interest_radius
        # How close (cosine) a node must be to our beacons to displace one of our chosen
        # neighbours; a node offered from beyond our radius is kept only if that close.
        self._interest_bar = -2.0

    # -- the view ----------------------------------------------------------------------

    def view(self) -> RoutingPolicy:
        cfg, state = self.config, self.state
        return PartialView(
            state.node_id, self.beacons, state.energy,
            lambda: [p.node_id for p in self.peers.neighbours(PeerState.ALIVE, PeerState.SUSPECT)],
            state.rng.choice, state.own_beacons, steer=cfg.steer_walk, near=self._near(cfg.relay_radius),
            widen_leaves=cfg.widen_leaves, walk_far=cfg.walk_far, origin_walks=cfg.origin_walks,
            reachable=self._reachable, leaf_walk=cfg.leaf_walk,
        )  # fmt: skip

    def linked(self, *states: PeerState) -> list[Peer]:
        return self.peers.neighbours(*states)

    def watched(self) -> list[Peer]:
        return self.peers.neighbours()

    def probes_due(self, watched: list[Peer], now: int) -> list[Peer]:
        # A partial view's live neighbours are probed by the gossip round (_gossip_target);
        # suspects and the dead get pings, one a round (SWIM: a bounded view).
        cfg = self.config
        due = [
            peer for peer in watched
            if not peer.ping_nonce and peer.state is not PeerState.ALIVE and now - peer.last_contact >= (
                cfg.dead_probe_interval_ms if peer.state is PeerState.DEAD else cfg.probe_interval_ms
            )
        ]  # fmt: skip
        return heapq.nsmallest(1, due, key=lambda p: p.last_contact) if len(due) > 1 else due

    def welcome(self, peer: Peer, is_new: bool, address: str, source: str, mtype: MsgType) -> None:
        invited = self.invited.pop(address, None) is not None
        invited = self.invited.pop(source, None) is not None or invited
        if is_new or not peer.neighbour:
            # A neighbour is a seed we contacted, or a peer that gossips with us while there is room.
            peer.neighbour = invited or (
                mtype is MsgType.GOSSIP
                and sum(not p.chosen for p in self.peers.neighbours()) < self.config.max_neighbours
            )

    def restore(self) -> set[str]:
        return set()  # a partial view re-learns its neighbourhood instead

    def _near(self, hops: int) -> Callable[[set[str]], set[str]] | None:
        """Of a set of nodes, those a relay that wanted a cell pushes it to. One hop: those
        linked to us now, either way (our neighbours, and the nodes that hold us, in-degree
        bounded); more: those known that near (None: no limit short of the radius)."""
        if hops == 1:
            return self._linked_of
        if hops >= self.radius:
            return None
        distance = self.control.distance
        return lambda nodes: {n for n in nodes if distance.get(n, hops + 1) <= hops}

    def _reachable(self, node_id: str) -> bool:
        """A node we could send to now (see DataPlane.enqueue)."""
        peer = self.peers.get(node_id)
        return node_id in self.state.contacts if peer is None else peer.state is not PeerState.DEAD

    def _linked_of(self, nodes: set[str]) -> set[str]:
        """Those of ``nodes`` linked to us now, either way (a relay runs this over every owner
        it matched: one pass, not a call per owner)."""
        peer_of = self.peers.get
        linked = {n for n in nodes if (peer := peer_of(n)) is not None and peer.neighbour}
        if len(linked) < len(nodes):  # asked only when needed: it also lets go of the stale
            holding = self.inbound.holding(self.state.now)
            linked.update(n for n in nodes if n in holding)
        return linked

    # -- gossip ------------------------------------------------------------------------

    def gossip_round(self) -> None:
        if self.config.interest_neighbours:
            self._choose_neighbours()
        super().gossip_round()

    def _gossip_target(self, live: list[Peer]) -> Peer:
        """The live neighbour silent the longest, if one is due a probe. The round goes to it
        and is its probe: a neighbour answers every gossip that asks for a reply, and any
        frame from it is the proof of life a ping would fetch (so no PING and PONG as well).
        Else one at random."""
        now, limit = self.state.now, self.config.probe_interval_ms
        due = [p for p in live if p.state is PeerState.ALIVE and not p.ping_nonce and now - p.last_contact >= limit]
        if not due:
            return self.state.rng.choice(live)
        peer = min(due, key=lambda p: p.last_contact)  # the first in table order among equals
        self.state.probe(peer)  # times out like a ping: FAILED, then suspect
        return peer

    def on_gossip(self, env: Envelope, peer: Peer) -> None:
        state, control, cfg = self.state, self.control, self.config
        if peer.node_id in control.distance:
            # It gossips with us: one hop away, however far its diffs first came from (a
            # neighbour chosen for its interest was often known at two hops), so we share them.
            control.closer(peer.node_id, 1)
        if env.reply_wanted:
            self.inbound.heard(peer.node_id, state.now)  # it holds us as a neighbour (or answers us)
        for diff in self._take_offers(env.diffs):
            self.accept_control(diff, env)
        if env.digest is None or not env.reply_wanted:
            return
        limits = cfg.limits
        delta = control.delta_for(env.digest, limits.max_diffs, state.max_bytes, self.radius - 1)
        if cfg.interest_offers and cfg.interest_neighbours:
            delta += self._offers_for(peer.node_id, env.digest, {d.origin for d in delta},
                                      limits.max_diffs - len(delta), state.max_bytes - sum(d.size for d in delta))
        need = control.needs_from(env.digest, known_only=True)
        if not need and control.version(peer.node_id) < env.digest.get(peer.node_id, 0):
            need = True  # its own diffs, even new to us: it is one hop away (it may have chosen us)
        # Always answered (even with nothing): the round may be the peer's liveness probe.
        self._answer(peer, delta, need)

    def _offers_for(
        self, peer_id: str, digest: dict[str, int], sending: set[str], max_diffs: int, max_bytes: int
    ) -> list[Diff]:
        """T-Man's ranked exchange: the diffs (peer record and beacons) of up to
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
        hops = self.radius + 1
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
        """Of the nodes offered from beyond our radius (``_offers_for``), keep those whose
        beacons are nearer our own than our chosen neighbours' (so ``_choose_neighbours``
        takes them next round), recorded at the edge of the radius: known, but not shared onward."""
        beyond = self.radius + 1
        if not any(d.hops == beyond for d in diffs):
            return diffs
        probes, bar = self.state.own_beacons.vectors(), self._interest_bar
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
                self.state.drop(_OFFER_DECLINED)
        return out

    # -- control diffs -----------------------------------------------------------------

    def _admissible(self, diff: Diff, env: Envelope) -> bool:
        """Within the radius, and newer than what we hold of its origin (which is at least as
        near as this copy says); a rejection is counted."""
        if not 1 <= diff.hops <= self.radius:
            self.state.drop(_OUT_OF_RADIUS)
            return False
        if diff.origin == self.state.node_id or not self.control.is_new(diff):
            if diff.origin in self.control.distance:
                self.control.closer(diff.origin, diff.hops)
            if not self.state.guard.refused(diff, env.keys):  # else a fork, or not ours: counted there
                self.state.drop(Reason.STALE)
            return False
        return True

    def _recorded(self, diff: Diff) -> None:
        """Not logged: a restarted partial view re-learns its neighbourhood."""
        self.control.closer(diff.origin, diff.hops)

    def _peer_record(self, origin: str, address: str) -> None:
        """A node within the radius: a contact, pushed to directly, not gossiped with."""
        self.state.contacts[origin] = address
        if self.peers.get(origin) is not None:
            self.peers.learn(origin, address, self.state.now)

    # -- neighbour choice --------------------------------------------------------------

    def _choose_neighbours(self) -> None:
        """T-Man style: take as neighbours the known nodes whose beacons are nearest our own.
        Gossip with them brings their neighbourhoods' beacons within our radius, among them
        nearer nodes still, chosen next round: nodes of like interest draw together, so a cell
        that reaches one of them is within reach of the others. The random neighbours stay (the
        seeds are never let go), and keep the mesh connected across interests."""
        state = self.state
        want, probes = self.config.interest_neighbours, state.own_beacons.vectors()
        chosen: list[Peer] = []
        for node_id in self.beacons.nearest_owners(probes, 2 * want) if probes else ():
            peer = self.peers.get(node_id)
            if peer is None:
                if node_id not in state.contacts:
                    continue
                peer, _ = self.peers.learn(node_id, state.contacts[node_id], state.now)
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

