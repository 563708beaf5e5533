"""Frames over HTTP, the client side: kept-alive connections (:mod:`.http_client`), one
:class:`SendError` per failure, per-peer limits and counters.

A sealed frame is the body of ``POST http://{address}/mesh/v1/frames``
(``application/octet-stream``). The peer's endpoint (:mod:`.port`) waits up to
``REPLY_WITHIN`` seconds for its engine to handle the frame: if it answered (an ack for a
data batch, a pong, a gossip or repair reply), the answer is ``200`` with the reply frames
in the body (``application/x-hyphae-frames``: each frame as a 4-byte big-endian length
and the bytes); otherwise ``202`` with an empty body once the frame is queued, and the
replies follow as requests of their own. So a data batch and its ack cost one HTTP exchange.

Exceptions are translated once, here, at the boundary::

    MeshError (mesh.errors)
    └── SendError      the peer or the path to it is at fault: refused, timed out,
                       answered non-2xx, partitioned by a FaultPlan, or a bad address

:class:`~.memory_transport.MemoryTransport` is the fake beside :class:`HttpTransport`.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any, Protocol

import httpx
import trio

from ..errors import MeshError
from ..team import FRAME_VERSION
from .faults import FaultPlan, Verdict
from .http_client import BadResponse, FrameClient, FrameClientError, ResponseTimeout

__all__ = [
    "PROTOCOL_VERSION", "FRAMES_PATH", "HELLO_PATH", "FRAMES_TYPE", "REPLY_WITHIN", "SendError", "Transport",
    "CountedTransport", "PeerTraffic", "HttpTransport", "pack_frames", "unpack_frames",
]  # fmt: skip

log = logging.getLogger("hyphae.mesh.transport")

# What /mesh/v1/hello and the zeroconf TXT record advertise: the frame's version (2: frames
# bound to their sender, mesh.frame_auth), which members must share to read each other.
PROTOCOL_VERSION = FRAME_VERSION
FRAMES_PATH = "/mesh/v1/frames"
HELLO_PATH = "/mesh/v1/hello"
_CONTENT_TYPE = "application/octet-stream"
FRAMES_TYPE = b"application/x-hyphae-frames"
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


class CountedTransport:
    """Per-address limiters and counters, shared by both transports (real and fake)."""

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


class HttpTransport(CountedTransport):
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
