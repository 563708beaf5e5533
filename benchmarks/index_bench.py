"""Benchmark node.index.LayerIndex against exact numpy search (run by hand).

Vectors are 384-d unit vectors. The "clustered" set is the realistic one: points drawn around 200
random topic centres with gaussian noise of norm 1, so two points of one topic have cos ~0.5 and two
of different topics cos ~0, close to what all-MiniLM-L6-v2 gives for paraphrases vs unrelated facts
(DESIGN.md section 12). The "uniform" set (uniform on the sphere) is the worst case for any ANN index
and is reported for honesty. Queries are held out from the same distribution.

    python benchmarks/index_bench.py --sizes 10000,100000 --queries 500 --seed 1

``--near-duplicates`` measures the indexer's near-duplicate check instead (``nearest_many`` with
k=3 at several beam widths): held-out copies of stored rows with a little noise (cos 0.95-0.99 to
their source), how many of the exact cos >= 0.95 pairs among the top 3 each beam finds, and its
CPU per query:

    python benchmarks/index_bench.py --near-duplicates --sizes 20000,100000 --queries 2000 --seed 1
"""

from __future__ import annotations

import argparse
import ctypes
import os
import pathlib
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from node.index import DEFAULT_EF_CONSTRUCTION, DEFAULT_EF_SEARCH, DEFAULT_M, LayerIndex  # noqa: E402

DIM = 384
TOPICS = 200
TOPIC_NOISE = 1.0
K = 10
EXACT_QUERIES = 200  # exact search is slow at 100k; its p50 settles well before 500 queries


@dataclass
class Row:
    kind: str
    n: int
    build_s: float
    recall: float
    recall_filtered: float
    p50_ms: float
    p99_ms: float
    filtered_p50_ms: float
    filtered_p99_ms: float
    exact_p50_ms: float
    save_s: float
    load_s: float
    file_mb: float
    disk_bytes_per_vector: float
    rss_bytes_per_vector: float

    @property
    def speedup(self) -> float:
        return self.exact_p50_ms / self.p50_ms


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def clustered(rng: np.random.Generator, n: int, centres: np.ndarray) -> np.ndarray:
    topic = rng.integers(0, len(centres), n)
    noise = rng.standard_normal((n, DIM)).astype(np.float32) * (TOPIC_NOISE / np.sqrt(DIM))
    return unit(centres[topic] + noise)


def make_sets(kind: str, rng: np.random.Generator, n: int, queries: int) -> tuple[np.ndarray, np.ndarray]:
    if kind == "uniform":
        return unit(rng.standard_normal((n, DIM))), unit(rng.standard_normal((queries, DIM)))
    centres = unit(rng.standard_normal((TOPICS, DIM)))
    return clustered(rng, n, centres), clustered(rng, queries, centres)


def exact_top(data: np.ndarray, queries: np.ndarray, k: int, rows: np.ndarray | None = None) -> np.ndarray:
    """Exact top-k labels (row numbers) for each query, by cosine, in blocks to bound memory."""
    candidates = np.arange(len(data)) if rows is None else rows
    subset = data[candidates]
    out = np.empty((len(queries), k), dtype=np.int64)
    for start in range(0, len(queries), 64):
        sims = queries[start : start + 64] @ subset.T
        top = np.argpartition(-sims, k, axis=1)[:, :k]
        out[start : start + 64] = candidates[top]
    return out


def recall(found: list[list[int]], truth: np.ndarray) -> float:
    hits = sum(len(set(row) & set(t.tolist())) for row, t in zip(found, truth))
    return hits / truth.size


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q))


def rss_bytes() -> int:
    # Hand memory freed by an earlier run back to the OS first, or the allocator reuses it and the
    # next run's delta reads as zero (glibc).
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def evict(directory: pathlib.Path) -> None:
    """Drop the saved files from the page cache so the load below reads from disk."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run(kind: str, n: int, queries: int, seed: int, params: dict[str, int]) -> Row:
    rng = np.random.default_rng(seed)
    data, query_set = make_sets(kind, rng, n, queries)
    labels = np.arange(n, dtype=np.int64)
    allowed_table = rng.random(n) < 0.5
    allow_half = lambda candidates: allowed_table[candidates]  # noqa: E731

    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(tmp)
        index = LayerIndex(directory, "L0", DIM, "bench", **params)
        rss_before = rss_bytes()
        build_s, _ = timed(lambda: index.add(labels, data, covered_seq=n))
        rss_per_vector = (rss_bytes() - rss_before) / n

        truth = exact_top(data, query_set, K)
        truth_half = exact_top(data, query_set, K, rows=np.flatnonzero(allowed_table))

        def latencies(allowed: Callable[[np.ndarray], np.ndarray] | None) -> tuple[list[float], list[list[int]]]:
            times, found = [], []
            for q in query_set:
                seconds, hits = timed(lambda: index.search(q, K, allowed=allowed))
                times.append(seconds * 1000)
                found.append([label for label, _ in hits])  # type: ignore[attr-defined]
            return times, found

        latencies(None)  # warm caches and the allocator before measuring
        plain_ms, plain_found = latencies(None)
        half_ms, half_found = latencies(allow_half)

        exact_ms = []
        for q in query_set[:EXACT_QUERIES]:
            seconds, _ = timed(lambda: np.argpartition(-(data @ q), K)[:K])
            exact_ms.append(seconds * 1000)

        save_s, _ = timed(index.save)
        file_bytes = sum(p.stat().st_size for p in directory.iterdir())
        evict(directory)
        cold = LayerIndex(directory, "L0", DIM, "bench", **params)
        load_s, outcome = timed(cold.load)
        assert outcome.loaded and len(cold) == n, outcome  # type: ignore[attr-defined]

    return Row(
        kind=kind,
        n=n,
        build_s=build_s,
        recall=recall(plain_found, truth),
        recall_filtered=recall(half_found, truth_half),
        p50_ms=statistics.median(plain_ms),
        p99_ms=percentile(plain_ms, 99),
        filtered_p50_ms=statistics.median(half_ms),
        filtered_p99_ms=percentile(half_ms, 99),
        exact_p50_ms=statistics.median(exact_ms),
        save_s=save_s,
        load_s=load_s,
        file_mb=file_bytes / 1e6,
        disk_bytes_per_vector=file_bytes / n,
        rss_bytes_per_vector=rss_per_vector,
    )


def table(rows: list[Row]) -> str:
    header = (
        "| data | N | build s | recall@10 | recall@10 (50% filter) | p50 ms | p99 ms | "
        "p50 ms (50% filter) | p99 ms (50% filter) | exact numpy p50 ms | speedup | save s | "
        "cold load s | file MB | disk B/vector | RSS B/vector |"
    )
    lines = [header, "|" + " --- |" * header.count(" | ") + " --- |"]
    for r in rows:
        lines.append(
            f"| {r.kind} | {r.n:,} | {r.build_s:.1f} | {r.recall:.4f} | {r.recall_filtered:.4f} | "
            f"{r.p50_ms:.3f} | {r.p99_ms:.3f} | {r.filtered_p50_ms:.3f} | {r.filtered_p99_ms:.3f} | "
            f"{r.exact_p50_ms:.2f} | {r.speedup:.0f}x | {r.save_s:.2f} | {r.load_s:.2f} | "
            f"{r.file_mb:.1f} | {r.disk_bytes_per_vector:.0f} | {r.rss_bytes_per_vector:.0f} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    blas = os.environ.get("OPENBLAS_CORETYPE", "unset")
    return (
        f"{os.cpu_count()} CPUs ({cpu}), Python {platform.python_version()}, numpy {np.__version__}, "
        f"OPENBLAS_CORETYPE={blas}"
    )


def near_duplicates(n: int, queries: int, seed: int, params: dict[str, int], beams: list[int]) -> None:
    """Near-duplicate pairs found by `nearest_many` at each beam width, and its CPU per query."""
    rng = np.random.default_rng(seed)
    data, _ = make_sets("clustered", rng, n, 0)
    with tempfile.TemporaryDirectory() as tmp:
        index = LayerIndex(pathlib.Path(tmp), "L0", DIM, "bench", **params)
        index.add(np.arange(n), data, covered_seq=n)
        for noise in (0.15, 0.3):  # cos to the source ~0.99 and ~0.96
            sources = rng.integers(0, n, queries)
            near = unit(data[sources] + noise * rng.standard_normal((queries, DIM)).astype(np.float32) / np.sqrt(DIM))
            similarity = near @ data.T
            top3 = np.argsort(-similarity, axis=1)[:, :3]
            truth = {(i, int(j)) for i, j in zip(*np.nonzero(similarity >= 0.95)) if j in top3[i]}
            for ef in beams:
                index._index.set_ef(ef)  # alone with the index: no search races this
                started = time.process_time()
                labels, distances = index.nearest_many(near, 3, threads=1)
                cpu_us = (time.process_time() - started) / queries * 1e6
                index._index.set_ef(index.ef_search)
                found = {(i, int(labels[i, j])) for i, j in zip(*np.nonzero((labels >= 0) & (1 - distances >= 0.95)))}
                print(
                    f"| {n:,} | {noise} | {ef} | {len(truth)} | {len(found & truth)} | {len(found - truth)} | {cpu_us:.0f} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--kinds", default="clustered,uniform")
    parser.add_argument("--m", type=int, default=DEFAULT_M)
    parser.add_argument("--ef-construction", type=int, default=DEFAULT_EF_CONSTRUCTION)
    parser.add_argument("--ef-search", type=int, default=DEFAULT_EF_SEARCH)
    parser.add_argument("--near-duplicates", action="store_true", help="measure the near-duplicate check")
    parser.add_argument("--beams", default="80,16,24,32", help="ef values for --near-duplicates")
    args = parser.parse_args()
    params = {"m": args.m, "ef_construction": args.ef_construction, "ef_search": args.ef_search}
    if args.near_duplicates:
        print(f"machine: {machine()}, load average {os.getloadavg()[0]:.1f}")
        print("| N | noise | ef | pairs (cos >= 0.95, top 3) | found | extra | CPU-us per query |")
        print("|---|---|---|---|---|---|---|")
        for n in (int(size) for size in args.sizes.split(",")):
            near_duplicates(n, args.queries, args.seed, params, [int(b) for b in args.beams.split(",")])
        return

    print(f"machine: {machine()}")
    print(f"params: M={args.m} ef_construction={args.ef_construction} ef_search={args.ef_search}, k={K}\n")
    rows = []
    for kind in args.kinds.split(","):
        for n in (int(size) for size in args.sizes.split(",")):
            rows.append(run(kind, n, args.queries, args.seed, params))
            print(f"done {kind} {n}", file=sys.stderr, flush=True)
    print(table(rows))


if __name__ == "__main__":
    main()
