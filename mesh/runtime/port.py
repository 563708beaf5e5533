"""The mesh port: the ASGI endpoint that hands frames to a runtime, and serving it.

``POST /mesh/v1/frames`` takes one sealed frame and answers with the engine's replies
(``200``, see :mod:`.transport` for the body) or ``202`` once it is queued. HTTP knows
nothing else: authentication, replay and membership are the engine's business (the frame
is AEAD-sealed under the team key), so garbage is *accepted* here and counted as a drop by
the engine, never answered with a 500. ``GET /mesh/v1/hello`` is public and carries no
secret: the protocol version, the team id *hash* (as in the zeroconf TXT record) and the
node id. Everything else is 404.

Connection slots are what a stranger can take without the key, so the port is served with
:data:`MESH_LIMITS`: a stranger's silent connection closes after 5 s, a frame must arrive
whole within 30 s, one address holds at most 32 connections, and half the slots are kept
for the hosts of the members the engine knows (:meth:`MeshApp.is_member_host`: learnt
from authenticated frames only). Refusals and cut-offs count in ``runtime.counters``
(``http_refused_per_address``, ``http_refused_no_slot``, ``http_timeout_<wait>``).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from web.asgi import BodyTooLarge, ClientGone, read_body, send_bytes, serve_lifespan
from web.server import HttpLimits, serve_asgi

from .driver import MeshRuntime
from .faults import FaultPlan
from .transport import FRAMES_TYPE, FRAMES_PATH, HELLO_PATH, PROTOCOL_VERSION, REPLY_WITHIN, pack_frames

__all__ = ["MeshApp", "make_mesh_app", "bind_mesh_socket", "serve_mesh"]

log = logging.getLogger("hyphae.mesh.port")

# A member holds a handful of connections to us (HttpTransport: 4 requests in flight, at
# most 8 kept idle), so 32 per address leaves room for a few members behind one address
# (NAT, several nodes on one host); a known member's host is not held to it anyway. Half
# the slots are the members' reserve: strangers (joiners, discovery's hellos) keep 256.
MESH_LIMITS = HttpLimits(first_byte_timeout=5.0, body_timeout=30.0, max_connections_per_address=32, reserved_slots=256)
_MEMBER_HOSTS_TTL = 1.0  # seconds a snapshot of the members' hosts is reused


class MeshApp:
    """The ASGI app of the mesh port. Counts what it refuses in ``runtime.counters``."""

    def __init__(
        self, runtime: MeshRuntime, *, max_frame_bytes: int, faults: FaultPlan | None = None,
        reply_within: float | None = REPLY_WITHIN,
    ) -> None:  # fmt: skip
        """``reply_within``: seconds to wait for the engine's replies to a frame; None answers 202 at once."""
        self.runtime = runtime
        self.max_frame_bytes = max_frame_bytes
        self.faults = faults
        self.reply_within = reply_within
        engine = runtime.engine
        self._hello = json.dumps(
            {"protocol": PROTOCOL_VERSION, "team_hash": engine.config.team.id_hash, "node_id": engine.node_id}
        ).encode()
        self._member_hosts: frozenset[str] = frozenset()
        self._member_hosts_at = -math.inf

    def is_member_host(self, host: str) -> bool:
        """Whether ``host`` (a client's IP) is the host of a peer the engine knows, whatever its
        state: peers are learnt from authenticated frames only. The server's ``is_preferred``:
        asked only when a slot limit would refuse, and answered from a snapshot at most a
        second old. A peer that advertises a host name is not recognised by its IP."""
        now = trio.current_time()
        if now - self._member_hosts_at >= _MEMBER_HOSTS_TTL:
            self._member_hosts = frozenset(p.address.rpartition(":")[0].strip("[]") for p in self.runtime.engine.peers)
            self._member_hosts_at = now
        return host in self._member_hosts

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict]], send: Callable) -> None:
        if scope["type"] == "lifespan":
            await serve_lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: not served; closing the scope refuses them
        path, method = scope["path"], scope["method"]
        if path == FRAMES_PATH:
            if method != "POST":
                await _respond(send, 405, b"use POST\n", headers=[(b"allow", b"POST")])
                return
            await self._frames(scope, receive, send)
        elif path == HELLO_PATH:
            if method not in ("GET", "HEAD"):
                await _respond(send, 405, b"use GET\n", headers=[(b"allow", b"GET, HEAD")])
                return
            await _respond(send, 200, self._hello, content_type=b"application/json")
        else:
            self.runtime.counters["http_not_found"] += 1
            await _respond(send, 404, b"not found\n")

    async def _frames(self, scope: dict[str, Any], receive: Callable, send: Callable) -> None:
        counters = self.runtime.counters
        client = scope.get("client")
        source = f"{client[0]}:{client[1]}" if client else ""
        if self.faults is not None and source and self.faults.blocks_incoming(source):
            await _respond(send, 503, b"partitioned\n")
            return
        declared = _content_length(scope)
        try:
            if declared is not None and declared > self.max_frame_bytes:
                raise BodyTooLarge(self.max_frame_bytes)
            frame = await read_body(receive, self.max_frame_bytes)
        except BodyTooLarge:
            counters["http_oversized"] += 1
            await _respond(send, 413, b"frame too large\n", headers=[(b"connection", b"close")])
            return
        except ClientGone:
            counters["http_disconnected"] += 1
            return
        try:
            replies = await self.runtime.receive_frame(source, frame, reply_within=self.reply_within)
        except Exception:  # the runtime is shutting down; tell the peer to try later
            log.debug("frame from %s not queued", source, exc_info=True)
            counters["http_unavailable"] += 1
            await _respond(send, 503, b"not running\n")
            return
        if replies:
            await _respond(send, 200, pack_frames(replies), content_type=FRAMES_TYPE)
        else:
            await _respond(send, 202, b"")


def make_mesh_app(runtime: MeshRuntime, *, max_frame_bytes: int, faults: FaultPlan | None = None) -> MeshApp:
    """The ASGI app for the mesh port; ``faults`` defaults to the runtime transport's plan."""
    if faults is None:
        faults = getattr(runtime.transport, "faults", None)
    return MeshApp(runtime, max_frame_bytes=max_frame_bytes, faults=faults)


def _content_length(scope: dict[str, Any]) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _respond(
    send: Callable, status: int, body: bytes, *, content_type: bytes = b"text/plain; charset=utf-8",
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:  # fmt: skip
    await send_bytes(send, status, body, content_type, headers or ())


# -- serving ------------------------------------------------------------------------------


def bind_mesh_socket(host: str = "0.0.0.0", port: int = 0) -> socket.socket:
    """A bound (not yet listening) TCP socket for :func:`serve_mesh`; port 0 picks one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


async def serve_mesh(
    app: Any, sock: socket.socket, *, shutdown_trigger: Callable[[], Awaitable[Any]] | None = None,
    graceful_timeout: float = 2.0, limits: HttpLimits = MESH_LIMITS,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve ``app`` on ``sock`` until cancelled (or ``shutdown_trigger`` returns), with the
    server :func:`~web.server.serve_asgi` picks. The server takes ``sock`` over
    and closes it when it stops: ``sock`` must not be used afterwards. A :class:`MeshApp`
    keeps the reserved slots for its members and counts refusals in its runtime's counters."""
    limits = dataclasses.replace(limits, graceful_timeout=graceful_timeout)
    is_preferred, counters = (app.is_member_host, app.runtime.counters) if isinstance(app, MeshApp) else (None, None)
    await serve_asgi(app, sock, shutdown_trigger=shutdown_trigger, limits=limits, is_preferred=is_preferred,
                     counters=counters, task_status=task_status)  # fmt: skip
