"""Importing the official MCP memory server's knowledge graph (node/memory_graph.py).

``data/memory_server_graph.jsonl`` is written exactly as that server's ``saveGraph`` writes
(``JSON.stringify({type: "entity", ...entity})`` per line, entities first, joined by
newlines, no newline at the end)."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from node.memory_graph import import_memory_graph

SAMPLE = Path(__file__).parent / "data" / "memory_server_graph.jsonl"


def storer(service, principal):
    async def store(fields):
        with trio.fail_after(10):
            return await service.store(principal, **fields)

    return store


def cells_by_locator(service) -> dict[str, dict]:
    rows = service.db.query("SELECT content, cell_type, source_ref, metadata, source_agent FROM cells")
    return {
        json.loads(ref)["locator"]: {"content": content, "cell_type": kind, "metadata": json.loads(meta), "agent": agent}
        for content, kind, ref, meta, agent in rows
    }


async def test_entities_and_relations_become_cells(service, make_agent):
    alice, _ = await make_agent("alice")
    report = await import_memory_graph(SAMPLE, storer(service, alice))
    assert report == {"entities": 4, "relations": 2, "errors": [], "error_count": 0}

    cells = cells_by_locator(service)
    assert sorted(cells) == [
        "entity:Anthropic", "entity:Empty_Entity", "entity:John_Smith", "entity:Storage_Backend",
        "relation:John_Smith|decided|Storage_Backend", "relation:John_Smith|works_at|Anthropic",
    ]  # fmt: skip
    john = cells["entity:John_Smith"]
    assert john["content"] == "John_Smith (person)\n- Speaks fluent Spanish\n- Graduated in 2019\n- Prefers morning meetings"
    assert john["cell_type"] == "Fact" and john["agent"] == alice.agent_id
    assert john["metadata"] == {"memory_graph": {"kind": "entity", "name": "John_Smith", "entityType": "person"}}
    assert cells["entity:Storage_Backend"]["cell_type"] == "Decision"  # an entityType that names a cell type
    assert cells["entity:Empty_Entity"]["content"] == "Empty_Entity (concept)"
    works = cells["relation:John_Smith|works_at|Anthropic"]
    assert works["content"] == "John_Smith works at Anthropic" and works["cell_type"] == "Fact"
    assert works["metadata"]["memory_graph"] == {
        "kind": "relation", "from": "John_Smith", "to": "Anthropic", "relationType": "works_at"}  # fmt: skip

    hit = (await service.search(alice, query="who speaks Spanish", k=1))["results"][0]
    assert hit["content"].startswith("John_Smith (person)")


async def test_importing_the_same_file_again_stores_nothing_new(service, make_agent):
    alice, _ = await make_agent("alice")
    await import_memory_graph(SAMPLE, storer(service, alice))
    (before,) = service.db.query_one("SELECT COUNT(*) FROM cells")
    again = await import_memory_graph(SAMPLE, storer(service, alice))
    assert again["error_count"] == 0
    (after,) = service.db.query_one("SELECT COUNT(*) FROM cells")
    assert before == after == 6


async def test_bad_lines_are_reported_and_the_rest_imported(service, make_agent, tmp_path):
    alice, _ = await make_agent("alice")
    path = tmp_path / "memory.json"
    path.write_text("\n".join([
        '{"type":"entity","name":"Ok","entityType":"thing","observations":["fine"],"project":"x","createdAt":"2025"}',
        '{"type":"entity","name":"","entityType":"thing","observations":[]}',
        '{"type":"relation","from":"Ok","to":"Other"}',
        '{"type":"entity","name":"Big","entityType":"thing","observations":["' + "x" * 70_000 + '"]}',
        '{"format":"hyphae-export","version":1}',
        "[1, 2]",
        '{"type":"entity","name":"Cut","entityType":"thing","observ',
    ]))  # fmt: skip
    seen = []
    report = await import_memory_graph(path, storer(service, alice), on_error=lambda n, r: seen.append(n))
    errors = {e["line"]: e["reason"] for e in report["errors"]}
    assert sorted(errors) == seen == [2, 3, 4, 5, 6, 7]
    assert "'name'" in errors[2] and "'relationType'" in errors[3] and "65536 bytes" in errors[4]
    assert "without --from" in errors[5] and "not a JSON object" in errors[6] and "not JSON" in errors[7]
    assert report["entities"] == 1
    (ok,) = cells_by_locator(service).values()
    assert ok["metadata"]["memory_graph"] == {
        "kind": "entity", "name": "Ok", "entityType": "thing", "createdAt": "2025", "project": "x"}  # fmt: skip


async def test_progress_is_reported_in_bytes_of_the_file(service, make_agent):
    alice, _ = await make_agent("alice")
    seen: list[tuple[int, int]] = []
    await import_memory_graph(SAMPLE, storer(service, alice), progress=lambda done, total: seen.append((done, total)))
    size = SAMPLE.stat().st_size
    assert len(seen) == 6 and all(total == size for _, total in seen)
    assert [done for done, _ in seen] == sorted(done for done, _ in seen) and seen[-1][0] == size
