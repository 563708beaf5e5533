"""The writer's group commit: writes that arrive together share one fsync'd transaction, and a
lone write waits the window for company only while writes have been arriving together."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from node.store.database import Database

LONG_WINDOW = 60.0  # a write that waited this long would time the test out


def _insert(value: int):
    return lambda tx: tx.execute("INSERT INTO meta_probe (v) VALUES (?)", (value,))


def _open(tmp_path: Path, window: float) -> Database:
    db = Database(tmp_path / "hyphae.db", group_commit_window=window)
    db.write_sync(lambda tx: tx.execute("CREATE TABLE meta_probe (v INTEGER)"))
    return db


def _wait_until_taken(db: Database) -> None:
    """Until the writer thread has taken every queued job (it is then committing, or waiting)."""
    deadline = time.monotonic() + 30
    while not db._queue.empty():
        assert time.monotonic() < deadline, "the writer never took the job"
        time.sleep(0.001)


def test_a_writer_that_waits_for_each_answer_is_not_held_by_the_window(tmp_path: Path) -> None:
    db = _open(tmp_path, LONG_WINDOW)
    try:
        for value in range(5):
            db.submit(_insert(value)).result(timeout=20)  # would wait 60 s if the window applied
        assert db.query("SELECT count(*) FROM meta_probe") == [(5,)]
    finally:
        db.close()


def test_after_writes_arrive_together_a_lone_write_waits_for_company(tmp_path: Path) -> None:
    db = _open(tmp_path, 2.0)
    try:
        # Hold the writer inside a commit while two more writes queue: they commit together.
        release = threading.Event()
        first = db.submit(lambda tx: release.wait(20))
        _wait_until_taken(db)
        together = [db.submit(_insert(1)), db.submit(_insert(2))]
        release.set()
        first.result(timeout=20)
        for fut in together:
            fut.result(timeout=20)
        batches = db.batches

        # Now a lone write waits the window, and a second one sent meanwhile shares its commit.
        lone = db.submit(_insert(3))
        _wait_until_taken(db)
        companion = db.submit(_insert(4))
        lone.result(timeout=20)
        companion.result(timeout=20)
        assert db.batches == batches + 1
        assert db.query("SELECT v FROM meta_probe ORDER BY v") == [(1,), (2,), (3,), (4,)]
    finally:
        db.close()
