"""The database's promise at its source: nobody hears "stored" before COMMIT, and every
connection it opens runs with the settings that make a COMMIT durable.

A SIGKILL test finds an answer sent before its commit only when the kill lands in the
gap; here the commit itself is held (a trace callback on the writer's connection blocks
on ``COMMIT``), so the gap is as long as the test wants, and the check is exact. The
pragmas are read back from each connection: ``synchronous = OFF`` loses nothing a SIGKILL
can show (the OS still has the pages), only a power cut, so no crash test can see it.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
import trio
import trio.testing

import node.store.database
from node.store.database import Database
from node.embedding import HashedEmbedder
from app.home import open_node

HANG_GUARD = 30  # s; none of these waits is the point of a test


class HeldCommit:
    """Blocks the writer thread inside the ``COMMIT`` of the first transaction that ran a
    statement starting with ``marker``, until :meth:`release`."""

    def __init__(self, conn: sqlite3.Connection, marker: str) -> None:
        self.marker = marker
        self.reached = threading.Event()
        self._release = threading.Event()
        self._seen = False
        self._held = False
        conn.set_trace_callback(self._trace)

    def _trace(self, sql: str) -> None:
        if sql.startswith(self.marker):
            self._seen = True
        elif sql == "COMMIT" and self._seen and not self._held:
            self._held = True
            self.reached.set()
            self._release.wait(HANG_GUARD)

    def release(self) -> None:
        self._release.set()

    def __enter__(self) -> "HeldCommit":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()  # a failed check must not leave the writer stuck for the hang guard


def _count(db: Database) -> int:
    """Rows committed, as a fresh connection sees them (not the writer's own view)."""
    conn = sqlite3.connect(db.path)
    try:
        return conn.execute("SELECT count(*) FROM probe").fetchone()[0]
    finally:
        conn.close()


def test_a_write_is_acknowledged_only_after_its_commit(tmp_path: Path) -> None:
    db = Database(tmp_path / "hyphae.db")
    try:
        db.write_sync(lambda tx: tx.execute("CREATE TABLE probe (v INTEGER)"))
        with HeldCommit(db._write_conn, "INSERT INTO probe") as held:
            written = db.submit(lambda tx: tx.execute("INSERT INTO probe (v) VALUES (1)").rowcount)
            assert held.reached.wait(HANG_GUARD), "the writer never reached COMMIT"
            # The writer thread sits in COMMIT; whatever it did before is visible now.
            assert not written.done(), "the write was acknowledged before its COMMIT ran"
            assert _count(db) == 0
        assert written.result(timeout=HANG_GUARD) == 1
        assert _count(db) == 1  # acknowledged: committed for every reader
    finally:
        db.close()


async def test_a_store_returns_only_after_its_commit(home: Path, clock) -> None:
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        with trio.fail_after(HANG_GUARD):
            principal, _ = await service.add_agent("writer", None)
        answers: list[dict] = []

        async def store() -> None:
            answers.append(await service.store(principal, content="held at COMMIT", cell_type="Fact"))

        with HeldCommit(service.db._write_conn, "INSERT INTO cells") as held, trio.fail_after(HANG_GUARD):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store)
                assert await trio.to_thread.run_sync(held.reached.wait, HANG_GUARD), "the writer never reached COMMIT"
                # A wake-up sent before COMMIT was queued to this loop before the one that
                # returned us here: once every task is blocked, an early answer has arrived.
                await trio.testing.wait_all_tasks_blocked()
                assert answers == [], "the store returned before its COMMIT ran"
                held.release()
        (answer,) = answers
        assert service.db.query_one("SELECT content FROM cells WHERE node_id = ?", (answer["node_id"],)) == (
            "held at COMMIT",
        )


# -- the settings of every connection ------------------------------------------------------

WRITER = {"journal_mode": "wal", "synchronous": 2, "busy_timeout": 30_000, "temp_store": 2, "query_only": 0}
READER = {**WRITER, "query_only": 1}  # synchronous 2 = FULL, temp_store 2 = MEMORY


def settings(conn: sqlite3.Connection) -> dict[str, object]:
    return {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in WRITER}


@pytest.fixture
def opened(monkeypatch) -> list[sqlite3.Connection]:
    """Every connection ``node.store.database`` opens from now on, in order."""
    connections: list[sqlite3.Connection] = []
    connect = node.store.database._connect

    def recording(path: Path) -> sqlite3.Connection:
        conn = connect(path)
        connections.append(conn)
        return conn

    monkeypatch.setattr(node.store.database, "_connect", recording)
    return connections


def test_the_writer_and_every_reader_run_durable_settings(tmp_path: Path, opened) -> None:
    db = Database(tmp_path / "hyphae.db")
    try:
        db.write_sync(lambda tx: tx.execute("CREATE TABLE probe (v INTEGER)"))
        def read_twice() -> None:
            db.query("SELECT count(*) FROM probe")
            db.query_one("SELECT count(*) FROM probe")

        read_twice()  # this thread's reader
        threads = [threading.Thread(target=read_twice) for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(HANG_GUARD)
        assert len(opened) == 5 and opened[0] is db._write_conn  # one reader per thread, kept
        assert settings(db._write_conn) == WRITER
        for conn in opened[1:]:
            assert settings(conn) == READER
    finally:
        db.close()


async def test_every_connection_of_a_working_node_runs_durable_settings(home: Path, clock, opened) -> None:
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        with trio.fail_after(HANG_GUARD):
            principal, _ = await service.add_agent("writer", None)
            for i in range(5):
                await service.store(principal, content=f"durable fact {i}", cell_type="Fact")
            await service.recall(principal, query="durable fact", k=3)
            await trio.to_thread.run_sync(service.db.query, "SELECT count(*) FROM cells")
        writer = service.db._write_conn
        assert writer in opened and len(opened) >= 3, opened
        for conn in opened:
            assert settings(conn) == (WRITER if conn is writer else READER)
