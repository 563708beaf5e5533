"""Engine configuration, and the energy interface the engine needs.

The mesh never imports ``node``: the caller passes ``node.energy.EnergyModel``,
which satisfies :class:`EnergyParams` by duck typing. Durations are in ms.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol

from .team import Team
from .diffs import DEFAULT_LIMITS, WireLimits

__all__ = ["MeshConfig", "EnergyParams"]


class EnergyParams(Protocol):
    """The slice of the energy model (DESIGN §4) routing and repair use.

    ``route_threshold`` must accept a numpy array of thresholds (plain arithmetic does).
    """

    def initial(self, salience: float, cell_type: str) -> float: ...

    def hop_budget(self, e0: float) -> int: ...

    def route_threshold(self, beacon_threshold: Any, e0: float) -> Any:
        """The routing rule's floor for a beacon of threshold τ and a cell of energy E0."""
        ...

    def worth_repairing(self, e0: float, cell_type: str, created_at_ms: int, now_ms: int) -> bool: ...


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    team: Team
    address: str  # where peers reach us: "host:port", or "n42" in a simulator
    view: Literal["full", "partial"] = "full"
    # control plane
    gossip_interval_ms: int = 1000
    gossip_jitter: float = 0.25  # fraction of the interval, randomised
    # liveness
    probe_interval_ms: int = 2000  # ping a peer not heard from for this long
    ping_timeout_ms: int = 1500
    suspect_timeout_ms: int = 6000  # suspect this long without a word: dead
    dead_probe_interval_ms: int = 10_000
    max_probes_per_round: int = 3  # pings per half probe interval
    # data plane
    flush_interval_ms: int = 5  # minimum gap between data frames to one peer
    # ... while one of ours to it is unacknowledged (unless a full batch waits): under load the
    # diffs share frames instead of costing an HTTP exchange each (see mesh.outbox)
    busy_flush_interval_ms: int = 100
    ack_timeout_ms: int = 1000
    # A data frame that came back in an HTTP response cannot be answered in one: its ack waits
    # this long for our next data frame to that peer to ride on, then goes alone (TCP's delayed ack).
    ack_delay_ms: int = 30
    max_attempts: int = 4
    max_inflight_batches: int = 4  # per peer
    send_queue_limit: int = 1024  # diffs per peer
    # repair
    repair_interval_ms: int = 30_000
    repair_scan_limit: int = 4096  # log entries a responder scans per request
    repair_timeout_ms: int = 5000
    # Cells this much older than a beacon still count. The two stamps come from two clocks
    # (the cell's origin, the beacon's owner), so the grace covers twice the clock skew too.
    repair_grace_ms: int = 60_000 + 2 * 600_000
    repair_min_interval_ms: int = 5_000  # reconnect-triggered repair requests to one peer, at most this often
    # control state put back at a restart leaves out beacon removals older than this (when their
    # origin has signed anything since) and beacons expired since; a member offline longer than
    # this may keep routing to such a beacon, which its owner no longer delivers to
    control_tombstone_ttl_ms: int = 7 * 24 * 3600 * 1000
    # admission. Members' clocks may differ by up to ``max_clock_skew_ms`` (issue 7: +-5 min
    # must work): diff timestamps and a sender's first frame are judged against it. After
    # that, each sender's clock offset is estimated from its frames, and its frames are
    # judged against its own clock: at most ``max_future_skew_ms`` ahead of it, at most
    # ``frame_max_age_ms`` behind it (the replay window; nonces are kept that long).
    max_clock_skew_ms: int = 600_000
    max_future_skew_ms: int = 60_000
    frame_max_age_ms: int = 120_000  # replay window for sealed frames
    # A sender's clock offset is the median of its last this many frames' samples, approached by
    # at most ``clock_offset_step_ms`` per frame: one wild sample cannot make its frames replays.
    clock_offset_samples: int = 9
    clock_offset_step_ms: int = 5_000
    # What one member may make every other member hold (mesh.quota): its live beacons, and all its
    # control entries (beacons, removals, scenes, its peer record). A control diff that would take
    # its origin past one of these is refused (counted ``quota``) before it is recorded or relayed.
    max_beacons_per_origin: int = 256
    max_beacon_bytes_per_origin: int = 1 << 20
    max_control_entries_per_origin: int = 1024
    max_control_bytes_per_origin: int = 2 << 20
    limits: WireLimits = DEFAULT_LIMITS  # frozen: one object shared by every config (cheap to compare)
    # partial view (view="partial"): a bounded set of gossip neighbours, interests known within a radius
    max_neighbours: int = 8  # active view: peers we gossip and ping
    interest_radius: int = 2  # hops over which control diffs (peers, beacons) replicate
    # Besides the random ones (seeds, peers that gossip with us while there is room), this many
    # neighbours chosen each gossip round as the known nodes whose beacons are nearest our own
    # (T-Man style): nodes of like interest end up within each other's radius. 0: random only.
    interest_neighbours: int = 4
    # A gossip answer offers the asker up to this many nodes it knows, beyond the asker's radius,
    # whose beacons are nearer the asker's than the nodes the asker's digest shows it knows (T-Man's
    # ranked exchange, as far as the answerer can tell); the asker keeps those nearer than its
    # chosen neighbours, at the edge of its radius (not shared onward). Without it a node of a
    # rare interest learns only what its radius brings, and at N=10,000 did not find its kind
    # within 20 s. 0: off.
    interest_offers: int = 8
    # A chosen neighbour is let go only for a node nearer our beacons by this much (cosine), and
    # an offered node kept only if that near: a popular interest has many nodes of nearly equal
    # closeness, and each change of neighbour costs an exchange of two whole neighbourhoods.
    choice_margin: float = 0.05
    steer_walk: bool = True  # a walk goes to the neighbour whose beacon is nearest the cell
    walk_far: bool = True  # ... to the node whose beacon is nearest the cell of all it knows (steered only)
    origin_walks: int = 2  # with walk_far: an origin that sees no interest starts this many walks
    leaf_walk: bool = False  # a relay that wanted the cell and knows no other interest walks on (ttl allowing)
    # A relay that wanted the cell pushes to the interests it knows within this many hops (the
    # origin and a walk's end, to all they know): beyond, other holders are as near.
    relay_radius: int = 1
    # With relay_radius 1, "one hop" is a link as it stands now, either way: our neighbours, and
    # the nodes that opened a gossip round with us within this long (they hold us as neighbour),
    # at most ``max_inbound_links`` of them, the nearest in interest (None: no bound).
    inbound_link_timeout_ms: int = 30_000
    max_inbound_links: int | None = None
    widen_leaves: bool = True  # a relay with no interest within relay_radius pushes to all it knows
    # Each relayed copy names up to this many nodes already sent it (its sender's targets, then
    # those its sender was told of); the receiver pushes to none of them (mesh.told). 0: off.
    told_limit: int = 64
    # Partial view: a relay's onward copies wait this long in its queue, so that copies of the
    # same cell from other relays (whose told lists name whom they were sent to) can withdraw
    # them first (0: they leave at once). Adds up to this much latency per relay hop.
    relay_hold_ms: int = 0
    # Partial view, lazy push (mesh.lazy, Plumtree): a relay's copies to a peer that was sent a
    # copy it had go as announcements instead, gathered for ``lazy_announce_ms`` into one frame;
    # an announced diff we lack waits ``lazy_graft_ms`` for a copy from elsewhere, then is asked
    # for. Fewer duplicate frames and their acks, for up to that much more latency where the
    # eager copies do not reach. No effect in the full view (nobody relays).
    lazy_push: bool = False
    lazy_announce_ms: int = 150
    lazy_graft_ms: int = 100
    # identity conflicts (mesh.identity_guard): a node that finds its own id in use elsewhere
    # this soon after it started is the newcomer and stops publishing; one id heard from two
    # addresses by turns within this long is reported.
    identity_grace_ms: int = 30_000

    def __post_init__(self) -> None:
        """Refuse settings the engine cannot run on, naming the first: no negative count or
        duration, and none of zero where the engine divides its time by it or waits on it."""
        if self.view not in ("full", "partial"):
            raise ValueError(f"view must be 'full' or 'partial', not {self.view!r}")
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if type(value) in (int, float) and value < _AT_LEAST.get(f.name, 0):
                raise ValueError(f"mesh setting {f.name} must be at least {_AT_LEAST.get(f.name, 0)}, not {value}")
        if not self.gossip_jitter < 1:
            raise ValueError(f"mesh setting gossip_jitter must be below 1, not {self.gossip_jitter}")


# Settings that must be positive (the rest may be 0: off, or at once).
_AT_LEAST = {
    name: 1 for name in (
        "gossip_interval_ms", "probe_interval_ms", "ping_timeout_ms", "suspect_timeout_ms", "dead_probe_interval_ms",
        "ack_timeout_ms", "max_attempts", "max_inflight_batches", "send_queue_limit", "repair_interval_ms",
        "repair_timeout_ms", "max_neighbours", "interest_radius", "relay_radius", "clock_offset_samples",
        "clock_offset_step_ms", "max_beacons_per_origin", "max_beacon_bytes_per_origin",
        "max_control_entries_per_origin", "max_control_bytes_per_origin",
    )
}  # fmt: skip
