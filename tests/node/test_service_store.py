"""store: the seed-001 contract at the memory-service facade.

Every field of seed 001 round-trips; every kind of bad input is refused with its reason code and
leaves nothing behind; identity comes from the principal; the idempotency key holds under
concurrency; session defaults apply; promotion to L1 follows the energy model (DESIGN §4).
"""

from __future__ import annotations

import json
import math
import uuid

import numpy as np
import pytest
import trio

from node.errors import HyphaeError
from tests.node.helpers import rejected, second_tenant_key

# -- helpers -------------------------------------------------------------------------------


def rows(service, table: str) -> int:
    (count,) = service.db.query_one(f"SELECT COUNT(*) FROM {table}")
    return count


def nothing_stored(service) -> None:
    assert rows(service, "cells") == 0
    assert rows(service, "layer_members") == 0
    assert rows(service, "idempotency") == 0


async def settle(service) -> None:
    """Wait for fire-and-forget write jobs: a job queued now runs after all of them."""
    service.flush_recall_hits()  # reinforcement counts gathering for their next drain
    with trio.fail_after(10):
        await service.db.write(lambda tx: None)


async def indexed(service) -> None:
    """Wait for the indexer thread (which spots near-duplicates), then for the writes it queued."""
    with trio.fail_after(10):
        await trio.to_thread.run_sync(service.layers.flush)
    await settle(service)


async def layer_ids(service, principal, text: str, layer: str, k: int = 10) -> list[str]:
    with trio.fail_after(10):
        result = await service.query(principal, query=text, layer=layer, k=k)
    return [hit["node_id"] for hit in result["results"]]


# -- the happy path: every field of seed 001 --------------------------------------------------


async def test_every_seed_field_round_trips(service, make_agent):
    alice, _ = await make_agent("alice")
    with trio.fail_after(10):
        session = await service.start_session(alice, project="storage", title="pick a backend")
        await service.end_session(alice, session_id=session["session_id"])
        result = await service.store(
            alice,
            content="Use pgvector for the V1 storage backend.",
            cell_type="Decision",
            salience=0.9,
            scene_id=session["scene_id"],
            source_ref={"kind": "file", "locator": "specs/hyphae-storage.md:42"},
            metadata={"ticket": "HY-12", "nested": {"ok": [1, 2.5, None, True]}},
            idempotency_key="req-1",
        )
    assert set(result) == {"node_id"}
    assert str(uuid.UUID(result["node_id"])) == result["node_id"]

    cell = await service.get_cell(alice, node_id=result["node_id"])
    assert cell["node_id"] == result["node_id"]
    assert cell["content"] == "Use pgvector for the V1 storage backend."
    assert cell["cell_type"] == "Decision"
    assert cell["salience"] == 0.9
    assert cell["scene_id"] == session["scene_id"]
    assert cell["session_id"] == session["session_id"]  # the scene's session
    assert cell["project"] == "storage"  # the scene's project
    assert cell["source_ref"] == {"kind": "file", "locator": "specs/hyphae-storage.md:42"}
    assert cell["metadata"] == {"ticket": "HY-12", "nested": {"ok": [1, 2.5, None, True]}}
    assert cell["tenant_id"] == alice.tenant_id
    assert cell["source_agent"] == alice.agent_id
    assert cell["origin_node"] == service.node_id
    assert cell["embedding_space"] == service.embedder.space
    assert cell["forgotten_at"] is None
    assert cell["energy"] == pytest.approx(0.9)  # E0 = 0.9 × w(Decision)=1.0, no time has passed


async def test_only_content_and_type_are_required_and_defaults_apply(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        node_id = (await service.store(alice, content="x", cell_type="Fact"))["node_id"]
    cell = await service.get_cell(alice, node_id=node_id)
    assert cell["salience"] == 0.5
    assert cell["metadata"] == {}
    assert cell["source_ref"] is None
    assert cell["scene_id"] is None and cell["session_id"] is None and cell["project"] is None
    assert cell["layer"] == "L0"  # E0 = 0.5 × 0.6 = 0.3 < 0.7


async def test_each_seed_cell_type_is_accepted(service, make_agent):
    alice, _ = await make_agent()
    for cell_type in ("Decision", "Constraint", "Risk", "Pattern", "Lesson", "Fact", "Preference", "Context", "Task"):
        with trio.fail_after(10):
            node_id = (await service.store(alice, content=f"a {cell_type} memory", cell_type=cell_type))["node_id"]
        assert (await service.get_cell(alice, node_id=node_id))["cell_type"] == cell_type


# -- content size ----------------------------------------------------------------------------


async def test_content_from_one_byte_to_exactly_64_kib_is_stored_intact(service, make_agent):
    alice, _ = await make_agent()
    for content in ("a", " ", "a" * 65536, "é" * 32768, "€" * 21845 + "a"):
        assert len(content.encode()) in (1, 65536)
        with trio.fail_after(10):
            node_id = (await service.store(alice, content=content, cell_type="Fact"))["node_id"]
        assert (await service.get_cell(alice, node_id=node_id))["content"] == content


# -- bad input: the reason code, the field, and nothing stored ---------------------------------

TOO_BIG_METADATA = {"blob": "x" * (16 * 1024)}

BAD_INPUTS = [
    # content
    ("empty-content", {"content": ""}, "invalid_argument", "content"),
    ("content-64KiB+1", {"content": "a" * 65537}, "too_large", "content"),
    ("content-64KiB+1-multibyte", {"content": "é" * 32768 + "a"}, "too_large", "content"),
    ("content-int", {"content": 42}, "invalid_argument", "content"),
    ("content-none", {"content": None}, "invalid_argument", "content"),
    ("content-bytes", {"content": b"bytes"}, "invalid_argument", "content"),
    ("content-list", {"content": ["a"]}, "invalid_argument", "content"),
    # cell_type: exact spelling only
    ("type-lowercase", {"cell_type": "decision"}, "invalid_argument", "cell_type"),
    ("type-uppercase", {"cell_type": "DECISION"}, "invalid_argument", "cell_type"),
    ("type-trailing-space", {"cell_type": "Decision "}, "invalid_argument", "cell_type"),
    ("type-unknown", {"cell_type": "Insight"}, "invalid_argument", "cell_type"),
    ("type-empty", {"cell_type": ""}, "invalid_argument", "cell_type"),
    ("type-none", {"cell_type": None}, "invalid_argument", "cell_type"),
    ("type-list", {"cell_type": ["Decision"]}, "invalid_argument", "cell_type"),
    # salience
    ("salience-below-0", {"salience": -0.01}, "invalid_argument", "salience"),
    ("salience-above-1", {"salience": 1.0001}, "invalid_argument", "salience"),
    ("salience-true", {"salience": True}, "invalid_argument", "salience"),
    ("salience-false", {"salience": False}, "invalid_argument", "salience"),
    ("salience-nan", {"salience": math.nan}, "invalid_argument", "salience"),
    ("salience-inf", {"salience": math.inf}, "invalid_argument", "salience"),
    ("salience-string", {"salience": "0.5"}, "invalid_argument", "salience"),
    ("salience-list", {"salience": [0.5]}, "invalid_argument", "salience"),
    # scene_id
    ("scene-not-uuid", {"scene_id": "scene-1"}, "invalid_argument", "scene_id"),
    ("scene-int", {"scene_id": 7}, "invalid_argument", "scene_id"),
    ("scene-unknown", {"scene_id": "9b2f8c3e-1d2a-4f5b-8c6d-7e8f9a0b1c2d"}, "not_found", "scene_id"),
    # source_ref: exactly {kind, locator}, both non-empty strings
    ("ref-string", {"source_ref": "file:a.py:1"}, "invalid_argument", "source_ref"),
    ("ref-missing-locator", {"source_ref": {"kind": "file"}}, "invalid_argument", "source_ref"),
    ("ref-extra-key", {"source_ref": {"kind": "file", "locator": "a", "line": 3}}, "invalid_argument", "source_ref"),
    ("ref-non-string", {"source_ref": {"kind": "file", "locator": 12}}, "invalid_argument", "source_ref"),
    ("ref-empty-kind", {"source_ref": {"kind": "", "locator": "a"}}, "invalid_argument", "source_ref"),
    ("ref-huge-locator", {"source_ref": {"kind": "url", "locator": "u" * 2049}}, "too_large", "source_ref"),
    # metadata
    ("metadata-list", {"metadata": [1, 2]}, "invalid_argument", "metadata"),
    ("metadata-string", {"metadata": '{"a": 1}'}, "invalid_argument", "metadata"),
    ("metadata-nan", {"metadata": {"x": math.nan}}, "invalid_argument", "metadata"),
    ("metadata-set", {"metadata": {"x": {1, 2}}}, "invalid_argument", "metadata"),
    ("metadata-bytes", {"metadata": {"x": b"raw"}}, "invalid_argument", "metadata"),
    ("metadata-object", {"metadata": {"x": object()}}, "invalid_argument", "metadata"),
    ("metadata-over-16KiB", {"metadata": TOO_BIG_METADATA}, "too_large", "metadata"),
    # idempotency_key
    ("key-201-chars", {"idempotency_key": "k" * 201}, "too_large", "idempotency_key"),
    ("key-empty", {"idempotency_key": ""}, "invalid_argument", "idempotency_key"),
    ("key-int", {"idempotency_key": 5}, "invalid_argument", "idempotency_key"),
]


async def test_bad_input_is_refused_with_its_reason_and_nothing_is_stored(service, make_agent):
    """One node, every bad request in turn; all mismatches are reported together."""
    alice, _ = await make_agent()
    mismatches = []
    for name, change, reason, field in BAD_INPUTS:
        request = {"content": "A perfectly good memory.", "cell_type": "Fact", "idempotency_key": "attempt-1", **change}
        try:
            with trio.fail_after(10):
                await service.store(alice, **request)
        except HyphaeError as exc:
            if (exc.reason, exc.field) != (reason, field) or not exc.message:
                mismatches.append(f"{name}: got {exc.reason}/{exc.field} ({exc.message}), want {reason}/{field}")
        except Exception as exc:  # noqa: BLE001 - anything but a HyphaeError is a bug to report
            mismatches.append(f"{name}: raised {exc!r} instead of {reason}")
        else:
            mismatches.append(f"{name}: was stored, want {reason}")
        if rows(service, "cells") or rows(service, "layer_members") or rows(service, "idempotency"):
            mismatches.append(f"{name}: left rows behind")
            break
    assert mismatches == []

    # The refused attempts burned nothing: the same idempotency key now stores a fresh cell.
    with trio.fail_after(10):
        first = await service.store(alice, content="A perfectly good memory.", cell_type="Fact", idempotency_key="attempt-1")
    assert rows(service, "cells") == 1
    assert (await service.get_cell(alice, node_id=first["node_id"]))["content"] == "A perfectly good memory."


async def test_text_that_is_not_unicode_is_refused_not_crashed_on(service, make_agent):
    """A lone surrogate is valid JSON (``"\\ud800"``) but not encodable text: a clear
    invalid_argument, never an internal UnicodeEncodeError, and nothing stored."""
    alice, _ = await make_agent()
    await rejected(service.store(alice, content="bad \ud800 text", cell_type="Fact"), "invalid_argument", "content")
    await rejected(
        service.store(alice, content="fine", cell_type="Fact", metadata={"x": "\udc80"}), "invalid_argument", "metadata"
    )
    nothing_stored(service)


async def test_salience_bounds_are_inclusive(service, make_agent):
    alice, _ = await make_agent()
    for salience in (0, 0.0, 1, 1.0, 0.123456):
        with trio.fail_after(10):
            node_id = (await service.store(alice, content="bounds", cell_type="Fact", salience=salience))["node_id"]
        cell = await service.get_cell(alice, node_id=node_id)
        assert cell["salience"] == float(salience)
        assert isinstance(cell["salience"], float)


async def test_metadata_of_exactly_16_kib_is_accepted(service, make_agent):
    alice, _ = await make_agent()
    overhead = len(json.dumps({"blob": ""}, separators=(",", ":")))
    metadata = {"blob": "x" * (16 * 1024 - overhead)}
    assert len(json.dumps(metadata, separators=(",", ":")).encode()) == 16 * 1024
    with trio.fail_after(10):
        node_id = (await service.store(alice, content="meta", cell_type="Fact", metadata=metadata))["node_id"]
    assert (await service.get_cell(alice, node_id=node_id))["metadata"] == metadata


async def test_idempotency_key_of_200_chars_is_accepted(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        first = await service.store(alice, content="k", cell_type="Fact", idempotency_key="k" * 200)
        again = await service.store(alice, content="k", cell_type="Fact", idempotency_key="k" * 200)
    assert first == again


async def test_scene_of_another_tenant_is_not_found_and_nothing_stored(service, make_agent):
    alice, _ = await make_agent()
    outsider = await service.authenticate(second_tenant_key(service))
    with trio.fail_after(10):
        foreign = await service.start_session(outsider, project="theirs")
    await rejected(service.store(alice, content="x", cell_type="Fact", scene_id=foreign["scene_id"]), "not_found", "scene_id")
    nothing_stored(service)


async def test_scene_outside_the_keys_projects_is_forbidden_and_nothing_stored(service, make_agent):
    owner, _ = await make_agent()
    restricted, _ = await make_agent(projects=["frontend"])
    with trio.fail_after(10):
        backend = await service.start_session(owner, project="backend")
    await rejected(
        service.store(restricted, content="x", cell_type="Fact", scene_id=backend["scene_id"]), "forbidden", "scene_id"
    )
    await rejected(service.store(restricted, content="x", cell_type="Fact", project="backend"), "forbidden", "project")
    nothing_stored(service)


async def test_scene_id_is_accepted_in_any_uuid_spelling_and_stored_canonically(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="p")
        node_id = (await service.store(alice, content="x", cell_type="Fact", scene_id=session["scene_id"].upper()))["node_id"]
    assert (await service.get_cell(alice, node_id=node_id))["scene_id"] == session["scene_id"]


# -- idempotency ------------------------------------------------------------------------------


async def test_replayed_idempotency_key_returns_the_original_node_id(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        first = await service.store(alice, content="once", cell_type="Task", idempotency_key="retry-me")
        # A retry after a lost reply may even differ in content: the key wins, nothing new is made.
        replay = await service.store(alice, content="once, edited", cell_type="Fact", idempotency_key="retry-me")
        other = await service.store(alice, content="once", cell_type="Task", idempotency_key="another")
    assert replay == first
    assert other != first
    assert rows(service, "cells") == 2
    assert (await service.get_cell(alice, node_id=first["node_id"]))["content"] == "once"


async def test_without_a_key_every_store_is_a_new_cell(service, make_agent):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        a = await service.store(alice, content="twice", cell_type="Fact")
        b = await service.store(alice, content="twice", cell_type="Fact")
    assert a != b and rows(service, "cells") == 2


async def test_idempotency_keys_belong_to_one_agent(service, make_agent):
    """Bob replaying Alice's key gets his own cell, never Alice's id."""
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    with trio.fail_after(10):
        mine = await service.store(alice, content="alice's", cell_type="Fact", idempotency_key="shared-key")
        theirs = await service.store(bob, content="bob's", cell_type="Fact", idempotency_key="shared-key")
    assert mine != theirs
    assert (await service.get_cell(bob, node_id=theirs["node_id"]))["source_agent"] == bob.agent_id


async def test_twenty_concurrent_stores_with_one_key_make_one_cell(service, make_agent):
    alice, _ = await make_agent()
    answers: list[str] = []

    async def store_once(i: int) -> None:
        result = await service.store(alice, content=f"racing store {i}", cell_type="Fact", idempotency_key="race")
        answers.append(result["node_id"])

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(store_once, i)
    assert len(answers) == 20
    assert len(set(answers)) == 1
    assert rows(service, "cells") == 1
    assert rows(service, "idempotency") == 1
    assert rows(service, "layer_members") == 1  # and the index holds it once


# -- identity stamping --------------------------------------------------------------------------


async def test_identity_cannot_be_claimed_in_the_request(service, make_agent):
    """The facade has no source_agent/tenant_id/origin_node parameter at all (seed 000, INV-5)."""
    alice, _ = await make_agent()
    for claimed in ("source_agent", "tenant_id", "origin_node"):
        with pytest.raises(TypeError, match=claimed):
            await service.store(alice, content="spoof", cell_type="Fact", **{claimed: "someone-else"})
    nothing_stored(service)


async def test_identity_is_stamped_from_the_principal(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    with trio.fail_after(10):
        a = (await service.store(alice, content="from alice", cell_type="Fact"))["node_id"]
        b = (await service.store(bob, content="from bob", cell_type="Fact"))["node_id"]
    cell_a = await service.get_cell(bob, node_id=a)
    cell_b = await service.get_cell(alice, node_id=b)
    assert (cell_a["source_agent"], cell_a["tenant_id"]) == (alice.agent_id, alice.tenant_id)
    assert (cell_b["source_agent"], cell_b["tenant_id"]) == (bob.agent_id, bob.tenant_id)
    assert cell_a["provenance"]["source_agent"] == alice.agent_id
    assert cell_a["provenance"]["local"] is True


# -- session defaults ---------------------------------------------------------------------------


async def test_an_open_session_places_the_agents_stores(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    with trio.fail_after(10):
        session = await service.start_session(alice, project="billing")
        inside = (await service.store(alice, content="during", cell_type="Fact"))["node_id"]
        by_bob = (await service.store(bob, content="bob has no session", cell_type="Fact"))["node_id"]
        await service.end_session(alice, session_id=session["session_id"])
        after = (await service.store(alice, content="after", cell_type="Fact"))["node_id"]

    cell = await service.get_cell(alice, node_id=inside)
    assert (cell["session_id"], cell["scene_id"], cell["project"]) == (
        session["session_id"], session["scene_id"], "billing"
    )
    other = await service.get_cell(alice, node_id=by_bob)
    assert (other["session_id"], other["scene_id"], other["project"]) == (None, None, None)
    later = await service.get_cell(alice, node_id=after)
    assert (later["session_id"], later["scene_id"], later["project"]) == (None, None, None)


async def test_the_latest_open_session_wins(service, make_agent, clock):
    alice, _ = await make_agent()
    with trio.fail_after(10):
        await service.start_session(alice, project="old")
        clock.advance(1000)
        newer = await service.start_session(alice, project="new")
        node_id = (await service.store(alice, content="where am I", cell_type="Fact"))["node_id"]
    cell = await service.get_cell(alice, node_id=node_id)
    assert (cell["session_id"], cell["project"]) == (newer["session_id"], "new")


async def test_a_single_project_key_stores_into_its_project(service, make_agent):
    solo, _ = await make_agent(projects=["mobile"])
    with trio.fail_after(10):
        node_id = (await service.store(solo, content="x", cell_type="Fact"))["node_id"]
    assert (await service.get_cell(solo, node_id=node_id))["project"] == "mobile"


# -- promotion ------------------------------------------------------------------------------------


PROMOTION_CASES = [
    ("Decision", 0.7, True),  # E0 = 0.70: the threshold itself promotes
    ("Decision", 1.0, True),
    ("Risk", 0.8, True),  # 0.72
    ("Decision", 0.69, False),
    ("Lesson", 0.85, False),  # 0.68
    ("Fact", 1.0, False),  # 0.60: a Fact never promotes on arrival by default
    ("Context", 1.0, False),  # 0.40
]


async def test_high_initial_energy_enters_l1_on_arrival(service, make_agent):
    alice, _ = await make_agent()
    for cell_type, salience, promoted in PROMOTION_CASES:
        text = f"promotion probe {cell_type} {salience}"
        with trio.fail_after(10):
            node_id = (await service.store(alice, content=text, cell_type=cell_type, salience=salience))["node_id"]
        case = (cell_type, salience)
        assert (await service.get_cell(alice, node_id=node_id))["layer"] == ("L1" if promoted else "L0"), case
        assert (node_id in await layer_ids(service, alice, text, "L1")) is promoted, case
        assert node_id in await layer_ids(service, alice, text, "L0"), case  # L0 holds every cell


async def test_a_near_duplicate_from_another_agent_promotes_the_earlier_cell(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "The staging database is rebuilt every night at 02:00 UTC."
    with trio.fail_after(10):
        first = (await service.store(alice, content=text, cell_type="Fact", salience=0.5))["node_id"]
        assert first not in await layer_ids(service, alice, text, "L1")
        # Same words, different punctuation: cos = 1.0 with the hashed embedder.
        await service.store(bob, content=text.replace(".", "!"), cell_type="Fact", salience=0.5)
    await indexed(service)  # reinforcement is bookkeeping done off the store's path
    assert (await service.get_cell(alice, node_id=first))["layer"] == "L1"
    assert first in await layer_ids(service, alice, text, "L1")


async def test_a_near_duplicate_from_the_same_agent_does_not_promote(service, make_agent):
    alice, _ = await make_agent()
    text = "The staging database is rebuilt every night at 02:00 UTC."
    with trio.fail_after(10):
        first = (await service.store(alice, content=text, cell_type="Fact", salience=0.5))["node_id"]
        await service.store(alice, content=text, cell_type="Fact", salience=0.5)
    await indexed(service)
    assert (await service.get_cell(alice, node_id=first))["layer"] == "L0"
    assert await layer_ids(service, alice, text, "L1") == []


async def test_a_merely_similar_cell_from_another_agent_does_not_promote(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    a = "The staging database is rebuilt every night at 02:00 UTC."
    b = "The staging cache is flushed every Monday morning."
    cos = float(service.embedder.embed([a])[0] @ service.embedder.embed([b])[0])
    assert cos < 0.95
    with trio.fail_after(10):
        first = (await service.store(alice, content=a, cell_type="Fact"))["node_id"]
        await service.store(bob, content=b, cell_type="Fact")
    await indexed(service)
    assert (await service.get_cell(alice, node_id=first))["layer"] == "L0"


async def test_three_top_3_recalls_promote_exactly_the_top_3(service, make_agent):
    alice, _ = await make_agent()
    texts = [
        "deploy checklist alpha bravo charlie delta",
        "deploy checklist alpha bravo charlie",
        "deploy checklist alpha bravo",
        "deploy checklist alpha",
        "deploy checklist",
    ]
    ids = []
    with trio.fail_after(10):
        for text in texts:
            ids.append((await service.store(alice, content=text, cell_type="Fact"))["node_id"])
    query = texts[0]

    async def recall_ranking() -> list[str]:
        await indexed(service)  # the index as a quiet machine would have it by now, whatever the load
        with trio.fail_after(10):
            result = await service.recall(alice, query=query, k=10)
        await settle(service)  # the reinforcement job is fire-and-forget
        await indexed(service)  # and the promotions it made, in the L1 index
        return [hit["node_id"] for hit in result["results"]]

    ranking = await recall_ranking()
    assert sorted(ranking) == sorted(ids)
    top3, rest = ranking[:3], ranking[3:]
    await recall_ranking()
    for node_id in ranking:  # two top-3 recalls are not enough
        assert (await service.get_cell(alice, node_id=node_id))["layer"] == "L0"
    assert await recall_ranking() == ranking
    for node_id in top3:
        assert (await service.get_cell(alice, node_id=node_id))["layer"] == "L1"
    for node_id in rest:
        assert (await service.get_cell(alice, node_id=node_id))["layer"] == "L0"
    assert sorted(await layer_ids(service, alice, query, "L1")) == sorted(top3)



async def test_a_burst_of_recalls_is_counted_in_one_write_and_a_close_writes_the_rest(home, clock, monkeypatch):
    """Reinforcement counts gather between drains (one commit per interval, not per recall);
    none is lost: the scheduled drain, or the close, writes them all."""
    from node import service as service_module
    from node.embedding import HashedEmbedder
    from app.home import open_node

    monkeypatch.setattr(service_module, "RECALL_HITS_INTERVAL", 3600.0)  # no timer fires in this test
    texts = [f"release checklist step {i} for the payments service" for i in range(6)]
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        alice, _ = await service.add_agent("alice")
        with trio.fail_after(10):
            for text in texts:
                await service.store(alice, content=text, cell_type="Fact")
        drains = []
        write = service._write_recall_hits
        service._write_recall_hits = lambda tx: (drains.append(1), write(tx))
        with trio.fail_after(20):
            for _ in range(40):
                await service.recall(alice, query=texts[0], k=3)
                await service.db.write(lambda tx: None)  # whatever a recall queued has run now
        assert len(drains) == 1  # the first recall's; the other 39 wait for the interval
        (written,) = service.db.query_one("SELECT SUM(recall_hits) FROM cells")
        assert written == 3
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        (written,) = service.db.query_one("SELECT SUM(recall_hits) FROM cells")
        assert written == 40 * 3  # the close wrote the 39 gathered recalls


async def test_concurrent_stores_each_keep_their_own_vector(service, make_agent):
    """Embedding is batched across concurrent callers; no cell may end up with another's vector."""
    alice, _ = await make_agent()
    texts = [f"batched embedding probe {i} {'xyz' * (i % 5)} word{i * 31}" for i in range(60)]
    stored: dict[str, str] = {}

    async def store_one(text: str) -> None:
        stored[text] = (await service.store(alice, content=text, cell_type="Fact"))["node_id"]

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for text in texts:
                nursery.start_soon(store_one, text)
    expected = service.embedder.embed(texts)
    for text, vector in zip(texts, expected):
        (blob,) = service.db.query_one("SELECT embedding FROM cells WHERE node_id = ?", (stored[text],))
        assert np.array_equal(np.frombuffer(blob, dtype=np.float32), vector), text
        assert (await layer_ids(service, alice, text, "L0", k=1)) == [stored[text]]
