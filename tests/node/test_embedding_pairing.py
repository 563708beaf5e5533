"""MiniLM in halves on two cores: the same vectors as before the split (the space is kept), the
partner thread's hand-over, the choice of when to pair, and the worker that uses both."""

from __future__ import annotations

import functools
import json
import threading
from pathlib import Path

import numpy as np
import pytest
import trio

from node.embedding import HashedEmbedder, MiniLMEmbedder, minilm
from node.embedding.pairing import PairingChoice, Partner
from node.embedding.safetensors import parse_safetensors
from node.embedding.worker import EmbeddingWorker

ANCHOR = json.loads((Path(__file__).parent / "data" / "minilm_space_anchor.json").read_text(encoding="utf-8"))
ANCHOR_TEXTS = [case["text"] for case in ANCHOR["cases"]]


from tests.node.test_embedding import model  # noqa: E402,F401 (the module's model, loaded once per module)


@pytest.fixture
def partner():
    partner = Partner()
    yield partner
    partner.close()


def test_halves_keep_the_vectors_and_the_space(model: MiniLMEmbedder, partner: Partner) -> None:
    # The anchor holds the vectors of the unsplit forward pass: the space name may stay only if
    # every vector stays within 1e-6 of them, alone, batched and paired.
    assert model.space == ANCHOR["space"]
    single = np.array([case["single"] for case in ANCHOR["cases"]])
    batched = np.array([case["batched"] for case in ANCHOR["cases"]])
    assert np.abs(np.concatenate([model.embed([t]) for t in ANCHOR_TEXTS]) - single).max() <= 1e-6
    assert np.abs(model.embed(ANCHOR_TEXTS) - batched).max() <= 1e-6
    paired = np.concatenate([model.embed([t], pair=partner.pair) for t in ANCHOR_TEXTS])
    assert np.abs(paired - single).max() <= 1e-6


def test_paired_and_in_turn_are_the_same_arithmetic(model: MiniLMEmbedder, partner: Partner) -> None:
    texts = ANCHOR_TEXTS * 3
    np.testing.assert_array_equal(model.embed(texts, pair=partner.pair), model.embed(texts))


def test_partner_returns_both_results_in_order(partner: Partner) -> None:
    for i in range(200):
        first, second = (
            functools.partial(tuple, ("first", i)),
            functools.partial(tuple, ("second", i)),
        )
        assert partner.pair(first, second) == (("first", i), ("second", i))


def test_second_half_runs_exactly_once_whoever_takes_it(partner: Partner) -> None:
    runs = []
    lock = threading.Lock()

    def second() -> int:
        with lock:
            runs.append(threading.current_thread().name)
        return 2

    for _ in range(300):
        assert partner.pair(lambda: 1, second) == (1, 2)
    assert len(runs) == 300


def test_an_error_in_either_half_reaches_the_caller(partner: Partner) -> None:
    def fail() -> None:
        raise ValueError("half broke")

    with pytest.raises(ValueError, match="half broke"):
        partner.pair(fail, lambda: 2)
    for _ in range(50):  # whether the partner or the caller runs it
        with pytest.raises(ValueError, match="half broke"):
            partner.pair(lambda: 1, fail)
    assert partner.pair(lambda: 1, lambda: 2) == (1, 2)  # and the partner still serves


def test_choice_tries_both_ways_then_keeps_the_faster_and_explores() -> None:
    choice = PairingChoice(explore=4)
    first = choice.use_partner()
    choice.record(first, 0.010, 100)
    second = choice.use_partner()
    assert second != first
    choice.record(second, 0.005 if second else 0.020, 100)  # pairing is the faster way here
    picks = []
    for _ in range(8):
        picks.append(choice.use_partner())
    assert picks.count(True) == 6 and picks.count(False) == 2  # every 4th batch explores
    for _ in range(20):
        choice.record(True, 0.050, 100)  # the other core got busy: pairing now costs more
    assert choice.costs["paired"] > choice.costs["alone"]
    assert [choice.use_partner() for _ in range(3)].count(False) >= 2


def test_worker_pairs_only_for_embedders_in_halves(model: MiniLMEmbedder) -> None:
    hashed = EmbeddingWorker(HashedEmbedder())
    paired = EmbeddingWorker(model, pairing=True)
    try:
        assert hashed._partner is None
        assert paired._partner is not None
    finally:
        hashed.close()
        paired.close()


def test_worker_gives_lone_and_concurrent_callers_the_same_vectors(
    model: MiniLMEmbedder,
) -> None:
    expected = np.array([case["single"] for case in ANCHOR["cases"]], dtype=np.float32)
    worker = EmbeddingWorker(model, pairing=True)
    results: dict[tuple[int, int], np.ndarray] = {}

    async def main() -> None:
        for i, text in enumerate(ANCHOR_TEXTS):  # one at a time: the lone path, paired or not
            results[(0, i)] = (await worker.embed([text]))[0]
        async with trio.open_nursery() as nursery:  # eight at once: batched, never paired
            for caller in range(1, 9):
                for i, text in enumerate(ANCHOR_TEXTS):
                    nursery.start_soon(one, caller, i, text)

    async def one(caller: int, i: int, text: str) -> None:
        results[(caller, i)] = (await worker.embed([text]))[0]

    try:
        trio.run(main)
    finally:
        worker.close()
    assert len(results) == 9 * len(ANCHOR_TEXTS)
    for (_, i), vector in results.items():
        assert np.abs(vector - expected[i]).max() <= 1e-6
    costs = worker.pairing.costs
    assert costs["paired"] is not None and costs["alone"] is not None  # the lone calls tried both ways


def test_word_embeddings_are_read_from_the_file_not_held(model: MiniLMEmbedder) -> None:
    # 47 MB of the 90: rows read on demand, the same bytes as the table in the file.
    rows = model._word_embeddings
    assert isinstance(rows, minilm._FileRows) and rows.shape == (30522, 384)
    directory = minilm.locate_builtin_weights()
    assert directory is not None
    table = parse_safetensors((directory / "model.safetensors").read_bytes())["embeddings.word_embeddings.weight"]
    ids = np.array([[101, 7592, 0, 30521], [7592, 7592, 102, 0]])
    np.testing.assert_array_equal(rows[ids], table[ids])
    with pytest.raises(IndexError, match="outside the vocabulary"):
        rows[np.array([[30522]])]


def test_worker_hands_no_half_over_while_another_batch_runs_or_waits(model: MiniLMEmbedder) -> None:
    worker = EmbeddingWorker(model, threads=0, pairing=True)  # no worker threads: the queue stays as put
    handed: list[str] = []

    class Recording:
        def pair(self, first, second):
            handed.append("partner")
            return first(), second()

        def close(self) -> None:
            pass

    real, worker._partner = worker._partner, Recording()
    try:
        worker._busy = 1
        assert worker._pair(lambda: 1, lambda: 2) == (1, 2) and handed == ["partner"]  # alone: pairs
        worker._busy = 2  # the other worker has a batch: its core is taken
        assert worker._pair(lambda: 1, lambda: 2) == (1, 2) and handed == ["partner"]
        worker._busy = 1
        worker._queue.put(None)  # something waits for the other worker
        assert worker._pair(lambda: 1, lambda: 2) == (1, 2) and handed == ["partner"]
    finally:
        worker._busy = 0
        worker._partner = real
        worker.close()
