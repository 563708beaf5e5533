"""Hybrid retrieval: the dense (HNSW) and lexical (BM25) rankings, fused.

Each list contributes its best ``CANDIDATE_DEPTH`` cells (at least k). Over their union a
cell scores ``cos + w * bm25 / best bm25``: its cosine similarity to the query, unscaled,
plus ``w`` (``[recall] lexical_weight``, 0.2) times its BM25 score relative to the best
lexical match of this query (0 for a cell BM25 did not return). The cosine keeps its
absolute margins, so a clear dense winner stays first on a paraphrased question, while a
cell that holds the query's words (an identifier above all) gains up to ``w``.

Chosen by measurement (``benchmarks/hybrid_sweep.py``, BENCHMARKS.md "Hybrid recall")
against reciprocal rank fusion (k 10..100, weighted and not) and a convex combination of
min-max scaled scores, on three sets: the team stream's questions, a held-out set of
paraphrases written to share words with distractors, and generated identifier queries.
Ranks alone (RRF) let any lexical vote reorder the dense top, where ranks 1 and 2 are a
hair apart: on the held-out paraphrases that cost a third of MRR@10. Min-max scaling keeps
paraphrases but stretches flat cosines, so identifiers lose. The rule here had the best
mean MRR@10 over the three sets.

What a caller gets back is still ``(rowid, distance)`` with ``distance`` the *dense* cosine
distance of that cell to the query, in fused order: a lexical-only hit's distance is
computed from its stored vector, so a surface that shows distances keeps meaning the same.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["fuse", "candidate_depth", "cosine_distances", "CANDIDATE_DEPTH"]

# Candidates each list contributes: enough for a cell ranked low by one list and high by the
# other to surface, few enough that the lexical query stays cheap. The sweep is flat in it.
CANDIDATE_DEPTH = 50


def candidate_depth(k: int) -> int:
    return max(k, CANDIDATE_DEPTH)


def fuse(
    dense: list[tuple[int, float]],
    lexical: list[tuple[int, float]],
    k: int,
    distances_of: Callable[[list[int]], dict[int, float]],
    *,
    lexical_weight: float,
) -> list[tuple[int, float]]:
    """The best ``k`` of ``dense`` (``(rowid, cosine distance)``, nearest first) and
    ``lexical`` (``(rowid, score)``, score > 0 and higher better) fused, as ``(rowid, dense
    distance)`` in fused order. ``distances_of(rowids)`` gives the dense distance of
    lexical-only hits; one it cannot give (a cell forgotten meanwhile) is left out.
    With no lexical hits this is ``dense[:k]``, unchanged."""
    if not lexical:
        return dense[:k]
    distance = dict(dense)
    missing = [rowid for rowid, _ in lexical if rowid not in distance]
    if missing:
        distance.update(distances_of(missing))
    words = dict(lexical)
    best = max(words.values())
    if best <= 0.0:
        return dense[:k]
    pool = [rowid for rowid in dict.fromkeys([r for r, _ in dense] + [r for r, _ in lexical]) if rowid in distance]
    scores = np.array([1.0 - distance[rowid] + lexical_weight * words.get(rowid, 0.0) / best for rowid in pool])
    order = np.argsort(-scores, kind="stable")[:k]  # ties: dense order first, then lexical
    return [(pool[i], distance[pool[i]]) for i in order]


def cosine_distances(query: np.ndarray, vectors: dict[int, np.ndarray]) -> dict[int, float]:
    """``1 - cos`` of unit vectors, clipped at 0 as the index's distances are."""
    return {rowid: max(0.0, float(1.0 - np.dot(vector, query))) for rowid, vector in vectors.items()}
