"""The per-layer approximate-nearest-neighbour index.

Why hnswlib: an HNSW graph answers a k=10 cosine query over 100k 384-d vectors in well under a
millisecond at recall@10 above 0.98 (see ``benchmarks/results/index.md``), supports deletion marks,
in-place resizing and a single-file save, and ships as a wheel (``chroma-hnswlib``). Exact numpy
search is 20-40x slower at that size.

Labels are the caller's int64 ids (the cell's SQLite rowid), so a hit maps straight back to a row and
the index stores nothing the database does not already hold. The database is the source of truth;
the index is a cache that can always be rebuilt from it. ``covered_seq`` is its durable watermark: the
highest caller-defined sequence number whose rows are all in the index, saved with it. After a restart
the caller loads the index and replays only rows newer than ``covered_seq``; when ``load`` reports
anything but ``"ok"`` the index is empty and the caller rebuilds it from the database.

Save protocol (a crash at any point leaves the previous good pair loadable):

1. hnswlib writes the graph to a fresh, uniquely named file ``<layer>-<token>.hnsw``; it is fsynced
   and hashed (blake2b). No meta names it yet, so a crash here leaves only an orphan.
2. The meta JSON (layer, dim, space, counts, ``covered_seq``, parameters, format version, the index
   file's name and checksum) goes to a temp name, is fsynced and ``os.replace``-d over
   ``<layer>.meta.json``; the directory is fsynced. This rename is the commit point.
3. Older index files and temp leftovers of this layer are deleted.

``load`` checks the checksum before hnswlib parses the file, because hnswlib trusts its input and may
crash the process on a damaged file.

Removing is erasing, on disk: hnswlib's ``mark_deleted`` only hides a row, and its vector would stay
in every file saved afterwards. Updating the row with zeros first (hnswlib's in-place update) costs
~13 ms a row, as it repairs the row's neighbourhood. So ``save`` zeroes the vectors (and chroma's
norms) of the removed rows in the file hnswlib just wrote, before it is fsynced and hashed: the
removed rows keep their place in the graph, and no saved file holds their vectors. A file saved
before this rule (no ``removed_erased`` in its meta) counts as a change at load, so it is saved again.

Threads: ``search`` runs under a shared lock and may run on several threads at once (hnswlib releases
the GIL while it searches); ``add``, ``remove`` and ``load`` take the lock exclusively, ``add`` in
chunks so searches interleave with a long rebuild. ``save`` holds the shared lock while hnswlib writes,
which keeps writers out but lets searches continue.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import pathlib
import secrets
import struct
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import hnswlib
import numpy as np

__all__ = ["LayerIndex", "LoadOutcome"]

FORMAT_VERSION = 1

# Tuned with benchmarks/index_bench.py (results in benchmarks/results/index.md). ef_construction
# 100 rather than 200: it halves the CPU of every insert (the online indexer is what bounds a
# sustained store rate) and still gives recall@10 0.993 at 100k clustered (64 gave 0.977).
DEFAULT_M = 16
DEFAULT_EF_CONSTRUCTION = 100
DEFAULT_EF_SEARCH = 80

# Rows per exclusive-lock hold in `add`, so searches are never blocked for a whole rebuild.
_ADD_CHUNK = 4096
# A filtered search over-fetches up to this many candidates from HNSW before it asks how many rows
# the filter allows at all; if they are few, an exact scan over just those rows is cheaper.
_OVERFETCH_BEFORE_EXACT = 1024
# hnswlib hands stored vectors back as Python lists (~50 us a row), so exact search is only worth it
# for small allowed sets; above this HNSW keeps widening instead.
_EXACT_MAX_ROWS = 4096
_HASH_CHUNK = 1 << 20

Filter = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True, slots=True)
class LoadOutcome:
    """Whether `LayerIndex.load` used the files on disk, and why not when it did not."""

    loaded: bool
    reason: str


class _ReadWriteLock:
    """Many readers or one writer; a waiting writer holds back new readers so it cannot starve."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._writers_waiting = 0

    @contextlib.contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._writers_waiting:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if not self._readers:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._writers_waiting += 1
            while self._writer or self._readers:
                self._cond.wait()
            self._writers_waiting -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()


class LayerIndex:
    """hnswlib, cosine space, for one layer ("L0"/"L1"/"L2").

    Labels are int64 ids chosen by the caller (the cell's SQLite rowid); vectors are float32 and
    L2-normalised. Distances are cosine distances, ``1 - cos``.
    """

    covered_seq: int
    space: str

    def __init__(
        self,
        directory: pathlib.Path,
        layer: str,
        dim: int,
        space: str,
        *,
        m: int = DEFAULT_M,
        ef_construction: int = DEFAULT_EF_CONSTRUCTION,
        ef_search: int = DEFAULT_EF_SEARCH,
        initial_capacity: int = 1024,
    ) -> None:
        if dim <= 0:
            raise ValueError(f"dim must be positive, got {dim}")
        self.directory = pathlib.Path(directory)
        self.layer = layer
        self.dim = dim
        self.space = space
        self.m = m
        self.ef_construction = ef_construction
        self.ef_search = ef_search
        self.initial_capacity = max(1, initial_capacity)
        self._lock = _ReadWriteLock()
        self._save_lock = threading.Lock()
        self._reset()

    @property
    def meta_path(self) -> pathlib.Path:
        return self.directory / f"{self.layer}.meta.json"

    @property
    def dirty(self) -> int:
        """Rows added or removed since the last save or load."""
        return self._dirty

    def __len__(self) -> int:
        """Live (not removed) items."""
        return self._index.element_count - len(self._removed)

    # -- loading -------------------------------------------------------------------------------

    def load(self) -> LoadOutcome:
        """Load the saved index from `directory`; on anything but "ok" the index is left empty."""
        with self._save_lock, self._lock.write():
            outcome = self._load_files()
            if not outcome.loaded:
                self._reset()
            return outcome

    def _load_files(self) -> LoadOutcome:
        try:
            raw = self.meta_path.read_bytes()
        except FileNotFoundError:
            return LoadOutcome(False, "missing")
        try:
            meta = json.loads(raw)
            index_name = meta["index_file"]
            if not isinstance(index_name, str) or pathlib.Path(index_name).name != index_name:
                raise ValueError("index_file must be a bare file name")
        except (ValueError, KeyError, TypeError):
            return LoadOutcome(False, "corrupt: meta unreadable")
        for key, expected in (
            ("format", FORMAT_VERSION),
            ("layer", self.layer),
            ("space", self.space),
            ("dim", self.dim),
        ):
            if meta.get(key) != expected:
                return LoadOutcome(False, f"stale: {key} differs")
        index_path = self.directory / index_name
        try:
            checksum = _blake2b_file(index_path)
        except FileNotFoundError:
            return LoadOutcome(False, "corrupt: index file missing")
        if checksum != meta.get("checksum"):
            return LoadOutcome(False, "corrupt: checksum mismatch")
        try:
            capacity = max(int(meta["capacity"]), int(meta["count"]), 1)
            index = hnswlib.Index(space="cosine", dim=self.dim)
            index.load_index(str(index_path), max_elements=capacity)
            removed = {int(label) for label in meta["removed"]}
            covered_seq = int(meta["covered_seq"])
        except (RuntimeError, ValueError, KeyError, TypeError) as exc:
            return LoadOutcome(False, f"corrupt: {exc}")
        if index.element_count != meta["count"] or index.dim != self.dim:
            return LoadOutcome(False, "corrupt: count differs")
        # The loaded graph keeps the M and ef_construction it was built with (saved in the file).
        index.set_ef(self.ef_search)
        self._index = index
        self._removed = removed
        self.covered_seq = covered_seq
        self._dirty = 0
        if not meta.get("removed_erased") and removed:  # saved by a version that kept their vectors
            self._dirty += 1
        self._remove_orphans(keep=index_name)
        return LoadOutcome(True, "ok")

    def _reset(self) -> None:
        index = hnswlib.Index(space="cosine", dim=self.dim)
        index.init_index(
            max_elements=self.initial_capacity, ef_construction=self.ef_construction, M=self.m
        )
        index.set_ef(self.ef_search)
        self._index = index
        self._removed: set[int] = set()
        self.covered_seq = 0
        self._dirty = 0

    # -- writing -------------------------------------------------------------------------------

    def add(
        self,
        labels: np.ndarray,
        vectors: np.ndarray,
        *,
        covered_seq: int,
        chunk_rows: int = _ADD_CHUNK,
        threads: int | None = None,
    ) -> None:
        """Insert rows (an existing label is replaced) and raise the watermark to `covered_seq`.

        hnswlib cannot search while it inserts, so searches wait for each chunk: a node that
        serves reads passes a small `chunk_rows` (a short stall per chunk), a rebuild the
        default. `threads` defaults to every core.
        """
        labels = _as_labels(labels)
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape != (len(labels), self.dim):
            raise ValueError(f"vectors must have shape ({len(labels)}, {self.dim}), got {vectors.shape}")
        for start in range(0, len(labels), chunk_rows):
            chunk = slice(start, start + chunk_rows)
            with self._lock.write():
                self._add_chunk(labels[chunk], vectors[chunk], threads or os.cpu_count() or 1)
        with self._lock.write():
            self.covered_seq = max(self.covered_seq, covered_seq)

    def _add_chunk(self, labels: np.ndarray, vectors: np.ndarray, threads: int) -> None:
        needed = self._index.element_count + len(labels)
        capacity = self._index.get_max_elements()
        if needed > capacity:
            # Amortised doubling: a rebuild of n rows resizes O(log n) times.
            self._index.resize_index(max(needed, 2 * capacity))
        self._index.add_items(vectors, labels.astype(np.uint64), num_threads=threads)
        # hnswlib revives a removed label when it is added again.
        self._removed.difference_update(labels.tolist())
        self._dirty += len(labels)

    def remove(self, labels: Iterable[int] | np.ndarray, *, covered_seq: int = 0) -> None:
        """Mark labels deleted so no search returns them (and the next save writes zeros for
        their vectors); absent labels are ignored.

        `covered_seq` lets a caller that sequences tombstones with rows advance the watermark too.
        """
        with self._lock.write():
            for label in _as_labels(labels).tolist():
                if label in self._removed:
                    continue
                try:
                    self._index.mark_deleted(label)
                except RuntimeError:  # "Label not found": never added
                    continue
                self._removed.add(label)
                self._dirty += 1
            self.covered_seq = max(self.covered_seq, covered_seq)

    def labels(self) -> np.ndarray:
        """Every label the index holds that is not removed."""
        with self._lock.read():
            labels = np.fromiter(self._index.get_ids_list(), dtype=np.int64)
            if self._removed:
                labels = labels[~np.isin(labels, np.fromiter(self._removed, dtype=np.int64))]
            return labels

    def save(self) -> None:
        """Write the index and its meta atomically (see the module docstring).

        If anything fails before the commit point (a full disk, above all), the new files are
        deleted, the previous pair stays the loadable one, and the error is raised.
        """
        with self._save_lock:
            self.directory.mkdir(parents=True, exist_ok=True)
            index_name = f"{self.layer}-{secrets.token_hex(8)}.hnsw"
            index_path = self.directory / index_name
            temp_meta = self.directory / f".{self.layer}.meta.{secrets.token_hex(8)}.tmp"
            try:
                saved_dirty = self._write_new_pair(index_path, temp_meta)
            except BaseException:
                index_path.unlink(missing_ok=True)
                temp_meta.unlink(missing_ok=True)
                raise
            os.replace(temp_meta, self.meta_path)
            _fsync_dir(self.directory)
            with self._lock.write():
                self._dirty -= saved_dirty
            self._remove_orphans(keep=index_name)

    def _write_new_pair(self, index_path: pathlib.Path, temp_meta: pathlib.Path) -> int:
        """Steps 1 and 2 of the save protocol up to the rename; returns the changes it covers."""
        with self._lock.read():
            self._index.save_index(str(index_path))
            _zero_removed(index_path, self._removed, self.dim)
            meta: dict[str, Any] = {
                "format": FORMAT_VERSION,
                "layer": self.layer,
                "dim": self.dim,
                "space": self.space,
                "count": self._index.element_count,
                "removed": sorted(self._removed),
                "removed_erased": True,
                "covered_seq": self.covered_seq,
                "capacity": self._index.get_max_elements(),
                "m": self._index.M,
                "ef_construction": self._index.ef_construction,
                "ef_search": self.ef_search,
                "index_file": index_path.name,
            }
            saved_dirty = self._dirty
        _fsync_file(index_path)
        # hnswlib does not check its writes: on a full disk it leaves a short file and
        # returns as if all went well, and a checksum of that file would bless it.
        _check_hnsw_file_complete(index_path)
        meta["checksum"] = _blake2b_file(index_path)
        with open(temp_meta, "wb") as fh:
            fh.write(json.dumps(meta, indent=1).encode())
            fh.flush()
            os.fsync(fh.fileno())
        return saved_dirty

    def _remove_orphans(self, *, keep: str) -> None:
        """Delete this layer's index files other than `keep`, and temp files of crashed saves."""
        patterns = (f"{self.layer}-*.hnsw", f".{self.layer}.meta.*.tmp")
        for pattern in patterns:
            for path in self.directory.glob(pattern):
                if path.name != keep:
                    path.unlink(missing_ok=True)

    # -- searching -----------------------------------------------------------------------------

    def search(
        self, vector: np.ndarray, k: int, *, allowed: Filter | None = None
    ) -> list[tuple[int, float]]:
        """Up to `k` (label, cosine distance) pairs, nearest first.

        `allowed` maps an int64 array of candidate labels to a bool mask of the same length. HNSW
        over-fetches ``max(4k, 32)`` candidates and doubles until `k` pass the filter or the whole
        index was searched; a filter that lets few rows through is answered by exact search.
        """
        query = np.asarray(vector, dtype=np.float32).reshape(-1)
        if query.shape != (self.dim,):
            raise ValueError(f"query must have {self.dim} dimensions, got {query.shape}")
        if k <= 0:
            return []
        with self._lock.read():
            live = len(self)
            if not live:
                return []
            fetch = min(k, live) if allowed is None else max(4 * k, 32)
            while True:
                fetch = min(fetch, live)
                found = self._knn(query, fetch)
                if found is not None:
                    labels, distances = found
                    if allowed is not None:
                        keep = _mask(allowed, labels)
                        labels, distances = labels[keep], distances[keep]
                    if len(labels) >= k or fetch == live:
                        return _pairs(labels[:k], distances[:k])
                if fetch == live:
                    # hnswlib could not walk to every live row (tombstones can cut the graph).
                    return self._exact(query, k, allowed, limit=None)
                if allowed is not None and fetch >= _OVERFETCH_BEFORE_EXACT:
                    exact = self._exact(query, k, allowed, limit=_EXACT_MAX_ROWS)
                    if exact is not None:
                        return exact
                fetch *= 2

    def nearest_many(self, vectors: np.ndarray, k: int, *, threads: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The `k` nearest live labels and cosine distances for each row of `vectors`, unfiltered.

        One hnswlib call for the whole batch (threads inside hnswlib, not a Python loop): the
        indexer's near-duplicate check asks this for every batch it inserts. Rows with fewer than
        `k` neighbours are padded with label -1 and distance 2 (the cosine maximum). `threads`
        defaults to every core.

        It searches with the searches' beam: a narrower one is cheaper but misses pairs as the
        index grows (``benchmarks/index_bench.py --near-duplicates``: at 100k, ef 32 finds 97.5 %
        of the cos >= 0.95 pairs ef 80 finds, for a third less CPU), and hnswlib's one ef per
        index would make the check hold the exclusive lock.
        """
        queries = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dim)
        labels = np.full((len(queries), k), -1, dtype=np.int64)
        distances = np.full((len(queries), k), 2.0, dtype=np.float32)
        with self._lock.read():
            fetch = min(k, len(self))
            if not fetch or not len(queries):
                return labels, distances
            try:
                found, far = self._index.knn_query(queries, k=fetch, num_threads=threads or os.cpu_count() or 1)
            except RuntimeError:  # tombstones cut some query off from `fetch` live rows
                found = None
        if found is None:  # row by row, outside the lock: search() takes it again
            for row, query in enumerate(queries):
                for column, (label, distance) in enumerate(self.search(query, fetch)):
                    labels[row, column], distances[row, column] = label, distance
        else:
            labels[:, :fetch] = found.astype(np.int64)
            distances[:, :fetch] = far
        return labels, distances

    def _knn(self, query: np.ndarray, fetch: int) -> tuple[np.ndarray, np.ndarray] | None:
        # hnswlib searches with ef = max(ef, k), so a large over-fetch widens the beam by itself and
        # concurrent searches never race on a shared set_ef.
        try:
            labels, distances = self._index.knn_query(query, k=fetch, num_threads=1)
        except RuntimeError:  # fewer than `fetch` reachable live rows
            return None
        return labels[0].astype(np.int64), distances[0]

    def _exact(
        self, query: np.ndarray, k: int, allowed: Filter | None, *, limit: int | None
    ) -> list[tuple[int, float]] | None:
        """Exact search over the live rows `allowed` admits; None if they number more than `limit`."""
        labels = np.fromiter(self._index.get_ids_list(), dtype=np.int64)
        if self._removed:
            labels = labels[~np.isin(labels, np.fromiter(self._removed, dtype=np.int64))]
        if allowed is not None:
            labels = labels[_mask(allowed, labels)]
        if limit is not None and len(labels) > limit:
            return None
        if not len(labels):
            return []
        stored = np.asarray(self._index.get_items(labels), dtype=np.float32)
        norm = float(np.linalg.norm(query)) or 1.0
        distances = (1.0 - stored @ (query / norm)).astype(np.float32)
        order = np.argsort(distances, kind="stable")[:k]
        return _pairs(labels[order], distances[order])


def _as_labels(labels: Iterable[int] | np.ndarray) -> np.ndarray:
    array = np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels)
    array = array.astype(np.int64, copy=False).reshape(-1)
    if len(array) and int(array.min()) < 0:
        raise ValueError("labels must be non-negative (hnswlib stores them unsigned)")
    return array


def _mask(allowed: Filter, labels: np.ndarray) -> np.ndarray:
    mask = np.asarray(allowed(labels), dtype=bool)
    if mask.shape != labels.shape:
        raise ValueError(f"allowed() returned shape {mask.shape} for {labels.shape} labels")
    return mask


def _pairs(labels: np.ndarray, distances: np.ndarray) -> list[tuple[int, float]]:
    return list(zip(labels.tolist(), distances.astype(float).tolist()))


def _blake2b_file(path: pathlib.Path) -> str:
    digest = hashlib.blake2b(digest_size=32)
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return "blake2b:" + digest.hexdigest()


_HNSW_HEADER = struct.Struct("<QQQQQQiIQQQdQ")  # hnswlib's saveIndex header, 96 bytes


def _check_hnsw_file_complete(path: pathlib.Path) -> None:
    """Raise ENOSPC unless ``path`` holds every byte hnswlib's header promises.

    The layout: the header (element count, bytes per element, ...), the level-0 block of
    count x bytes-per-element, in chroma-hnswlib a float32 norm per element, then for each
    element a uint32 size and that many bytes of upper-level links. Both layouts (with and
    without the norms) are accepted; a file that ends early or late fits neither.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = fh.read(_HNSW_HEADER.size)
        if len(header) == _HNSW_HEADER.size:
            count, per_element = _HNSW_HEADER.unpack(header)[2:4]
            level0_end = _HNSW_HEADER.size + count * per_element
            for links_at in (level0_end + 4 * count, level0_end):
                if links_at > size:
                    continue
                fh.seek(links_at)
                if _links_end(fh.read(size - links_at), count) == size - links_at:
                    return
    raise OSError(errno.ENOSPC, "hnswlib wrote a short index file (is the disk full?)", str(path))


def _zero_removed(path: pathlib.Path, removed: set[int], dim: int) -> None:
    """Overwrite, in a file hnswlib just saved, the vector (and chroma-hnswlib's stored norm)
    of every element whose label is in ``removed``: a removed row keeps its place in the
    graph, and no byte of what it was.

    Each element of the level-0 block is ``size_data_per_element`` bytes: its links, then its
    vector at ``offsetData``, its label at ``label_offset``; chroma-hnswlib writes a float32
    norm per element right after the block (found as ``_check_hnsw_file_complete`` finds it).
    """
    if not removed:
        return
    with open(path, "rb") as fh:
        header = fh.read(_HNSW_HEADER.size)
    if len(header) < _HNSW_HEADER.size:
        return  # a short file: the completeness check that follows refuses it
    count, per_element, label_offset, data_offset = _HNSW_HEADER.unpack(header)[2:6]
    if not count or data_offset + 4 * dim > label_offset:
        return
    mapped = np.memmap(path, dtype=np.uint8, mode="r+")
    try:
        start = _HNSW_HEADER.size
        labels = np.ndarray((count,), "<u8", mapped, start + label_offset, (per_element,))
        rows = np.flatnonzero(np.isin(labels.astype(np.int64), np.fromiter(removed, np.int64, len(removed))))
        if not len(rows):
            return
        vectors = np.ndarray((count, dim), "<f4", mapped, start + data_offset, (per_element, 4))
        vectors[rows] = 0.0
        norms_at = start + count * per_element
        if _links_end(bytes(mapped[norms_at + 4 * count :]), count) == len(mapped) - norms_at - 4 * count:
            np.ndarray((count,), "<f4", mapped, norms_at)[rows] = 0.0
        mapped.flush()
    finally:
        del mapped


def _links_end(tail: bytes, count: int) -> int:
    """Where ``count`` (uint32 size, bytes) link lists starting at ``tail[0]`` end; -1 if cut short."""
    at = 0
    for _ in range(count):
        if at + 4 > len(tail):
            return -1
        (length,) = struct.unpack_from("<I", tail, at)
        at += 4 + length
    return at if at <= len(tail) else -1


def _fsync_file(path: pathlib.Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def _fsync_dir(directory: pathlib.Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
