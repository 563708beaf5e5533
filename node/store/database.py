"""SQLite access: one writer thread doing group commit, and per-thread readers.

Why a writer thread: SQLite allows one writer at a time, and an fsync per write would
cap durable stores at a few hundred per second. Every write is a *job* (a function of a
:class:`Transaction`) queued to one thread, which runs whatever jobs are waiting inside
a single ``BEGIN IMMEDIATE … COMMIT`` with ``synchronous=FULL``: one fsync acknowledges
the whole batch, so throughput grows with concurrency and every acknowledged write is
on disk. Each job runs under its own SAVEPOINT, so a job that fails is rolled back alone
and its caller gets the error; the others still commit.

Jobs may register *after-commit* actions (index inserts, in-memory catalogues). They run
in the writer thread, in commit order, before any caller of the batch is answered, so a
caller that got its answer can read its own write through every structure.

Readers: each thread gets its own connection (WAL lets them read while the writer
writes). Callers on the trio loop use the loop thread's connection for short point reads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from ..errors import ConfigError, DiskFull, Unavailable
from ..waking import Waker, current_waker, wake_all
from .schema import migrate

__all__ = ["Database", "PendingWrite", "Transaction", "damaged_database"]

log = logging.getLogger("hyphae.database")
T = TypeVar("T")

_STOP = object()


class Transaction:
    """What a write job sees: the connection, and a place to queue after-commit work."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self._after: list[Callable[[], None]] = []
        self._gathered: dict[Callable[[list[Any]], None], list[Any]] = {}

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def after_commit(self, action: Callable[[], None]) -> None:
        self._after.append(action)

    def after_commit_gathered(self, action: Callable[[list[T]], None], item: T) -> None:
        """Queue ``item`` for ``action``, which runs once after commit with every item the
        batch queued for it, in the place of the first. A batch of stores then updates
        the in-memory structures once (one lock, one wake-up of the indexer), not per row."""
        items = self._gathered.get(action)
        if items is None:
            items = self._gathered[action] = []
            self._after.append(lambda: action(items))
        items.append(item)

    def _mark(self) -> tuple[int, dict[Callable[[list[Any]], None], int]]:
        return len(self._after), {action: len(items) for action, items in self._gathered.items()}

    def _undo(self, mark: tuple[int, dict[Callable[[list[Any]], None], int]]) -> None:
        """Forget the after-commit work queued since ``mark`` (a job that was rolled back)."""
        after, counts = mark
        del self._after[after:]
        for action in list(self._gathered):
            if action in counts:
                del self._gathered[action][counts[action] :]
            else:
                del self._gathered[action]


class PendingWrite:
    """One write job and its outcome. An async caller is woken through its waker and
    reads ``outcome()``; only threads that block on a write get a Future (a Condition and
    two locks apiece: too dear to build for every store)."""

    __slots__ = ("fn", "future", "waker", "ok", "value")

    def __init__(self, fn: Callable[[Transaction], Any], waker: Waker | None = None) -> None:
        self.fn = fn
        self.future: concurrent.futures.Future[Any] | None = None if waker else concurrent.futures.Future()
        self.waker = waker  # (trio token, event) of an async caller, woken once per batch
        self.ok = False
        self.value: Any = None

    def settle(self, ok: bool, value: Any) -> None:
        self.ok, self.value = ok, value
        if self.future is not None:
            if ok:
                self.future.set_result(value)
            else:
                self.future.set_exception(value)

    def outcome(self) -> Any:
        if self.ok:
            return self.value
        raise self.value


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30.0)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("PRAGMA secure_delete = ON")  # freed space is zeroed: a forgotten cell leaves no bytes behind
    return conn


class Database:
    """The node's SQLite database: open, migrate, write through the group committer."""

    def __init__(self, path: Path, *, group_commit_window: float = 0.0) -> None:
        self.path = path
        self._window = group_commit_window
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = _connect(path)
        except sqlite3.DatabaseError as exc:
            raise damaged_database(exc, path) or exc from None
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if mode.lower() != "wal":
                raise Unavailable(f"{path}: SQLite refused WAL mode (got {mode})")
            migrate(conn)
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise damaged_database(exc, path) or exc from None
        except BaseException:
            conn.close()
            raise
        self._write_conn = conn
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.batches = 0
        self.jobs = 0
        self._had_company = False  # the last batch held more than one write
        self._thread = threading.Thread(target=self._run, name="hyphae-writer", daemon=True)
        self._thread.start()
        self._closed = False

    # -- reads -------------------------------------------------------------------

    def reader(self) -> sqlite3.Connection:
        """This thread's read connection."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = _connect(self.path)
            conn.execute("PRAGMA query_only = ON")
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def query(self, sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        return self.reader().execute(sql, params).fetchall()

    def query_one(self, sql: str, params: Any = ()) -> tuple[Any, ...] | None:
        return self.reader().execute(sql, params).fetchone()

    # -- writes ------------------------------------------------------------------

    def submit(self, fn: Callable[[Transaction], T]) -> concurrent.futures.Future[T]:
        """Queue a write job; the future resolves once its batch is durable."""
        job = self._enqueue(PendingWrite(fn))
        assert job.future is not None
        return job.future

    def _enqueue(self, job: PendingWrite) -> PendingWrite:
        if self._closed:
            raise Unavailable("the database is closed")
        self._queue.put(job)
        return job

    def write_sync(self, fn: Callable[[Transaction], T]) -> T:
        return self.submit(fn).result()

    async def write(self, fn: Callable[[Transaction], T]) -> T:
        """Run a write job and wait for it to be durable, without holding a worker thread."""
        waker = current_waker()
        job = self._enqueue(PendingWrite(fn, waker))
        await waker[1].wait()
        return job.outcome()

    def enqueue(self, write: PendingWrite) -> None:
        """Queue a write made with a waker, from any thread: the waker is woken once its
        batch is durable, and ``write.outcome()`` then gives its result or raises."""
        assert write.waker is not None
        self._enqueue(write)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join()
        self._write_conn.close()
        with self._readers_lock:
            for conn in self._readers:
                try:
                    conn.close()
                except sqlite3.ProgrammingError:  # created in a thread that is gone
                    pass
            self._readers.clear()

    def _run_batch(self, batch: list[PendingWrite], *, isolated: bool) -> tuple[Transaction | None, list[tuple[PendingWrite, bool, Any]]]:
        """Run a batch's jobs in one open transaction.

        The fast path runs them back to back; if one fails it rolls everything back and
        returns no transaction, and the batch is run again ``isolated``: each job under a
        SAVEPOINT, so a failing job is undone alone. Jobs are functions of the database,
        so running one twice is safe; their after-commit actions are only kept from the
        run that commits. A failure after which SQLite has rolled the whole transaction
        back itself (a full disk) is raised: the batch fails as a commit that failed.
        """
        conn = self._write_conn
        tx = Transaction(conn)
        outcomes: list[tuple[PendingWrite, bool, Any]] = []
        conn.execute("BEGIN IMMEDIATE")
        for job in batch:
            if not isolated:
                try:
                    outcomes.append((job, True, job.fn(tx)))
                except Exception:
                    if conn.in_transaction:  # else SQLite has rolled it back already (see below)
                        conn.execute("ROLLBACK")
                    return None, []
                continue
            conn.execute("SAVEPOINT job")
            mark = tx._mark()
            try:
                result = job.fn(tx)
            except Exception as exc:  # the job's own failure: undo it alone
                if not conn.in_transaction:
                    # SQLite rolled the whole transaction back itself (SQLITE_FULL, an I/O error):
                    # every job of the batch is undone, so the batch fails as at its commit.
                    if isinstance(exc, sqlite3.Error):
                        raise
                    raise sqlite3.OperationalError(f"the transaction was rolled back: {exc}") from exc
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                tx._undo(mark)
                outcomes.append((job, False, _job_error(exc, self.path)))
            else:
                conn.execute("RELEASE job")
                outcomes.append((job, True, result))
        return tx, outcomes

    # -- the writer thread -------------------------------------------------------

    def _run(self) -> None:
        while True:
            first = self._queue.get()
            if first is _STOP:
                return
            batch = [first]
            stop = self._drain(batch)
            if len(batch) == 1 and not stop and self._window > 0 and self._had_company:
                # A lone write waits the window for company, but only while writes have been
                # arriving together (PostgreSQL's commit_siblings, in spirit): a writer that
                # waits for each answer before the next write never brings company, and
                # would pay the window on every call. When others were already queued,
                # writers are outpacing commits: later ones gather during this batch's
                # fsync, and sleeping would only idle every waiting caller.
                time.sleep(self._window)
                stop = self._drain(batch)
            self._had_company = len(batch) > 1
            self._commit(batch)
            if stop:
                return

    def _drain(self, batch: list[PendingWrite]) -> bool:
        """Move every queued job into ``batch``; True when the stop marker was among them."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return False
            if item is _STOP:
                return True
            batch.append(item)

    def _commit(self, batch: list[PendingWrite]) -> None:
        conn = self._write_conn
        try:
            tx, outcomes = self._run_batch(batch, isolated=False)
            if tx is None:  # a job failed: undo the batch, then run each job under its own savepoint
                tx, outcomes = self._run_batch(batch, isolated=True)
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            log.error("write batch of %d failed: %s", len(batch), exc)
            error = _commit_error(exc, self.path)
            for job in batch:
                job.settle(False, error)
            wake_all(job.waker for job in batch)
            return
        self.batches += 1
        self.jobs += len(batch)
        for action in tx._after:
            try:
                action()
            except Exception:  # an in-memory structure failed; the data is safe on disk
                log.exception("after-commit action failed")
        for job, ok, value in outcomes:
            job.settle(ok, value)
        wake_all(job.waker for job in batch)


def damaged_database(exc: BaseException, path: Path) -> ConfigError | None:
    """A file that is no SQLite database, or a damaged one, as the one line a user can act
    on (the CLI's exit 3); None for any other error."""
    if isinstance(exc, sqlite3.DatabaseError) and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) in _DAMAGED:
        return ConfigError(
            f"{path} is not a usable database ({exc}): restore it from a backup or a `hyphae export` file, or "
            "move it away and run `hyphae init` to start an empty one"
        )
    return None


_DAMAGED = (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _disk_full(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.Error) and (getattr(exc, "sqlite_errorcode", 0) & 0xFF) == sqlite3.SQLITE_FULL


def _job_error(exc: Exception, path: Path) -> Exception:
    """What the caller of a job that failed alone is told: its own error, except a full disk
    (a big job, an import's batch, spills to the WAL before the commit and meets it there),
    which is named as at a commit."""
    return _commit_error(exc, path) if _disk_full(exc) else exc


def _commit_error(exc: sqlite3.Error, path: Path) -> Unavailable:
    """What the callers of a batch that could not commit are told.

    SQLITE_FULL (no space for the database, its WAL or its journal) is the one failure a
    user can act on, so it gets its own reason; the batch was rolled back and the
    database stays consistent, so freeing space is all it takes to write again.
    """
    if _disk_full(exc):
        log.error("the disk holding %s is full: writes are refused until space is freed", path)
        return DiskFull("the node's disk is full: nothing was stored; free some space and retry (reads still work)")
    return Unavailable(f"the database could not commit: {exc}")
