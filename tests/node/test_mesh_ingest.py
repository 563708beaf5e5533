"""Remote cells in, and the mesh's diff log: batches cost one write job, and lose nothing.

A data batch from a peer reaches the node as a run of ``StoreRemoteCell`` effects
(``MeshLink.apply_many``); its cells are stored as one job of the group committer. The
diff log's rows put in a row share one job too. Both must stay exact: known cells are
not stored twice, one bad cell does not hold back its batch, and a batch the writer runs
again (another job of its commit failed) writes the same rows.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid

import numpy as np
import trio

from mesh import events as ev
from mesh.identity import NodeIdentity
from mesh.wire import CellPayload, PeerPayload, sign_diff
from app.mesh_link import MeshLink
from node.store.diff_log import SqliteDiffLog

TOPIC = "the postgres connection pool size"


def remote_cell(service, origin: NodeIdentity, seq: int, text: str, **fields) -> ev.StoreRemoteCell:
    payload = CellPayload(
        str(uuid.uuid4()), service.config.tenant_id, "their-agent", text, "Decision", 0.9, 1_780_000_000_000 + seq,
        embedding=service.embedder.embed([text])[0], embedding_space=service.embedder.space, **fields,
    )  # fmt: skip
    return ev.StoreRemoteCell(payload, origin.node_id, 1, b"\x01" * 64, seq)


async def reader_and_link(service, make_agent) -> tuple:
    """An agent with a beacon on TOPIC, the node's mesh link, and a remote origin."""
    reader, _ = await make_agent()
    with trio.fail_after(10):
        await service.place_beacon(reader, query=TOPIC, threshold=0.5)
    return reader, MeshLink(service, lambda event: None), NodeIdentity.generate()


async def inbox_ids(service, principal) -> list[str]:
    with trio.fail_after(10):
        return [d["node_id"] for d in (await service.inbox(principal, limit=100))["diffs"]]


async def test_a_batch_of_remote_cells_is_one_write_job_and_reaches_the_inbox(service, make_agent):
    reader, link, origin = await reader_and_link(service, make_agent)
    batch = [remote_cell(service, origin, seq, f"{TOPIC} {seq}") for seq in range(1, 21)]

    jobs = service.db.jobs
    with trio.fail_after(10):
        await link.apply_many(batch)
    assert service.db.jobs - jobs == 1, "the batch's cells did not share one write job"
    assert sorted(await inbox_ids(service, reader)) == sorted(e.cell.node_id for e in batch)
    stored = service.cell_record(batch[0].cell.node_id)
    assert (stored.origin_node, stored.hops, stored.signature) == (origin.node_id, 1, b"\x01" * 64)
    assert link.status()["cells_received_from"] == {origin.node_id: 20}

    # The same batch again (a retransmission that crossed its ack): nothing new, nothing counted.
    with trio.fail_after(10):
        await link.apply_many(batch)
    assert len(await inbox_ids(service, reader)) == 20
    assert link.status()["cells_received"] == 20


class _OneBatchEngine:
    """An engine whose only answer, to the first frame it is handed, is one data batch's cells."""

    def __init__(self, effects: list) -> None:
        self.effects = effects

    def handle(self, event, now_ms: int) -> list:
        if isinstance(event, ev.FrameReceived):
            effects, self.effects = self.effects, []
            return effects
        return []


async def test_the_daemons_runtime_hands_a_batch_to_the_link_as_one_write_job(service, make_agent):
    # The daemon gives the runtime a sink that finds the link later (run_mesh's _LazySink);
    # the runtime batches only when its sink offers apply_many.
    from mesh.runtime import MemoryHub, MemoryTransport, MeshRuntime
    from app.mesh_node import _LazySink

    reader, link, origin = await reader_and_link(service, make_agent)
    batch = [remote_cell(service, origin, seq, f"{TOPIC} {seq}") for seq in range(1, 11)]
    runtime = MeshRuntime(
        _OneBatchEngine(batch), transport=MemoryTransport(MemoryHub(), source="me"), sink=_LazySink(lambda: link)
    )
    jobs = service.db.jobs
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            await runtime.receive_frame("peer", b"frame", reply_within=5)  # returns once handled
            nursery.cancel_scope.cancel()
    assert service.db.jobs - jobs == 1, "the batch's cells were not one write job"
    assert sorted(await inbox_ids(service, reader)) == sorted(e.cell.node_id for e in batch)


class _FrameBatchesEngine:
    """An engine that answers each frame with the cells scripted for it."""

    def __init__(self, batches: dict[bytes, list]) -> None:
        self.batches = batches

    def handle(self, event, now_ms: int) -> list:
        return self.batches.pop(event.frame, []) if isinstance(event, ev.FrameReceived) else []


async def test_frames_queued_together_are_ingested_as_one_write_job(service, make_agent):
    from mesh.runtime import MemoryHub, MemoryTransport, MeshRuntime
    from app.mesh_node import _LazySink

    reader, link, origin = await reader_and_link(service, make_agent)
    first = [remote_cell(service, origin, seq, f"{TOPIC} {seq}") for seq in range(1, 6)]
    second = [remote_cell(service, origin, seq, f"{TOPIC} {seq}") for seq in range(6, 9)]
    engine = _FrameBatchesEngine({b"f1": first, b"f2": second})
    runtime = MeshRuntime(engine, transport=MemoryTransport(MemoryHub(), source="me"), sink=_LazySink(lambda: link))
    jobs = service.db.jobs
    with trio.fail_after(10):
        # Both frames wait in the queue before the engine task starts: it takes them together.
        for frame in (b"f1", b"f2"):
            await runtime.receive_frame("peer", frame)
        async with trio.open_nursery() as nursery:
            await nursery.start(runtime.run)
            while link.cells_received < 8:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    assert service.db.jobs - jobs == 1, "each frame's cells were a write job of their own"
    assert sorted(await inbox_ids(service, reader)) == sorted(e.cell.node_id for e in first + second)


async def test_one_bad_cell_does_not_hold_back_its_batch(service, make_agent):
    reader, link, origin = await reader_and_link(service, make_agent)
    good = [remote_cell(service, origin, seq, f"{TOPIC} {seq}") for seq in range(1, 4)]
    bad = remote_cell(service, origin, 4, f"{TOPIC} 4", metadata={"not json": {1, 2}})  # a set: json.dumps fails
    with trio.fail_after(10):
        await link.apply_many([good[0], bad, *good[1:]])
    assert sorted(await inbox_ids(service, reader)) == sorted(e.cell.node_id for e in good)
    assert link.status()["cells_received"] == 3
    assert not service.db.query("SELECT 1 FROM cells WHERE node_id = ?", (bad.cell.node_id,))


def test_log_rows_put_in_a_row_share_one_job_and_survive_a_rerun_of_their_commit(tmp_path):
    from node.store.database import Database

    db = Database(tmp_path / "hyphae.db")
    try:
        log = SqliteDiffLog(db)
        me = NodeIdentity.generate()
        # Hold the writer on a first job, so the log's job and a failing one land in one commit.
        entered, release = threading.Event(), threading.Event()
        db.submit(lambda tx: (entered.set(), release.wait(10)))
        assert entered.wait(10)
        jobs = db.jobs
        for seq in range(1, 11):
            log.put(sign_diff(PeerPayload(f"127.0.0.1:{seq}"), origin=me.node_id, seq=seq, ts=seq, sign=me.sign), seq)
        failing = db.submit(lambda tx: 1 / 0)  # the commit runs again, each job on its own
        release.set()
        db.write_sync(lambda tx: None)  # everything before it is committed
        assert isinstance(failing.exception(timeout=10), ZeroDivisionError)
        assert db.jobs - jobs == 4, "ten puts were not one job (beside the blocker, the failing job and the barrier)"
        reopened = SqliteDiffLog(db)
        assert reopened.max_seq(me.node_id) == 10
        assert [d.payload.address for d in reopened.control_diffs()] == ["127.0.0.1:10"]
    finally:
        db.close()


# -- what the facade refuses from the mesh, and the provenance it keeps ---------------------


async def test_a_cell_from_the_mesh_is_signed_and_one_stored_here_is_not(service, make_agent):
    """``provenance.signed``: the copy carries its origin's signature, which the engine
    verified on arrival. A cell stored on this node is not: its row keeps no signature (the
    mesh signs its diff in the log when it goes out), and ``local`` says where it came from."""
    reader, link, origin = await reader_and_link(service, make_agent)
    remote = remote_cell(service, origin, 1, f"{TOPIC} from a teammate")
    with trio.fail_after(10):
        await link.apply_many([remote])
        here = (await service.store(reader, content=f"{TOPIC} decided here", cell_type="Decision"))["node_id"]
        got_remote = await service.get_cell(reader, node_id=remote.cell.node_id)
        got_here = await service.get_cell(reader, node_id=here)
    assert got_remote["provenance"] == {
        "origin_node": origin.node_id, "source_agent": "their-agent", "hops": 1, "signed": True, "local": False,
        "forgotten_by": None,
    }  # fmt: skip
    assert got_here["provenance"] == {
        "origin_node": service.node_id, "source_agent": reader.agent_id, "hops": 0, "signed": False, "local": True,
        "forgotten_by": None,
    }  # fmt: skip


async def test_a_cell_of_another_tenant_from_the_mesh_is_refused(service, make_agent):
    reader, link, origin = await reader_and_link(service, make_agent)
    foreign = [remote_cell(service, origin, seq, f"{TOPIC} {seq}") for seq in (1, 2)]
    foreign = [dataclasses.replace(e, cell=dataclasses.replace(e.cell, tenant_id=str(uuid.uuid4()))) for e in foreign]
    own = remote_cell(service, origin, 3, f"{TOPIC} 3")
    with trio.fail_after(10):
        await link.apply_many([foreign[0], own])  # a batch: the foreign cell alone is left out
        await link.apply(foreign[1])  # one cell on its own
    assert await inbox_ids(service, reader) == [own.cell.node_id]
    assert link.status()["cells_received"] == 1
    for effect in foreign:
        assert service.db.query_one("SELECT 1 FROM cells WHERE node_id = ?", (effect.cell.node_id,)) is None


async def test_only_a_cells_origin_may_forget_it_here(service, make_agent, clock):
    """The facade's own guard behind the engine's: a tombstone whose signer is not the
    origin of the row changes nothing; the origin's erases content and vector."""
    reader, link, origin = await reader_and_link(service, make_agent)
    remote = remote_cell(service, origin, 1, f"{TOPIC} a secret")
    mallory = NodeIdentity.generate()
    cell_id = remote.cell.node_id
    with trio.fail_after(10):
        await link.apply_many([remote])
        assert await service.apply_tombstone(cell_id, mallory.node_id, clock.now) is False
        await link.apply(ev.ApplyTombstone(cell_id, service.config.tenant_id, service.node_id, clock.now))
        kept = await service.get_cell(reader, node_id=cell_id)
        hits = await service.recall(reader, query=f"{TOPIC} a secret", k=5)
    assert kept["content"] == f"{TOPIC} a secret" and kept["forgotten_at"] is None
    assert cell_id in {hit["node_id"] for hit in hits["results"]}

    forgotten_at = clock.now - 5_000
    with trio.fail_after(10):
        assert await service.apply_tombstone(cell_id, origin.node_id, forgotten_at) is True
        gone = await service.get_cell(reader, node_id=cell_id)
        hits = await service.recall(reader, query=f"{TOPIC} a secret", k=5)
        assert await service.apply_tombstone(cell_id, origin.node_id, forgotten_at + 1) is False  # once only
    assert (gone["content"], gone["forgotten_at"], gone["provenance"]["forgotten_by"]) == ("", forgotten_at, "their-agent")
    assert cell_id not in {hit["node_id"] for hit in hits["results"]}
    row = service.db.query_one("SELECT length(embedding), forgotten_at FROM cells WHERE node_id = ?", (cell_id,))
    assert row == (0, forgotten_at)


class RecordingHooks:
    """The facade's mesh hooks, kept as calls."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __getattr__(self, name: str):
        return lambda *args: self.calls.append((name, *args))


async def test_a_forget_is_handed_to_the_mesh_once_with_its_time(service, make_agent, clock):
    alice, _ = await make_agent()
    node_id = (await service.store(alice, content="a secret to forget", cell_type="Fact"))["node_id"]
    service.mesh = hooks = RecordingHooks()
    with trio.fail_after(10), clock.frozen() as now:
        await service.forget(alice, node_id=node_id)
    assert hooks.calls == [("cell_forgotten", node_id, alice.tenant_id, now)]  # at once, not on a later call
    with trio.fail_after(10):
        assert (await service.forget(alice, node_id=node_id))["forgotten_at"] == now  # again: nothing new
    assert hooks.calls == [("cell_forgotten", node_id, alice.tenant_id, now)]


async def test_refusals_name_the_cell_and_why(service, make_agent):
    from tests.node.helpers import rejected

    alice, _ = await make_agent(projects=["apollo"])
    bob, _ = await make_agent()
    mine = (await service.store(alice, content="apollo's launch window", cell_type="Fact", project="apollo"))["node_id"]
    elsewhere = (await service.store(bob, content="gemini's budget", cell_type="Fact", project="gemini"))["node_id"]
    missing = str(uuid.uuid4())
    assert missing in (await rejected(service.get_cell(alice, node_id=missing), "not_found", "node_id")).message
    outside = await rejected(service.get_cell(alice, node_id=elsewhere), "forbidden", "node_id")
    assert elsewhere in outside.message and "'gemini'" in outside.message
    not_yours = await rejected(service.forget(bob, node_id=mine), "forbidden", "node_id")
    assert mine in not_yours.message and "only the agent that stored a cell may forget it" in not_yours.message


async def test_a_cell_from_another_embedding_space_is_embedded_again_here_once(service, make_agent):
    reader, link, origin = await reader_and_link(service, make_agent)
    elsewhere = [remote_cell(service, origin, seq, f"{TOPIC} from elsewhere {seq}") for seq in (1, 2)]
    elsewhere = [dataclasses.replace(e, cell=dataclasses.replace(e.cell, embedding_space="other-model/8",
                                                                 embedding=np.ones(8, np.float32))) for e in elsewhere]  # fmt: skip
    same = remote_cell(service, origin, 3, f"{TOPIC} in our space")
    embedded: list[list[str]] = []
    embed = service.inbound._embed

    async def counting(texts):
        embedded.append(list(texts))
        return await embed(texts)

    service.inbound._embed = counting
    with trio.fail_after(10):
        await link.apply_many([elsewhere[0]])
        await link.apply_many([elsewhere[0], elsewhere[1], same])  # the first is known by now
    assert embedded == [[elsewhere[0].cell.content], [elsewhere[1].cell.content]]  # a known cell is not embedded again
    for effect in elsewhere:
        record = service.cell_record(effect.cell.node_id)
        assert record.embedding_space == service.embedder.space
        np.testing.assert_array_equal(record.embedding, service.embedder.embed([effect.cell.content])[0])
    assert sorted(await inbox_ids(service, reader)) == sorted(e.cell.node_id for e in (*elsewhere, same))


async def test_a_bad_cell_in_a_batch_of_two_does_not_hold_back_the_other(service, make_agent):
    reader, link, origin = await reader_and_link(service, make_agent)
    good = remote_cell(service, origin, 1, f"{TOPIC} good")
    bad = remote_cell(service, origin, 2, f"{TOPIC} bad", metadata={"not json": {1, 2}})
    with trio.fail_after(10):
        await link.apply_many([bad, good])
    assert await inbox_ids(service, reader) == [good.cell.node_id]


async def test_a_batch_with_nothing_to_store_writes_only_its_quarantine_row(service, make_agent):
    """Another tenant's cell is never stored: the one write is the attempt to set its logged
    diff aside (here there is none in the log, so nothing is marked), never a cell write."""
    reader, link, origin = await reader_and_link(service, make_agent)
    foreign = remote_cell(service, origin, 1, f"{TOPIC} elsewhere")
    foreign = dataclasses.replace(foreign, cell=dataclasses.replace(foreign.cell, tenant_id="another-tenant"))
    jobs = service.db.jobs
    with trio.fail_after(10):
        await link.apply_many([foreign])
    assert service.db.jobs == jobs + 1 and await inbox_ids(service, reader) == []
    assert service.db.query("SELECT 1 FROM cells WHERE node_id = ?", (foreign.cell.node_id,)) == []
