"""Who is in the mesh, where they listen, and whether they answer.

Membership is learned two ways: a peer's own frames (its key and proof ride in every
envelope) and its signed ``peer`` diff, replicated by the control plane. Liveness is
a three-state machine, driven by three inputs and written down as a table:

    state \\ input   HEARD    FAILED    EXPIRED
    alive           alive    suspect   alive
    suspect         alive    suspect   dead
    dead            alive    dead      dead

HEARD is any authenticated frame from the peer; FAILED is a probe without answer (a ping,
or in a partial view the gossip round that probes a live neighbour), a send the runtime
could not make, or a batch given up; EXPIRED is "suspect for
``suspect_timeout_ms``". Peers learned from gossip start alive (optimistic): a
failed probe corrects that within a few seconds.

In a partial view only *neighbours* (the seeds we contacted, the peers that gossip with us
while fewer than ``max_neighbours`` random ones are taken, and ``interest_neighbours`` chosen
for their beacons) are gossiped with and probed (a live one by the gossip round, which it
always answers; a suspect by ping);
other peers are contacts we push data to directly, learned from ``peer`` diffs within
the interest radius, whose liveness comes from acks and failed sends.
"""

from __future__ import annotations

import dataclasses
import enum
import heapq
from collections.abc import Callable, Iterator

from .identity import node_id_for

__all__ = ["PeerState", "Liveness", "LIVENESS", "Peer", "PeerTable", "Keyring"]


class PeerState(enum.StrEnum):
    ALIVE = "alive"
    SUSPECT = "suspect"
    DEAD = "dead"


class Liveness(enum.StrEnum):
    HEARD = "heard"
    FAILED = "failed"
    EXPIRED = "expired"


A, S, D = PeerState.ALIVE, PeerState.SUSPECT, PeerState.DEAD
H, F, X = Liveness.HEARD, Liveness.FAILED, Liveness.EXPIRED

LIVENESS: dict[tuple[PeerState, Liveness], PeerState] = {
    (A, H): A, (A, F): S, (A, X): A,
    (S, H): A, (S, F): S, (S, X): D,
    (D, H): A, (D, F): D, (D, X): D,
}  # fmt: skip


@dataclasses.dataclass(slots=True)
class Peer:
    node_id: str
    address: str
    state: PeerState = PeerState.ALIVE
    changed_at: int = 0  # when the state last changed
    heard_at: int = 0  # last authenticated frame
    ping_nonce: int = 0  # outstanding ping, 0 if none
    ping_sent_at: int = 0
    neighbour: bool = True  # in a partial view: gossiped with and pinged, not just sent data
    chosen: bool = False  # a neighbour we chose for its interest (partial view), not a random one
    rank: int = 0  # position in the table (iteration order), breaks ties between equally silent peers
    silence_key: int = 0  # the key of its entry in the table's silence heap

    @property
    def last_contact(self) -> int:
        """When we last heard from it or pinged it: probes go to the peers for which this is oldest."""
        return max(self.heard_at, self.ping_sent_at)


class PeerTable:
    """The peers we know, by node id and by address."""

    def __init__(self, self_id: str) -> None:
        self.self_id = self_id
        self._peers: dict[str, Peer] = {}
        self._by_address: dict[str, str] = {}
        # Liveness without a scan of every peer per round (a full view knows every member):
        # one live heap entry (key, rank, peer) per peer, its key ``peer.silence_key``. Contact
        # times grow, so a key is at most the peer's real last contact and is corrected when
        # it surfaces; should the clock step back, a fresh entry replaces it. Peers with a
        # ping out or under suspicion are few: kept in ``_watched``.
        self._silence: list[tuple[int, int, Peer]] = []
        self._watched: dict[str, Peer] = {}

    def __len__(self) -> int:
        return len(self._peers)

    def __iter__(self) -> Iterator[Peer]:
        return iter(self._peers.values())

    def get(self, node_id: str) -> Peer | None:
        return self._peers.get(node_id)

    def by_address(self, address: str) -> Peer | None:
        node_id = self._by_address.get(address)
        return self._peers.get(node_id) if node_id else None

    def learn(self, node_id: str, address: str, now: int) -> tuple[Peer, bool]:
        """Add or re-address a peer; returns (peer, is_new)."""
        peer = self._peers.get(node_id)
        if peer is None:
            peer = Peer(node_id, address, changed_at=now, heard_at=now, rank=len(self._peers), silence_key=now)
            self._peers[node_id] = peer
            heapq.heappush(self._silence, (now, peer.rank, peer))
            self._by_address[address] = node_id
            return peer, True
        if address and address != peer.address:
            self._by_address.pop(peer.address, None)
            peer.address = address
            self._by_address[address] = node_id
        return peer, False

    def apply(self, peer: Peer, event: Liveness, now: int) -> PeerState | None:
        """Feed a liveness input; returns the new state if it changed."""
        if event is Liveness.HEARD:
            peer.heard_at = now
            peer.ping_nonce = 0
            self._rekey(peer)
        new = LIVENESS[(peer.state, event)]
        if new is peer.state:
            return None
        peer.state = new
        peer.changed_at = now
        if new is PeerState.SUSPECT:
            self._watched[peer.node_id] = peer
        return new

    def pinged(self, peer: Peer, nonce: int, now: int) -> None:
        peer.ping_nonce, peer.ping_sent_at = nonce, now
        self._watched[peer.node_id] = peer
        self._rekey(peer)

    def _rekey(self, peer: Peer) -> None:
        last = peer.last_contact
        if last < peer.silence_key:  # the clock stepped back: its entry would surface too late
            peer.silence_key = last
            heapq.heappush(self._silence, (last, peer.rank, peer))

    def watched(self) -> list[Peer]:
        """Peers with a ping outstanding or under suspicion, in table order."""
        watched = self._watched
        for node_id in [i for i, p in watched.items() if not p.ping_nonce and p.state is not PeerState.SUSPECT]:
            del watched[node_id]
        return sorted(watched.values(), key=lambda p: p.rank)

    def most_silent(self, now: int, count: int, probe_interval: int, dead_probe_interval: int) -> list[Peer]:
        """The peers due a probe (no ping out, silent for their state's interval), at most ``count``:
        the ``count`` silent the longest (oldest first) when more are due, else all in table order."""
        heap, found, aside = self._silence, [], {}
        soonest = min(probe_interval, dead_probe_interval)
        while heap and len(found) <= count:
            key, rank, peer = heap[0]
            if key != peer.silence_key or rank in aside:
                heapq.heappop(heap)  # replaced by a fresher entry
                continue
            last = peer.last_contact
            if last != key:
                peer.silence_key = last
                heapq.heapreplace(heap, (last, rank, peer))
                continue
            if now - last < soonest:
                break  # every other peer was in touch more recently
            aside[rank] = heapq.heappop(heap)
            limit = dead_probe_interval if peer.state is PeerState.DEAD else probe_interval
            if not peer.ping_nonce and now - last >= limit:
                found.append(peer)
        for entry in aside.values():
            heapq.heappush(heap, entry)
        return found[:count] if len(found) > count else sorted(found, key=lambda p: p.rank)

    def in_state(self, *states: PeerState) -> list[Peer]:
        return [p for p in self._peers.values() if p.state in states]

    def neighbours(self, *states: PeerState) -> list[Peer]:
        return [p for p in self._peers.values() if p.neighbour and (not states or p.state in states)]


class Keyring:
    """Origin -> (public key, membership proof), checked once and then cached."""

    def __init__(self, is_member: Callable[[bytes, bytes], bool]) -> None:
        self._is_member = is_member
        self._keys: dict[str, tuple[bytes, bytes]] = {}

    def get(self, origin: str) -> tuple[bytes, bytes] | None:
        return self._keys.get(origin)

    def learn(self, origin: str, public_key: bytes, proof: bytes) -> bool:
        """Accept a key if it hashes to the origin id and the team vouches for it."""
        known = self._keys.get(origin)
        if known is not None and known == (public_key, proof):
            return True
        if node_id_for(public_key) != origin or not self._is_member(public_key, proof):
            return False
        self._keys[origin] = (public_key, proof)
        return True
