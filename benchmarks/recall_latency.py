"""Recall latency, hybrid against dense only, through the facade with the built-in model. Run by hand:

    taskset -c 0 python benchmarks/recall_latency.py [--copies 10]

Stores the team stream's 431 memories ``--copies`` times (each copy's text tagged with its copy
number, so the lexical index holds distinct rows), then asks every question of the team stream
and of the held-out retrieval set (171 questions the node has never seen, so each one is
embedded: a *new-query* recall) with ``[recall] hybrid`` on and then off, on the same node, in
alternating order. Prints p50/p90 of each, in ms, end to end through ``MemoryService.recall``
(embedding the query, HNSW, BM25, fusion). The query cache is emptied before each recall.
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
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.home import init_home, open_node  # noqa: E402
from node.embedding import load_embedder  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"


async def run(copies: int) -> dict[str, object]:
    team = json.loads((DATA / "team_stream.json").read_text(encoding="utf-8"))
    held = json.loads((DATA / "retrieval_set.json").read_text(encoding="utf-8"))
    questions = [q["question"] for q in team["questions"]] + [q["query"] for q in held["queries"]]
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        init_home(home)
        async with open_node(home, embedder=load_embedder({"provider": "builtin"})) as service:
            principal, _ = await service.add_agent("bench")
            for copy in range(copies):
                for memory in team["memories"]:
                    text = memory["content"] if copy == 0 else f"{memory['content']} (copy {copy})"
                    await service.store(principal, content=text, cell_type=memory["cell_type"])
            service.layers.flush()
            timings: dict[bool, list[float]] = {True: [], False: []}
            for i, question in enumerate(questions):
                for hybrid in (True, False) if i % 2 else (False, True):
                    service.config = dataclasses.replace(service.config, hybrid_recall=hybrid)
                    service._query_cache.clear()
                    start = time.perf_counter()
                    await service.recall(principal, query=question, k=10)
                    timings[hybrid].append((time.perf_counter() - start) * 1000)
            cells = service.storage.cells.live_count()

    def stats(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"p50": statistics.median(ordered), "p90": ordered[int(0.9 * len(ordered))]}

    return {"cells": cells, "questions": len(questions), "hybrid": stats(timings[True]), "dense": stats(timings[False])}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=10)
    args = parser.parse_args()
    result = trio.run(run, args.copies)
    print(json.dumps(result, indent=1))
    h, d = result["hybrid"], result["dense"]
    print(f"\n| recall of a new query ({result['cells']} cells) | p50 ms | p90 ms |\n| --- | --- | --- |")
    print(f"| dense only | {d['p50']:.1f} | {d['p90']:.1f} |\n| hybrid | {h['p50']:.1f} | {h['p90']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
