"""The fake beside :class:`~.transport.HttpTransport`: frames handed to another runtime in this process.

:class:`MemoryTransport` delivers straight to the ``receive_frame`` of the runtime attached
at the destination address of a :class:`MemoryHub`, through the same :class:`FaultPlan`,
limits and counters as the real transport, so the same tests run over both
(``tests/mesh/test_transport_conformance.py``).
"""

from __future__ import annotations

from .driver import MeshRuntime
from .faults import FaultPlan
from .transport import REPLY_WITHIN, PeerTraffic, SendError, CountedTransport

__all__ = ["MemoryHub", "MemoryTransport"]


class MemoryHub:
    """Runtimes by address, in one process: the network of :class:`MemoryTransport`."""

    def __init__(self) -> None:
        self.runtimes: dict[str, MeshRuntime] = {}

    def attach(self, address: str, runtime: MeshRuntime) -> None:
        self.runtimes[address] = runtime

    def detach(self, address: str) -> None:
        self.runtimes.pop(address, None)


class MemoryTransport(CountedTransport):
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
