"""Frames queued while the engine task is busy are ingested together, and no ack outruns its commit.

The runtime hands the remote cells of every event already queued to one ``apply_many`` (one
durable commit on a node). What a user relies on is that an acknowledged write survives a
crash: an ack, alone, on a data frame or in a response, may only leave once the write of the
cell it acknowledges has committed. The sink and the transport here write to one shared log,
so the order of commits and sends can be read off it.
"""

from __future__ import annotations

import dataclasses

import trio

from mesh.events import FrameReceived, PeerStateChanged, SendFrame, SetTimer, StoreRemoteCell
from mesh.runtime import MeshRuntime

from .test_runtime import ScriptedEngine, ScriptedTransport, cell, eventually, unit, wall_ms


def store(name: str) -> StoreRemoteCell:
    payload = dataclasses.replace(cell(unit(1), created_at=wall_ms()), node_id=name)
    return StoreRemoteCell(payload, "origin", 1, b"sig")


async def queue_in_order(nursery: trio.Nursery, runtime: MeshRuntime, deliveries) -> None:
    """Start each delivery once the one before it is queued (trio does not promise task order)."""
    for deliver, *args in deliveries:
        queued = runtime.counters["frames_queued"]
        nursery.start_soon(deliver, *args)
        await eventually(lambda: runtime.counters["frames_queued"] > queued)


class CommitLog:
    """A sink whose ``apply_many`` is a commit that the test holds open until ``gate`` is set."""

    def __init__(self, log: list[tuple[str, ...]]) -> None:
        self.log = log
        self.gate = trio.Event()
        self.entered = trio.Event()
        self.runs: list[list[str]] = []

    async def _commit(self, names: list[str]) -> None:
        self.entered.set()
        await self.gate.wait()
        for _ in range(20):  # a commit yields to the loop while the writer thread works: sends could run
            await trio.lowlevel.checkpoint()
        self.runs.append(names)
        self.log.extend(("committed", name) for name in names)

    async def apply(self, effect) -> None:
        if isinstance(effect, StoreRemoteCell):
            await self._commit([effect.cell.node_id])
        else:
            self.log.append(("applied", effect.state))

    async def apply_many(self, effects) -> None:
        await self._commit([e.cell.node_id for e in effects])


class LoggingTransport(ScriptedTransport):
    def __init__(self, log: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.log = log

    async def send(self, address: str, frame: bytes) -> None:
        self.log.append(("sent", frame.decode()))
        await super().send(address, frame)


def engine_acking_each_frame() -> ScriptedEngine:
    """Frame ``cN`` holds cell ``cN``: its ack rides back in the response when the sender waits,
    else it rides on a data frame of ours; ``state`` frames change a peer's state (a sink effect)."""

    def script(event, now):
        if not isinstance(event, FrameReceived):
            return []
        name = event.frame.decode()
        if name.startswith("state"):
            return [PeerStateChanged("p", "peer:1", name)]
        ack = SendFrame("peer:1", f"ack {name}".encode(), 0, True, in_reply=True)
        if not event.replies_ride:
            ack = SendFrame("peer:1", f"data+ack {name}".encode(), 10, False, batch_id=1)
        return [store(name), SetTimer("ack", now + 10_000), ack]

    return ScriptedEngine(script)


async def test_frames_queued_during_a_commit_share_the_next_one_and_their_acks_wait_for_it():
    log: list[tuple[str, ...]] = []
    sink, transport = CommitLog(log), LoggingTransport(log)
    runtime = MeshRuntime(engine_acking_each_frame(), transport=transport, sink=sink)
    replies: dict[str, list[bytes]] = {}

    async def deliver(name: str, wait: bool) -> None:
        got = await runtime.receive_frame("peer:1", name.encode(), reply_within=5.0 if wait else None)
        for frame in got:
            log.append(("replied", frame.decode()))
        replies[name] = got

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            nursery.start_soon(deliver, "c1", True)
            await sink.entered.wait()  # c1's commit is open: the engine task is busy
            await queue_in_order(nursery, runtime, [(deliver, "c2", True), (deliver, "c3", False), (deliver, "c4", True)])
            sink.gate.set()
            await eventually(lambda: len(replies) == 4 and len(transport.sent) == 1)
            nursery.cancel_scope.cancel()

    assert sink.runs == [["c1"], ["c2", "c3", "c4"]]  # the queued frames: one commit, not three
    assert runtime.counters["store_runs"] == 1
    assert replies == {"c1": [b"ack c1"], "c2": [b"ack c2"], "c3": [], "c4": [b"ack c4"]}
    for name in ("c1", "c2", "c3", "c4"):
        committed = log.index(("committed", name))
        acked = next(i for i, entry in enumerate(log) if entry[0] in ("sent", "replied") and entry[1].endswith(name))
        assert committed < acked, f"the ack for {name} left before its write committed: {log}"


async def test_a_sink_effect_between_cells_keeps_its_place():
    log: list[tuple[str, ...]] = []
    sink = CommitLog(log)
    runtime = MeshRuntime(engine_acking_each_frame(), transport=LoggingTransport(log), sink=sink)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            nursery.start_soon(runtime.receive_frame, "peer:1", b"c1")
            await sink.entered.wait()
            for name in ("c2", "state-x", "c3", "c4"):
                await runtime.receive_frame("peer:1", name.encode())  # queued; no reply awaited
            sink.gate.set()
            await eventually(lambda: ("committed", "c4") in log)
            nursery.cancel_scope.cancel()

    assert sink.runs == [["c1"], ["c2"], ["c3", "c4"]]
    applied = [entry for entry in log if entry[0] in ("committed", "applied")]
    assert applied == [("committed", "c1"), ("committed", "c2"), ("applied", "state-x"),
                       ("committed", "c3"), ("committed", "c4")]  # fmt: skip
