"""Node-core figures: durable store throughput, recall latency and quality through the
facade, cold start, and bytes per cell. Run by hand; prints a markdown table and JSON.

    python benchmarks/store_bench.py --sizes 10000,100000 --seed 1

"Embedding excluded" uses a pool embedder that hands out precomputed clustered unit
vectors (no model cost), so the figure is storage + index + delivery alone; the
"with embedding" figure runs the built-in MiniLM model. Every store is durable
(SQLite WAL, synchronous=FULL, group commit) when it returns.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.home import init_home, open_node  # noqa: E402

DIM = 384


def clustered(n: int, rng: np.random.Generator, topics: int = 200, noise: float = 0.35) -> np.ndarray:
    centres = rng.standard_normal((topics, DIM)).astype(np.float32)
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    picks = rng.integers(0, topics, n)
    vectors = centres[picks] + noise * rng.standard_normal((n, DIM)).astype(np.float32) / np.sqrt(DIM) * 4
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors.astype(np.float32)


class PoolEmbedder:
    """Precomputed vectors keyed by text: embedding cost excluded from the figures."""

    dim = DIM
    space = "bench-pool/384/v1"

    def __init__(self, texts: list[str], vectors: np.ndarray) -> None:
        self._table = dict(zip(texts, vectors))

    def embed(self, texts):
        return np.stack([self._table[t] for t in texts]) if texts else np.zeros((0, DIM), np.float32)


def rss_mb() -> float:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


async def fill(service, principal, texts: list[str], concurrency: int) -> tuple[float, float]:
    """Store every text from `concurrency` tasks; returns (wall seconds, process CPU seconds)."""
    queue = iter(texts)
    cpu_started = time.process_time()
    started = time.perf_counter()

    async def worker():
        for text in queue:
            await service.store(principal, content=text, cell_type="Fact")

    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return time.perf_counter() - started, time.process_time() - cpu_started


async def bench_size(n: int, args, rng) -> dict:
    home = Path(tempfile.mkdtemp(prefix="hyphae-bench-"))
    try:
        init_home(home)
        queries = 300
        vectors = clustered(n + queries, rng)
        texts = [f"memory {i}: synthetic cell about topic {i % 200}" for i in range(n)]
        query_texts = [f"query {i}" for i in range(queries)]
        embedder = PoolEmbedder(texts + query_texts, vectors)
        result: dict = {"cells": n}
        rss_before = rss_mb()
        async with open_node(home, embedder=embedder) as service:
            principal, _ = await service.add_agent("bench")
            result["load_avg"] = round(os.getloadavg()[0], 2)
            elapsed, cpu = await fill(service, principal, texts, args.concurrency)
            result["store_cells_per_s"] = round(n / elapsed)
            # every thread of the process (trio loop, writer, indexer), per store
            result["cpu_us_per_store"] = round(cpu / n * 1e6)
            result["write_batches"] = service.db.batches
            t0 = time.perf_counter()
            await trio.to_thread.run_sync(service.layers.flush)
            result["index_catch_up_s"] = round(time.perf_counter() - t0, 2)
            # recall through the facade (query vector cached after first use: measure the index path)
            latencies, hits = [], []
            base = vectors[:n]
            row_of = {content: rowid for rowid, content in service.db.query("SELECT rowid, content FROM cells")}
            rowids = [row_of[text] for text in texts]
            for i, text in enumerate(query_texts):
                await service.recall(principal, query=text, k=10)  # warm the query cache
                t0 = time.perf_counter()
                got = await service.recall(principal, query=text, k=10)
                latencies.append((time.perf_counter() - t0) * 1000)
                ids = {r["node_id"] for r in got["results"]}
                exact = np.argsort(-(base @ vectors[n + i]))[:10]
                exact_ids = {service.layers.catalog.node_id(rowids[int(row)]) for row in exact}
                hits.append(len(ids & exact_ids) / 10)
            t0 = time.perf_counter()
            for i in range(50):
                np.argsort(-(base @ vectors[n + i]))[:10]
            exact_ms = (time.perf_counter() - t0) * 1000 / 50
            result["recall_p50_ms"] = round(statistics.median(latencies), 3)
            result["recall_p99_ms"] = round(float(np.percentile(latencies, 99)), 3)
            result["recall_at_10"] = round(float(np.mean(hits)), 4)
            result["exact_numpy_ms"] = round(exact_ms, 3)
            result["speedup_vs_exact"] = round(exact_ms / statistics.median(latencies), 1)
            await trio.to_thread.run_sync(service.layers.flush)
            result["rss_mb_per_1k_cells"] = round((rss_mb() - rss_before) / n * 1000, 2)
        result["disk_bytes_per_cell"] = round(dir_bytes(home) / n)
        colds = []
        for _ in range(3):
            t0 = time.perf_counter()
            async with open_node(home, embedder=embedder) as service:
                colds.append(time.perf_counter() - t0)
                report = dict(service.layers.open_report)
        result["cold_start_s"] = round(statistics.median(colds), 3)
        result["cold_start_report"] = report["L0"]
        return result
    finally:
        shutil.rmtree(home, ignore_errors=True)


async def bench_with_model(n: int) -> dict:
    from node.embedding import load_embedder

    home = Path(tempfile.mkdtemp(prefix="hyphae-bench-"))
    try:
        init_home(home)
        embedder = load_embedder({"provider": "builtin"})
        async with open_node(home, embedder=embedder) as service:
            principal, _ = await service.add_agent("bench")
            texts = [f"Decision {i}: we keep service {i % 37} behind the gateway with retry budget {i}" for i in range(n)]
            elapsed, _ = await fill(service, principal, texts, 8)
        return {"cells": n, "store_cells_per_s_with_embedding": round(n / elapsed, 1)}
    finally:
        shutil.rmtree(home, ignore_errors=True)


def machine() -> str:
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    return f"{os.cpu_count()} cores, {model}, Python {platform.python_version()}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--model-cells", type=int, default=500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = [await bench_size(int(s), args, rng) for s in args.sizes.split(",")]
    with_model = await bench_with_model(args.model_cells) if args.model_cells else None
    print(f"machine: {machine()}")
    print(
        f"command: python benchmarks/store_bench.py --sizes {args.sizes} --concurrency {args.concurrency} "
        f"--model-cells {args.model_cells} --seed {args.seed}"
    )
    keys = [k for k in rows[0] if k != "cold_start_report"]
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    print(json.dumps({"sizes": rows, "with_model": with_model}, indent=2))


if __name__ == "__main__":
    trio.run(main)
