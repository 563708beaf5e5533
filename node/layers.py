"""The three layer indexes (L0, L1, L2), kept in step with the database.

``layer_members`` records, in order, every cell that joined a layer. Each index file
remembers the last ``seq`` it covers, so opening a node loads the files and adds only
the newer members (their vectors are read from SQLite: nothing is re-embedded). When
a file is missing, corrupt or stale, that layer is rebuilt from SQLite and the reason
is logged. Cells stored in another embedding space stay out of the indexes until the
node is re-indexed: one index never mixes fingerprints.

Inserting into HNSW costs far more than a durable SQLite write, so the two are
decoupled: a committed row joins a small *fresh* buffer at once (searched exactly, so
a writer reads its own write) and an indexer thread moves the buffer into HNSW in
batches, on every core. The same pass looks for near-duplicates of the new rows (the
energy model's reinforcement) with one batched query. The buffer is bounded: when the
indexer falls behind, commits wait for it rather than let memory grow.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

import numpy as np

from .catalog import CellCatalog
from .cells import LAYERS
from .index import LayerIndex
from .progress import Progress as ProgressBar
from .store.members import LayerMembers

__all__ = ["LayerSet", "RebuildProgress"]

log = logging.getLogger("hyphae.layers")

Progress = Callable[[str, int, int], None]
NearDuplicates = Callable[[list[tuple[int, int, float]]], None]
_CHUNK = 20_000
_INDEX_BATCH = 2048
_FRESH_LIMIT = 16_384
# The online indexer takes the index's write lock per chunk: searches wait at most one chunk.
_ONLINE_CHUNK = 64


class RebuildProgress:
    """The default ``progress`` of :meth:`LayerSet.open`: rebuilds show that they move.

    With stderr on a terminal, a one-line bar per layer (``node.progress``); otherwise (a
    daemon writing its log to a file) a log line at every tenth of the way, with the
    percentage, so whoever reads the log of a slow start sees what it is doing.
    """

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", None) and self.stream.isatty())
        self._layer: str | None = None
        self._bar: ProgressBar | None = None
        self._logged_tenth = -1

    def __call__(self, layer: str, done: int, total: int) -> None:
        if not total:
            return
        if layer != self._layer:
            self._finish()
            self._layer, self._logged_tenth = layer, -1
            if self.terminal:
                self._bar = ProgressBar(f"indexing {layer}", total, enabled=True, stream=self.stream)
        if self._bar is not None:
            self._bar.update(done, total)
        else:
            tenth = 10 * done // total
            if tenth > self._logged_tenth:
                self._logged_tenth = tenth
                log.warning("indexing the %s layer: %d%% (%d/%d rows)", layer, 100 * done // total, done, total)
        if done >= total:
            self._finish()

    def _finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar, self._layer = None, None


class _Fresh:
    """Committed rows of one layer that HNSW does not hold yet, oldest first.

    Rows live in preallocated arrays (a window ``[_start, _start + len)`` that grows by
    doubling and is compacted when the front was consumed), so a store appends one row
    and a search scans a view: nothing is re-stacked per search, which matters when the
    buffer holds tens of thousands of rows during a burst.
    """

    _INITIAL = 1024

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._reset()

    def _reset(self) -> None:
        self._matrix = np.empty((self._INITIAL, self.dim), dtype=np.float32)
        self._rowids = np.empty(self._INITIAL, dtype=np.int64)
        self._seqs = np.empty(self._INITIAL, dtype=np.int64)
        self._start = self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, seq: int, rowid: int, vector: np.ndarray) -> None:
        self.extend([seq], [rowid], [vector])

    def extend(self, seqs: list[int], rowids: list[int], vectors: list[np.ndarray]) -> None:
        """Append rows in order: one block write per array (a write batch's rows at once)."""
        end = self._start + self._count
        if end + len(seqs) > len(self._rowids):
            self._make_room(len(seqs))
            end = self._count
        rows = slice(end, end + len(seqs))
        self._matrix[rows] = vectors
        self._rowids[rows] = rowids
        self._seqs[rows] = seqs
        self._count += len(seqs)

    def _make_room(self, extra: int) -> None:
        live = slice(self._start, self._start + self._count)
        capacity = len(self._rowids)
        while self._count + extra > capacity // 2:
            capacity *= 2
        matrix, rowids, seqs = self._matrix[live].copy(), self._rowids[live].copy(), self._seqs[live].copy()
        if capacity != len(self._rowids):
            self._matrix = np.empty((capacity, self.dim), dtype=np.float32)
            self._rowids = np.empty(capacity, dtype=np.int64)
            self._seqs = np.empty(capacity, dtype=np.int64)
        self._matrix[: self._count], self._rowids[: self._count], self._seqs[: self._count] = matrix, rowids, seqs
        self._start = 0

    def front(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Copies of the oldest ``count`` rows: (seqs, rowids, vectors)."""
        rows = slice(self._start, self._start + min(count, self._count))
        return self._seqs[rows].copy(), self._rowids[rows].copy(), self._matrix[rows].copy()

    def drop_front(self, count: int) -> None:
        count = min(count, self._count)
        self._start += count
        self._count -= count
        if not self._count:
            if len(self._rowids) > self._INITIAL:
                self._reset()  # hand a burst's large arrays back
            self._start = 0

    def discard(self, rowid: int) -> None:
        """Forget a row's vector before it ever reaches HNSW (its seq stays, for the watermark)."""
        rows = slice(self._start, self._start + self._count)
        for i in np.flatnonzero(self._rowids[rows] == rowid):
            self._matrix[self._start + i] = 0.0
            self._rowids[self._start + i] = -1

    def search(self, vector: np.ndarray, k: int, allowed) -> list[tuple[int, float]]:
        if not self._count:
            return []
        rows = slice(self._start, self._start + self._count)
        labels = self._rowids[rows]
        distances = 1.0 - self._matrix[rows] @ vector
        keep = labels >= 0
        if allowed is not None:
            keep &= allowed(np.where(keep, labels, 0))
        labels, distances = labels[keep], distances[keep]
        if len(distances) > k:
            nearest = np.argpartition(distances, k)[:k]
            labels, distances = labels[nearest], distances[nearest]
        order = np.argsort(distances, kind="stable")[:k]
        return [(int(labels[i]), float(distances[i])) for i in order]


class LayerSet:
    def __init__(
        self,
        members: LayerMembers,
        index_dir: Path,
        dim: int,
        space: str,
        *,
        near_duplicate_cos: float = 0.95,
        on_near_duplicates: NearDuplicates | None = None,
        index_options: dict | None = None,
    ) -> None:
        self.members = members
        self._index_options = dict(index_options or {})
        self.dim = dim
        self.space = space
        self.catalog = CellCatalog()
        index_dir.mkdir(parents=True, exist_ok=True)
        self.index_dir = index_dir
        self.indexes = {layer: self._new_index(layer) for layer in LAYERS}
        self.open_report: dict[str, str] = {}
        self._near_cos = near_duplicate_cos
        self._on_near_duplicates = on_near_duplicates
        self._fresh = {layer: _Fresh(dim) for layer in LAYERS}
        self._cond = threading.Condition()
        self._closing = False
        self._indexer: threading.Thread | None = None
        self.indexer_errors = 0

    def _new_index(self, layer: str) -> LayerIndex:
        return LayerIndex(self.index_dir, layer, self.dim, self.space, **self._index_options)

    def open(self, progress: Progress | None = None) -> dict[str, str]:
        """Load the catalogue and each index, catching up or rebuilding. Blocking.

        A layer whose files are missing (while the database has members for it), corrupt
        or stale is rebuilt from SQLite, after a warning that says why. ``progress(layer,
        done, total)`` follows every rebuild and any catch-up longer than one chunk; by
        default a :class:`RebuildProgress` (a bar on a terminal, log lines otherwise). A
        caller that passes its own is driving a rebuild it asked for (``hyphae reindex``) and
        reports it itself, so the reason is then logged at INFO rather than WARNING.
        """
        why_level = logging.WARNING if progress is None else logging.INFO
        progress = progress if progress is not None else RebuildProgress()
        self.catalog.add_many(self.members.catalog_entries())
        for layer in LAYERS:
            index = self.indexes[layer]
            outcome = index.load()
            members, last_seq = self.members.extent(layer)
            reason = None if outcome.loaded else outcome.reason
            if outcome.loaded and last_seq < index.covered_seq:
                # The files cover members this database never had (a database restored from
                # a backup, or another data dir's files): not ours.
                reason = f"stale: the files cover row {index.covered_seq}, the database ends at {last_seq}"
                index = self.indexes[layer] = self._new_index(layer)
            if reason is not None and (members or reason != "missing"):
                log.log(why_level, "rebuilding the %s index from the database (%d rows): %s", layer, members, reason)
            behind = members if reason is not None else self._members_after(layer, index.covered_seq)
            report = progress if reason is not None or behind > _CHUNK else None
            added = self._catch_up(layer, index, report)
            # Rows forgotten after the files were last saved (a crash before the next save):
            # their vectors are still in the files until erased and saved again.
            held = index.labels()
            index.remove(held[~self.catalog.alive(held)])
            state = "loaded" if reason is None else f"rebuilt ({reason})"
            self.open_report[layer] = f"{state}, {added} rows added, {len(index)} live"
            if added or reason is not None or index.dirty:
                self._save_index(layer, index)
        return self.open_report

    def _members_after(self, layer: str, seq: int) -> int:
        return self.members.count_after(layer, seq)

    def _catch_up(self, layer: str, index: LayerIndex, progress: Progress | None) -> int:
        """Add the layer's members newer than the index's watermark; returns how many were added."""
        last_seq = self.members.last_seq(layer)
        start = index.covered_seq
        total = self._members_after(layer, start)
        if progress and total:
            progress(layer, 0, total)
        added = scanned = 0
        while True:
            rows = self.members.after(layer, start, _CHUNK)
            if not rows:
                break
            start = rows[-1][0]
            scanned += len(rows)
            usable = [r for r in rows if r[4] is None and r[3] == self.space]
            if usable:
                labels = np.array([r[1] for r in usable], dtype=np.int64)
                vectors = np.frombuffer(b"".join(r[2] for r in usable), dtype=np.float32).reshape(-1, self.dim)
                index.add(labels, vectors, covered_seq=start)
                added += len(usable)
            else:
                index.covered_seq = max(index.covered_seq, start)
            if progress:
                progress(layer, min(scanned, total), total)
        index.covered_seq = max(index.covered_seq, last_seq)
        return added

    # -- the fresh buffer and the indexer thread -----------------------------------

    def set_near_duplicate_handler(self, handler: NearDuplicates) -> None:
        self._on_near_duplicates = handler

    def start_indexer(self) -> None:
        self._indexer = threading.Thread(target=self._index_loop, name="hyphae-indexer", daemon=True)
        self._indexer.start()

    def add(self, layer: str, seq: int, rowid: int, vector: np.ndarray) -> None:
        """A committed row joins the layer (called after commit, from the writer thread)."""
        self.add_rows([(layer, seq, rowid, vector)])

    def add_rows(self, rows: list[tuple[str, int, int, np.ndarray]]) -> None:
        """Committed rows ``(layer, seq, rowid, vector)`` join their layers, in order: a
        write batch's rows under one lock and one wake-up of the indexer (writer thread)."""
        with self._cond:
            while sum(map(len, self._fresh.values())) >= _FRESH_LIMIT and self._indexer_alive():
                self._cond.wait(0.5)  # backpressure: the indexer is behind
            by_layer: dict[str, tuple[list[int], list[int], list[np.ndarray]]] = {}
            for layer, seq, rowid, vector in rows:
                seqs, rowids, vectors = by_layer.setdefault(layer, ([], [], []))
                seqs.append(seq)
                rowids.append(rowid)
                vectors.append(vector)
            for layer, (seqs, rowids, vectors) in by_layer.items():
                self._fresh[layer].extend(seqs, rowids, vectors)
            self._cond.notify_all()

    def _indexer_alive(self) -> bool:
        return self._indexer is not None and self._indexer.is_alive() and not self._closing

    def flush(self) -> None:
        """Wait until every committed row is in HNSW (or index it here if no indexer runs)."""
        if not self._indexer_alive():
            while self._index_some():
                pass
            return
        with self._cond:
            while any(len(f) for f in self._fresh.values()):
                self._cond.wait(0.5)

    def _index_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closing and not any(len(f) for f in self._fresh.values()):
                    self._cond.wait()
                if self._closing and not any(len(f) for f in self._fresh.values()):
                    return
            try:
                self._index_some()
            except Exception:  # keep serving from the fresh buffer; the DB has the rows
                self.indexer_errors += 1
                log.exception("indexing failed; the rows stay searchable and are retried")
                with self._cond:
                    self._cond.wait(1.0)

    def _index_some(self) -> bool:
        """Move one batch per layer from the fresh buffer into HNSW; False when there was none."""
        moved = False
        for layer, fresh in self._fresh.items():
            with self._cond:
                count = min(len(fresh), _INDEX_BATCH)
                if not count:
                    continue
                seqs, labels, vectors = fresh.front(count)
            live = (labels >= 0) & self.catalog.alive(np.maximum(labels, 0))
            labels, vectors = labels[live], vectors[live]
            index = self.indexes[layer]
            # One core for HNSW while the buffer is shallow leaves the other to the store path
            # (trio loop + writer); both once it fills, since a full buffer holds writers back.
            threads = 1 if len(fresh) < _FRESH_LIMIT // 2 else os.cpu_count() or 1
            if layer == "L0" and self._on_near_duplicates is not None and len(labels):
                self._find_near_duplicates(index, labels, vectors, threads)
            if len(labels):
                index.add(labels, vectors, covered_seq=int(seqs.max()), chunk_rows=_ONLINE_CHUNK, threads=threads)
            else:
                index.covered_seq = max(index.covered_seq, int(seqs.max()))
            with self._cond:
                fresh.drop_front(count)
                self._cond.notify_all()
            # A forget that landed while this batch was being inserted: take it out again.
            died = labels[~self.catalog.alive(labels)] if len(labels) else labels
            if len(died):
                index.remove(died)
            moved = True
        return moved

    def _find_near_duplicates(self, index: LayerIndex, labels: np.ndarray, vectors: np.ndarray, threads: int) -> None:
        """Pairs (new, earlier, cos) with cos ≥ the threshold, against HNSW and within the batch."""
        pairs: list[tuple[int, int, float]] = []
        if len(index):
            others, distances = index.nearest_many(vectors, 3, threads=threads)
            for i, j in zip(*np.nonzero((others >= 0) & (1.0 - distances >= self._near_cos))):
                pairs.append((int(labels[i]), int(others[i, j]), float(1.0 - distances[i, j])))
        if len(labels) > 1:
            similar = np.triu(vectors @ vectors.T, k=1) >= self._near_cos
            for i, j in zip(*np.nonzero(similar)):
                pairs.append((int(labels[j]), int(labels[i]), float(vectors[i] @ vectors[j])))
        if pairs:
            self._on_near_duplicates(pairs)

    def close(self) -> None:
        """Index what is left, stop the indexer, save. Blocking."""
        self.flush()
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._indexer is not None:
            self._indexer.join()
        self.save()

    def remove(self, rowid: int) -> None:
        """A forgotten row leaves every layer: its vector is erased from the fresh buffer and
        the indexes (the next save writes files without it)."""
        self.catalog.kill(rowid)
        with self._cond:
            for fresh in self._fresh.values():
                fresh.discard(rowid)
        for index in self.indexes.values():
            index.remove(np.array([rowid], dtype=np.int64))

    # -- reads --------------------------------------------------------------------

    def search(self, layer: str, vector: np.ndarray, k: int, allowed) -> list[tuple[int, float]]:
        """Nearest allowed rows: HNSW merged with the fresh buffer, so writes are read at once."""
        hits = self.indexes[layer].search(vector, k, allowed=allowed)
        fresh = self._fresh[layer]
        if len(fresh):
            with self._cond:
                recent = fresh.search(vector, k, allowed)
            if recent:
                best = dict(hits)
                for label, distance in recent:
                    best[label] = min(distance, best.get(label, distance))
                hits = sorted(best.items(), key=lambda item: item[1])[:k]
        return hits

    def save(self, min_dirty: int = 1) -> bool:
        """Persist every index with at least ``min_dirty`` unsaved changes. Blocking.

        Never raises for a failed save (a full disk, above all): the files are a cache, the
        previous ones stay valid, and the next start catches up from the database. Returns
        False when some index could not be saved.
        """
        saved = True
        for layer, index in self.indexes.items():
            if index.dirty >= min_dirty:
                saved &= self._save_index(layer, index)
        return saved

    def _save_index(self, layer: str, index: LayerIndex) -> bool:
        try:
            index.save()
        except (OSError, RuntimeError) as exc:
            log.warning(
                "could not save the %s index (%s); the previous files stay valid and the next start "
                "catches up from the database", layer, exc,
            )
            return False
        return True

    def sizes(self) -> dict[str, int]:
        return {layer: len(index) + len(self._fresh[layer]) for layer, index in self.indexes.items()}

    def backlog(self) -> int:
        return sum(map(len, self._fresh.values()))

