"""The peers benchmark's workload and scoring helpers (no server is started here)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "peers"))

from servers import Reference, Store, payload  # noqa: E402
from workload import Query, filler, latency_summary, load_workload, score  # noqa: E402


def test_the_paraphrase_set_loads_with_every_target_among_the_memories() -> None:
    workload = load_workload(filler_count=5)
    ids = {memory.id for memory in workload.memories}
    assert len(workload.memories) == 241 + 5 and len(workload.queries) == 103
    assert all(query.target in ids for query in workload.queries)
    assert all(query.text.lower() not in memory.text.lower() for query in workload.queries
               for memory in workload.memories if memory.id == query.target)  # fmt: skip


def test_filler_is_distinct_and_reproducible() -> None:
    notes = filler(300, seed=3)
    assert len({note.text for note in notes}) == 300
    assert [note.text for note in notes] == [note.text for note in filler(300, seed=3)]


def test_an_empty_answer_is_a_miss_and_ranks_count() -> None:
    queries = [Query("q1", "a"), Query("q2", "b"), Query("q3", "c"), Query("q4", "d")]
    ranked = [["a", "x"], ["x", "y", "z", "w", "b"], [], ["x", "y", "z", "w", "v", "d"]]
    assert score(ranked, queries) == {"hit@1": 0.25, "hit@5": 0.5, "empty": 0.25, "queries": 4}


def test_latency_summary_is_in_milliseconds() -> None:
    summary = latency_summary([0.010, 0.020, 0.030, 0.040])
    assert summary["calls"] == 4 and summary["p50_ms"] in (20.0, 30.0) and round(summary["per_s"]) == 40


def test_payload_unwraps_structured_lists_and_parses_text() -> None:
    text = SimpleNamespace(type="text", text='{"id": "m1"}')
    assert payload(SimpleNamespace(is_error=False, structured_content={"result": [1, 2]}, content=[])) == [1, 2]
    assert payload(SimpleNamespace(is_error=False, structured_content=None, content=[text])) == {"id": "m1"}


def test_reference_prefill_is_read_back_from_its_own_file(tmp_path: Path) -> None:
    peer = Reference(tmp_path / "work")
    store = Store(tmp_path / "memory.jsonl")
    peer.prefill(store, ["one note", "another note"])
    assert peer.contents(store) == ["one note", "another note"]
