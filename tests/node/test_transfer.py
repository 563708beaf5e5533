"""Export and import (node/transfer.py): a round trip that gives the same bytes, idempotent
re-import, per-line errors that store nothing of a bad line, and an interrupted import that
continues from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from node import transfer
from node.embedding import HashedEmbedder
from app.home import init_home, open_node

from .helpers import store


async def fill(service, make_agent) -> dict[str, str]:
    """A node with a bit of everything: scenes, a consolidation, a beacon, a tombstone."""
    alice, _ = await make_agent("alice")
    bob, _ = await make_agent("bob", projects=["web"])
    session = await service.start_session(alice, project="storage", title="pick a database")
    ids = {
        "decision": await store(service, alice, "Use pgvector for the V1 storage backend.", "Decision", salience=0.9),
        "risk": await store(service, alice, "Vacuum can stall writes on large tables.", "Risk",
                            metadata={"z": 1, "a": [1, 2, {"b": None}]}, source_ref={"kind": "file", "locator": "db.py:42"}),
        "web": await store(service, bob, "The web app talks to the API over JSON.", "Fact", project="web"),
        "doomed": await store(service, bob, "A note nobody needs.", "Context"),
    }  # fmt: skip
    await service.end_session(alice, session_id=session["session_id"])
    ids["summary"] = (await service.consolidate_scene(alice, scene_id=session["scene_id"]))["node_id"]
    await service.place_beacon(bob, query="which database do we use", threshold=0.2, cell_types=["Decision"])
    await service.forget(bob, node_id=ids["doomed"])
    return ids


async def export_bytes(service, path: Path) -> bytes:
    with trio.fail_after(30):
        await transfer.export_file(service, path)
    return path.read_bytes()


async def test_export_import_export_is_byte_identical(service, make_agent, tmp_path, clock):
    ids = await fill(service, make_agent)
    first = await export_bytes(service, tmp_path / "first.jsonl")
    lines = [json.loads(line) for line in first.decode().splitlines()]
    assert lines[0] == {"format": "hyphae-export", "version": 1}
    kinds = [line.get("kind") for line in lines[1:]]
    assert kinds == sorted(kinds, key=["scene", "beacon", "cell"].index)  # scenes, then beacons, then cells
    cells = {line["node_id"]: line for line in lines if line.get("kind") == "cell"}
    assert set(cells) == set(ids.values())
    assert cells[ids["doomed"]]["forgotten_at"] is not None and "content" not in cells[ids["doomed"]]
    decision = cells[ids["decision"]]
    assert decision["origin_node"] == service.node_id and decision["embedding_space"] == service.embedder.space
    assert decision["layer"] == "L1" and cells[ids["summary"]]["layer"] == "L2"

    fresh = tmp_path / "fresh-home"
    init_home(fresh)
    async with open_node(fresh, embedder=HashedEmbedder(), clock=clock) as other:
        with trio.fail_after(30):
            report = await transfer.import_file(other, tmp_path / "first.jsonl")
        assert report["error_count"] == 0, report["errors"]
        assert (report["stored"], report["known"], report["scenes"], report["beacons"]) == (5, 0, 1, 1)
        second = await export_bytes(other, tmp_path / "second.jsonl")
        assert second == first

        # The imported memories are the new node's: found by recall, with their provenance.
        reader, _ = await other.add_agent("reader")
        hit = (await other.search(reader, query="Use pgvector for the V1 storage backend.", k=1))["results"][0]
        assert hit["node_id"] == ids["decision"] and hit["tenant_id"] == other.config.tenant_id
        assert hit["provenance"]["origin_node"] == service.node_id and not hit["provenance"]["local"]

        again = await transfer.import_file(other, tmp_path / "first.jsonl")
        assert (again["stored"], again["known"], again["error_count"]) == (0, 5, 0)
        assert await export_bytes(other, tmp_path / "third.jsonl") == first


async def test_bad_lines_are_reported_by_number_and_store_nothing(service, make_agent, tmp_path, clock):
    await fill(service, make_agent)
    good = (await export_bytes(service, tmp_path / "good.jsonl")).decode().splitlines()
    header, cell_lines = good[0], [line for line in good if '"kind":"cell"' in line and '"content"' in line]
    wrong_type = json.loads(cell_lines[0]) | {"cell_type": "decision", "node_id": "0b5e6d9e-9c1e-4e9e-8f55-5f4bd3c1f001"}
    wrong_dim = json.loads(cell_lines[0]) | {"embedding": "AAAAAA==", "node_id": "0b5e6d9e-9c1e-4e9e-8f55-5f4bd3c1f002"}
    smuggled = json.loads(cell_lines[0]) | {"tenant_id": "someone-else", "node_id": "0b5e6d9e-9c1e-4e9e-8f55-5f4bd3c1f003"}
    text = "\n".join([
        header,                      # 1
        cell_lines[0],               # 2 fine
        "{not json",                 # 3
        json.dumps(wrong_type),      # 4
        json.dumps({"kind": "memo"}),  # 5
        "",                          # 6 blank: ignored
        json.dumps(wrong_dim),       # 7
        json.dumps(smuggled),        # 8
        cell_lines[1][: len(cell_lines[1]) // 2],  # 9: a line cut in half (the file ends mid-write)
    ])  # fmt: skip
    path = tmp_path / "mixed.jsonl"
    path.write_text(text)
    fresh = tmp_path / "fresh-home"
    init_home(fresh)
    seen: list[tuple[int, str]] = []
    async with open_node(fresh, embedder=HashedEmbedder(), clock=clock) as other:
        report = await transfer.import_file(other, path, on_error=lambda n, reason: seen.append((n, reason)))
        assert report["stored"] == 1
        errors = {e["line"]: e["reason"] for e in report["errors"]}
        assert seen == [(e["line"], e["reason"]) for e in report["errors"]]
        assert sorted(errors) == [3, 4, 5, 7, 8, 9]
        assert "not JSON" in errors[3] and "cell_type" in errors[4] and "Decision" in errors[4]
        assert "unknown kind 'memo'" in errors[5]
        assert "1 dimensions" in errors[7] and "unknown field(s) tenant_id" in errors[8] and "not JSON" in errors[9]
        (count,) = other.db.query_one("SELECT COUNT(*) FROM cells")
        assert count == 1


async def test_a_file_that_is_not_an_export_is_refused_with_a_hint(service, tmp_path):
    path = tmp_path / "memory.json"
    path.write_text('{"type":"entity","name":"Ada","entityType":"person","observations":["writes code"]}')
    report = await transfer.import_file(service, path)
    assert report["stored"] == 0 and report["errors"][0]["line"] == 1
    assert "--from memory-server" in report["errors"][0]["reason"]
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert "empty" in (await transfer.import_file(service, empty))["errors"][0]["reason"]


class Interrupted(Exception):
    pass


async def test_an_interrupted_import_continues_from_its_checkpoint(service, make_agent, tmp_path, clock, monkeypatch):
    alice, _ = await make_agent("alice")
    for i in range(23):
        await store(service, alice, f"Memory number {i} about subsystem {i % 5}.")
    path = tmp_path / "many.jsonl"
    first = await export_bytes(service, path)
    monkeypatch.setattr(transfer, "BATCH", 5)

    fresh = tmp_path / "fresh-home"
    init_home(fresh)
    async with open_node(fresh, embedder=HashedEmbedder(), clock=clock) as other:
        calls = 0

        def stop_after_two_batches(done: int, total: int) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                raise Interrupted

        with pytest.raises(Interrupted):
            await transfer.import_file(other, path, progress=stop_after_two_batches)
        (count,) = other.db.query_one("SELECT COUNT(*) FROM cells")
        assert count == 10  # two whole batches, durable; the checkpoint says so
        checkpoints = list((fresh / "imports").glob("*.json"))
        assert len(checkpoints) == 1 and json.loads(checkpoints[0].read_text())["line"] == 11

        report = await transfer.import_file(other, path)
        assert report["resumed_at_line"] == 12
        assert (report["stored"], report["known"], report["read"]) == (13, 0, 13)
        assert not list((fresh / "imports").glob("*.json"))  # done: the checkpoint is gone
        assert await export_bytes(other, tmp_path / "after.jsonl") == first


async def test_cells_from_another_embedding_space_are_embedded_again(service, make_agent, tmp_path, clock):
    alice, _ = await make_agent("alice")
    node_id = await store(service, alice, "Retries use exponential backoff with jitter.")
    path = tmp_path / "export.jsonl"
    await export_bytes(service, path)
    fresh = tmp_path / "fresh-home"
    init_home(fresh)
    other_space = HashedEmbedder(dim=64)
    async with open_node(fresh, embedder=other_space, clock=clock) as other:
        report = await transfer.import_file(other, path)
        assert report["stored"] == 1 and report["error_count"] == 0
        reader, _ = await other.add_agent("reader")
        hit = (await other.search(reader, query="exponential backoff with jitter", k=1))["results"][0]
        assert hit["node_id"] == node_id and hit["embedding_space"] == other_space.space


async def test_export_pages_through_ties_in_time_without_losing_or_repeating(home, tmp_path, monkeypatch):
    from tests.conftest import FakeClock

    monkeypatch.setattr(transfer, "PAGE", 3)  # many pages, each boundary inside a run of equal times
    async with open_node(home, embedder=HashedEmbedder(), clock=FakeClock(step=0)) as frozen:
        alice, _ = await frozen.add_agent("alice")
        ids = [await store(frozen, alice, f"Same millisecond, memory {i}.") for i in range(10)]
        lines = (await export_bytes(frozen, tmp_path / "ties.jsonl")).decode().splitlines()
    exported = [json.loads(line)["node_id"] for line in lines[1:]]
    assert exported == sorted(ids)  # each once, in (created_at, id) order
