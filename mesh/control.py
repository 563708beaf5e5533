"""The control plane's replicated state: Scuttlebutt-style anti-entropy.

Each origin owns a few keys (its ``peer`` record, each beacon id, each scene id);
every control diff it signs gets a fresh ``seq`` from the origin's one counter, and
only the newest diff per key is kept. The *version* of an origin is the highest
seq we hold from it. Two nodes reconcile with a digest ``{origin: version}``: each
sends the other every entry newer than the other's version, per origin in ascending
seq order. A reply cut short by a size limit is still a prefix, so "version = max seq
received" stays true: whoever holds version v of an origin holds all its entries ≤ v (but
those its quota refused or let go, :mod:`mesh.quota`, which no member is given again).

What each origin holds here is kept count of (:class:`Usage`), for :mod:`mesh.quota`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from .diffs import BeaconPayload, Diff, PeerPayload, ScenePayload, UnbeaconPayload, id_bytes
from .wire import Digest

__all__ = ["ControlState", "control_key", "Usage"]


@dataclasses.dataclass(slots=True)
class Usage:
    """What one origin's entries take: its live beacons, and its other entries (beacon
    removals, scenes, its peer record), each as a count and bytes on the wire."""

    beacons: int = 0
    beacon_bytes: int = 0
    others: int = 0
    other_bytes: int = 0

    def add(self, diff: Diff, sign: int = 1) -> None:
        if isinstance(diff.payload, BeaconPayload):
            self.beacons += sign
            self.beacon_bytes += sign * diff.size
        else:
            self.others += sign
            self.other_bytes += sign * diff.size


def control_key(diff: Diff) -> tuple[str, str]:
    p = diff.payload
    if isinstance(p, (BeaconPayload, UnbeaconPayload)):
        return ("beacon", p.beacon_id)
    if isinstance(p, ScenePayload):
        return ("scene", p.scene_id)
    if isinstance(p, PeerPayload):
        return ("peer", "")
    raise ValueError(f"not a control diff: {diff.kind!r}")


class ControlState:
    def __init__(self) -> None:
        self._versions: dict[str, int] = {}
        self._wire_versions: dict[bytes, int] = {}  # the same, keyed by raw id: the digest's wire form
        self._entries: dict[str, dict[tuple[str, str], Diff]] = {}
        self.distance: dict[str, int] = {}  # origin -> hops (partial view only)
        # (max_distance, the origins within it in version order): a partial view shares its
        # nearest few origins of ~100 known, with every gossip reply; reset when either changes.
        self._near: tuple[int, list[str]] | None = None
        # origin -> {hops: its entries in seq order, marked with those hops}: what answers
        # send, made once per change of the origin's entries instead of once per answer.
        self._marked: dict[str, dict[int | None, list[Diff]]] = {}
        self._usage: dict[str, Usage] = {}

    def version(self, origin: str) -> int:
        return self._versions.get(origin, 0)

    def __len__(self) -> int:
        return len(self._versions)

    def digest(self, max_distance: int | None = None) -> dict[str, int]:
        if max_distance is None:
            return Digest(self._versions, self._wire_versions)
        dist = self.distance
        return {o: v for o, v in self._versions.items() if dist.get(o, 0) <= max_distance}

    def closer(self, origin: str, hops: int) -> bool:
        """Record that ``origin`` is ``hops`` away if that is nearer than we knew; True if so."""
        known = self.distance.get(origin)
        if known is not None and known <= hops:
            return False
        self.distance[origin] = hops
        self._near = None
        self._marked.pop(origin, None)
        return True

    def entries(self, origin: str) -> Iterable[Diff]:
        return self._entries.get(origin, {}).values()

    def in_order(self, origin: str, hops: int | None = None) -> list[Diff]:
        """The origin's entries in seq order (a prefix of them is what a peer may lack), marked
        ``hops`` away with no ttl (None: as held). Shared: do not change the list."""
        entries = self._entries.get(origin)
        if not entries:
            return []  # nothing to keep for an origin we do not hold
        marked = self._marked.setdefault(origin, {})
        out = marked.get(hops)
        if out is None:
            out = sorted(entries.values(), key=lambda d: d.seq)
            if hops is not None:
                out = [d.routed(hops=hops, ttl=0) for d in out]
            marked[hops] = out
        return out

    def is_new(self, diff: Diff) -> bool:
        return diff.seq > self._versions.get(diff.origin, 0)

    def apply(self, diff: Diff) -> Diff | None:
        """Record a newer diff; returns the entry it supersedes (if any)."""
        if diff.origin not in self._versions:
            self._near = None
        self._marked.pop(diff.origin, None)
        entries = self._entries.setdefault(diff.origin, {})
        key = control_key(diff)
        previous = entries.pop(key, None)  # re-inserted: the entries stay in the order last changed
        entries[key] = diff
        usage = self._usage.get(diff.origin)
        if usage is None:
            usage = self._usage[diff.origin] = Usage()
        if previous is not None:
            usage.add(previous, -1)
        usage.add(diff)
        version = self._versions[diff.origin] = max(diff.seq, self._versions.get(diff.origin, 0))
        self._wire_versions[id_bytes(diff.origin)] = version
        return previous

    def skip(self, origin: str, seq: int) -> None:
        """Count ``seq`` of ``origin`` as received (applied, or refused for good)."""
        version = self._versions[origin] = max(seq, self._versions.get(origin, 0))
        self._wire_versions[id_bytes(origin)] = version

    def held(self, origin: str, key: tuple[str, str]) -> Diff | None:
        """The entry of ``origin`` under ``key`` (see :func:`control_key`), if we hold one."""
        entries = self._entries.get(origin)
        return entries.get(key) if entries else None

    def usage(self, origin: str) -> Usage | None:
        """What ``origin``'s entries take here (None: nothing). Read it, do not change it."""
        return self._usage.get(origin)

    def oldest(self, origin: str) -> Iterable[Diff]:
        """``origin``'s entries, the least recently changed first."""
        return list(self._entries.get(origin, {}).values())

    def let_go(self, diff: Diff) -> None:
        """Drop one entry of its origin's (the version stays: it is not asked for again)."""
        entries = self._entries.get(diff.origin)
        if entries is not None and entries.pop(control_key(diff), None) is not None:
            self._usage[diff.origin].add(diff, -1)
            self._marked.pop(diff.origin, None)

    def needs_from(self, digest: Mapping[str, int], known_only: bool = False) -> bool:
        """Does the peer that sent ``digest`` hold anything we lack?

        ``known_only`` (partial view): count only origins we already hold. A peer lists
        origins at the edge of its radius that it will not share; new origins reach us
        anyway when our own digest, which lacks them, goes the other way.
        """
        versions = self._versions
        if known_only:
            return any(v > versions[origin] for origin, v in digest.items() if origin in versions)
        return any(v > versions.get(origin, 0) for origin, v in digest.items())

    def forget(self, origin: str) -> None:
        """Drop everything of an origin (it moved out of our radius)."""
        self._versions.pop(origin, None)
        self._wire_versions.pop(id_bytes(origin), None)
        self._entries.pop(origin, None)
        self._usage.pop(origin, None)
        self.distance.pop(origin, None)
        self._near = None
        self._marked.pop(origin, None)

    def _within(self, max_distance: int) -> list[str]:
        near = self._near
        if near is None or near[0] != max_distance:
            dist = self.distance
            near = self._near = (max_distance, [o for o in self._versions if dist.get(o, 0) <= max_distance])
        return near[1]

    def delta_for(
        self, digest: Mapping[str, int], max_diffs: int, max_bytes: int, max_distance: int | None = None
    ) -> list[Diff]:
        """Entries newer than ``digest``, as per-origin prefixes, within the limits (and the radius)."""
        out: list[Diff] = []
        size = 0
        dist, versions = self.distance, self._versions
        pairs = versions.items() if max_distance is None else ((o, versions[o]) for o in self._within(max_distance))
        for origin, version in pairs:
            theirs = digest.get(origin, 0)
            if version <= theirs:
                continue
            hops = None if max_distance is None else dist.get(origin, 0) + 1
            for diff in self.in_order(origin, hops):
                if diff.seq <= theirs:
                    continue
                if len(out) >= max_diffs or size + diff.size > max_bytes:
                    return out
                out.append(diff)
                size += diff.size
        return out
