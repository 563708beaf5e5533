"""Sessions and scenes: opening and closing work, paging through scenes, consolidating one into L2."""

from __future__ import annotations

import uuid

import pytest
import trio

from node.embedding import HashedEmbedder
from node.errors import HyphaeError
from app.home import open_node
from tests.node.helpers import rejected, second_tenant_key, store


async def test_a_session_opens_a_scene_and_ending_it_closes_both(service, make_agent, clock):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="payments", title="refund flow")
    assert set(session) == {"session_id", "scene_id"}
    uuid.UUID(session["session_id"]), uuid.UUID(session["scene_id"])

    scene = await service.get_scene(alice, scene_id=session["scene_id"])
    assert scene["session_id"] == session["session_id"]
    assert scene["project"] == "payments" and scene["title"] == "refund flow"
    assert scene["agent_id"] == alice.agent_id and scene["origin_node"] == service.node_id
    assert scene["ended_at"] is None and scene["consolidated_at"] is None
    assert scene["cell_ids"] == [] and scene["cell_count"] == 0

    first = await store(service, alice, "refunds go back to the original card")
    second = await store(service, alice, "partial refunds need a reason code", "Constraint")
    clock.advance(5_000)
    with trio.fail_after(10), clock.frozen() as now:
        ended = await service.end_session(alice, session_id=session["session_id"])
    assert ended["session_id"] == session["session_id"]
    assert ended["cell_count"] == 2
    assert ended["ended_at"] == now

    scene = await service.get_scene(alice, scene_id=session["scene_id"])
    assert scene["ended_at"] == ended["ended_at"]
    assert scene["cell_ids"] == [first, second] and scene["cell_count"] == 2

    # Ending again answers the same, even later, and changes nothing.
    clock.advance(5_000)
    with trio.fail_after(10):
        assert await service.end_session(alice, session_id=session["session_id"]) == ended
    # The session no longer places new stores.
    later = await store(service, alice, "unrelated afterthought")
    assert (await service.get_cell(alice, node_id=later))["scene_id"] is None


async def test_start_session_validates_its_arguments(service, make_agent):
    alice, _ = await make_agent()
    for project in (None, "", "  ", 5):
        await rejected(service.start_session(alice, project=project), "invalid_argument", "project")
    await rejected(service.start_session(alice, project="p" * 201), "too_large", "project")
    await rejected(service.start_session(alice, project="p", title=""), "invalid_argument", "title")
    await rejected(service.start_session(alice, project="p", title="t" * 501), "too_large", "title")
    assert service.db.query_one("SELECT COUNT(*) FROM sessions")[0] == 0
    assert service.db.query_one("SELECT COUNT(*) FROM scenes")[0] == 0


async def test_end_session_errors(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    outsider = await service.authenticate(second_tenant_key(service, "outsider"))
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
        foreign = await service.start_session(outsider, project="p")
    await rejected(service.end_session(bob, session_id=session["session_id"]), "forbidden", "session_id")
    await rejected(service.end_session(alice, session_id=str(uuid.uuid4())), "not_found", "session_id")
    await rejected(service.end_session(alice, session_id=foreign["session_id"]), "not_found", "session_id")
    for bad in ("not-a-uuid", "", None, 12):
        await rejected(service.end_session(alice, session_id=bad), "invalid_argument", "session_id")
    # Bob's attempt did not end it.
    assert (await service.get_scene(alice, scene_id=session["scene_id"]))["ended_at"] is None


async def test_get_scene_errors(service, make_agent):
    alice, _ = await make_agent()
    await rejected(service.get_scene(alice, scene_id="nope"), "invalid_argument", "scene_id")
    await rejected(service.get_scene(alice, scene_id=str(uuid.uuid4())), "not_found", "scene_id")


# -- list_scenes ------------------------------------------------------------------------------------


async def collect_pages(service, principal, limit: int, **filters) -> list[list[str]]:
    pages, cursor = [], None
    with trio.fail_after(10):
        while True:
            page = await service.list_scenes(principal, limit=limit, cursor=cursor, **filters)
            pages.append([s["scene_id"] for s in page["scenes"]])
            cursor = page["next_cursor"]
            if cursor is None:
                return pages
            assert len(pages) < 20, "the cursor never ends"


@pytest.mark.parametrize("same_millisecond", [False, True], ids=["distinct-times", "all-in-one-ms"])
async def test_list_scenes_pages_newest_first_without_overlap(service, make_agent, clock, same_millisecond):
    alice, _ = await make_agent()
    if same_millisecond:
        clock.step = 0  # ties on created_at must still page correctly
    created = []
    with trio.fail_after(10):
        for i in range(7):
            created.append((await service.start_session(alice, project=f"p{i}"))["scene_id"])
            clock.advance(0 if same_millisecond else 10)

    pages = await collect_pages(service, alice, 3)
    assert [len(p) for p in pages] == [3, 3, 1]
    flat = [s for p in pages for s in p]
    assert len(set(flat)) == 7 and set(flat) == set(created)
    with trio.fail_after(10):
        everything = (await service.list_scenes(alice, limit=50))
    assert [s["scene_id"] for s in everything["scenes"]] == flat  # pages are slices of one order
    assert everything["next_cursor"] is None
    if not same_millisecond:
        assert flat == created[::-1]  # newest first


async def test_list_scenes_reports_cell_counts_and_filters_by_project(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        web = await service.start_session(alice, project="web")
        await store(service, alice, "one")
        await store(service, alice, "two")
        await service.end_session(alice, session_id=web["session_id"])
        await service.start_session(alice, project="ops")
        listed = (await service.list_scenes(alice, project="web"))["scenes"]
    assert [(s["scene_id"], s["cell_count"]) for s in listed] == [(web["scene_id"], 2)]


async def test_list_scenes_rejects_bad_limits_and_cursors(service, make_agent):
    alice, _ = await make_agent()
    for limit in (0, -1, 501, True, "3", 1.5):
        await rejected(service.list_scenes(alice, limit=limit), "invalid_argument", "limit")
    for cursor in ("garbage!!", "", "bm90LWEtY3Vyc29y", 12, ["x"], "////"):
        await rejected(service.list_scenes(alice, cursor=cursor), "invalid_argument", "cursor")


# -- consolidate_scene ---------------------------------------------------------------------------------


async def test_consolidation_writes_one_l2_summary_most_energetic_first(service, make_agent, clock):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="infra", title="db migration")
    context = await store(service, alice, "we looked at three hosting providers last week", "Context", salience=0.3)
    decision = await store(service, alice, "Use pgvector for the V1 storage backend.", "Decision", salience=0.9)
    twin = await store(service, alice, "Use pgvector for the V1 storage backend!", "Decision", salience=0.6)
    risk = await store(service, alice, "the migration may lock the orders table for minutes", "Risk", salience=0.6)
    with trio.fail_after(10):
        await service.end_session(alice, session_id=session["session_id"])
        # Anyone who may read the scene may consolidate it.
        with clock.frozen() as consolidated_at:
            result = await service.consolidate_scene(bob, scene_id=session["scene_id"])
    assert result["scene_id"] == session["scene_id"]
    assert result["source_count"] == 4
    assert result["cell_count"] == 3  # the near-duplicate was merged, not repeated

    summary = await service.get_cell(alice, node_id=result["node_id"])
    assert summary["layer"] == "L2"
    lines = summary["content"].split("\n")
    assert lines == [
        "- [Decision] Use pgvector for the V1 storage backend. (+1 similar)",  # E0 0.90
        "- [Risk] the migration may lock the orders table for minutes",  # E0 0.54
        "- [Context] we looked at three hosting providers last week",  # E0 0.12
    ]
    assert summary["cell_type"] == "Decision"  # the lead line's type
    assert summary["salience"] == 0.9
    assert summary["scene_id"] == session["scene_id"] and summary["project"] == "infra"
    assert summary["source_agent"] == bob.agent_id  # stamped from whoever asked
    assert summary["source_ref"] == {"kind": "scene", "locator": session["scene_id"]}
    assert summary["metadata"]["source_cells"] == [decision, risk, context]
    assert twin not in summary["metadata"]["source_cells"]

    # Found at L2, not at L0; the scene points at it and still lists only its own cells.
    with trio.fail_after(10):
        l2 = (await service.query(alice, query="pgvector storage backend", layer="L2"))["results"]
        l0 = (await service.recall(alice, query=summary["content"], k=100))["results"]
    assert [h["node_id"] for h in l2] == [result["node_id"]]
    assert result["node_id"] not in [h["node_id"] for h in l0]
    scene = await service.get_scene(alice, scene_id=session["scene_id"])
    assert scene["consolidated_at"] == consolidated_at
    assert scene["summary_node_id"] == result["node_id"]
    assert scene["cell_ids"] == [context, decision, twin, risk]


async def test_a_scene_is_consolidated_once(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
    await store(service, alice, "a lesson worth keeping", "Lesson")
    with trio.fail_after(10):
        first = await service.consolidate_scene(alice, scene_id=session["scene_id"])
    error = await rejected(service.consolidate_scene(alice, scene_id=session["scene_id"]), "conflict", "scene_id")
    assert first["node_id"] in error.message
    assert service.db.query_one("SELECT COUNT(*) FROM cells WHERE layer = 'L2'")[0] == 1


async def test_concurrent_consolidations_make_one_summary(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
    await store(service, alice, "a lesson worth keeping", "Lesson")
    outcomes = []

    async def attempt() -> None:
        try:
            outcomes.append((await service.consolidate_scene(alice, scene_id=session["scene_id"]))["node_id"])
        except HyphaeError as exc:
            outcomes.append(exc.reason)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(attempt)
    assert sorted(o == "conflict" for o in outcomes) == [False] + [True] * 4
    assert service.db.query_one("SELECT COUNT(*) FROM cells WHERE layer = 'L2'")[0] == 1


async def test_an_empty_scene_cannot_be_consolidated(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
        await service.end_session(alice, session_id=session["session_id"])
    await rejected(service.consolidate_scene(alice, scene_id=session["scene_id"]), "conflict", "scene_id")
    # Forgotten cells do not count either.
    with trio.fail_after(10):
        other = await service.start_session(alice, project="p")
    node_id = await store(service, alice, "oops, a secret")
    with trio.fail_after(10):
        await service.forget(alice, node_id=node_id)
    await rejected(service.consolidate_scene(alice, scene_id=other["scene_id"]), "conflict", "scene_id")
    assert service.db.query_one("SELECT COUNT(*) FROM cells WHERE layer = 'L2'")[0] == 0
    await rejected(service.consolidate_scene(alice, scene_id=str(uuid.uuid4())), "not_found", "scene_id")
    await rejected(service.consolidate_scene(alice, scene_id="x"), "invalid_argument", "scene_id")


async def test_a_sessions_cell_count_is_its_memories_not_its_summary(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
    await store(service, alice, "first finding")
    await store(service, alice, "second finding", "Lesson")
    with trio.fail_after(10):
        await service.consolidate_scene(alice, scene_id=session["scene_id"])  # allowed while the session is open
        ended = await service.end_session(alice, session_id=session["session_id"])
    assert ended["cell_count"] == 2
    scene = await service.get_scene(alice, scene_id=session["scene_id"])
    assert scene["cell_count"] == 2


async def test_ending_again_answers_the_same_after_a_consolidation(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
    await store(service, alice, "first finding")
    with trio.fail_after(10):
        ended = await service.end_session(alice, session_id=session["session_id"])
        await service.consolidate_scene(alice, scene_id=session["scene_id"])
        assert await service.end_session(alice, session_id=session["session_id"]) == ended


async def test_ending_the_newer_of_two_open_sessions_falls_back_to_the_older(service, make_agent, clock):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        older = await service.start_session(alice, project="old")
        clock.advance(1000)
        newer = await service.start_session(alice, project="new")
        await service.end_session(alice, session_id=older["session_id"])  # ending the older changes nothing
    cell = await service.get_cell(alice, node_id=await store(service, alice, "still in the newer"))
    assert cell["session_id"] == newer["session_id"]

    with trio.fail_after(10):
        third = await service.start_session(alice, project="third")
        clock.advance(1000)
        await service.end_session(alice, session_id=third["session_id"])
    cell = await service.get_cell(alice, node_id=await store(service, alice, "back in the newer"))
    assert (cell["session_id"], cell["project"]) == (newer["session_id"], "new")
    with trio.fail_after(10):
        await service.end_session(alice, session_id=newer["session_id"])
    cell = await service.get_cell(alice, node_id=await store(service, alice, "no session left"))
    assert cell["session_id"] is None and cell["project"] is None


async def test_an_open_session_survives_a_restart(home, clock):
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            alice, _ = await service.add_agent("alice")
            session = await service.start_session(alice, project="long-running")
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            node_id = await store(service, alice, "after the restart")
            cell = await service.get_cell(alice, node_id=node_id)
            assert (cell["session_id"], cell["scene_id"], cell["project"]) == (
                session["session_id"], session["scene_id"], "long-running")
            ended = await service.end_session(alice, session_id=session["session_id"])
            assert ended["cell_count"] == 1
