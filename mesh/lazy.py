"""Lazy push for the partial view's relays (Plumtree): duplicates teach the links to announce.

In a partial view every holder of a cell pushes it to the interested nodes linked to it, and
in a community of like interest most of those pushes reach a node that has the cell already
(2.7 duplicates per delivery at N=1,000, 4.2 at 10,000): each a DATA frame and its ACK. After
Leitão et al., "Epidemic Broadcast Trees", each link, our side of it, is *eager* or *lazy*
(new links are eager):

* A node sent a relayed copy of a diff it holds asks the sender to PRUNE the link: a flag on
  the ack that goes back for that frame anyway (:mod:`mesh.wire`), no frame of its own.
* A relay's copies to lazy links become announcements, ``(origin, seq)`` (IHAVE), gathered
  per peer for ``lazy_announce_ms`` into one frame that is not acknowledged (a lost one is
  made good by repair, as a lost push would be), or sooner on an ack or data frame going to
  that peer anyway.
* A node announced a diff it lacks waits ``lazy_graft_ms`` for an eager copy; then it asks
  the first announcer it can still reach for it (GRAFT). The announcer sends the diff as an
  ordinary acknowledged DATA push, and makes its link to the grafter eager again. No copy
  within a retry interval: the next announcer is asked.

So the eager links settle into few copies per delivery, and a lazy link repairs the spread
wherever an eager copy failed to come. Only a relay's pushes to known interest go lazy: an
origin's push and a walk hop are the only copy on their way. Sans-IO like the engine: time
is passed in, nothing is random, and every table is bounded.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Callable

from .diffs import Diff

__all__ = ["LazyPush", "DiffRef"]

DiffRef = tuple[str, int]  # (origin, seq)

_COPIES_KEPT = 4096  # announced copies kept for grafts; an older graft is left to repair
_MISSING_KEPT = 4096  # announced diffs we lack, waiting for a copy; beyond, left to repair
_PENDING_KEPT = 1024  # announcements waiting for one peer; beyond, left to repair
_SENDERS_KEPT = 1 << 14  # who sent us each recent diff first (a resend of it is no duplicate)


@dataclasses.dataclass(slots=True)
class _Missing:
    announcers: list[str]  # in the order their announcements came
    due: int  # when to graft from the next one
    tried: int = 0  # announcers asked so far


class LazyPush:
    """One node's eager/lazy links, pending announcements and awaited diffs."""

    def __init__(self, announce_interval: int, graft_timeout: int, retry_interval: int) -> None:
        self.announce_interval = announce_interval
        self.graft_timeout = graft_timeout
        self.retry_interval = retry_interval
        self.lazy: set[str] = set()  # peers our relayed copies go to as announcements
        self._pending: dict[str, dict[DiffRef, None]] = {}  # peer -> refs to announce, in order
        self._announce_at: dict[str, int] = {}  # peer -> when its announcements go
        self._copies: collections.OrderedDict[DiffRef, tuple[Diff, float]] = collections.OrderedDict()
        self._missing: dict[DiffRef, _Missing] = {}
        self._due: list[tuple[int, DiffRef]] = []  # (due, ref) per missing diff; stale entries skipped
        self._first_sender: collections.OrderedDict[DiffRef, str] = collections.OrderedDict()

    # -- links --------------------------------------------------------------------------

    def prune(self, peer_id: str) -> None:
        """The peer got a copy from us it had: announce to it from now on."""
        self.lazy.add(peer_id)

    def graft(self, peer_id: str) -> None:
        """The peer asked us for an announced diff: push to it again."""
        self.lazy.discard(peer_id)

    def forget(self, peer_id: str) -> None:
        """The peer is dead: if it comes back, its link is new (eager), and nothing waits for it."""
        self.lazy.discard(peer_id)
        self._pending.pop(peer_id, None)
        self._announce_at.pop(peer_id, None)

    # -- receiving copies ---------------------------------------------------------------

    def received(self, ref: DiffRef, sender_id: str) -> None:
        """A copy of a diff new to us came from ``sender_id``: nothing waits for it any more."""
        self._missing.pop(ref, None)
        self._first_sender[ref] = sender_id
        if len(self._first_sender) > _SENDERS_KEPT:
            self._first_sender.popitem(last=False)

    def should_prune(self, ref: DiffRef, sender_id: str) -> bool:
        """A copy of a diff we hold came from ``sender_id``: ask it to prune, unless it sent us
        the first copy too (a resend after a lost ack, not a second path)."""
        return self._first_sender.get(ref) != sender_id

    # -- announcing ---------------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No announcement waiting to go, no announced diff awaited."""
        return not self._announce_at and not self._missing

    def announce(self, peer_id: str, copy: Diff, energy: float, now: int) -> None:
        """Announce ``copy`` (routed as it would have gone) to a lazy peer; kept for its graft."""
        ref = (copy.origin, copy.seq)
        pending = self._pending.setdefault(peer_id, {})
        if not pending:
            self._announce_at[peer_id] = now + self.announce_interval
        elif len(pending) >= _PENDING_KEPT:
            return
        pending[ref] = None
        self._copies[ref] = (copy, energy)
        self._copies.move_to_end(ref)
        if len(self._copies) > _COPIES_KEPT:
            self._copies.popitem(last=False)

    def withdraw(self, peer_id: str, ref: DiffRef) -> None:
        """The peer has the diff: no need to announce it."""
        pending = self._pending.get(peer_id)
        if pending is None or ref not in pending:
            return
        del pending[ref]
        if not pending:
            del self._pending[peer_id]
            del self._announce_at[peer_id]

    def take_announcements(self, now: int) -> list[tuple[str, list[DiffRef]]]:
        """The peers whose announcements are due, each with its refs."""
        due = sorted(p for p, at in self._announce_at.items() if at <= now)
        out = []
        for peer_id in due:
            del self._announce_at[peer_id]
            out.append((peer_id, list(self._pending.pop(peer_id))))
        return out

    def take_announcements_for(self, peer_id: str, limit: int) -> list[DiffRef]:
        """Up to ``limit`` of the peer's announcements, now, to ride on a frame going to it anyway."""
        pending = self._pending.get(peer_id)
        if not pending:
            return []
        refs = list(itertools.islice(pending, limit))
        for ref in refs:
            del pending[ref]
        if not pending:
            del self._pending[peer_id]
            del self._announce_at[peer_id]
        return refs

    def copy_for(self, ref: DiffRef) -> tuple[Diff, float] | None:
        """The copy we announced as ``ref`` and its energy, if still kept."""
        return self._copies.get(ref)

    # -- awaiting announced diffs --------------------------------------------------------

    def announced(self, ref: DiffRef, announcer: str, now: int) -> None:
        """``announcer`` has a diff we lack: wait a little for an eager copy, then graft it."""
        missing = self._missing.get(ref)
        if missing is None:
            if len(self._missing) >= _MISSING_KEPT:
                return
            missing = self._missing[ref] = _Missing([], now + self.graft_timeout)
            heapq.heappush(self._due, (missing.due, ref))
        if announcer not in missing.announcers:
            missing.announcers.append(announcer)

    def take_grafts(self, now: int, reachable: Callable[[str], bool]) -> list[tuple[str, list[DiffRef]]]:
        """The missing diffs whose wait is over, grouped by the announcer to ask (the next one
        still ``reachable``); each waits ``retry_interval`` for the copy before the next is asked."""
        asks: dict[str, list[DiffRef]] = {}
        heap = self._due
        while heap and heap[0][0] <= now:
            due, ref = heapq.heappop(heap)
            missing = self._missing.get(ref)
            if missing is None or missing.due != due:
                continue
            while missing.tried < len(missing.announcers) and not reachable(missing.announcers[missing.tried]):
                missing.tried += 1
            if missing.tried >= len(missing.announcers):
                del self._missing[ref]  # no one left to ask: repair's turn
                continue
            asks.setdefault(missing.announcers[missing.tried], []).append(ref)
            missing.tried += 1
            missing.due = now + self.retry_interval
            heapq.heappush(heap, (missing.due, ref))
        return sorted(asks.items())

    def awaiting(self, ref: DiffRef) -> bool:
        return ref in self._missing

    def next_deadline(self) -> int | None:
        """When announcements are due or a graft is, whichever first."""
        heap, missing = self._due, self._missing
        while heap and ((m := missing.get(heap[0][1])) is None or m.due != heap[0][0]):
            heapq.heappop(heap)
        at = heap[0][0] if heap else None
        if self._announce_at:
            first = min(self._announce_at.values())
            at = first if at is None or first < at else at
        return at
