"""A lone embedding on two cores, and eight clients at once, with and without the partner thread.

    python benchmarks/profile_pairing.py [--rounds 5] [--seconds 4]

The node's own embedding worker (``node/embedding/worker.py``) and the built-in MiniLM, in this
process, on the 241 memories of ``benchmarks/data/retrieval_set.json``: one client embedding one
text at a time (the lone call: the partner may take half of each layer), then eight clients at once
(the worker batches them; the partner must stay out of the way). Each round runs pairing off, then
on (A B, rounds alternate which goes first), each for ``--seconds``; reported are texts per second,
process CPU per text, and the on/off ratios of the medians, so a loaded machine shifts both sides.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import trio

from node.embedding import load_embedder
from node.embedding.worker import EmbeddingWorker


def run(worker: EmbeddingWorker, texts: list[str], clients: int, seconds: float) -> dict[str, float]:
    done = 0

    async def client(offset: int, deadline: float) -> None:
        nonlocal done
        i = offset
        while time.monotonic() < deadline:
            await worker.embed([texts[i % len(texts)]])
            done += 1
            i += clients

    async def main() -> None:
        deadline = time.monotonic() + seconds
        async with trio.open_nursery() as nursery:
            for offset in range(clients):
                nursery.start_soon(client, offset, deadline)

    cpu, began = time.process_time(), time.monotonic()
    trio.run(main)
    wall, cpu = time.monotonic() - began, time.process_time() - cpu
    return {"per_s": done / wall, "cpu_ms_per_text": 1e3 * cpu / max(done, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    texts = [m["text"] for m in json.loads((ROOT / "benchmarks/data/retrieval_set.json").read_text())["memories"]]
    embedder = load_embedder()
    workers = {False: EmbeddingWorker(embedder, pairing=False), True: EmbeddingWorker(embedder, pairing=True)}
    results: dict[tuple[int, bool], list[dict[str, float]]] = {}
    try:
        for worker in workers.values():
            run(worker, texts, 1, 1.0)  # warm-up: caches, and the choice's first timings
        for round_number in range(args.rounds):
            for clients in (1, 8):
                for paired in (False, True) if round_number % 2 == 0 else (True, False):
                    results.setdefault((clients, paired), []).append(run(workers[paired], texts, clients, args.seconds))
    finally:
        for worker in workers.values():
            worker.close()
    print(f"| clients | pairing | texts/s (median of {args.rounds}) | CPU ms per text | on / off |")
    print("| ---: | --- | ---: | ---: | ---: |")
    for clients in (1, 8):
        medians = {p: statistics.median(r["per_s"] for r in results[(clients, p)]) for p in (False, True)}
        for paired in (False, True):
            cpu = statistics.median(r["cpu_ms_per_text"] for r in results[(clients, paired)])
            ratio = f"{medians[True] / medians[False]:.2f}x" if paired else ""
            print(f"| {clients} | {'on' if paired else 'off'} | {medians[paired]:.1f} | {cpu:.1f} | {ratio} |")
    print(f"\npartner's choice (s per character): {workers[True].pairing.costs}", file=sys.stderr)


if __name__ == "__main__":
    main()
