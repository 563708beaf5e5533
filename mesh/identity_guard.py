"""Identity conflicts: one node key used by two nodes (a copied ``node.key``), found, told, refused.

Theory of operation
-------------------
A node id is the hash of a node's public key; every diff a node signs names it as origin.
Two nodes on one key (a cloned VM, a copied home dir) sign under one origin: their members
took whichever copy of an ``(origin, seq)`` came first and dropped the other as a duplicate,
and sent the id's traffic wherever it last spoke from. Nothing said so. The guard finds such
a conflict in what the engine receives anyway, and makes it loud.

    evidence       what was seen                                          signed?  seen by
    own_diff       a diff under our id that this run did not sign, and     yes      the two nodes
                   that is not our own past (held with other bytes, or
                   signed after we started, or in this run's incarnation)
    own_frame      a frame whose header names our id, from another         no       the two nodes
                   address than ours (a loop back has ours)
    fork           two diffs of one (origin, seq) with other signed bytes,  yes      any member
                   both verified
    two_addresses  one id heard from address a, then b, then a again,       no       any member
                   within ``identity_grace_ms``

Each conflict becomes an :class:`~mesh.events.IdentityConflict` (the daemon logs it as an
error) when first seen and at most once per :data:`REPORT_INTERVAL_MS` after, and stays in
``status()``. Drops: a frame or diff under our id that is not ours is ``own_id``; the second
copy of a forked (origin, seq) is ``fork`` (the first stays, and nothing is applied over it).

Who yields (the rule): the *newcomer*. A node that meets signed evidence of its own id in use
elsewhere within ``identity_grace_ms`` of its start (it came to a mesh where the id was
already at work) stops: from then on it signs nothing, sends nothing and takes nothing in,
each refusal counted (``identity_conflict``), and it says why. A node that has run longer
keeps its id and says so; it goes on above the other's seqs (no fork with it) and announces
itself again, so the members' record of where the id listens points at it. Two nodes that
start together both stop: neither is preferred, both are told. Only signed evidence (which
takes the key to make) stops a node; a frame header names a sender without proving it, so
an ``own_frame`` is reported and answered, never obeyed.

A node that sees its id in use tells the other user directly: it sends its own signed
``peer`` record to the address it was heard from (at most once per :data:`TELL_INTERVAL_MS`
per address), which is signed evidence at the other end. A node whose log says it last
listened at another address sends its record there at a start, and again every
:data:`TELL_INTERVAL_MS` of its grace until it stops: a copy of its data dir still running
there is told at once, and a frame lost on the way (a loaded machine, a busy link) is not
the end of it, since each of ours that arrives has the other send its record back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .diffs import Diff, PeerPayload
from .errors import Reason
from .events import (
    BeaconPlaced, BeaconRemoved, CellForgotten, CellStored, FrameReceived, IdentityConflict, SceneChanged,
)  # fmt: skip
from .incarnation import after_incarnation_of, first_seq
from .wire import Envelope, MsgType

__all__ = ["IdentityGuard", "REPORT_INTERVAL_MS", "TELL_INTERVAL_MS"]

REPORT_INTERVAL_MS = 60_000  # a conflict still seen is reported again this often
TELL_INTERVAL_MS = 5_000  # our record sent again to one address at most this often (one frame: cheap, bounded)
_MAX_RECORDS = 64  # conflicts kept apart by address; beyond, one record per (id, evidence)
_MAX_TOLD = 16  # addresses sent our record per interval (a forged frame names any address it likes)
_REFUSED = (FrameReceived, CellStored, CellForgotten, BeaconPlaced, BeaconRemoved, SceneChanged)


class IdentityGuard:
    """One node's watch over node ids used twice; see the module docstring.

    ``state`` is the engine's :class:`~mesh.state.NodeState`; ``republish`` announces our
    ``peer`` record anew (the overlay's publish, handed in by the engine).
    """

    def __init__(self, state: Any, republish: Callable[[], None]) -> None:
        self.state = state
        self.republish = republish
        self.stopped = False  # we are the newcomer of a conflict over our own id
        self.conflicts: dict[tuple[str, str, str], dict[str, Any]] = {}  # (node_id, evidence, address) -> record
        self._told: dict[str, int] = {}  # address -> when we last sent it our record
        self._recorded: str | None = None  # where our log says we last listened, if not here
        self._republished_at: int | None = None
        self._addresses: dict[str, list[Any]] = {}  # peer id -> [address, previous address, when it changed]

    # -- what the engine and its parts hand over ------------------------------------------

    def refused(self, diff: Diff, keys: Any) -> bool:
        """A diff the caller would drop as held (duplicate, stale) or as ours: is it evidence of
        a conflict? True if so, counted here (``own_id`` or ``fork``)."""
        if diff.origin == self.state.node_id:
            return self._own_diff(diff)
        held = self.state.store.signature(diff.origin, diff.seq)
        if held is None or held == diff.signature:
            return False
        if not self.state.admit(diff, keys):  # not validly signed: counted there, no fork
            return True
        self.state.drop(Reason.FORK)
        self._conflict(diff.origin, "fork", "", ours=False, signed=True,
                       detail=f"two different diffs signed as seq {diff.seq}")  # fmt: skip
        return True

    def own_frame(self, env: Envelope) -> None:
        """A frame naming our id as its sender, from another address than ours."""
        self.state.drop(Reason.OWN_ID)
        signed = False  # does it carry a diff signed with our key that we did not sign? (proof, not a claim)
        for diff in env.diffs:
            if diff.origin == self.state.node_id and self._own_diff(diff):
                signed = True
        if not signed:
            self._conflict(self.state.node_id, "own_frame", env.sender_address, ours=True, signed=False,
                           detail="a frame under this node's id came from another address")  # fmt: skip

    def heard(self, node_id: str, address: str) -> None:
        """An admitted frame from ``node_id``, saying it listens at ``address``."""
        seen = self._addresses.get(node_id)
        if seen is None:
            self._addresses[node_id] = [address, "", self.state.now]
            return
        if address == seen[0] or not address:
            return
        now = self.state.now
        if address == seen[1] and now - seen[2] <= self.state.config.identity_grace_ms:
            self._conflict(node_id, "two_addresses", address, ours=False, signed=False,
                           detail=f"heard from {seen[1]} and {seen[0]} by turns")  # fmt: skip
        seen[:] = [address, seen[0], now]

    def started(self, recorded_address: str | None) -> None:
        """At a start: our log says we last listened at ``recorded_address``; if that is not
        where we listen now, tell whoever is there (a copy of our data dir?) who we are."""
        if recorded_address and recorded_address != self.state.config.address:
            self._recorded = recorded_address
            self._tell(recorded_address)

    def tick(self) -> None:
        """Every gossip round: within our grace, tell the address we last listened at again
        (a copy of our data dir there answers with its record, which stops us)."""
        state = self.state
        if self._recorded is None or self.stopped or state.started_at is None:
            return
        if state.now - state.started_at > state.config.identity_grace_ms:
            self._recorded = None  # past the grace nothing we could hear would stop us
            return
        self._tell(self._recorded)

    def refuse(self, event: Any) -> None:
        """Stopped: an event refused (frames not taken, our changes not published), counted."""
        if isinstance(event, _REFUSED):
            self.state.drop(Reason.IDENTITY_CONFLICT)

    def status(self) -> dict[str, Any]:
        return {
            "stopped": self.stopped,
            "conflicts": [{k: v for k, v in c.items() if k != "reported_at"} for c in self.conflicts.values()],
        }

    # -- within -----------------------------------------------------------------------------

    def _own_diff(self, diff: Diff) -> bool:
        """A diff under our id reached us: ours (an echo, our own past) or another node's?"""
        state = self.state
        if state.started_at is None:
            state.begin_incarnation()
        forked = state.store.has(diff.origin, diff.seq)
        if forked:
            held = state.store.signature(diff.origin, diff.seq)
            if held is None or held == diff.signature:
                return False  # an echo of ours (or of one the log let go, superseded)
        if not state.verify(state.public_key, diff.signature, diff.signed):
            return False  # not signed with our key: the caller drops it as before
        if not forked and diff.seq <= state.run_base and diff.ts < state.started_at:
            return False  # signed by an earlier run of ours (a log put back from a backup forgets it)
        state.drop(Reason.OWN_ID)
        if diff.seq > state.run_base:  # go on above the other's seqs: no fork with it from here on
            state.seq = max(state.seq, first_seq(after_incarnation_of(diff.seq)))
        address = diff.payload.address if isinstance(diff.payload, PeerPayload) else ""
        detail = (f"seq {diff.seq} was signed twice with this node's key" if forked
                  else f"a diff signed with this node's key (seq {diff.seq}) that this node did not sign")  # fmt: skip
        self._conflict(state.node_id, "own_diff", address, ours=True, signed=True, detail=detail)
        return True

    def _conflict(self, node_id: str, evidence: str, address: str, *, ours: bool, signed: bool, detail: str) -> None:
        state, now = self.state, self.state.now
        key = (node_id, evidence, address)
        if key not in self.conflicts and len(self.conflicts) >= _MAX_RECORDS:
            key = (node_id, evidence, "")
        record = self.conflicts.get(key)
        if record is None:
            record = self.conflicts[key] = {
                "node_id": node_id, "evidence": evidence, "address": address, "ours": ours, "detail": detail,
                "first_at": now, "last_at": now, "count": 0, "reported_at": None,
            }  # fmt: skip
        record["count"] += 1
        record["last_at"] = now
        stop = (
            ours and signed and not self.stopped and state.started_at is not None
            and now - state.started_at <= state.config.identity_grace_ms
        )  # fmt: skip
        if ours:
            if stop:
                self._tell(address)  # our record, so the other end sees the conflict too
                self.stopped = True
            else:
                if self._republished_at is None or now - self._republished_at >= REPORT_INTERVAL_MS:
                    self._republished_at = now
                    self.republish()  # the members' record of where our id listens: ours again
                self._tell(address)
        if stop or record["reported_at"] is None or now - record["reported_at"] >= REPORT_INTERVAL_MS:
            record["reported_at"] = now
            effect = IdentityConflict(node_id, evidence, address, ours, self.stopped, detail)
            record["message"] = effect.message()
            state.out.append(effect)

    def _tell(self, address: str) -> None:
        """Send our signed ``peer`` record to ``address`` (at most once per interval)."""
        state, now = self.state, self.state.now
        if not address or address == state.config.address:
            return
        for stale in [a for a, at in self._told.items() if now - at >= TELL_INTERVAL_MS]:
            del self._told[stale]
        if address in self._told or len(self._told) >= _MAX_TOLD:
            return
        record = next((d for d in state.control.entries(state.node_id) if isinstance(d.payload, PeerPayload)), None)
        if record is not None:
            self._told[address] = now
            state.send(address, MsgType.GOSSIP, (record,), digest=None, reply_wanted=False)
