"""Hybrid retrieval: the dense (HNSW) and lexical (BM25) rankings, fused.

Each list contributes its best ``CANDIDATE_DEPTH`` cells (at least k). Over their union a
cell scores ``cos + w * coverage``: its cosine similarity to the query, unscaled, plus ``w``
(``[recall] lexical_weight``, 0.4) times its lexical *coverage*, the cell's BM25 score over
the query's own weight (the BM25 an average-length document holding each query term once
would get: the sum of the terms' IDFs, function words included although they are not
matched), capped at 1 (0 for a cell BM25 did not return).
So a cell holding all of an identifier query (``PAY-1432``, ``cells.py``) gains the whole
``w``, while the best lexical match of a loose paraphrase, sharing a few common words,
gains little; and the cosine keeps its absolute margins, so a clear dense winner stays first.

Chosen by measurement (``benchmarks/hybrid_sweep.py``, BENCHMARKS.md "Hybrid recall"), by
the best mean MRR@10 over three sets (the team stream's questions, held-out paraphrases
written to share words with distractors, generated identifier queries), against reciprocal
rank fusion (k 10..100, weighted and not), a convex combination of min-max scaled scores and
the cosine plus BM25 over the query's best match. Ranks alone (RRF, k = 60) let any lexical
vote reorder the dense top, where ranks 1 and 2 are a hair apart: on the held-out
paraphrases that cost a third of MRR@10. Min-max scaling stretches flat cosines, so
identifiers lose; scaling BM25 by the best match gives a loose question's best match as
much as an identifier's.

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
    ``lexical`` (``(rowid, coverage in [0, 1])``) fused, as ``(rowid, dense distance)`` in
    fused order. ``distances_of(rowids)`` gives the dense distance of lexical-only hits;
    one it cannot give (a cell forgotten meanwhile) is left out. With no lexical hits this
    is ``dense[:k]``, unchanged."""
    if not lexical:
        return dense[:k]
    distance = dict(dense)
    missing = [rowid for rowid, _ in lexical if rowid not in distance]
    if missing:
        distance.update(distances_of(missing))
    coverage = dict(lexical)
    pool = [rowid for rowid in dict.fromkeys([r for r, _ in dense] + [r for r, _ in lexical]) if rowid in distance]
    scores = np.array([1.0 - distance[rowid] + lexical_weight * coverage.get(rowid, 0.0) for rowid in pool])
    order = np.argsort(-scores, kind="stable")[:k]  # ties: dense order first, then lexical
    return [(pool[i], distance[pool[i]]) for i in order]


def cosine_distances(query: np.ndarray, vectors: dict[int, np.ndarray]) -> dict[int, float]:
    """``1 - cos`` of unit vectors, clipped at 0 as the index's distances are."""
    return {rowid: max(0.0, float(1.0 - np.dot(vector, query))) for rowid, vector in vectors.items()}
