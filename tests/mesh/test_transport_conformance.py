"""One suite, two transports: the in-memory fake and real HTTP on loopback behave alike.

Each test runs once over :class:`MemoryTransport` (runtimes handed frames in-process
through a :class:`MemoryHub`) and once over :class:`HttpTransport` (each node serving its
mesh port on a socket it bound itself to ``127.0.0.1:0``, so no port is ever released and
taken again). What the engines see must not depend on which one carries their frames:
delivery to the interested node only, acknowledgements, failures reported with the same
reasons, a fault plan's partition and its heal, and a closed transport refusing.
Synchronisation is by polling with a deadline; nothing asserts on elapsed time.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable

import numpy as np
import pytest
import trio

from mesh.events import ApplyRemoteBeacon, BeaconPlaced, CellStored, PeerDiscovered, PeerStateChanged, StoreRemoteCell
from mesh.runtime import (
    FaultPlan, HttpTransport, MemoryHub, MemoryTransport, MeshRuntime, SendError, bind_mesh_socket, make_mesh_app,
    serve_mesh, wall_clock_ms,
)  # fmt: skip
from mesh.team import Team
from mesh.testing import make_engine
from mesh.wire import BeaconPayload, CellPayload

from .test_runtime import ENERGY, FAST, unit

HANG_GUARD = 60  # seconds: only a hung test ever meets it
_ids = itertools.count()


def cell(vector: np.ndarray) -> CellPayload:
    return CellPayload(
        f"conf-cell-{next(_ids)}", "t", "writer", "content", "Decision", 0.9, wall_clock_ms(),
        embedding=vector, embedding_space="space",
    )  # fmt: skip


def beacon(vector: np.ndarray) -> BeaconPayload:
    return BeaconPayload(f"conf-beacon-{next(_ids)}", "t", "reader", "query", 0.8, embedding=vector, embedding_space="space")


async def eventually(predicate: Callable[[], bool], what: str) -> None:
    """Poll until ``predicate`` holds; only the hang guard around the test bounds the wait."""
    while not predicate():
        await trio.sleep(0.01)


class Sink:
    def __init__(self) -> None:
        self.effects: list[object] = []

    async def apply(self, effect) -> None:
        self.effects.append(effect)

    def cells(self) -> set[str]:
        return {e.cell.node_id for e in self.effects if isinstance(e, StoreRemoteCell)}

    def knows_beacon(self, beacon_id: str) -> bool:
        return any(isinstance(e, ApplyRemoteBeacon) and e.beacon.beacon_id == beacon_id for e in self.effects)

    def last_state(self, peer_id: str) -> str | None:
        states = [e.state for e in self.effects if isinstance(e, PeerStateChanged) and e.peer_id == peer_id]
        return states[-1] if states else None


@dataclasses.dataclass(eq=False)
class Node:
    address: str
    runtime: MeshRuntime
    sink: Sink
    faults: FaultPlan

    @property
    def node_id(self) -> str:
        return self.runtime.engine.node_id

    def submit(self, event) -> None:
        self.runtime.submit(event)


class Network:
    """Makes nodes over one kind of transport and runs them in a nursery."""

    def __init__(self, kind: str, nursery: trio.Nursery) -> None:
        self.kind, self.nursery = kind, nursery
        self.team, self.hub = Team.create(), MemoryHub()
        self.nodes: list[Node] = []

    async def node(self) -> Node:
        seed = len(self.nodes)
        faults, sink = FaultPlan(seed=seed), Sink()
        if self.kind == "memory":
            address = f"mem-{seed}"
            engine = make_engine(address, self.team, ENERGY, seed=seed, **FAST)
            runtime = MeshRuntime(engine, transport=MemoryTransport(self.hub, source=address, faults=faults), sink=sink)
            self.hub.attach(address, runtime)
        else:
            sock = bind_mesh_socket("127.0.0.1", 0)  # held from here on: the server takes it over
            address = "127.0.0.1:%d" % sock.getsockname()[1]
            engine = make_engine(address, self.team, ENERGY, seed=seed, **FAST)
            transport = HttpTransport(faults=faults, timeout=2.0)
            runtime = MeshRuntime(engine, transport=transport, sink=sink)
            app = make_mesh_app(runtime, max_frame_bytes=engine.config.limits.max_frame_bytes)
            await self.nursery.start(serve_mesh, app, sock)
        await self.nursery.start(runtime.run)
        node = Node(address, runtime, sink, faults)
        self.nodes.append(node)
        return node

    async def aclose(self) -> None:
        for node in self.nodes:
            await node.runtime.transport.aclose()


@pytest.fixture(params=["memory", "http"])
async def network(request) -> AsyncIterator[Network]:
    with trio.fail_after(HANG_GUARD):
        async with trio.open_nursery() as nursery:
            net = Network(request.param, nursery)
            try:
                yield net
            finally:
                await net.aclose()
                nursery.cancel_scope.cancel()


async def staple(*nodes: Node) -> None:
    for node in nodes[1:]:
        node.submit(PeerDiscovered(nodes[0].address))
    await eventually(lambda: all(len(n.runtime.engine.peers) == len(nodes) - 1 for n in nodes), "every node known")


async def test_a_cell_reaches_the_interested_node_only_and_is_acknowledged(network):
    a, b, c = [await network.node() for _ in range(3)]
    await staple(a, b, c)
    wanted, unrelated = beacon(unit(1)), beacon(unit(2))
    b.submit(BeaconPlaced(wanted))
    c.submit(BeaconPlaced(unrelated))
    await eventually(lambda: a.sink.knows_beacon(wanted.beacon_id) and a.sink.knows_beacon(unrelated.beacon_id),
                     "the beacons replicating")  # fmt: skip
    stored = [cell(unit(1)) for _ in range(3)]
    for one in stored:
        a.submit(CellStored(one))
    await eventually(lambda: {s.node_id for s in stored} <= b.sink.cells(), "the cells reaching bob")
    await eventually(lambda: a.runtime.engine.outbox.inflight(b.node_id) == 0, "the last acknowledgement")
    # Carol's beacon is far from the cells: the engine never sent them her way, whatever carried the frames.
    assert not c.sink.cells() & {s.node_id for s in stored}
    status = a.runtime.status()["transport"]
    assert status["failed"] == 0 and status["sent"] > 0
    assert status["peers"][b.address]["bytes_sent"] > 0


async def test_a_send_to_where_nothing_listens_fails_as_connect_failed(network):
    a = await network.node()
    nowhere = "mem-nowhere" if network.kind == "memory" else "127.0.0.1:1"  # port 1: nothing listens (tcpmux)
    with pytest.raises(SendError) as caught:
        await a.runtime.transport.send(nowhere, b"frame")
    assert caught.value.reason == SendError.CONNECT_FAILED
    status = a.runtime.status()["transport"]
    assert status["failed"] == 1 and status["peers"][nowhere]["last_error"] == SendError.CONNECT_FAILED


async def test_a_partition_blocks_both_ways_and_its_heal_lets_the_cell_through(network):
    a, b = [await network.node() for _ in range(2)]
    await staple(a, b)
    topic = beacon(unit(4))
    b.submit(BeaconPlaced(topic))
    await eventually(lambda: a.sink.knows_beacon(topic.beacon_id), "the beacon replicating")
    a.faults.partition(b.address)
    b.faults.partition(a.address)
    with pytest.raises(SendError) as caught:
        await a.runtime.transport.send(b.address, b"frame")
    assert caught.value.reason == SendError.PARTITIONED
    cut = cell(unit(4))
    a.submit(CellStored(cut))
    await eventually(lambda: a.sink.last_state(b.node_id) == "dead", "alice declaring bob dead")
    assert cut.node_id not in b.sink.cells()
    a.faults.heal()
    b.faults.heal()
    await eventually(lambda: cut.node_id in b.sink.cells(), "the cell arriving after the heal")
    await eventually(lambda: a.sink.last_state(b.node_id) == "alive", "bob alive again")


async def test_a_closed_transport_refuses_with_closed(network):
    a, b = [await network.node() for _ in range(2)]
    await a.runtime.transport.aclose()
    with pytest.raises(SendError) as caught:
        await a.runtime.transport.send(b.address, b"frame")
    assert caught.value.reason == SendError.CLOSED
