"""Retrieval quality: does a paraphrased question find the memory it is about? Run by hand:

    python benchmarks/retrieval_eval.py

Uses the hand-written set in benchmarks/data/retrieval_set.json (memories of a fictional team,
paraphrased queries each aimed at one target, distractors that share its words). Search is exact
(cosine against every memory), so the figures measure the embedder alone, not an ANN index.
Reports hit@1 and hit@5 per embedder, as JSON and a markdown table.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import app  # noqa: F401  (first: one BLAS thread per operation, as in the daemon)
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from node.embedding import HashedEmbedder, load_embedder  # noqa: E402
from node.embedding.base import Embedder  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "retrieval_set.json"


def evaluate(embedder: Embedder, memories: list[dict], queries: list[dict]) -> dict:
    ids = [memory["id"] for memory in memories]
    stored = embedder.embed([memory["text"] for memory in memories])
    asked = embedder.embed([query["query"] for query in queries])
    top5 = [[ids[i] for i in np.argsort(-row)[:5]] for row in asked @ stored.T]
    hits = [(top[0] == query["target"], query["target"] in top) for query, top in zip(queries, top5)]
    return {
        "space": embedder.space,
        "queries": len(queries),
        "memories": len(memories),
        "hit@1": sum(first for first, _ in hits) / len(queries),
        "hit@5": sum(in_top5 for _, in_top5 in hits) / len(queries),
        "missed_at_5": [query["query"] for query, (_, in_top5) in zip(queries, hits) if not in_top5],
    }


def main() -> None:
    data = json.loads(DATA.read_text(encoding="utf-8"))
    results = {
        name: evaluate(embedder, data["memories"], data["queries"])
        for name, embedder in {"all-MiniLM-L6-v2 (numpy)": load_embedder(), "hashed n-grams": HashedEmbedder()}.items()
    }
    print(json.dumps(results, indent=1))
    print("\n| embedder | queries | memories | hit@1 | hit@5 |\n| --- | --- | --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['queries']} | {r['memories']} | {r['hit@1']:.2f} | {r['hit@5']:.2f} |")


if __name__ == "__main__":
    main()
