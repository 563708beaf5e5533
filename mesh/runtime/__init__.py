"""The I/O side of the mesh: trio tasks, HTTP and zeroconf around the sans-IO engine.

:class:`MeshRuntime` owns one :class:`~mesh.engine.MeshEngine`: it feeds it events
(frames, timers, local changes, send failures) through one channel and carries out
its effects (frames to per-peer send lanes, timers, everything else to an
:class:`EffectSink`). :class:`HttpTransport` sends frames (:class:`MemoryTransport` is its fake);
:func:`make_mesh_app` is the mesh port's ASGI app; :class:`Discovery` proposes peers found by zeroconf;
:class:`FaultPlan` injects partitions, delay and loss between real processes.
The mesh port is served by :mod:`web.server`, the HTTP/1.1 server (h11 + trio) the node's API
port uses too. Nothing else in ``mesh`` imports trio, httpx, hypercorn or zeroconf.
"""

from .discovery import SERVICE_TYPE, Discovery
from .driver import EffectSink, MeshRuntime, wall_clock_ms
from .faults import FaultPlan, Verdict, watch_fault_file
from .memory_transport import MemoryHub, MemoryTransport
from .port import MeshApp, bind_mesh_socket, make_mesh_app, serve_mesh
from .transport import (
    FRAMES_PATH, HELLO_PATH, PROTOCOL_VERSION, REPLY_WITHIN, HttpTransport, SendError, Transport, pack_frames,
    unpack_frames,
)  # fmt: skip

__all__ = [
    "MeshRuntime", "EffectSink", "wall_clock_ms",
    "Transport", "HttpTransport", "MemoryTransport", "MemoryHub", "SendError",
    "MeshApp", "make_mesh_app", "bind_mesh_socket", "serve_mesh", "PROTOCOL_VERSION", "FRAMES_PATH", "HELLO_PATH",
    "pack_frames", "unpack_frames", "REPLY_WITHIN",
    "Discovery", "SERVICE_TYPE",
    "FaultPlan", "Verdict", "watch_fault_file",
]  # fmt: skip
