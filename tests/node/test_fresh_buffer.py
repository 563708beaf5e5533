"""The fresh buffer: committed rows HNSW does not hold yet, searched exactly.

Its rows live in preallocated arrays that grow, are consumed from the front and compacted;
whatever that bookkeeping does, a search must equal exact search over the rows still held.
"""

from __future__ import annotations

import numpy as np

from node.layers import _Fresh

DIM = 16


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def exact(held: dict[int, np.ndarray], query: np.ndarray, k: int) -> list[int]:
    rowids = sorted(held)
    if not rowids:
        return []
    distances = 1.0 - np.stack([held[r] for r in rowids]) @ query
    order = np.argsort(distances, kind="stable")[:k]
    return [rowids[i] for i in order]


def test_appends_consumption_and_discards_keep_search_exact() -> None:
    rng = np.random.default_rng(3)
    fresh = _Fresh(DIM)
    held: dict[int, np.ndarray] = {}
    order: list[int] = []  # rowids in buffer order, discarded ones included
    next_rowid = 0
    for step in range(60):
        block = unit(rng.standard_normal((3000 if step == 11 else int(rng.integers(1, 400)), DIM)))
        rowids = list(range(next_rowid, next_rowid + len(block)))
        if step % 2:  # a write batch's rows at once (one block larger than the buffer at step 11)...
            fresh.extend([r + 1000 for r in rowids], rowids, list(block))  # seq = rowid + 1000
        else:  # ...or one by one
            for rowid, vector in zip(rowids, block):
                fresh.append(rowid + 1000, rowid, vector)
        held.update(zip(rowids, block))
        order.extend(rowids)
        next_rowid += len(block)
        if step % 3 == 1 and held:
            doomed = int(rng.choice(list(held)))
            fresh.discard(doomed)
            del held[doomed]
        if step % 2 == 0:
            count = int(rng.integers(0, len(order) + 1))
            seqs, rowids, vectors = fresh.front(count)
            assert seqs.tolist() == [r + 1000 for r in order[:count]]
            assert rowids.tolist() == [r if r in held else -1 for r in order[:count]]
            for rowid, vector in zip(rowids.tolist(), vectors):
                if rowid >= 0:
                    assert np.array_equal(vector, held[rowid])
            fresh.drop_front(count)
            for rowid in order[:count]:
                held.pop(rowid, None)
            del order[:count]
        assert len(fresh) == len(order)
        query = unit(rng.standard_normal((1, DIM)))[0]
        for k in (1, 10, 5000):
            assert [label for label, _ in fresh.search(query, k, None)] == exact(held, query, k)


def test_search_applies_the_filter_before_choosing_the_k_nearest() -> None:
    rng = np.random.default_rng(4)
    fresh = _Fresh(DIM)
    vectors = unit(rng.standard_normal((3000, DIM)))
    for rowid, vector in enumerate(vectors):
        fresh.append(rowid, rowid, vector)
    query = vectors[0]
    odd = lambda labels: labels % 2 == 1  # noqa: E731
    hits = fresh.search(query, 10, odd)
    assert [label for label, _ in hits] == exact({r: vectors[r] for r in range(1, 3000, 2)}, query, 10)
    assert all(abs(distance - (1.0 - float(vectors[label] @ query))) < 1e-5 for label, distance in hits)


def test_a_drained_buffer_hands_its_large_arrays_back() -> None:
    fresh = _Fresh(DIM)
    for rowid in range(20_000):
        fresh.append(rowid, rowid, np.ones(DIM, dtype=np.float32))
    fresh.drop_front(20_000)
    assert len(fresh) == 0 and fresh.search(np.ones(DIM, dtype=np.float32), 5, None) == []
    assert fresh._matrix.shape[0] == _Fresh._INITIAL
