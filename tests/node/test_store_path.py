"""The store path's plumbing (DESIGN §5): how a store travels from the facade through the
embedding thread to the group committer and back, and what a write batch does once.

Each test pins one property the throughput work relies on: the group-commit window is not
slept while writes are already queued; after-commit work gathered across a batch runs once,
in order, without the work of a job that was rolled back; new cells enter the catalogue
before their rows reach the indexer; the embedding thread hands a store on to the writer;
ids are time-ordered UUIDs.
"""

from __future__ import annotations

import threading
import time
import uuid

import numpy as np
import pytest
import trio

from node.catalog import CellCatalog
from node.store.database import Database
from node.errors import Unavailable
from node.service import new_id
from node.waking import wake_all

from .helpers import store


def blocked_writer(db: Database) -> tuple[threading.Event, threading.Event, object]:
    """Occupy the writer thread with a job that waits for ``release``: jobs queue up behind it."""
    gate, release = threading.Event(), threading.Event()

    def blocker(tx):
        gate.set()
        release.wait(10)

    return gate, release, db.submit(blocker)


async def test_queued_writes_commit_without_sleeping_the_window(tmp_path):
    db = Database(tmp_path / "window.db")
    try:
        gate, release, first = blocked_writer(db)
        assert await trio.to_thread.run_sync(gate.wait, 10)
        db._window = 60.0  # from now on a lone write would wait a minute for company
        futures = [db.submit(lambda tx, i=i: i) for i in range(3)]
        release.set()
        with trio.fail_after(10):  # the window is only for a write with no company
            assert [await trio.to_thread.run_sync(f.result, 10) for f in futures] == [0, 1, 2]
        assert db.batches == 2
    finally:
        db.close()


async def test_gathered_after_commit_work_runs_once_per_batch_without_rolled_back_jobs(service):
    db = service.db
    calls: list[list[str]] = []
    order: list[str] = []

    def gathered(items: list[str]) -> None:
        calls.append(list(items))
        order.append("gathered")

    def job(name: str, fail: bool = False):
        def run(tx):
            tx.execute("INSERT INTO pull_cursors (agent_id, last_seq) VALUES (?, ?)", (name, 1))
            tx.after_commit_gathered(gathered, name)
            tx.after_commit(lambda: order.append(name))
            if fail:
                raise RuntimeError(f"{name} failed after writing")
            return name

        return run

    gate, release, first = blocked_writer(db)
    assert await trio.to_thread.run_sync(gate.wait, 10)
    # job0 fails, so the gathered action is first registered by a job that is rolled back
    futures = [db.submit(job(f"job{i}", fail=i in (0, 2))) for i in range(5)]
    release.set()
    with trio.fail_after(10):
        for i, future in enumerate(futures):
            if i in (0, 2):
                with pytest.raises(RuntimeError, match=f"job{i} failed after writing"):
                    await trio.to_thread.run_sync(future.result, 10)
            else:
                assert await trio.to_thread.run_sync(future.result, 10) == f"job{i}"
    assert calls == [["job1", "job3", "job4"]]  # once, with the survivors' items in job order
    assert order == ["gathered", "job1", "job3", "job4"]  # in the place of the first surviving item


async def test_new_cells_are_catalogued_before_their_rows_join_the_layers(service, make_agent):
    """A batch whose first job puts an old cell in a layer and whose next stores a new one:
    the indexer drops rows the catalogue does not know, so the new cell must be catalogued
    before any row of the batch reaches the fresh buffer."""
    alice, _ = await make_agent("alice")
    old = await store(service, alice, "an old cell, promoted in the batch")
    (old_rowid,) = service.db.query_one("SELECT rowid FROM cells WHERE node_id = ?", (old,))
    seen: list[bool] = []
    add_rows = service.layers.add_rows

    def checking_add_rows(rows):
        seen.extend(bool(service.layers.catalog.alive(np.array([rowid]))[0]) for _, _, rowid, _ in rows)
        add_rows(rows)

    service.layers.add_rows = checking_add_rows
    gate, release, first = blocked_writer(service.db)
    assert await trio.to_thread.run_sync(gate.wait, 10)
    promote = service.db.submit(lambda tx: service._promote(tx, old_rowid))
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store, service, alice, "a new cell in the same batch")
            while service.db._queue.qsize() < 2:  # the store's job is queued behind the promotion
                await trio.sleep(0.01)
            release.set()
        await trio.to_thread.run_sync(promote.result, 10)
    assert len(seen) == 2 and all(seen)


async def test_a_store_that_cannot_reach_the_writer_fails_with_the_writers_error(service, make_agent):
    alice, _ = await make_agent("alice")
    service.db._closed = True  # as after close: the embedding thread's hand-over is refused
    try:
        with trio.fail_after(10), pytest.raises(Unavailable):
            await service.store(alice, content="nowhere to go", cell_type="Fact")
    finally:
        service.db._closed = False
    assert service.db.query_one("SELECT COUNT(*) FROM cells") == (0,)


async def test_embed_then_hands_the_vectors_and_the_waker_to_the_next_step(service):
    shapes: list[tuple[int, ...]] = []

    def then(vectors, waker):
        shapes.append(vectors.shape)
        wake_all([waker])  # what the writer does once the write is durable

    with trio.fail_after(10):
        await service._embedding.embed_then(["a", "b"], then)
    assert shapes == [(2, service.embedder.dim)]

    def failing(vectors, waker):
        raise ValueError("the next step failed")

    with trio.fail_after(10), pytest.raises(ValueError, match="next step"):
        await service._embedding.embed_then(["a"], failing)


def test_ids_are_version_7_uuids_in_time_order(monkeypatch):
    now = [1_780_000_000_000_000_000]
    monkeypatch.setattr(time, "time_ns", lambda: now[0])
    ids = []
    for _ in range(50):
        ids.append(new_id())
        now[0] += 1_000_000  # one millisecond
    parsed = [uuid.UUID(i) for i in ids]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in parsed)
    assert all(str(u) == i for u, i in zip(parsed, ids))
    assert ids == sorted(ids)
    assert parsed[0].int >> 80 == 1_780_000_000_000
    assert len({new_id() for _ in range(1000)}) == 1000  # same millisecond: still distinct


def test_catalog_add_many_matches_adding_one_by_one():
    rows = [
        (3 * i + 1, f"n{i}", "t" if i % 2 else "u", None if i % 3 else "p", "Fact" if i % 7 else "Decision", f"a{i % 4}", i % 5 != 0)
        for i in range(20_000)  # more than one chunk, and growth past the initial capacity
    ]
    one, many = CellCatalog(4), CellCatalog(4)
    for row in rows:
        one.add(*row)
    many.add_many(iter(rows))
    labels = np.arange(70_000)
    assert (one.alive(labels) == many.alive(labels)).all()
    for tenant, projects, types in (("t", None, None), ("u", ("p",), None), ("t", None, ("Decision",))):
        assert (one.mask_for(tenant, projects, types)(labels) == many.mask_for(tenant, projects, types)(labels)).all()
    assert all(one.node_id(r[0]) == many.node_id(r[0]) for r in rows)
    assert one.same_tenant_other_agent(4, 10) == many.same_tenant_other_agent(4, 10)
