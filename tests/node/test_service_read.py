"""Reading memories back: recall/query/search, get_cell, forget, authentication and read scope.

Read scope (DESIGN §3, §10): a principal reads the cells of its own tenant whose project is
empty or among its key's projects; no surface ever shows it anything else.
"""

from __future__ import annotations

import uuid

import pytest
import trio

from node.principals import Principal, PrincipalCache, hash_api_key, new_api_key
from tests.node.helpers import rejected, second_tenant_key, store

# -- helpers -------------------------------------------------------------------------------


async def ids(service, principal, text: str, *, layer: str | None = None, k: int = 100, **filters) -> list[str]:
    with trio.fail_after(10):
        if layer is None:
            result = await service.recall(principal, query=text, k=k, **filters)
        else:
            result = await service.query(principal, query=text, layer=layer, k=k, **filters)
    return [hit["node_id"] for hit in result["results"]]


async def test_recall_and_query_return_ids_and_distances_only_nearest_first(service, make_agent):
    alice, _ = await make_agent()
    texts = ["rotate the signing keys every ninety days", "the cafeteria closes at three", "keys are rotated by a cron job"]
    stored = [await store(service, alice, t, "Decision", salience=0.9) for t in texts]
    with trio.fail_after(10):
        recall = await service.recall(alice, query=texts[0])
        query = await service.query(alice, query=texts[0], layer="L1")
    for result in (recall, query):
        assert set(result) == {"results"}
        hits = result["results"]
        assert sorted(h["node_id"] for h in hits) == sorted(stored)
        for hit in hits:
            assert set(hit) == {"node_id", "distance"}  # seed 000: ids, not content
            assert isinstance(hit["distance"], float) and 0.0 <= hit["distance"] <= 2.0
        assert hits[0]["node_id"] == stored[0]
        assert hits[0]["distance"] == pytest.approx(0.0, abs=1e-5)
        distances = [h["distance"] for h in hits]
        assert distances == sorted(distances)


async def test_k_bounds(service, make_agent):
    alice, _ = await make_agent()
    for i in range(12):
        await store(service, alice, f"note number {i}")
    assert len(await ids(service, alice, "note", k=None)) == 10  # the default
    assert len(await ids(service, alice, "note", k=1)) == 1
    assert len(await ids(service, alice, "note", k=100)) == 12
    for k in (0, -1, 101, True, "3", 2.5):
        await rejected(service.recall(alice, query="note", k=k), "invalid_argument", "k")
        await rejected(service.query(alice, query="note", layer="L0", k=k), "invalid_argument", "k")


async def test_query_text_is_validated(service, make_agent):
    alice, _ = await make_agent()
    for bad in ("", "   ", None, 42, ["q"]):
        await rejected(service.recall(alice, query=bad), "invalid_argument", "query")
        await rejected(service.query(alice, query=bad, layer="L0"), "invalid_argument", "query")
    await rejected(service.recall(alice, query="q" * (8 * 1024 + 1)), "too_large", "query")


async def test_layer_is_validated(service, make_agent):
    alice, _ = await make_agent()
    for bad in ("L3", "l0", "", None, 0, "L0 "):
        await rejected(service.query(alice, query="anything", layer=bad), "invalid_argument", "layer")
        await rejected(service.search(alice, query="anything", layer=bad), "invalid_argument", "layer")


async def test_cell_types_filter(service, make_agent):
    alice, _ = await make_agent()
    risk = await store(service, alice, "the disk may fill up during the import", "Risk")
    fact = await store(service, alice, "the disk holds the import files", "Fact")
    task = await store(service, alice, "check the disk before the import", "Task")
    assert await ids(service, alice, "disk import", cell_types=["Risk"]) == [risk]
    assert sorted(await ids(service, alice, "disk import", cell_types=["Fact", "Task"])) == sorted([fact, task])
    for bad in ([], "Risk", ["risk"], [None], 3):
        await rejected(service.recall(alice, query="disk", cell_types=bad), "invalid_argument", "cell_types")


async def test_project_filter(service, make_agent):
    alice, _ = await make_agent()
    in_a = await store(service, alice, "deploys go out on tuesday", project="a")
    in_b = await store(service, alice, "deploys go out on friday", project="b")
    await store(service, alice, "deploys need a green build")  # tenant-wide
    found = await ids(service, alice, "deploys", project="a")
    assert in_a in found and in_b not in found
    with trio.fail_after(10):
        hits = (await service.search(alice, query="deploys", project="a"))["results"]
    assert hits and {h["project"] for h in hits} == {"a"}
    await rejected(service.recall(alice, query="deploys", project=""), "invalid_argument", "project")
    await rejected(service.recall(alice, query="deploys", project=7), "invalid_argument", "project")


async def test_search_returns_hydrated_cells_with_distances(service, make_agent):
    alice, _ = await make_agent()
    node_id = await store(service, alice, "feature flags live in LaunchDarkly", "Decision", salience=0.8,
                          source_ref={"kind": "url", "locator": "https://wiki/flags"})
    with trio.fail_after(10):
        hits = (await service.search(alice, query="feature flags live in LaunchDarkly", k=3))["results"]
    assert hits[0]["node_id"] == node_id
    assert hits[0]["content"] == "feature flags live in LaunchDarkly"
    assert hits[0]["source_ref"] == {"kind": "url", "locator": "https://wiki/flags"}
    assert hits[0]["distance"] == pytest.approx(0.0, abs=1e-5)


# -- get_cell --------------------------------------------------------------------------------------


async def test_get_cell_hydrates_with_provenance(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    node_id = await store(service, alice, "Use pgvector for the V1 storage backend.", "Decision", salience=0.9,
                          metadata={"pr": 17})
    cell = await service.get_cell(bob, node_id=node_id)  # anyone in scope may read it
    assert cell["content"] == "Use pgvector for the V1 storage backend."
    assert cell["metadata"] == {"pr": 17}
    assert cell["layer"] == "L1"
    provenance = cell["provenance"]
    assert provenance["origin_node"] == service.node_id
    assert provenance["source_agent"] == alice.agent_id
    assert provenance["hops"] == 0
    assert provenance["local"] is True
    assert provenance["forgotten_by"] is None
    assert provenance["signed"] is False  # no origin signature on a row written here (see test_mesh_ingest)


async def test_get_cell_rejects_bad_and_unknown_ids(service, make_agent):
    alice, _ = await make_agent()
    await rejected(service.get_cell(alice, node_id="nope"), "invalid_argument", "node_id")
    await rejected(service.get_cell(alice, node_id=None), "invalid_argument", "node_id")
    await rejected(service.get_cell(alice, node_id=str(uuid.uuid4())), "not_found", "node_id")


# -- forget --------------------------------------------------------------------------------------------


async def test_forget_leaves_a_hydratable_tombstone_that_recall_no_longer_finds(service, make_agent, clock):
    alice, _ = await make_agent()
    text = "the VPN root password is hunter2"
    node_id = await store(service, alice, text, "Decision", salience=0.9)  # in L0 and L1
    keep = await store(service, alice, "the VPN is needed for the staging cluster")
    assert node_id in await ids(service, alice, text)
    assert node_id in await ids(service, alice, text, layer="L1")

    with trio.fail_after(10), clock.frozen() as now:
        answer = await service.forget(alice, node_id=node_id)
    assert answer == {"node_id": node_id, "forgotten_at": now}

    tombstone = await service.get_cell(alice, node_id=node_id)
    assert tombstone["content"] == ""  # the content is erased ...
    assert tombstone["forgotten_at"] == answer["forgotten_at"]  # ... the record stays
    assert tombstone["energy"] == 0.0
    assert tombstone["provenance"]["forgotten_by"] == alice.agent_id
    assert tombstone["cell_type"] == "Decision" and tombstone["source_agent"] == alice.agent_id
    (blob,) = service.db.query_one("SELECT embedding FROM cells WHERE node_id = ?", (node_id,))
    assert blob == b""  # the vector, which encodes the content, is erased too

    assert node_id not in await ids(service, alice, text)
    assert node_id not in await ids(service, alice, text, layer="L1")
    with trio.fail_after(10):
        hits = (await service.search(alice, query=text))["results"]
    assert [h["node_id"] for h in hits] == [keep]

    clock.advance(60_000)
    with trio.fail_after(10):
        again = await service.forget(alice, node_id=node_id)
    assert again == answer  # forgetting twice answers the same


async def test_only_the_author_may_forget(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    node_id = await store(service, alice, "alice's memory")
    await rejected(service.forget(bob, node_id=node_id), "forbidden", "node_id")
    cell = await service.get_cell(bob, node_id=node_id)
    assert cell["content"] == "alice's memory" and cell["forgotten_at"] is None
    await rejected(service.forget(alice, node_id=str(uuid.uuid4())), "not_found", "node_id")
    await rejected(service.forget(alice, node_id="not-a-uuid"), "invalid_argument", "node_id")


# -- authentication ----------------------------------------------------------------------------------


async def test_authenticate_resolves_keys_to_principals(service, make_agent):
    alice, key = await make_agent("alice", projects=["p2", "p1", "p1"])
    assert await service.authenticate(key) == alice
    assert alice.projects == ("p1", "p2")
    row = service.db.query_one("SELECT key_hash FROM principals WHERE agent_id = ?", (alice.agent_id,))
    assert key.encode() not in row[0] and row[0] == hash_api_key(key)  # stored only hashed


async def test_unknown_empty_and_revoked_keys_are_unauthenticated(service, make_agent, clock):
    _, key = await make_agent("alice")
    _, bobs_key = await make_agent("bob")
    for bad in (None, "", new_api_key(), key + "x", key[:-1]):
        await rejected(service.authenticate(bad), "unauthenticated")

    with trio.fail_after(10), clock.frozen() as now:
        revoked = await service.revoke_agent("alice")
    assert revoked["revoked_at"] == now
    await rejected(service.authenticate(key), "unauthenticated")  # the very next call
    assert (await service.authenticate(bobs_key)).name == "bob"  # others are untouched
    with trio.fail_after(10):
        assert await service.revoke_agent("alice") == revoked  # revoking twice answers the same
    await rejected(service.revoke_agent("nobody"), "not_found", "name")


async def test_a_key_in_use_is_refused_on_the_first_call_after_its_revocation(service, make_agent):
    alice, key = await make_agent("alice")
    _, bobs_key = await make_agent("bob")
    for _ in range(3):  # resolved once, then answered from the principal cache
        assert await service.authenticate(key) == alice
    assert (await service.authenticate(bobs_key)).name == "bob"
    with trio.fail_after(10):
        await service.revoke_agent("alice")
    await rejected(service.authenticate(key), "unauthenticated")
    await rejected(service.authenticate(key), "unauthenticated")
    assert (await service.authenticate(bobs_key)).name == "bob"


def test_a_lookup_that_started_before_a_revocation_is_not_cached():
    cache = PrincipalCache()
    alice = Principal("tenant", "agent-alice", "alice")
    read_at = cache.generation  # the database was read here, before the revocation committed
    cache.invalidate()  # the revocation commits
    cache.put(b"alice-hash", alice, read_at)
    assert cache.get(b"alice-hash") is None
    cache.put(b"alice-hash", alice, cache.generation)  # a read after it is kept
    assert cache.get(b"alice-hash") == alice
    cache.invalidate()
    assert cache.get(b"alice-hash") is None


# -- read scope: tenants -----------------------------------------------------------------------------


async def test_a_tenant_never_sees_another_tenants_memories(service, make_agent):
    alice, _ = await make_agent("alice")
    watcher, _ = await make_agent("watcher")
    outsider = await service.authenticate(second_tenant_key(service, "outsider"))
    assert outsider.tenant_id != alice.tenant_id

    text = "the acquisition closes on March 3rd"
    with trio.fail_after(10):
        await service.place_beacon(watcher, query=text, threshold=0.3)
        await service.place_beacon(outsider, query=text, threshold=0.3)
    wide = await store(service, alice, "the acquisition needs a lawyer on call")  # tenant-wide
    with trio.fail_after(10):
        session = await service.start_session(alice, project="secret")
    secret = await store(service, alice, text, "Decision", salience=1.0)  # in L0 and L1, project "secret"
    with trio.fail_after(10):
        await service.end_session(alice, session_id=session["session_id"])
        summary = await service.consolidate_scene(alice, scene_id=session["scene_id"])  # an L2 cell too

    # Positive control: a same-tenant agent sees all of it, and its beacon caught the cell and the summary.
    assert {secret, wide} <= set(await ids(service, watcher, text))
    assert summary["node_id"] in await ids(service, watcher, text, layer="L2")
    with trio.fail_after(10):
        caught = {d["node_id"] for d in (await service.inbox(watcher))["diffs"]}
    assert {secret, summary["node_id"]} <= caught

    for layer in (None, "L0", "L1", "L2"):
        assert await ids(service, outsider, text, layer=layer) == []
    with trio.fail_after(10):
        assert (await service.search(outsider, query=text))["results"] == []
        assert (await service.search(outsider, query=text, layer="L2"))["results"] == []
    for node_id in (secret, wide, summary["node_id"]):
        await rejected(service.get_cell(outsider, node_id=node_id), "not_found", "node_id")
        await rejected(service.forget(outsider, node_id=node_id), "not_found", "node_id")
    await rejected(service.get_scene(outsider, scene_id=session["scene_id"]), "not_found", "scene_id")
    await rejected(service.consolidate_scene(outsider, scene_id=session["scene_id"]), "not_found", "scene_id")
    await rejected(service.end_session(outsider, session_id=session["session_id"]), "not_found", "session_id")
    with trio.fail_after(10):
        assert (await service.list_scenes(outsider))["scenes"] == []
        assert (await service.list_scenes(outsider, project="secret"))["scenes"] == []
        assert (await service.inbox(outsider))["diffs"] == []
        assert (await service.pull_inbox(outsider))["diffs"] == []
        assert len((await service.list_beacons(outsider))["beacons"]) == 1

    # And the other way round: the outsider's memories never reach this tenant.
    theirs = await store(service, outsider, "the acquisition closes on March 3rd")
    assert theirs not in await ids(service, alice, text)
    await rejected(service.get_cell(alice, node_id=theirs), "not_found", "node_id")
    with trio.fail_after(10):
        assert {d["node_id"] for d in (await service.inbox(watcher))["diffs"]} == caught


async def test_near_duplicates_do_not_promote_across_tenants(service, make_agent):
    alice, _ = await make_agent()
    outsider = await service.authenticate(second_tenant_key(service, "outsider"))
    text = "standups are at 09:30 in the blue room"
    mine = await store(service, alice, text)
    await store(service, outsider, text)
    with trio.fail_after(10):
        await trio.to_thread.run_sync(service.layers.flush)  # near-duplicates are found by the indexer
        await service.db.write(lambda tx: None)  # ... which queues the promotion
    assert (await service.get_cell(alice, node_id=mine))["layer"] == "L0"


# -- read scope: projects -------------------------------------------------------------------------------


async def test_a_project_key_reads_its_projects_and_tenant_wide_cells_only(service, make_agent):
    admin, _ = await make_agent("admin")  # no project list: reads everything
    frontend, _ = await make_agent("frontend-agent", projects=["frontend"])
    with trio.fail_after(10):
        web_session = await service.start_session(admin, project="frontend")
        web = await store(service, admin, "buttons use the primary colour token")
        await service.end_session(admin, session_id=web_session["session_id"])
        api_session = await service.start_session(admin, project="backend")
        api = await store(service, admin, "buttons of the admin API are rate limited")
        await service.end_session(admin, session_id=api_session["session_id"])
    wide = await store(service, admin, "buttons must be reachable by keyboard")

    query = "buttons"
    assert sorted(await ids(service, frontend, query)) == sorted([web, wide])
    assert sorted(await ids(service, admin, query)) == sorted([web, api, wide])
    with trio.fail_after(10):
        assert {h["node_id"] for h in (await service.search(frontend, query=query))["results"]} == {web, wide}

    assert (await service.get_cell(frontend, node_id=web))["content"]
    assert (await service.get_cell(frontend, node_id=wide))["content"]
    await rejected(service.get_cell(frontend, node_id=api), "forbidden", "node_id")
    await rejected(service.get_scene(frontend, scene_id=api_session["scene_id"]), "forbidden", "scene_id")
    assert (await service.get_scene(frontend, scene_id=web_session["scene_id"]))["cell_ids"] == [web]
    with trio.fail_after(10):
        listed = (await service.list_scenes(frontend))["scenes"]
    assert [s["scene_id"] for s in listed] == [web_session["scene_id"]]

    # Naming an out-of-scope project explicitly is refused, not silently emptied.
    await rejected(service.recall(frontend, query=query, project="backend"), "forbidden", "project")
    await rejected(service.query(frontend, query=query, layer="L0", project="backend"), "forbidden", "project")
    await rejected(service.search(frontend, query=query, project="backend"), "forbidden", "project")
    await rejected(service.list_scenes(frontend, project="backend"), "forbidden", "project")
    await rejected(service.start_session(frontend, project="backend"), "forbidden", "project")
    await rejected(service.place_beacon(frontend, query=query, project="backend"), "forbidden", "project")
    await rejected(service.store(frontend, content="x", cell_type="Fact", project="backend"), "forbidden", "project")
    await rejected(service.consolidate_scene(frontend, scene_id=api_session["scene_id"]), "forbidden", "scene_id")
