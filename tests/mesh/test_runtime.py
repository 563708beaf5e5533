"""The trio runtime: real engines, real HTTP on loopback, one trio process.

Each node is an engine + :class:`MeshRuntime` + :class:`HttpTransport` + an HTTP server (serve_mesh)
server on ``127.0.0.1``; nodes are stapled by ``PeerDiscovered``. Timer intervals are
small so the stories run in seconds. The first tests drive the runtime with a
scripted stand-in for the engine, to pin down timers, lanes and shutdown exactly: they
run on trio's virtual clock (``autojump_clock``) with the runtime reading the same clock,
so every deadline is exact and no test waits on the wall clock. The stories over real
sockets keep the wall clock; they wait for what they need with one generous hang guard
each, and never assert how long anything took. Each node holds its port for its whole
life (a bound socket that never listens), so a restart finds it free.
"""

from __future__ import annotations

import dataclasses
import itertools
import socket
from collections.abc import Callable

import numpy as np
import pytest
import trio

from mesh.events import (
    ApplyRemoteBeacon, BeaconPlaced, CellStored, FrameDelivered, FrameReceived, PeerDiscovered, PeerStateChanged, SendFailed, SendFrame,
    SetTimer, Started, StoreRemoteCell, TimerFired,
)  # fmt: skip
from mesh.runtime import (
    FaultPlan, HttpTransport, MemoryHub, MemoryTransport, MeshRuntime, SendError, bind_mesh_socket, make_mesh_app,
    serve_mesh, wall_clock_ms,
)  # fmt: skip
from mesh.team import Team
from mesh.testing import make_engine
from mesh.wire import BeaconPayload, CellPayload
from node.energy import EnergyModel

ENERGY = EnergyModel()
DIM = 16
FAST = dict(
    gossip_interval_ms=100, probe_interval_ms=300, ping_timeout_ms=250, suspect_timeout_ms=600,
    dead_probe_interval_ms=400, repair_interval_ms=1000, ack_timeout_ms=300, max_attempts=3, flush_interval_ms=2,
)  # fmt: skip
_ids = itertools.count()


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)
    return v / np.linalg.norm(v)


def cell(vector: np.ndarray, *, created_at: int) -> CellPayload:
    return CellPayload(
        f"cell-{next(_ids)}", "t", "writer", "content", "Decision", 0.9, created_at,
        embedding=vector, embedding_space="space",
    )  # fmt: skip


def beacon(vector: np.ndarray) -> BeaconPayload:
    return BeaconPayload(f"beacon-{next(_ids)}", "t", "reader", "query", 0.8, embedding=vector, embedding_space="space")


wall_ms = wall_clock_ms
VIRTUAL_START_MS = 1_780_000_000_000


def virtual_ms() -> int:
    """The runtime's clock on trio's clock: under ``autojump_clock``, virtual milliseconds."""
    return VIRTUAL_START_MS + round(trio.current_time() * 1000)


async def eventually(predicate: Callable[[], bool]) -> None:
    """Poll until ``predicate()`` holds; the caller's ``trio.fail_after`` is the hang guard."""
    while not predicate():
        await trio.sleep(0.01)


class RecordingSink:
    """Keeps every effect with the trio time it arrived; ``fail`` makes ``apply`` raise."""

    def __init__(self, fail: Callable[[object], bool] = lambda effect: False) -> None:
        self.effects: list[tuple[float, object]] = []
        self.fail = fail

    async def apply(self, effect) -> None:
        self.effects.append((trio.current_time(), effect))
        if self.fail(effect):
            raise RuntimeError("the sink broke")

    def cells(self) -> dict[str, StoreRemoteCell]:
        return {e.cell.node_id: e for _, e in self.effects if isinstance(e, StoreRemoteCell)}

    def arrived_at(self, cell_id: str) -> float:
        return next(t for t, e in self.effects if isinstance(e, StoreRemoteCell) and e.cell.node_id == cell_id)

    def knows_beacon(self, beacon_id: str) -> bool:
        return any(isinstance(e, ApplyRemoteBeacon) and e.beacon.beacon_id == beacon_id for _, e in self.effects)

    def last_state(self, peer_id: str) -> str | None:
        states = [e.state for _, e in self.effects if isinstance(e, PeerStateChanged) and e.peer_id == peer_id]
        return states[-1] if states else None


@dataclasses.dataclass(eq=False)
class LiveNode:
    """One node of the mesh under test; ``start``/``stop`` run and cancel its runtime and server."""

    name: str
    engine: object
    sink: RecordingSink
    faults: FaultPlan
    held: socket.socket  # bound, never listening: the port stays ours while the node is down
    runtime: MeshRuntime | None = None
    scope: trio.CancelScope | None = None
    stopped: trio.Event | None = None

    @property
    def port(self) -> int:
        return self.held.getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def node_id(self) -> str:
        return self.engine.node_id

    async def start(self, nursery: trio.Nursery) -> None:
        await nursery.start(self._serve)

    async def stop(self) -> None:
        self.scope.cancel()
        with trio.fail_after(5):
            await self.stopped.wait()

    async def _serve(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.stopped = trio.Event()
        sock = bind_mesh_socket("127.0.0.1", self.port)  # the same port on every restart: ``held`` keeps it
        transport = HttpTransport(faults=self.faults, timeout=2.0)
        self.runtime = MeshRuntime(self.engine, transport=transport, sink=self.sink)
        app = make_mesh_app(self.runtime, max_frame_bytes=self.engine.config.limits.max_frame_bytes)
        try:
            with trio.CancelScope() as self.scope:
                async with trio.open_nursery() as nursery:
                    await nursery.start(serve_mesh, app, sock)
                    await nursery.start(self.runtime.run)
                    task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await transport.aclose()
            self.stopped.set()

    def submit(self, event) -> None:
        self.runtime.submit(event)


@pytest.fixture
def make_nodes():
    """``make_nodes(*names, team=, sinks=)``: nodes whose ports are held until the test ends."""
    held: list[socket.socket] = []

    def make(*names: str, team: Team | None = None, sinks: dict[str, RecordingSink] | None = None) -> list[LiveNode]:
        team = team or Team.create()
        nodes = []
        for i, name in enumerate(names):
            # SO_REUSEADDR on both sockets lets the server bind beside this one, which never
            # listens; nobody else's port-0 bind or outgoing connection can take the port.
            held.append(bind_mesh_socket("127.0.0.1", 0))
            engine = make_engine(f"127.0.0.1:{held[-1].getsockname()[1]}", team, ENERGY, seed=i, **FAST)
            sink = (sinks or {}).get(name) or RecordingSink()
            nodes.append(LiveNode(name, engine, sink, FaultPlan(seed=len(nodes)), held[-1]))
        return nodes

    yield make
    for sock in held:
        sock.close()


async def start_mesh(nursery: trio.Nursery, nodes: list[LiveNode]) -> None:
    """Start every node and staple each to the first."""
    for node in nodes:
        await node.start(nursery)
    for node in nodes[1:]:
        node.submit(PeerDiscovered(nodes[0].address))
    await eventually(lambda: all(len(n.engine.peers) == len(nodes) - 1 for n in nodes))


# -- the runtime with a scripted engine ---------------------------------------------------


class ScriptedEngine:
    """Stands in for MeshEngine: records what it is handed, answers from a script."""

    def __init__(self, script: Callable[[object, int], list]) -> None:
        self.script = script
        self.handled: list[tuple[int, object]] = []

    def handle(self, event, now_ms: int) -> list:
        self.handled.append((now_ms, event))
        return self.script(event, now_ms)

    def status(self) -> dict:
        return {"node_id": "scripted"}

    def events(self, kind: type) -> list:
        return [(at, e) for at, e in self.handled if isinstance(e, kind)]


class ScriptedTransport:
    """Fails for addresses in ``down``, blocks for addresses in ``hang``, records the rest."""

    def __init__(self, down=(), hang=()) -> None:
        self.down, self.hang = set(down), set(hang)
        self.sent: list[tuple[str, bytes]] = []

    async def send(self, address: str, frame: bytes) -> None:
        if address in self.hang:
            await trio.sleep_forever()
        if address in self.down:
            raise SendError(SendError.CONNECT_FAILED, "down")
        self.sent.append((address, frame))

    def status(self) -> dict:
        return {"sent": len(self.sent)}


async def test_a_new_deadline_replaces_the_old_and_timers_fire_on_time(autojump_clock):
    def script(event, now):
        if isinstance(event, Started):
            return [SetTimer("gossip", now + 400), SetTimer("repair", now + 100)]
        if isinstance(event, TimerFired) and event.name == "repair":
            return [SetTimer("gossip", now + 100)]  # moves gossip earlier than 400
        return []

    engine = ScriptedEngine(script)
    runtime = MeshRuntime(engine, transport=ScriptedTransport(), sink=RecordingSink(), clock=virtual_ms)
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            started_at = engine.handled[0][0]
            await trio.sleep(1.0)  # virtual: well past the replaced 400 ms deadline
            nursery.cancel_scope.cancel()
    (repair_at, repair), (gossip_at, gossip) = engine.events(TimerFired)  # exactly two: 400 never fired
    assert (repair.name, gossip.name) == ("repair", "gossip")
    assert (repair_at, gossip_at) == (started_at + 100, started_at + 200)


async def test_a_new_runtime_for_the_same_engine_inherits_its_pending_timers(autojump_clock):
    """The engine re-emits SetTimer only when a deadline changes, so pending ones must survive a restart."""
    starts = []

    def script(event, now):
        if isinstance(event, Started):
            starts.append(now)
            return [SetTimer("repair", now + 150)] if len(starts) == 1 else []
        return []

    engine = ScriptedEngine(script)

    def runtime() -> MeshRuntime:
        return MeshRuntime(engine, transport=ScriptedTransport(), sink=RecordingSink(), clock=virtual_ms)

    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime().run)
            await trio.sleep(0.05)  # virtual: stopped 50 ms in, before the deadline
            nursery.cancel_scope.cancel()
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime().run)
            await eventually(lambda: engine.events(TimerFired))
            nursery.cancel_scope.cancel()
    ((fired_at, fired),) = engine.events(TimerFired)
    assert fired.name == "repair" and starts == [starts[0], starts[0] + 50] and fired_at == starts[0] + 150


async def test_effects_go_to_lanes_the_sink_and_failures_come_back_as_send_failed(autojump_clock):
    def script(event, now):
        if isinstance(event, PeerDiscovered):
            return [SendFrame("up:1", b"one", 0, True), PeerStateChanged("p", "up:1", "alive"),
                    SendFrame("down:1", b"two", 0, True), SendFrame("up:1", b"three", 0, True),
                    SendFrame("up:1", b"data", 10, False, batch_id=7), SendFrame("down:1", b"lost", 10, False, batch_id=8)]  # fmt: skip
        return []

    engine, transport, sink = ScriptedEngine(script), ScriptedTransport(down={"down:1"}), RecordingSink()
    runtime = MeshRuntime(engine, transport=transport, sink=sink, clock=virtual_ms)
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            runtime.submit(PeerDiscovered("x"))
            await eventually(lambda: len(engine.events(SendFailed)) == 2 and engine.events(FrameDelivered))
            nursery.cancel_scope.cancel()
    assert transport.sent == [("up:1", b"one"), ("up:1", b"three"), ("up:1", b"data")]  # one lane per address, in order
    assert [e for _, e in sink.effects] == [PeerStateChanged("p", "up:1", "alive")]
    assert [e for _, e in engine.events(SendFailed)] == [SendFailed("down:1")] * 2
    assert [e for _, e in engine.events(FrameDelivered)] == [FrameDelivered("up:1", 7)]  # data batches only, once taken
    assert runtime.counters["send_failures"] == 2


class AnsweringTransport(ScriptedTransport):
    """Records sends like ScriptedTransport; the peer answers each in its response."""

    async def send(self, address: str, frame: bytes) -> list[bytes]:
        await super().send(address, frame)
        return [b"answer to " + frame]


async def test_frames_say_whether_a_reply_can_ride_back_and_whether_they_came_in_a_response(autojump_clock):
    def script(event, now):
        if isinstance(event, PeerDiscovered):
            return [SendFrame("up:1", b"out", 0, True)]
        if isinstance(event, FrameReceived) and event.frame == b"request":
            return [SendFrame("peer:1", b"ack", 0, True, in_reply=True),
                    SendFrame("peer:1", b"data", 10, False, in_reply=True, batch_id=3)]  # fmt: skip
        return []

    engine, transport = ScriptedEngine(script), AnsweringTransport()
    runtime = MeshRuntime(engine, transport=transport, sink=RecordingSink(), clock=virtual_ms)
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            # From the endpoint: its replies, a data batch among them, go back in the response.
            assert await runtime.receive_frame("peer:1", b"request", reply_within=1.0) == [b"ack", b"data"]
            # Sent by us: what the peer answered in its response comes in marked as such.
            runtime.submit(PeerDiscovered("x"))
            await eventually(lambda: len(engine.events(FrameReceived)) == 2)
            nursery.cancel_scope.cancel()
    assert [e for _, e in engine.events(FrameReceived)] == [
        FrameReceived("peer:1", b"request", replies_ride=True),
        FrameReceived("up:1", b"answer to out", in_response=True),
    ]
    assert transport.sent == [("up:1", b"out")]  # nothing of the replies went as a request of its own
    assert (runtime.counters["replies_in_response"], runtime.counters["data_frames_in_response"]) == (2, 1)


async def test_a_full_lane_drops_frames_and_shutdown_leaves_nothing_running(autojump_clock):
    frames = [SendFrame("slow:1", bytes([i]), 0, True) for i in range(10)]
    engine = ScriptedEngine(lambda event, now: frames if isinstance(event, PeerDiscovered) else [])
    runtime = MeshRuntime(
        engine, transport=ScriptedTransport(hang={"slow:1"}), sink=RecordingSink(), peer_queue_limit=2,
        per_peer_concurrency=1, clock=virtual_ms,
    )  # fmt: skip
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            runtime.submit(PeerDiscovered("x"))
            await eventually(lambda: runtime.counters["frames_dropped_queue_full"] == 8)
            assert runtime.status()["runtime"]["lanes"]["slow:1"]["dropped"] == 8
            nursery.cancel_scope.cancel()  # a send hangs forever: cancellation must still be clean
    status = runtime.status()["runtime"]
    assert status["running"] is False and status["lanes"] == {}


async def test_an_idle_lane_retires_and_comes_back(autojump_clock):
    frame = SendFrame("p:1", b"f", 0, True)
    engine = ScriptedEngine(lambda event, now: [frame] if isinstance(event, PeerDiscovered) else [])
    transport = ScriptedTransport()
    runtime = MeshRuntime(engine, transport=transport, sink=RecordingSink(), lane_idle_timeout=0.05, clock=virtual_ms)
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            runtime.submit(PeerDiscovered("x"))
            await eventually(lambda: len(transport.sent) == 1)
            await eventually(lambda: runtime.status()["runtime"]["lanes"] == {})
            runtime.submit(PeerDiscovered("x"))
            await eventually(lambda: len(transport.sent) == 2)
            nursery.cancel_scope.cancel()


async def test_submitted_events_are_handled_in_order_after_started():
    engine = ScriptedEngine(lambda event, now: [])
    runtime = MeshRuntime(engine, transport=ScriptedTransport(), sink=RecordingSink(), clock=lambda: 42)
    for i in range(5):
        runtime.submit(PeerDiscovered(f"n{i}"))  # before run: queued, handled after Started
    with trio.fail_after(3):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            await eventually(lambda: len(engine.handled) == 6)
            nursery.cancel_scope.cancel()
    assert [e for _, e in engine.handled] == [Started(), *(PeerDiscovered(f"n{i}") for i in range(5))]
    assert {at for at, _ in engine.handled} == {42}  # the injected clock, read once per event


# -- real engines over HTTP ---------------------------------------------------------------


async def test_a_cell_reaches_the_interested_node_only(make_nodes):
    a, b, c = make_nodes("alice", "bob", "carol")
    with trio.fail_after(120):  # a hang guard only: on a machine at load 20-30 one delivery took over 2 s
        async with trio.open_nursery() as nursery:
            await start_mesh(nursery, [a, b, c])
            wanted, unrelated = beacon(unit(1)), beacon(unit(2))
            b.submit(BeaconPlaced(wanted))
            c.submit(BeaconPlaced(unrelated))
            await eventually(lambda: a.sink.knows_beacon(wanted.beacon_id) and a.sink.knows_beacon(unrelated.beacon_id))

            latencies = []
            for _ in range(5):
                stored = cell(unit(1), created_at=wall_ms())
                stored_at = trio.current_time()
                a.submit(CellStored(stored))
                await eventually(lambda: stored.node_id in b.sink.cells())
                latencies.append((b.sink.arrived_at(stored.node_id) - stored_at) * 1000)
            got = b.sink.cells()[stored.node_id]
            assert got.cell == stored and got.origin_node == a.node_id and got.hops == 1
            # Each data batch was acknowledged in the response to its own POST: no ACK request.
            await eventually(lambda: a.engine.outbox.inflight(b.node_id) == 0)
            # Carol got nothing, and nothing is on its way to her: alice routes a cell when it
            # is stored, and sent five diffs in all (resends aside), each acknowledged by bob; none is queued.
            sent = a.engine.counters.data_diffs_sent - a.engine.counters.data_diffs_resent
            assert sent == 5 and a.engine.outbox.depth(c.node_id) == 0
            assert a.engine.outbox.inflight(c.node_id) == 0 and c.engine.counters.cells_delivered == 0
            assert c.sink.cells() == {}
            assert a.runtime.status()["transport"]["failed"] == 0
            assert b.runtime.counters["replies_in_response"] >= 5 and a.runtime.counters["replies_received"] >= 5
            nursery.cancel_scope.cancel()
    print(f"A store -> B sink over loopback HTTP: first {latencies[0]:.1f} ms, "
          f"then {', '.join(f'{x:.1f}' for x in latencies[1:])} ms")  # `pytest -rP` shows it  # fmt: skip


async def test_a_node_that_was_down_catches_up_through_repair(make_nodes):
    a, b = make_nodes("alice", "bob")
    topic = beacon(unit(3))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_mesh(nursery, [a, b])
            b.submit(BeaconPlaced(topic))
            await eventually(lambda: a.sink.knows_beacon(topic.beacon_id))

            await b.stop()
            await eventually(lambda: a.sink.last_state(b.node_id) == "dead")
            missed = [cell(unit(3), created_at=wall_ms()) for _ in range(3)]
            for stored in missed:
                a.submit(CellStored(stored))
            # alice handled the three stores: bob is dead to her, so none was sent
            await eventually(lambda: a.engine.status()["drops"].get("peer_dead", 0) == 3)
            assert b.sink.cells() == {}

            await b.start(nursery)  # the same engine and diff log, a new runtime and server, the same port
            await eventually(lambda: {m.node_id for m in missed} <= set(b.sink.cells()))
            assert b.engine.counters.repairs_requested >= 1
            assert a.engine.status()["drops"].get("peer_dead", 0) == 3  # never sent directly: repair did it
            nursery.cancel_scope.cancel()


async def test_a_partition_made_by_fault_plans_heals(make_nodes):
    a, b = make_nodes("alice", "bob")
    topic = beacon(unit(4))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_mesh(nursery, [a, b])
            b.submit(BeaconPlaced(topic))
            await eventually(lambda: a.sink.knows_beacon(topic.beacon_id))

            a.faults.partition(b.address)
            b.faults.partition(a.address)
            cut = cell(unit(4), created_at=wall_ms())
            a.submit(CellStored(cut))
            await eventually(lambda: a.sink.last_state(b.node_id) == "dead")
            assert cut.node_id not in b.sink.cells()
            assert a.runtime.status()["transport"]["faults"]["blocked_out"] > 0

            a.faults.heal()
            b.faults.heal()
            await eventually(lambda: cut.node_id in b.sink.cells())
            await eventually(lambda: a.sink.last_state(b.node_id) == "alive")
            nursery.cancel_scope.cancel()


async def test_a_sink_that_raises_does_not_stop_the_runtime(make_nodes):
    broken = RecordingSink(fail=lambda effect: isinstance(effect, (StoreRemoteCell, ApplyRemoteBeacon)))
    a, b = make_nodes("alice", "bob", sinks={"bob": broken})
    topic = beacon(unit(5))
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await start_mesh(nursery, [a, b])
            b.submit(BeaconPlaced(topic))
            await eventually(lambda: a.sink.knows_beacon(topic.beacon_id))
            cells = [cell(unit(5), created_at=wall_ms()) for _ in range(3)]
            for stored in cells:
                a.submit(CellStored(stored))
            await eventually(lambda: len(b.sink.cells()) == 3)
            assert b.runtime.counters["sink_errors"] == 3
            assert b.runtime.status()["runtime"]["running"] is True
            nursery.cancel_scope.cancel()


async def test_the_same_story_over_the_in_memory_transport(autojump_clock):
    """The fake beside the real transport runs the same engines the same way (on virtual time)."""
    team, hub = Team.create(), MemoryHub()
    names = ("mem-a", "mem-b")
    engines = {n: make_engine(n, team, ENERGY, **FAST) for n in names}
    sinks = {n: RecordingSink() for n in names}
    faults = {n: FaultPlan() for n in names}
    runtimes = {
        n: MeshRuntime(engines[n], transport=MemoryTransport(hub, source=n, faults=faults[n]), sink=sinks[n],
                       clock=virtual_ms)
        for n in names
    }  # fmt: skip
    for n in names:
        hub.attach(n, runtimes[n])
    topic = beacon(unit(6))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for n in names:
                await nursery.start(runtimes[n].run)
            runtimes["mem-b"].submit(PeerDiscovered("mem-a"))
            runtimes["mem-b"].submit(BeaconPlaced(topic))
            await eventually(lambda: sinks["mem-a"].knows_beacon(topic.beacon_id))
            stored = cell(unit(6), created_at=virtual_ms())
            runtimes["mem-a"].submit(CellStored(stored))
            await eventually(lambda: stored.node_id in sinks["mem-b"].cells())
            faults["mem-a"].partition("mem-b")
            faults["mem-b"].partition("mem-a")
            await eventually(lambda: sinks["mem-a"].last_state(engines["mem-b"].node_id) == "dead")
            hub.detach("mem-b")
            faults["mem-a"].heal()
            with pytest.raises(SendError, match="nothing listens"):
                await runtimes["mem-a"].transport.send("mem-b", b"frame")
            nursery.cancel_scope.cancel()
    assert runtimes["mem-a"].status()["transport"]["failed"] > 0
