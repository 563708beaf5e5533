"""Members of an older mesh protocol: dropped, counted, and named, never silently.

Since protocol 2 every frame is bound to its sender (:mod:`mesh.frame_auth`); a node of the
previous release still seals protocol-1 frames, which admission refuses as ``old_version``
(it cannot tell which member sent one, so nothing in it may be let in). A team half upgraded
would then lose the other half's memories with nothing but a counter to say why. So each
such frame is also looked at here: if it opens as protocol 1 under our team key (a member's,
not an outsider's), its sender is recorded, and the first frame from each sender becomes a
:class:`~mesh.events.PeerOutdated` effect, which the daemon logs as a warning ("peer X speaks
mesh protocol 1, this node 2: upgrade it"), and ``status()`` lists it for ``hyphae peers`` and
``hyphae doctor``.

The other way round, a node of the previous release counts our frames as ``bad_version`` (its
name for a version it does not know) and stores nothing from them.

The table is bounded (:data:`MAX_RECORDS` senders; a protocol-1 header's sender id is not
proven, so a member could name many): past it, frames are still counted, not recorded.
"""

from __future__ import annotations

from typing import Any

from .events import PeerOutdated
from .team import FRAME_VERSION

__all__ = ["OutdatedPeers", "MAX_RECORDS"]

MAX_RECORDS = 64


class OutdatedPeers:
    """Who was heard speaking an older protocol, where, and how often."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self._records: dict[str, dict[str, Any]] = {}

    def heard(self, frame: bytes, address: str) -> None:
        """A frame admission refused as ``old_version`` (already counted there)."""
        state = self.state
        sender = state.sealer.protocol_1_sender(frame)
        if sender is None:
            return  # not a member's (or not protocol 1): the drop counter is all there is to say
        record = self._records.get(sender)
        if record is None:
            if len(self._records) >= MAX_RECORDS:
                return
            effect = PeerOutdated(sender, address, frame[0], FRAME_VERSION)
            record = self._records[sender] = {
                "node_id": sender, "address": address, "protocol": frame[0], "ours": FRAME_VERSION,
                "first_at": state.now, "frames": 0, "message": effect.message(),
            }  # fmt: skip
            state.out.append(effect)
        record["frames"] += 1
        record["last_at"] = state.now
        if address:
            record["address"] = address

    def status(self) -> list[dict[str, Any]]:
        return [dict(record) for record in self._records.values()]
