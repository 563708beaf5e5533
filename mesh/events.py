"""What goes into the engine (events, named as facts) and what comes out (effects, commands).

The runtime feeds events to :meth:`MeshEngine.handle` with the current time and
carries out the effects it returns, in order. Timers are named: ``SetTimer(name, at)``
replaces any earlier timer of the same name; a ``TimerFired`` that arrives early or
late is harmless (the engine checks its own deadlines).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

from .diffs import BeaconPayload, CellPayload, Diff

__all__ = [
    "Started", "CellStored", "CellForgotten", "BeaconPlaced", "BeaconRemoved", "SceneChanged",
    "PeerDiscovered", "FrameReceived", "FrameDelivered", "SendFailed", "TimerFired", "Event",
    "SendFrame", "StoreRemoteCell", "ApplyTombstone", "ApplyRemoteBeacon", "RemoveRemoteBeacon",
    "ApplyScene", "SetTimer", "PeerStateChanged", "IdentityConflict", "PeerOutdated", "Effect",
]  # fmt: skip

# -- events (inputs) --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Started:
    """The runtime is up: announce ourselves and start the timers."""


@dataclasses.dataclass(frozen=True, slots=True)
class CellStored:
    """A local agent stored a cell: disseminate it to interested members."""

    cell: CellPayload


@dataclasses.dataclass(frozen=True, slots=True)
class CellForgotten:
    node_id: str
    tenant_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class BeaconPlaced:
    beacon: BeaconPayload


@dataclasses.dataclass(frozen=True, slots=True)
class BeaconRemoved:
    beacon_id: str
    tenant_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class SceneChanged:
    """A scene was created, changed or consolidated; ``scene`` holds scene_id and tenant_id."""

    scene: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class PeerDiscovered:
    """Discovery or configuration proposes an address; proofs decide if it is a member."""

    address: str
    peer_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class FrameReceived:
    """A sealed frame arrived; ``address`` is where the sender can be reached, if known.

    ``replies_ride``: the runtime carries frames marked ``in_reply`` back in the response to
    this one, so a reply costs the peers no exchange of its own. ``in_response``: this frame
    itself came back in the response to one of ours, so whatever answers it would be a
    request of its own. Both false (the simulator): every frame travels alone.
    """

    address: str
    frame: bytes
    replies_ride: bool = False
    in_response: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class FrameDelivered:
    """The peer at ``address`` took the data frame of batch ``batch_id`` (its endpoint
    accepted it): only the ack is outstanding, so the batch need not be sent again soon."""

    address: str
    batch_id: int


@dataclasses.dataclass(frozen=True, slots=True)
class SendFailed:
    """A frame could not be delivered to ``address`` (connection refused, timeout)."""

    address: str


@dataclasses.dataclass(frozen=True, slots=True)
class TimerFired:
    name: str


Event = Union[
    Started, CellStored, CellForgotten, BeaconPlaced, BeaconRemoved, SceneChanged,
    PeerDiscovered, FrameReceived, FrameDelivered, SendFailed, TimerFired,
]  # fmt: skip

# -- effects (outputs) ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SendFrame:
    """Send sealed bytes; ``data_bytes`` counts the data diffs inside (for metrics), and
    ``data_diffs`` are those diffs (an observer such as the simulator reads them there
    instead of opening the frame again).

    ``in_reply``: this frame answers the frame being handled (an ack, a pong, a gossip or
    repair reply), so a runtime whose transport has a response channel may carry it back
    in the response to that frame instead of sending it on its own.
    """

    address: str
    frame: bytes
    data_bytes: int
    is_control: bool
    in_reply: bool = False
    batch_id: int = 0  # a data batch: report its delivery with ``FrameDelivered``
    data_diffs: tuple[Diff, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class StoreRemoteCell:
    """Ingest a cell from the mesh: store, deliver to inboxes, re-embed if the space differs."""

    cell: CellPayload
    origin_node: str
    hops: int
    signature: bytes
    seq: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyTombstone:
    cell_id: str
    tenant_id: str
    origin_node: str
    forgotten_at: int


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyRemoteBeacon:
    beacon: BeaconPayload
    origin_node: str


@dataclasses.dataclass(frozen=True, slots=True)
class RemoveRemoteBeacon:
    beacon_id: str
    tenant_id: str
    origin_node: str


@dataclasses.dataclass(frozen=True, slots=True)
class ApplyScene:
    scene: dict[str, Any]
    origin_node: str


@dataclasses.dataclass(frozen=True, slots=True)
class SetTimer:
    name: str
    at_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class PeerStateChanged:
    peer_id: str
    address: str
    state: str


@dataclasses.dataclass(frozen=True, slots=True)
class IdentityConflict:
    """Two nodes use the key of ``node_id`` (a copied ``node.key``?): say so, as an error.

    ``evidence`` is what showed it (:mod:`mesh.identity_guard`: ``own_diff``, ``own_frame``,
    ``fork``, ``two_addresses``); ``address`` where the other user was heard, if known;
    ``ours``: the id is this node's own; ``stopped``: this node stopped publishing (it is the
    newcomer: it found its id already in use just after it started)."""

    node_id: str
    evidence: str
    address: str
    ours: bool
    stopped: bool
    detail: str = ""

    def message(self) -> str:
        """One line for the log and the status pages: what, where, and what follows."""
        where = f" at {self.address}" if self.address else ""
        seen = f"({self.evidence}: {self.detail})"
        if not self.ours:
            kept = " The first copy of each seq is kept, a later one dropped as a fork" if self.evidence == "fork" else ""
            return f"node id {self.node_id} looks used by two nodes{where} {seen}: a copied node.key?{kept}"
        if self.stopped:
            return (f"this node's id {self.node_id} is already in use by another node{where} {seen}: this node "
                    "started later, so it stopped publishing to the mesh. Give it an identity of its own: stop it, "
                    "move node.key away, run `hyphae init`, and start it again")  # fmt: skip
        return (f"this node's id {self.node_id} is also in use{where} {seen}: a copy of this node's key "
                "(node.key) runs there? This node keeps its id; that one must stop and get a key of its own")  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class PeerOutdated:
    """A member speaks an older mesh protocol than ours: its frames are dropped (``old_version``)
    until it is upgraded. Emitted once per member (:mod:`mesh.outdated`); the daemon logs it."""

    node_id: str
    address: str
    protocol: int
    ours: int

    def message(self) -> str:
        """One line for the log and the status pages."""
        where = f" at {self.address}" if self.address else ""
        return (f"peer {self.node_id}{where} speaks mesh protocol {self.protocol}, this node {self.ours}: upgrade it "
                "(its frames are dropped as old_version until then)")  # fmt: skip


Effect = Union[
    SendFrame, StoreRemoteCell, ApplyTombstone, ApplyRemoteBeacon, RemoveRemoteBeacon,
    ApplyScene, SetTimer, PeerStateChanged, IdentityConflict, PeerOutdated,
]  # fmt: skip
