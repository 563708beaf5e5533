"""The gossip mesh: identity, team, wire format, a sans-IO engine, and its test network.

``MeshEngine.handle(event, now_ms) -> effects`` is the whole protocol; runtimes (trio
and HTTP in production, :mod:`mesh.testing` and the simulator) only carry effects out.

Names are loaded on first use: the node's validation and every CLI command read the cell
rules (:mod:`mesh.cell_rules`), and must not pay for numpy, msgpack and the engine to do it.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import EnergyParams, MeshConfig
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
    from .diffs import BeaconPayload, CellPayload, DecodeCache, Diff, DiffKind, WireLimits

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

_HOMES = {
    "EnergyParams": "config", "MeshConfig": "config", "Counters": "state", "MeshEngine": "engine",
    "NodeIdentity": "identity", "node_id_for": "identity", "Team": "team", "FrameSealer": "team",
    "DiffLog": "memory", "MemoryDiffLog": "memory", "PeerState": "membership", "Liveness": "membership",
    "LIVENESS": "membership", "BeaconIndex": "routing", "FullView": "routing", "RoutingPolicy": "routing",
    **dict.fromkeys(("BeaconPayload", "CellPayload", "DecodeCache", "Diff", "DiffKind", "WireLimits"), "diffs"),
    **dict.fromkeys(("MeshError", "LocalError", "JoinTokenError", "RemoteError", "SealError", "WireError", "Reason"),
                    "errors"),
}  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name, "events" if name in __all__ else None)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{home}", __name__), name)
    globals()[name] = value
    return value
