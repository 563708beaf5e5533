"""Durability (DESIGN §5, §10): an acknowledged store survives SIGKILL; the HNSW files are caches
that catch up from, or are rebuilt from, SQLite; a failing write job rolls back alone; the schema
refuses a database from the future.

The crash tests run the node in a child process and kill it with SIGKILL: nothing in this process
could honestly imitate a crash (every in-process exit path would run ``finally`` blocks).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import trio

from node.store.database import Database
from node.embedding import HashedEmbedder
from node.errors import ConfigError, Conflict, NotFound
from app.home import open_node
from node.store.schema import SCHEMA_VERSION, migrate

@pytest.fixture
def make_agent(make_agent):
    """The conftest factory, with a deadline on its write."""

    async def make(*args, **kwargs):
        with trio.fail_after(10):
            return await make_agent(*args, **kwargs)

    return make


REPO = Path(__file__).resolve().parents[2]

# Stores from 8 concurrent tasks, printing each node_id the moment `store` returns it.
CRASH_CHILD = r"""
import sys, uuid, trio
from pathlib import Path
from node.embedding import HashedEmbedder
from app.home import open_node

home, key = Path(sys.argv[1]), sys.argv[2]

async def main():
    async with open_node(home, embedder=HashedEmbedder()) as service:
        principal = await service.authenticate(key)

        async def writer(task):
            i = 0
            while True:
                text = f"crash probe {uuid.uuid4().hex} {uuid.uuid4().hex[:12]} task{task} n{i}"
                result = await service.store(principal, content=text, cell_type="Fact")
                sys.stdout.write(f"{result['node_id']} {text}\n")
                sys.stdout.flush()
                i += 1

        async with trio.open_nursery() as nursery:
            for task in range(8):
                nursery.start_soon(writer, task)

trio.run(main)
"""

# Stores some cells, saves the index files, stores more, then dies without closing anything.
RESTART_CHILD = r"""
import os, signal, sys, trio
from pathlib import Path
from node.embedding import HashedEmbedder
from app.home import open_node

home, key = Path(sys.argv[1]), sys.argv[2]

async def main():
    async with open_node(home, embedder=HashedEmbedder()) as service:
        principal = await service.authenticate(key)
        for i in range(5):
            await service.store(principal, content=f"saved before the snapshot number {i}", cell_type="Fact")
        await trio.to_thread.run_sync(service.layers.flush)  # all 5 in HNSW ...
        await trio.to_thread.run_sync(service.layers.save)  # ... and on disk
        for i in range(7):
            result = await service.store(principal, content=f"written after the snapshot number {i}", cell_type="Decision",
                                         salience=0.9)
            print(result["node_id"], flush=True)
        os.kill(os.getpid(), signal.SIGKILL)

trio.run(main)
"""


def child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


async def make_key(home: Path, name: str = "writer") -> str:
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder()) as service:
            _, key = await service.add_agent(name)
    return key


def l0_consistency(service) -> tuple[int, int]:
    """(live items in the L0 index, live L0 members in SQLite): they must agree."""
    (rows,) = service.db.query_one(
        "SELECT COUNT(*) FROM layer_members m JOIN cells c ON c.rowid = m.cell_rowid "
        "WHERE m.layer = 'L0' AND c.forgotten_at IS NULL"
    )
    return len(service.layers.indexes["L0"]), rows


# -- (1) an acknowledged store survives SIGKILL -----------------------------------------------------


def run_and_kill(home: Path, key: str, *, min_acks: int, timeout: float) -> list[tuple[str, str]]:
    """Run the crash child until it acknowledged ``min_acks`` stores, SIGKILL it, return every ack."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CRASH_CHILD, str(home), key],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=child_env(),
        cwd=REPO,
    )
    lines: list[str] = []
    enough = threading.Event()

    def read() -> None:
        for raw in proc.stdout:  # every line the child flushed before it died
            lines.append(raw.decode())
            if len(lines) >= min_acks:
                enough.set()
        enough.set()  # EOF: the child is gone

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        enough.wait(timeout)
        alive = proc.poll() is None
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        reader.join(timeout=10)
        stderr = proc.stderr.read().decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert alive, f"the child died before it was killed:\n{stderr}"
    assert len(lines) >= min_acks, f"only {len(lines)} acknowledgements within {timeout}s:\n{stderr}"
    assert proc.returncode == -signal.SIGKILL
    acks = []
    for line in lines:
        if not line.endswith("\n"):
            continue  # a torn last line is not an acknowledgement
        node_id, _, text = line.rstrip("\n").partition(" ")
        acks.append((str(uuid.UUID(node_id)), text))
    return acks


async def test_every_acknowledged_store_survives_sigkill(home):
    key = await make_key(home)
    acks = await trio.to_thread.run_sync(lambda: run_and_kill(home, key, min_acks=300, timeout=60))
    assert len({node_id for node_id, _ in acks}) == len(acks)

    with trio.fail_after(60):
        async with open_node(home, embedder=HashedEmbedder()) as service:
            principal = await service.authenticate(key)
            missing, unrecallable = [], []
            for node_id, text in acks:
                try:
                    cell = await service.get_cell(principal, node_id=node_id)
                except NotFound:
                    missing.append(node_id)
                    continue
                assert cell["content"] == text
                hits = (await service.recall(principal, query=text, k=5))["results"]
                if node_id not in [h["node_id"] for h in hits]:
                    unrecallable.append(node_id)
            assert missing == [], f"{len(missing)} of {len(acks)} acknowledged stores were lost"
            assert unrecallable == [], f"{len(unrecallable)} stored cells are not found by their own text"
            index_items, db_rows = l0_consistency(service)
            assert index_items == db_rows >= len(acks)
            assert "rows added" in service.layers.open_report["L0"]


# -- (2) a restart without a clean close catches the index up ---------------------------------------


async def test_restart_after_sigkill_catches_the_indexes_up_from_the_database(home):
    key = await make_key(home)
    proc = await trio.to_thread.run_sync(
        lambda: subprocess.run(
            [sys.executable, "-c", RESTART_CHILD, str(home), key],
            capture_output=True, env=child_env(), cwd=REPO, timeout=60,
        )
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    late = proc.stdout.decode().split()
    assert len(late) == 7

    with trio.fail_after(60):
        async with open_node(home, embedder=HashedEmbedder()) as service:
            report = service.layers.open_report
            assert report["L0"].startswith("loaded, 7 rows added"), report  # the saved 5 + the 7 newer
            assert report["L1"].startswith("loaded, 7 rows added"), report  # the Decisions were promoted
            principal = await service.authenticate(key)
            for i, node_id in enumerate(late):
                text = f"written after the snapshot number {i}"
                for layer in ("L0", "L1"):
                    hits = (await service.query(principal, query=text, layer=layer, k=3))["results"]
                    assert hits[0]["node_id"] == node_id, (layer, text)
            assert l0_consistency(service) == (12, 12)


# -- (3) and (4) missing or corrupt index files are rebuilt -----------------------------------------

QUERIES = ["release train", "database backup", "oncall pager", "feature flag cleanup"]


async def fill_and_probe(home: Path) -> tuple[str, dict]:
    """Store a varied set of cells, close cleanly, and record what each layer answers."""
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder()) as service:
            principal, key = await service.add_agent("writer")
            for i in range(60):
                topic = QUERIES[i % len(QUERIES)]
                await service.store(principal, content=f"{topic} note {i} detail {i * 7919 % 1000}", cell_type="Decision",
                                    salience=(i % 10) / 10)
            forgotten = (await service.store(principal, content="release train secret", cell_type="Fact"))["node_id"]
            await service.forget(principal, node_id=forgotten)
            # Every row in HNSW before the probe: a row still in the fresh buffer is measured by
            # numpy, not hnswlib, and equal distances may then tie in another order (a busy machine,
            # or the scrubber's save after the forget holding the indexer back, leaves rows there).
            await trio.to_thread.run_sync(service.layers.flush)
            return key, await probe(service, principal)


async def probe(service, principal) -> dict:
    answers = {}
    for layer in ("L0", "L1"):
        for query in QUERIES:
            hits = (await service.query(principal, query=query, layer=layer, k=10))["results"]
            answers[layer, query] = [(h["node_id"], round(h["distance"], 5)) for h in hits]
    return answers


async def reopen_and_probe(home: Path, key: str) -> tuple[dict, dict]:
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder()) as service:
            principal = await service.authenticate(key)
            assert l0_consistency(service) == (60, 60)
            return dict(service.layers.open_report), await probe(service, principal)


async def test_deleted_index_files_are_rebuilt_with_identical_results(home):
    key, before = await fill_and_probe(home)
    index_dir = home / "index"
    assert any(index_dir.iterdir())
    for path in index_dir.iterdir():
        path.unlink()
    report, after = await reopen_and_probe(home, key)
    for layer in ("L0", "L1", "L2"):
        assert "rebuilt" in report[layer], report
    assert after == before
    # ... and the rebuilt files are saved: the next open loads them.
    report, again = await reopen_and_probe(home, key)
    assert report["L0"].startswith("loaded, 0 rows added"), report
    assert again == before


@pytest.mark.parametrize("damage", ["index-bytes", "meta-json"])
async def test_a_corrupt_index_file_is_rebuilt(home, damage):
    key, before = await fill_and_probe(home)
    index_dir = home / "index"
    if damage == "index-bytes":
        (target,) = index_dir.glob("L0-*.hnsw")
        data = bytearray(target.read_bytes())
        for offset in range(100, len(data), max(1, len(data) // 50)):
            data[offset] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        (index_dir / "L0.meta.json").write_text("{ not json")
    report, after = await reopen_and_probe(home, key)
    assert "rebuilt" in report["L0"] and "corrupt" in report["L0"], report
    assert report["L1"].startswith("loaded"), report  # the undamaged layer is used as is
    assert after == before


async def test_a_cell_forgotten_before_the_indexer_reached_it_never_enters_the_index(home):
    """Store, then forget at once: the erased vector must not reach HNSW (nor its saved files).

    The indexer thread is held at a gate (a wrapper around its batch step) so the forget lands
    while the cell is still waiting in the fresh buffer, deterministically.
    """
    gate = threading.Event()
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder()) as service:
            real_step = service.layers._index_some

            def gated_step() -> bool:
                gate.wait(10)
                return real_step()

            service.layers._index_some = gated_step
            principal, key = await service.add_agent("writer")
            kept = (await service.store(principal, content="a harmless note", cell_type="Fact"))["node_id"]
            secret = (await service.store(principal, content="the root password is hunter2", cell_type="Fact"))["node_id"]
            await service.forget(principal, node_id=secret)
            gate.set()
            await trio.to_thread.run_sync(service.layers.flush)
            assert l0_consistency(service) == (1, 1)
            hits = (await service.query(principal, query="the root password is hunter2", layer="L0"))["results"]
            assert [h["node_id"] for h in hits] == [kept]
        async with open_node(home, embedder=HashedEmbedder()) as service:
            assert l0_consistency(service) == (1, 1)  # nor in the files saved at close


# -- (5) group commit: a failing job rolls back alone ----------------------------------------------


async def test_a_failing_write_job_rolls_back_alone_in_its_batch(service):
    db = service.db
    gate, release = threading.Event(), threading.Event()
    after_commit: list[str] = []

    def blocker(tx):
        gate.set()
        release.wait(10)

    def job(name: str, fail: bool = False):
        def run(tx):
            tx.execute("INSERT INTO pull_cursors (agent_id, last_seq) VALUES (?, ?)", (name, 1))
            tx.after_commit(lambda: after_commit.append(name))
            if fail:
                raise RuntimeError(f"{name} failed after writing")
            return name

        return run

    first = db.submit(blocker)
    assert await trio.to_thread.run_sync(gate.wait, 10)  # the writer is busy: the next jobs queue up
    batches_before = db.batches
    futures = [db.submit(job(f"job{i}", fail=(i == 2))) for i in range(5)]
    release.set()
    with trio.fail_after(10):
        await trio.to_thread.run_sync(first.result, 10)
        outcomes = []
        for i, future in enumerate(futures):
            if i == 2:
                with pytest.raises(RuntimeError, match="job2 failed after writing"):
                    await trio.to_thread.run_sync(future.result, 10)
            else:
                outcomes.append(await trio.to_thread.run_sync(future.result, 10))
    assert db.batches == batches_before + 2  # the blocker's batch, then one batch of all five
    assert outcomes == ["job0", "job1", "job3", "job4"]
    committed = [r[0] for r in db.query("SELECT agent_id FROM pull_cursors ORDER BY agent_id")]
    assert committed == ["job0", "job1", "job3", "job4"]
    assert after_commit == ["job0", "job1", "job3", "job4"]  # the failed job's after-commit work never ran
    with trio.fail_after(10):
        assert await db.write(lambda tx: "still writing") == "still writing"


async def test_a_facade_error_inside_a_batch_does_not_hurt_concurrent_stores(service, make_agent):
    alice, _ = await make_agent("alice")
    results: dict[str, object] = {}

    async def store(i: int) -> None:
        results[f"store{i}"] = await service.store(alice, content=f"concurrent note {i}", cell_type="Fact")

    async def duplicate_agent() -> None:
        try:
            await service.add_agent("alice")
        except Conflict as exc:  # the failure provoked; anything else fails the test
            results["dup"] = exc

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(store, i)
            nursery.start_soon(duplicate_agent)
    assert getattr(results["dup"], "reason", None) == "conflict"
    assert service.db.query_one("SELECT COUNT(*) FROM cells")[0] == 5


# -- (6) schema versions ---------------------------------------------------------------------------


async def test_a_database_from_a_newer_hyphae_is_refused(home):
    db_path = home / "hyphae.db"
    conn = sqlite3.connect(db_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(ConfigError, match="newer"):
        Database(db_path)
    with pytest.raises(ConfigError):
        with trio.fail_after(30):
            async with open_node(home, embedder=HashedEmbedder()):
                pass  # pragma: no cover - must not open
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1  # left untouched
    conn.close()


def test_migrating_from_zero_is_idempotent(tmp_path):
    conn = sqlite3.connect(tmp_path / "fresh.db", isolation_level=None)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 0
    assert migrate(conn) == 0
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"principals", "cells", "layer_members", "idempotency", "scenes", "sessions", "beacons", "inbox",
            "pull_cursors"} <= tables
    conn.execute(
        "INSERT INTO pull_cursors (agent_id, last_seq) VALUES ('kept', 7)"
    )
    assert migrate(conn) == SCHEMA_VERSION  # nothing to do, and nothing lost
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT last_seq FROM pull_cursors WHERE agent_id = 'kept'").fetchone() == (7,)
    conn.close()
    Database(tmp_path / "fresh.db").close()  # and the product opens it as is
