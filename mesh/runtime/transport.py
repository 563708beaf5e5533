"""Frames over HTTP: the client side (kept-alive connections, :mod:`.http_client`) and the mesh endpoint (ASGI).

A sealed frame is the body of ``POST http://{address}/mesh/v1/frames``
(``application/octet-stream``). The endpoint waits up to ``reply_within`` seconds for
the engine to handle the frame: if it answered (an ack for a data batch, a pong, a
gossip or repair reply), the answer is ``200`` with the reply frames in the body
(``application/x-hyphae-frames``: each frame as a 4-byte big-endian length and the
bytes); otherwise ``202`` with an empty body once the frame is queued, and the replies
follow as requests of their own. So a data batch and its ack cost one HTTP exchange.
HTTP knows nothing else: authentication, replay and membership are the
engine's business (the frame is AEAD-sealed under the team key), so garbage is
*accepted* here and counted as a drop by the engine, never answered with a 500.
``GET /mesh/v1/hello`` is public and carries no secret: the protocol version, the
team id *hash* (as in the zeroconf TXT record) and the node id. Everything else is 404.

Exceptions are translated once, here, at the boundary::

    MeshError (mesh.errors)
    └── SendError      the peer or the path to it is at fault: refused, timed out,
                       answered non-2xx, partitioned by a FaultPlan, or a bad address

:class:`MemoryTransport` is the fake beside :class:`HttpTransport`: frames go
straight to another runtime's ``receive_frame`` in this process, through the same
:class:`FaultPlan`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

import httpx
import trio

from web.asgi import BodyTooLarge, ClientGone, read_body, send_bytes, serve_lifespan
from web.server import HttpLimits, serve_asgi

from ..errors import MeshError
from ..wire import WIRE_VERSION
from .faults import FaultPlan, Verdict
from .http_client import BadResponse, FrameClient, FrameClientError, ResponseTimeout

if TYPE_CHECKING:
    from .driver import MeshRuntime

__all__ = [
    "PROTOCOL_VERSION", "FRAMES_PATH", "HELLO_PATH", "SendError", "Transport", "HttpTransport",
    "MemoryTransport", "MemoryHub", "MeshApp", "make_mesh_app", "bind_mesh_socket", "serve_mesh",
    "pack_frames", "unpack_frames", "REPLY_WITHIN",
]  # fmt: skip

log = logging.getLogger("hyphae.mesh.transport")

PROTOCOL_VERSION = WIRE_VERSION  # what /mesh/v1/hello and the zeroconf TXT record advertise
FRAMES_PATH = "/mesh/v1/frames"
HELLO_PATH = "/mesh/v1/hello"
_CONTENT_TYPE = "application/octet-stream"
_FRAMES_TYPE = b"application/x-hyphae-frames"
REPLY_WITHIN = 3.0  # seconds the endpoint waits for the engine's replies before answering 202 (clients wait 5)
_MAX_REPLIES = 64


def pack_frames(frames: list[bytes]) -> bytes:
    """Frames as one body: each a 4-byte big-endian length and its bytes."""
    return b"".join(len(f).to_bytes(4, "big") + f for f in frames)


def unpack_frames(body: bytes, max_frame_bytes: int) -> list[bytes]:
    """The frames of a reply body; raises ``ValueError`` if it is not one."""
    frames: list[bytes] = []
    i = 0
    while i < len(body):
        if len(body) - i < 4 or len(frames) >= _MAX_REPLIES:
            raise ValueError("truncated reply body")
        size = int.from_bytes(body[i : i + 4], "big")
        if size > max_frame_bytes or i + 4 + size > len(body):
            raise ValueError("bad frame length in a reply body")
        frames.append(body[i + 4 : i + 4 + size])
        i += 4 + size
    return frames
_ADDRESS = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):([0-9]{1,5})$")


class SendError(MeshError):
    """A frame did not reach the peer; ``reason`` is one of the ``SendError.*`` codes."""

    CONNECT_FAILED = "connect_failed"
    TIMEOUT = "timeout"
    HTTP_STATUS = "http_status"  # the peer answered, but not 2xx
    BAD_RESPONSE = "bad_response"  # the peer answered with something that is not HTTP/1.x
    PARTITIONED = "partitioned"  # a FaultPlan blocked it
    BAD_ADDRESS = "bad_address"
    CLOSED = "closed"  # the transport was closed


class Transport(Protocol):
    """What :class:`~mesh.runtime.driver.MeshRuntime` needs to move frames.

    ``send`` returns the frames the peer sent back in reply (possibly none).
    """

    async def send(self, address: str, frame: bytes) -> list[bytes]: ...

    def status(self) -> dict[str, Any]: ...


@dataclasses.dataclass
class PeerTraffic:
    """Per-address counters of one transport."""

    sent: int = 0
    failed: int = 0
    in_flight: int = 0
    bytes_sent: int = 0
    lost: int = 0  # dropped by a FaultPlan's loss rule
    replies: int = 0  # frames the peer answered with in its responses
    last_error: str | None = None


class _Counted:
    """Per-address limiters and counters, shared by both transports."""

    def __init__(self, faults: FaultPlan | None, per_peer_concurrency: int) -> None:
        if per_peer_concurrency < 1:
            raise ValueError("per_peer_concurrency must be at least 1")
        self.faults = faults
        self.per_peer_concurrency = per_peer_concurrency
        self.peers: dict[str, PeerTraffic] = {}
        self._limiters: dict[str, trio.CapacityLimiter] = {}
        self._closed = False

    def _traffic(self, address: str) -> PeerTraffic:
        traffic = self.peers.get(address)
        if traffic is None:
            traffic = self.peers[address] = PeerTraffic()
            self._limiters[address] = trio.CapacityLimiter(self.per_peer_concurrency)
        return traffic

    def _fail(self, traffic: PeerTraffic, address: str, reason: str, message: str) -> SendError:
        traffic.failed += 1
        traffic.last_error = reason
        return SendError(reason, f"send to {address} failed: {message}")

    async def send(self, address: str, frame: bytes) -> list[bytes]:
        """Deliver one frame to ``address`` ("host:port"); its replies. Raises :class:`SendError`."""
        traffic = self._traffic(address)
        if self._closed:
            raise self._fail(traffic, address, SendError.CLOSED, "the transport is closed")
        verdict = self.faults.outgoing(address) if self.faults is not None else Verdict()
        if verdict.blocked:
            raise self._fail(traffic, address, SendError.PARTITIONED, "partitioned by the fault plan")
        async with self._limiters[address]:
            traffic.in_flight += 1
            try:
                if verdict.delay:
                    await trio.sleep(verdict.delay)
                if verdict.lost:
                    traffic.lost += 1
                    return []
                replies = await self._deliver(traffic, address, frame)
            finally:
                traffic.in_flight -= 1
        traffic.sent += 1
        traffic.bytes_sent += len(frame)
        traffic.replies += len(replies)
        return replies

    async def _deliver(self, traffic: PeerTraffic, address: str, frame: bytes) -> list[bytes]:
        raise NotImplementedError

    def status(self) -> dict[str, Any]:
        """Per-peer traffic, plus totals."""
        peers = {address: dataclasses.asdict(t) for address, t in self.peers.items()}
        return {
            "sent": sum(t.sent for t in self.peers.values()),
            "failed": sum(t.failed for t in self.peers.values()),
            "in_flight": sum(t.in_flight for t in self.peers.values()),
            "peers": peers,
            "faults": dict(self.faults.counters) if self.faults is not None else {},
            "fault_plan": self.faults.describe() if self.faults is not None else None,
        }


class HttpTransport(_Counted):
    """POSTs frames over kept-alive connections: a timeout per request, at most
    ``per_peer_concurrency`` requests in flight to one address.

    By default the client is :class:`~mesh.runtime.http_client.FrameClient`, made for
    this one request (httpx's per-request machinery cost about as much as the rest of the
    exchange). An ``httpx.AsyncClient`` passed in (tests hand it a ``MockTransport``) is
    used instead, and stays the caller's to close; a client made here is closed by
    :meth:`aclose`. Neither reads proxy environment variables: mesh traffic is LAN traffic.
    """

    def __init__(
        self, *, client: httpx.AsyncClient | None = None, faults: FaultPlan | None = None, timeout: float = 5.0,
        per_peer_concurrency: int = 4, max_frame_bytes: int = 4 * 1024 * 1024,
    ) -> None:  # fmt: skip
        super().__init__(faults, per_peer_concurrency)
        self.max_frame_bytes = max_frame_bytes
        self._owns_client = client is None
        self._timeout_s = timeout
        self._timeout = httpx.Timeout(timeout)
        self.client: httpx.AsyncClient | FrameClient = client or FrameClient(
            path=FRAMES_PATH, content_type=_CONTENT_TYPE, max_body_bytes=_MAX_REPLIES * (max_frame_bytes + 4),
            max_idle=max(8, per_peer_concurrency),
        )  # fmt: skip
        self._urls: dict[str, str] = {}
        self._hosts: dict[str, tuple[str, int]] = {}

    def _url(self, address: str) -> str | None:
        url = self._urls.get(address)
        if url is None:
            match = _ADDRESS.match(address)
            if match is None or not 0 < int(match.group(2)) < 65536:
                return None
            url = self._urls[address] = f"http://{address}{FRAMES_PATH}"
            self._hosts[address] = (match.group(1).strip("[]"), int(match.group(2)))
        return url

    async def _deliver(self, traffic: PeerTraffic, address: str, frame: bytes) -> list[bytes]:
        url = self._url(address)
        if url is None:
            raise self._fail(traffic, address, SendError.BAD_ADDRESS, "not a host:port address")
        if isinstance(self.client, FrameClient):
            status, body = await self._post_lean(traffic, address, frame)
        else:
            status, body = await self._post_httpx(traffic, address, url, frame)
        if not 200 <= status < 300:
            raise self._fail(traffic, address, SendError.HTTP_STATUS, f"HTTP {status}")
        if status != 200 or not body:
            return []
        try:
            return unpack_frames(body, self.max_frame_bytes)
        except ValueError as exc:  # the frame was delivered; only its replies are lost (the engine copes)
            traffic.last_error = str(exc)
            return []

    async def _post_lean(self, traffic: PeerTraffic, address: str, frame: bytes) -> tuple[int, bytes]:
        host, port = self._hosts[address]
        try:
            return await self.client.post(host, port, frame, self._timeout_s)  # type: ignore[union-attr]
        except ResponseTimeout as exc:
            raise self._fail(traffic, address, SendError.TIMEOUT, str(exc)) from None
        except BadResponse as exc:
            raise self._fail(traffic, address, SendError.BAD_RESPONSE, str(exc)) from None
        except FrameClientError as exc:
            raise self._fail(traffic, address, SendError.CONNECT_FAILED, f"{type(exc).__name__}: {exc}") from None

    async def _post_httpx(self, traffic: PeerTraffic, address: str, url: str, frame: bytes) -> tuple[int, bytes]:
        try:
            response = await self.client.post(  # type: ignore[union-attr]
                url, content=frame, headers={"content-type": _CONTENT_TYPE}, timeout=self._timeout
            )
        except httpx.TimeoutException as exc:
            raise self._fail(traffic, address, SendError.TIMEOUT, type(exc).__name__) from None
        except (httpx.RemoteProtocolError, httpx.DecodingError) as exc:
            raise self._fail(traffic, address, SendError.BAD_RESPONSE, f"{type(exc).__name__}: {exc}") from None
        except (httpx.HTTPError, httpx.InvalidURL) as exc:
            raise self._fail(traffic, address, SendError.CONNECT_FAILED, f"{type(exc).__name__}: {exc}") from None
        return response.status_code, response.content

    async def aclose(self) -> None:
        """Refuse further sends; close the client if this transport made it."""
        self._closed = True
        if self._owns_client:
            await self.client.aclose()


class MemoryHub:
    """Runtimes by address, in one process: the network of :class:`MemoryTransport`."""

    def __init__(self) -> None:
        self.runtimes: dict[str, MeshRuntime] = {}

    def attach(self, address: str, runtime: MeshRuntime) -> None:
        self.runtimes[address] = runtime

    def detach(self, address: str) -> None:
        self.runtimes.pop(address, None)


class MemoryTransport(_Counted):
    """Hands frames to the runtime attached at the destination address; no sockets."""

    def __init__(
        self, hub: MemoryHub, *, source: str, faults: FaultPlan | None = None, per_peer_concurrency: int = 4
    ) -> None:
        super().__init__(faults, per_peer_concurrency)
        self.hub = hub
        self.source = source

    async def _deliver(self, traffic: PeerTraffic, address: str, frame: bytes) -> list[bytes]:
        runtime = self.hub.runtimes.get(address)
        if runtime is None:
            raise self._fail(traffic, address, SendError.CONNECT_FAILED, "nothing listens there")
        return await runtime.receive_frame(self.source, frame, reply_within=REPLY_WITHIN)

    async def aclose(self) -> None:
        self._closed = True


# -- the server side ----------------------------------------------------------------------


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
            await _respond(send, 200, pack_frames(replies), content_type=_FRAMES_TYPE)
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
    graceful_timeout: float = 2.0, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:  # fmt: skip
    """Serve ``app`` on ``sock`` until cancelled (or ``shutdown_trigger`` returns), with the
    server :func:`~web.server.serve_asgi` picks. The server takes ``sock`` over
    and closes it when it stops: ``sock`` must not be used afterwards."""
    limits = HttpLimits(graceful_timeout=graceful_timeout)
    await serve_asgi(app, sock, shutdown_trigger=shutdown_trigger, limits=limits, task_status=task_status)
