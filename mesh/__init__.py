"""The gossip mesh: identity, team, wire format, a sans-IO engine, and its test network.

``MeshEngine.handle(event, now_ms) -> effects`` is the whole protocol; runtimes (trio
and HTTP in production, :mod:`mesh.testing` and the simulator) only carry effects out.
"""

from .config import EnergyParams, MeshConfig
from .diffs import BeaconPayload, CellPayload, DecodeCache, Diff, DiffKind, WireLimits
from .engine import MeshEngine
from .errors import JoinTokenError, LocalError, MeshError, Reason, RemoteError, SealError, WireError
from .events import (
    ApplyRemoteBeacon, ApplyScene, ApplyTombstone, BeaconPlaced, BeaconRemoved, CellForgotten, CellStored,
    Effect, Event, FrameReceived, PeerDiscovered, PeerStateChanged, RemoveRemoteBeacon, SceneChanged,
    SendFailed, SendFrame, SetTimer, Started, StoreRemoteCell, TimerFired,
)  # fmt: skip
from .identity import NodeIdentity, node_id_for
from .membership import LIVENESS, Liveness, PeerState
from .memory import DiffLog, MemoryDiffLog
from .routing import BeaconIndex, FullView, RoutingPolicy
from .state import Counters
from .team import FrameSealer, Team

__all__ = [
    "NodeIdentity", "node_id_for",
    "Team", "FrameSealer",
    "MeshEngine", "MeshConfig", "EnergyParams", "Counters",
    "DiffLog", "MemoryDiffLog",
    "CellPayload", "BeaconPayload", "Diff", "DiffKind", "WireLimits", "DecodeCache",
    "BeaconIndex", "FullView", "RoutingPolicy",
    "PeerState", "Liveness", "LIVENESS",
    "MeshError", "LocalError", "JoinTokenError", "RemoteError", "SealError", "WireError", "Reason",
    "Started", "CellStored", "CellForgotten", "BeaconPlaced", "BeaconRemoved", "SceneChanged",
    "PeerDiscovered", "FrameReceived", "SendFailed", "TimerFired", "Event",
    "SendFrame", "StoreRemoteCell", "ApplyTombstone", "ApplyRemoteBeacon", "RemoveRemoteBeacon",
    "ApplyScene", "SetTimer", "PeerStateChanged", "Effect",
]  # fmt: skip
