"""Per-origin quotas: how much control state one member may make every other member hold.

Control diffs replicate to every member (within the radius, in a partial view), so without a
bound one member could fill everyone's memory: 5,120 beacons of 4 KB in 2 s once spread to every
node, +80 MiB each. Each origin now has a share (:class:`ControlQuota`, from the
``max_*_per_origin`` settings of :class:`~mesh.config.MeshConfig`), checked where a control diff
is accepted, after its signature and before it is recorded, applied or served to anyone:

* **live beacons** (count and bytes): a beacon beyond the share is refused, counted ``quota``.
  A beacon is a standing interest: its owner's older ones are not let go to make room (that
  would change where its cells go behind its back); its own engine refuses to publish past
  the share, so an honest node learns of it where it placed it (the same count).
* **other entries** (beacon removals, scenes, the peer record; count and bytes): beyond the
  share the origin's least recently changed removals and scenes are let go (counted
  ``quota``), as a restart lets go of old removals: a busy honest node opens a scene per
  session and must not be cut off after its thousandth, and an insider gains nothing by
  flooding them but churn. One entry larger than the whole share is refused.

A diff that does not grow what its origin holds (an update in place, a removal of a live
beacon) always fits. A refused diff's seq still counts as received (the version moves past
it): members that refused it do not ask each other for it again and again. Members refuse
the same diffs of an honest origin: the check reads only what the origin holds, the same at
every member that holds its entries up to that version. (An insider that shows members
different histories of its own entries changes only which of its own beacons they hold.)
"""

from __future__ import annotations

import dataclasses

from .config import MeshConfig
from .control import ControlState, Usage, control_key
from .diffs import BeaconPayload, Diff, PeerPayload

__all__ = ["ControlQuota"]


@dataclasses.dataclass(frozen=True)
class ControlQuota:
    """One origin's share of every member's control state."""

    beacons: int
    beacon_bytes: int
    others: int
    other_bytes: int

    @classmethod
    def of(cls, config: MeshConfig) -> "ControlQuota":
        return cls(
            config.max_beacons_per_origin, config.max_beacon_bytes_per_origin,
            config.max_control_entries_per_origin, config.max_control_bytes_per_origin,
        )  # fmt: skip

    def make_room(self, control: ControlState, diff: Diff) -> int | None:
        """Make room for ``diff`` among its origin's entries: None if it does not fit (refused),
        else how many of the origin's entries were let go for it (0: it fit as it was)."""
        held_now, size = control.usage(diff.origin), diff.size
        if held_now is None or (
            held_now.beacons < self.beacons and held_now.beacon_bytes + size <= self.beacon_bytes
            and held_now.others < self.others and held_now.other_bytes + size <= self.other_bytes
        ):  # fmt: skip
            return 0  # it fits whatever it replaces: the usual case, decided without looking further
        usage = Usage(held_now.beacons, held_now.beacon_bytes, held_now.others, held_now.other_bytes)
        previous = control.held(diff.origin, control_key(diff))
        if previous is not None:
            usage.add(previous, -1)
        usage.add(diff)
        if isinstance(diff.payload, BeaconPayload):
            grows = previous is None or not isinstance(previous.payload, BeaconPayload) or diff.size > previous.size
            if grows and (usage.beacons > self.beacons or usage.beacon_bytes > self.beacon_bytes):
                return None
        if usage.others <= self.others and usage.other_bytes <= self.other_bytes:
            return 0
        if not isinstance(diff.payload, BeaconPayload) and diff.size > self.other_bytes:
            return None
        doomed: list[Diff] = []
        for held in control.oldest(diff.origin):
            if usage.others <= self.others and usage.other_bytes <= self.other_bytes:
                break
            if held is previous or isinstance(held.payload, (BeaconPayload, PeerPayload)):
                continue
            usage.add(held, -1)
            doomed.append(held)
        if usage.others > self.others or usage.other_bytes > self.other_bytes:
            return None
        for held in doomed:
            control.let_go(held)
        return len(doomed)
