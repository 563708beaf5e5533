"""Recall latency, hybrid against dense only, through the facade with the built-in model. Run by hand:

    taskset -c 0 python benchmarks/recall_latency.py [--copies 10]

Stores the team stream's 431 memories ``--copies`` times (each copy's text tagged with its copy
number, so the lexical index holds distinct rows; a copy's vector is its original's, jittered
and normalised, so filling a large node does not pay the model per copy), then asks every question of the team stream
and of the held-out retrieval set (171 questions the node has never seen, so each one is
embedded: a *new-query* recall) with ``[recall] hybrid`` on and then off, on the same node, in
alternating order. Prints p50/p90 of each, in ms, end to end through ``MemoryService.recall``
(embedding the query, HNSW, BM25, fusion), wall time and the process's CPU time (all threads:
the figure to trust on a shared machine). The query cache is emptied before each recall.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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
from node.embedding import load_embedder  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


class CopiesEmbedder:
    """The built-in model for what it has not seen; the memories' copies from a table."""

    def __init__(self, model, table: dict[str, np.ndarray]) -> None:
        self.model, self.table = model, table
        self.dim, self.space = model.dim, model.space

    def embed(self, texts):
        known = [self.table.get(t) for t in texts]
        if all(v is not None for v in known):
            return np.stack(known) if known else np.zeros((0, self.dim), np.float32)
        return self.model.embed(texts)


async def run(copies: int) -> dict[str, object]:
    team = json.loads((DATA / "team_stream.json").read_text(encoding="utf-8"))
    held = json.loads((DATA / "retrieval_set.json").read_text(encoding="utf-8"))
    questions = [q["question"] for q in team["questions"]] + [q["query"] for q in held["queries"]]
    model = load_embedder({"provider": "builtin"})
    originals = model.embed([m["content"] for m in team["memories"]])
    rng = np.random.default_rng(1)
    table, stored = {}, []
    for copy in range(copies):
        for memory, vector in zip(team["memories"], originals):
            text = memory["content"] if copy == 0 else f"{memory['content']} (copy {copy})"
            jittered = vector + (0.02 * rng.standard_normal(len(vector)) if copy else 0)
            table[text] = (jittered / np.linalg.norm(jittered)).astype(np.float32)
            stored.append((text, memory["cell_type"]))
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        init_home(home)
        async with open_node(home, embedder=CopiesEmbedder(model, table)) as service:
            principal, _ = await service.add_agent("bench")
            fill_started, fill_cpu = time.perf_counter(), time.process_time()
            async with trio.open_nursery() as nursery:
                queue = iter(stored)

                async def writer() -> None:
                    for text, cell_type in queue:
                        await service.store(principal, content=text, cell_type=cell_type)

                for _ in range(16):
                    nursery.start_soon(writer)
            fill = {
                "stores_per_s": len(stored) / (time.perf_counter() - fill_started),
                "cpu_ms_per_store": 1000 * (time.process_time() - fill_cpu) / len(stored),
            }
            service.layers.flush()
            timings: dict[bool, list[float]] = {True: [], False: []}
            cpu: dict[bool, list[float]] = {True: [], False: []}
            for i, question in enumerate(questions):
                for hybrid in (True, False) if i % 2 else (False, True):
                    service.config = dataclasses.replace(service.config, hybrid_recall=hybrid)
                    service._query_cache.clear()
                    start, start_cpu = time.perf_counter(), time.process_time()
                    await service.recall(principal, query=question, k=10)
                    timings[hybrid].append((time.perf_counter() - start) * 1000)
                    cpu[hybrid].append((time.process_time() - start_cpu) * 1000)
            cells = service.storage.cells.live_count()

    def stats(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"p50": statistics.median(ordered), "p90": ordered[int(0.9 * len(ordered))]}

    return {
        "cells": cells, "questions": len(questions), "hybrid": stats(timings[True]), "dense": stats(timings[False]),
        "hybrid_cpu": stats(cpu[True]), "dense_cpu": stats(cpu[False]), "fill": fill,
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    parser.add_argument(
        "--skip-lexical-writes", action="store_true",
        help="stores leave the FTS5 index alone (what a store cost before it): compare the fill figures",
    )  # fmt: skip
    args = parser.parse_args()
    if args.skip_lexical_writes:
        from node.store.lexical import LexicalIndex

        LexicalIndex.add = lambda self, tx, rowid, content, source_ref: None
    result = trio.run(run, args.copies)
    print(json.dumps(result, indent=1))
    print(f"\n| recall of a new query ({result['cells']} cells) | wall p50 ms | wall p90 ms | CPU p50 ms | CPU p90 ms |")
    print("| --- | --- | --- | --- | --- |")
    for name in ("dense", "hybrid"):
        w, c = result[name], result[f"{name}_cpu"]
        print(f"| {name} | {w['p50']:.1f} | {w['p90']:.1f} | {c['p50']:.1f} | {c['p90']:.1f} |")
    fill = result["fill"]
    print(f"\nfill: {fill['stores_per_s']:.0f} stores/s, {fill['cpu_ms_per_store']:.2f} CPU-ms per store (16 writers)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
