"""A forgotten cell is gone from the data dir's files, not hidden; and only its author or the
data dir's owner may forget it.

Each story stores a secret, shows that its content, a rare word of it and its vector *are*
in the data dir's files (the database, the WAL, the index files), forgets it (locally, by a
tombstone from the mesh, or by a tombstone that came before the cell), waits for the
scrubber, and then finds none of them in any file (``tests.node.traces``).
"""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import trio

from app.mesh_link import MeshLink
from mesh import events as ev
from mesh.identity import NodeIdentity
from mesh.wire import CellPayload, TombstonePayload, sign_diff
from node.index import LayerIndex

from .helpers import rejected, second_tenant_key, store
from .traces import needles, traces

SECRET = "The staging vault passphrase is qxzylophonic7431; rotate it every month."
WORD = "ylophonic7431"  # the tail of its rarest word: what FTS5's segments keep of it
OTHERS = [f"note {i}: the connection pool of service {i} holds {10 + i} sockets" for i in range(12)]


def secret_needles(service, node_id: str | None = None, vector: np.ndarray | None = None) -> dict[str, bytes]:
    if vector is None:
        vector = service.storage.cells.record(node_id).embedding
    return needles(SECRET, WORD, vector)


async def on_disk(service) -> None:
    """Everything stored so far is in the index files too (HNSW's, saved)."""
    with trio.fail_after(30):
        await trio.to_thread.run_sync(service.layers.flush)
        await trio.to_thread.run_sync(service.layers.save)


async def scrubbed(service) -> None:
    with trio.fail_after(60):
        await trio.to_thread.run_sync(lambda: service.db.write_sync(lambda tx: None))  # queued log writes land
        assert await trio.to_thread.run_sync(service.forgetting.scrubbed, 55)


def wal_size(home) -> int:
    wal = home / "hyphae.db-wal"
    return wal.stat().st_size if wal.exists() else 0


async def test_a_forgotten_cell_leaves_no_byte_of_its_content_or_vector_in_the_data_dir(service, make_agent, home):
    alice, _ = await make_agent()
    for text in OTHERS[:6]:
        await store(service, alice, text)
    secret = await store(service, alice, SECRET, "Decision")
    for text in OTHERS[6:]:
        await store(service, alice, text)
    wanted = secret_needles(service, secret)
    await on_disk(service)
    assert set(traces(home, wanted)) == set(wanted), "the needles must be found before the forget"

    with trio.fail_after(10):
        forgotten = await service.forget(alice, node_id=secret)
    await scrubbed(service)
    assert traces(home, wanted) == {}
    assert wal_size(home) == 0

    # The record stays, as a tombstone; the other cells are still found by their words and meaning.
    shown = await service.get_cell(alice, node_id=secret)
    assert (shown["content"], shown["forgotten_at"]) == ("", forgotten["forgotten_at"])
    with trio.fail_after(10):
        hits = (await service.search(alice, query="sockets of service 7", k=3))["results"]
        by_word = (await service.search(alice, query="qxzylophonic7431 vault passphrase", k=5))["results"]
    assert hits and hits[0]["node_id"] != secret and "service 7" in hits[0]["content"]
    assert secret not in {hit["node_id"] for hit in by_word}


async def test_a_tombstone_from_the_mesh_erases_the_cell_and_the_logs_copy_of_it(service, make_agent, home):
    reader, _ = await make_agent()
    with trio.fail_after(10):
        await service.place_beacon(reader, query="staging vault passphrase", threshold=0.1)
    origin = NodeIdentity.generate()
    payload, cell_diff = signed_cell(service, origin, seq=1)
    log = service.storage.diff_log()
    assert log.put(cell_diff, 1)
    with trio.fail_after(10):
        await MeshLink(service, lambda event: None).apply_many([ev.StoreRemoteCell(payload, origin.node_id, 1, cell_diff.signature, 1)])
    wanted = secret_needles(service, payload.node_id)
    await on_disk(service)
    assert set(traces(home, wanted)) == set(wanted)

    tomb = tombstone(service, origin, payload.node_id, seq=2)
    assert log.put(tomb, 2)
    assert log.cell(payload.node_id) is not None, "within the step that put the tombstone, the engine still routes by it"
    with trio.fail_after(10):
        assert await service.apply_tombstone(payload.node_id, origin.node_id, tomb.payload.forgotten_at)
    await scrubbed(service)
    assert traces(home, wanted) == {}
    assert log.has(origin.node_id, 1), "the erased cell diff still counts as held: never taken again"
    assert [d.payload.cell_id for _, _, d in log.scan(0, 10)] == [payload.node_id]  # the tombstone alone
    log.put(tombstone(service, origin, str(uuid.uuid4()), seq=3), 3)  # the next put: the step is over
    assert log.cell(payload.node_id) is None
    reopened = service.storage.diff_log()
    assert reopened.cell(payload.node_id) is None and reopened.has(origin.node_id, 1)


async def test_a_cell_that_arrives_after_its_tombstone_is_never_written_with_its_content(service, make_agent, home):
    reader, _ = await make_agent()
    with trio.fail_after(10):
        await service.place_beacon(reader, query="staging vault passphrase", threshold=0.1)
    origin, mallory = NodeIdentity.generate(), NodeIdentity.generate()
    link = MeshLink(service, lambda event: None)
    log = service.storage.diff_log()
    payload, cell_diff = signed_cell(service, origin, seq=1)
    tomb = tombstone(service, origin, payload.node_id, seq=2)

    assert log.put(tomb, 1)
    with trio.fail_after(10):
        assert not await service.apply_tombstone(payload.node_id, origin.node_id, tomb.payload.forgotten_at)
    assert log.put(cell_diff, 2)
    with trio.fail_after(10):
        await link.apply_many([ev.StoreRemoteCell(payload, origin.node_id, 1, cell_diff.signature, 1)])
    shown = service.storage.cells.by_node_id(payload.node_id)
    assert (shown.content, shown.forgotten_at, shown.forgotten_by) == ("", tomb.payload.forgotten_at, "their-agent")
    assert (await service.inbox(reader))["diffs"] == []
    service.db.write_sync(lambda tx: None)
    assert traces(home, secret_needles(service, vector=payload.embedding)) == {}  # not even in the WAL
    assert log.cell(payload.node_id) is None and log.has(origin.node_id, 1)

    # A tombstone signed by another node than the cell's origin stops nothing.
    other, other_diff = signed_cell(service, origin, seq=3, text="The staging vault is opened by two people.")
    assert log.put(tombstone(service, mallory, other.node_id, seq=1, cell_origin=mallory.node_id), 3)
    assert log.put(other_diff, 4)
    with trio.fail_after(10):
        await link.apply_many([ev.StoreRemoteCell(other, origin.node_id, 1, other_diff.signature, 3)])
    kept = service.storage.cells.by_node_id(other.node_id)
    assert kept.forgotten_at is None and kept.content.startswith("The staging vault")
    assert log.cell(other.node_id) is not None


async def test_only_the_author_or_the_data_dirs_owner_forgets_and_never_across_tenants(service, make_agent):
    alice, _ = await make_agent("alice")
    bob, _ = await make_agent("bob")
    apollo = [await store(service, alice, f"apollo launch note {i}", project="apollo") for i in range(2)]
    loose = await store(service, alice, "a note of no project")
    bobs = await store(service, bob, "bob's apollo note", project="apollo")

    refused = await rejected(service.forget(bob, node_id=apollo[0]), "forbidden", "node_id")
    assert apollo[0] in refused.message and "only the agent that stored a cell may forget it" in refused.message
    outsider = await service.authenticate(second_tenant_key(service))
    await rejected(service.forget(outsider, node_id=apollo[0]), "not_found", "node_id")  # another tenant: no such cell
    assert service.storage.cells.by_node_id(apollo[0]).forgotten_at is None

    # The owner's bulk forget: what it would take, by agent and/or project.
    origin = NodeIdentity.generate()
    remote, remote_diff = signed_cell(service, origin, seq=1, project="apollo")
    with trio.fail_after(10):
        await MeshLink(service, lambda event: None).apply_many([ev.StoreRemoteCell(remote, origin.node_id, 1, remote_diff.signature, 1)])
    assert (await service.forgettable(agent="alice"))["node_ids"] == [*apollo, loose]
    by_project = await service.forgettable(project="apollo")
    assert (by_project["node_ids"], by_project["from_other_nodes"]) == ([*apollo, bobs], 1)
    assert (await service.forgettable(agent="alice", project="apollo"))["count"] == 2
    await rejected(service.forgettable(agent="nobody"), "not_found", "agent")
    await rejected(service.forgettable(), "invalid_argument", "agent")

    missing = str(uuid.uuid4())
    with trio.fail_after(10):
        result = await service.admin_forget([apollo[0], remote.node_id, missing, apollo[0]])
    assert [f["node_id"] for f in result["forgotten"]] == [apollo[0]] and result["count"] == 1
    assert {(r["node_id"], r["reason"]) for r in result["refused"]} == {(remote.node_id, "forbidden"), (missing, "not_found")}
    assert origin.node_id in next(r["message"] for r in result["refused"] if r["reason"] == "forbidden")
    assert service.storage.cells.by_node_id(apollo[0]).forgotten_by == alice.agent_id
    assert service.storage.cells.by_node_id(remote.node_id).forgotten_at is None
    await rejected(service.admin_forget("x"), "invalid_argument", "node_ids")
    await rejected(service.admin_forget(["not-a-uuid"]), "invalid_argument", "node_ids")
    with trio.fail_after(10):  # again: nothing new, the same time
        again = await service.admin_forget([apollo[0]])
    assert again["forgotten"] == result["forgotten"]


def test_a_removed_rows_vector_is_not_in_the_saved_index_file_even_from_an_older_file(tmp_path):
    rng = np.random.default_rng(7)
    vectors = rng.standard_normal((40, 16)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)

    def holds(row: int) -> bool:
        return any(vectors[row][:4].tobytes() in p.read_bytes() for p in tmp_path.glob("L0-*.hnsw"))

    index = LayerIndex(tmp_path, "L0", 16, "test")
    index.add(np.arange(40), vectors, covered_seq=40)
    index.remove([3])
    index.save()
    assert not holds(3) and holds(4)
    assert [label for label, _ in index.search(vectors[3], 3)] != [3]

    # A file saved by a version that only marked rows deleted: its removed rows are erased at load.
    index._index.mark_deleted(5)  # hidden, as an older version did, so this save keeps its vector
    index.save()
    meta = json.loads(index.meta_path.read_text())
    meta.update(removed=[3, 5], removed_erased=False)
    index.meta_path.write_text(json.dumps(meta))
    assert holds(5)
    again = LayerIndex(tmp_path, "L0", 16, "test")
    assert again.load().loaded and again.dirty == 1  # an older file counts as a change: it is saved again
    again.save()
    assert not holds(5) and not holds(3) and holds(6)
    assert len(again) == 38


@pytest.mark.parametrize("layer_rows", [12])
async def test_a_forget_the_files_missed_before_a_crash_is_erased_at_the_next_start(home, clock, make_agent, service, layer_rows):
    alice, _ = await make_agent()
    secret = await store(service, alice, SECRET)
    for text in OTHERS[:layer_rows]:
        await store(service, alice, text)
    wanted = secret_needles(service, secret)
    await on_disk(service)
    saved = {p.name: p.read_bytes() for p in (home / "index").iterdir()}
    with trio.fail_after(10):
        await service.forget(alice, node_id=secret)
    await scrubbed(service)
    # Put the index files back as they were before the forget (a crash before the save).
    for path in (home / "index").iterdir():
        path.unlink()
    for name, data in saved.items():
        (home / "index" / name).write_bytes(data)
    assert traces(home, wanted)
    await trio.to_thread.run_sync(service.layers.open)  # what the next start does
    assert traces(home, wanted) == {}


# -- helpers ----------------------------------------------------------------------------


def signed_cell(service, origin: NodeIdentity, *, seq: int, text: str = SECRET, **fields):
    payload = CellPayload(
        str(uuid.uuid4()), service.config.tenant_id, "their-agent", text, "Decision", 0.9, 1_780_000_000_000 + seq,
        embedding=service.embedder.embed([text])[0], embedding_space=service.embedder.space, **fields,
    )  # fmt: skip
    return payload, sign_diff(payload, origin=origin.node_id, seq=seq, ts=1_780_000_000_000 + seq, sign=origin.sign, hops=1)


def tombstone(service, signer: NodeIdentity, cell_id: str, *, seq: int, cell_origin: str | None = None):
    at = 1_780_000_100_000 + seq
    payload = TombstonePayload(cell_id, service.config.tenant_id, at, cell_origin or signer.node_id, 1)
    return sign_diff(payload, origin=signer.node_id, seq=seq, ts=at, sign=signer.sign, hops=1)


async def test_a_scrub_that_could_not_truncate_the_wal_is_tried_again(service, make_agent, home):
    alice, _ = await make_agent()
    secret = await store(service, alice, SECRET)
    wanted = secret_needles(service, secret)
    real, calls = service.storage.erasure.checkpoint, []

    def held_by_a_reader() -> bool:  # the first attempt meets a long reader
        calls.append(len(calls))
        return real() if len(calls) > 1 else False

    service.storage.erasure.checkpoint = held_by_a_reader
    with trio.fail_after(10):
        await service.forget(alice, node_id=secret)
    await scrubbed(service)
    assert len(calls) >= 2 and service.scrubber.failed_passes >= 1
    assert traces(home, wanted) == {} and wal_size(home) == 0
