"""Embedder speed: milliseconds per text, one text at a time and in batches. Run by hand:

    python benchmarks/embedder.py [--repeats 60]

Single-text latency is what a recall pays for its query; batched throughput is what a bulk import
pays per memory. Texts are the memories of benchmarks/data/retrieval_set.json (typical length
10-25 tokens). Each figure is the median over repeated runs; prints a markdown table and JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
from node.embedding import HashedEmbedder, load_embedder  # noqa: E402
from node.embedding.base import Embedder  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "retrieval_set.json"


def median_ms_per_text(embedder: Embedder, texts: list[str], batch: int, repeats: int) -> float:
    timings = []
    for i in range(repeats):
        start = (i * batch) % (len(texts) - batch)
        chunk = texts[start : start + batch]
        began = time.perf_counter()
        embedder.embed(chunk)
        timings.append((time.perf_counter() - began) * 1000 / batch)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=60, help="timed runs per figure")
    args = parser.parse_args()
    texts = [memory["text"] for memory in json.loads(DATA.read_text(encoding="utf-8"))["memories"]]
    embedders = {"all-MiniLM-L6-v2 (numpy)": load_embedder(), "hashed n-grams": HashedEmbedder()}
    results = {}
    for name, embedder in embedders.items():
        embedder.embed(texts[:64])  # warm-up: caches, BLAS threads
        results[name] = {
            "space": embedder.space,
            "single_ms": median_ms_per_text(embedder, texts, 1, args.repeats),
            "batch32_ms": median_ms_per_text(embedder, texts, 32, max(5, args.repeats // 4)),
            "batch64_ms": median_ms_per_text(embedder, texts, 64, max(5, args.repeats // 4)),
        }
    print(json.dumps({"cpus": os.cpu_count(), "python": platform.python_version(), "results": results}, indent=1))
    print("\n| embedder | ms/text single | batch 32 | batch 64 |\n| --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['single_ms']:.2f} | {r['batch32_ms']:.2f} | {r['batch64_ms']:.2f} |")


if __name__ == "__main__":
    main()
