"""Beacons and the local inbox: standing interests catch what *others* store (DESIGN §3, §4).

Most tests use the hashed embedder, whose cosines are computed here with
``service.embedder.embed`` so thresholds can be set precisely around them; the calibration test at
the end uses the real MiniLM model and the configured default threshold.
"""

from __future__ import annotations

import itertools
import math
import uuid
from datetime import datetime, timedelta, timezone

import pytest
import trio

from node.errors import HyphaeError
from app.home import open_node
from node.embedding import HashedEmbedder
from tests.node.helpers import rejected, store


async def beacon(service, principal, query: str, **options) -> str:
    with trio.fail_after(10):
        return (await service.place_beacon(principal, query=query, **options))["beacon_id"]


async def caught(service, principal, **options) -> list[str]:
    with trio.fail_after(10):
        return [d["node_id"] for d in (await service.inbox(principal, **options))["diffs"]]


def cos(service, a: str, b: str) -> float:
    va, vb = service.embedder.embed([a, b])
    return float(va @ vb)


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


TOPIC = "the postgres connection pool size"


# -- place / list / remove ----------------------------------------------------------------------------


async def test_place_beacon_validates_every_field_and_stores_nothing_on_error(service, make_agent):
    alice, _ = await make_agent(projects=["web"])
    cases = [
        ({"query": ""}, "invalid_argument", "query"),
        ({"query": "   "}, "invalid_argument", "query"),
        ({"query": None}, "invalid_argument", "query"),
        ({"query": 5}, "invalid_argument", "query"),
        ({"query": "q" * (8 * 1024 + 1)}, "too_large", "query"),
        ({"threshold": -0.01}, "invalid_argument", "threshold"),
        ({"threshold": 1.01}, "invalid_argument", "threshold"),
        ({"threshold": True}, "invalid_argument", "threshold"),
        ({"threshold": "0.5"}, "invalid_argument", "threshold"),
        ({"threshold": math.nan}, "invalid_argument", "threshold"),
        ({"cell_types": []}, "invalid_argument", "cell_types"),
        ({"cell_types": "Risk"}, "invalid_argument", "cell_types"),
        ({"cell_types": ["risk"]}, "invalid_argument", "cell_types"),
        ({"project": ""}, "invalid_argument", "project"),
        ({"project": "api"}, "forbidden", "project"),  # outside the key's projects
        ({"min_salience": -0.5}, "invalid_argument", "min_salience"),
        ({"min_salience": 2}, "invalid_argument", "min_salience"),
        ({"min_salience": False}, "invalid_argument", "min_salience"),
        ({"ttl_seconds": 0}, "invalid_argument", "ttl_seconds"),
        ({"ttl_seconds": -60}, "invalid_argument", "ttl_seconds"),
        ({"ttl_seconds": 1.5}, "invalid_argument", "ttl_seconds"),
        ({"ttl_seconds": "60"}, "invalid_argument", "ttl_seconds"),
        ({"ttl_seconds": True}, "invalid_argument", "ttl_seconds"),
        ({"ttl_seconds": 10 * 365 * 86_400 + 1}, "invalid_argument", "ttl_seconds"),
    ]
    mismatches = []
    for change, reason, field in cases:
        try:
            with trio.fail_after(10):
                await service.place_beacon(alice, **{"query": TOPIC, **change})
        except HyphaeError as exc:
            if (exc.reason, exc.field) != (reason, field):
                mismatches.append(f"{change}: got {exc.reason}/{exc.field}, want {reason}/{field}")
        else:
            mismatches.append(f"{change}: accepted, want {reason}")
    assert mismatches == []
    assert service.db.query_one("SELECT COUNT(*) FROM beacons")[0] == 0
    assert (await service.list_beacons(alice))["beacons"] == []


async def test_list_beacons_shows_your_own_live_beacons(service, make_agent, clock):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    first = await beacon(service, alice, TOPIC)
    clock.advance(10)
    second = await beacon(service, alice, "flaky tests", threshold=0.5, cell_types=["Risk", "Lesson", "Risk"],
                          project="ci", min_salience=0.3, ttl_seconds=3600)
    await beacon(service, bob, "bob's interest")

    listed = (await service.list_beacons(alice))["beacons"]
    assert [b["beacon_id"] for b in listed] == [first, second]  # oldest first; bob's is not there
    default, custom = listed
    assert default["query"] == TOPIC
    assert default["threshold"] == service.config.default_beacon_threshold
    assert (default["cell_types"], default["project"], default["min_salience"], default["ttl_seconds"]) == (
        None, None, None, None)
    assert default["expires_at"] is None
    assert custom["threshold"] == 0.5
    assert custom["cell_types"] == ["Risk", "Lesson"]  # duplicates dropped, order kept
    assert (custom["project"], custom["min_salience"], custom["ttl_seconds"]) == ("ci", 0.3, 3600)
    assert custom["expires_at"] == custom["created_at"] + 3_600_000

    clock.advance(3_600_000)  # the ttl has passed: an expired beacon is not listed
    assert [b["beacon_id"] for b in (await service.list_beacons(alice))["beacons"]] == [first]


async def test_remove_beacon(service, make_agent, clock):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    mine = await beacon(service, alice, TOPIC, threshold=0.5)
    await rejected(service.remove_beacon(bob, beacon_id=mine), "not_found", "beacon_id")  # not bob's
    await rejected(service.remove_beacon(alice, beacon_id=str(uuid.uuid4())), "not_found", "beacon_id")
    await rejected(service.remove_beacon(alice, beacon_id="b-1"), "invalid_argument", "beacon_id")
    assert len((await service.list_beacons(alice))["beacons"]) == 1  # bob's attempt removed nothing

    with trio.fail_after(10), clock.frozen() as now:
        removed = await service.remove_beacon(alice, beacon_id=mine)
    assert removed == {"beacon_id": mine, "removed_at": now}
    assert (await service.list_beacons(alice))["beacons"] == []
    clock.advance(1000)
    with trio.fail_after(10):
        assert await service.remove_beacon(alice, beacon_id=mine) == removed  # twice: the same answer
    await store(service, bob, TOPIC)
    assert await caught(service, alice) == []  # a removed beacon catches nothing


# -- local delivery ------------------------------------------------------------------------------------


async def test_a_beacon_catches_what_others_store_never_your_own(service, make_agent, clock):
    alice, _ = await make_agent("alice")
    bob, _ = await make_agent("bob")
    carol, _ = await make_agent("carol")
    alices_beacon = await beacon(service, alice, TOPIC, threshold=0.5)
    bobs_beacon = await beacon(service, bob, TOPIC, threshold=0.5)
    await beacon(service, carol, "the office plants need water on fridays", threshold=0.5)
    assert cos(service, TOPIC, "the office plants need water on fridays") < 0.5

    with clock.frozen() as stored_at:
        node_id = await store(
            service, alice, "the postgres connection pool size is twenty", "Decision", salience=0.8,
            source_ref={"kind": "file", "locator": "db.py:12"}, metadata={"pr": 9},
        )
    assert await caught(service, alice) == []  # alice's own beacon does not deliver alice's own cell
    assert await caught(service, carol) == []  # unrelated interest: nothing
    with trio.fail_after(10):
        (diff,) = (await service.inbox(bob))["diffs"]
    assert diff["node_id"] == node_id
    assert diff["content"] == "the postgres connection pool size is twenty"
    assert (diff["cell_type"], diff["salience"]) == ("Decision", 0.8)
    assert diff["source_agent"] == alice.agent_id and diff["origin_node"] == service.node_id
    assert diff["source_ref"] == {"kind": "file", "locator": "db.py:12"} and diff["metadata"] == {"pr": 9}
    assert diff["beacon_id"] == bobs_beacon != alices_beacon
    assert diff["similarity"] == pytest.approx(cos(service, TOPIC, diff["content"]), abs=1e-5)
    assert diff["hops"] == 0 and diff["forgotten"] is False
    assert diff["received_at"] == diff["created_at"] == stored_at  # delivered in the store's own commit

    # And the other way round: bob's store reaches alice, not bob.
    back = await store(service, bob, "the postgres connection pool size is forty")
    assert await caught(service, alice) == [back]
    assert await caught(service, bob) == [node_id]


async def test_one_inbox_item_per_principal_naming_the_best_beacon(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "the postgres connection pool size is twenty"
    loose = await beacon(service, bob, "postgres", threshold=0.1)
    tight = await beacon(service, bob, "postgres connection pool size twenty", threshold=0.1)
    assert cos(service, "postgres connection pool size twenty", text) > cos(service, "postgres", text) > 0.1
    await store(service, alice, text)
    with trio.fail_after(10):
        diffs = (await service.inbox(bob))["diffs"]
    assert len(diffs) == 1 and diffs[0]["beacon_id"] == tight != loose


async def test_a_forgotten_cell_is_erased_from_inboxes_too(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    await beacon(service, bob, TOPIC, threshold=0.5)
    node_id = await store(service, alice, "the postgres connection pool size password is s3cret")
    with trio.fail_after(10):
        await service.forget(alice, node_id=node_id)
        (diff,) = (await service.inbox(bob))["diffs"]
        (pulled,) = (await service.pull_inbox(bob))["diffs"]
    for item in (diff, pulled):
        assert item["node_id"] == node_id
        assert item["forgotten"] is True
        assert "s3cret" not in item["content"]


# -- filters --------------------------------------------------------------------------------------------


async def test_cell_types_filter(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "the postgres connection pool size is twenty"
    await beacon(service, bob, TOPIC, threshold=0.3, cell_types=["Risk", "Constraint"])
    fact = await store(service, alice, text, "Fact")
    risk = await store(service, alice, text, "Risk")
    assert await caught(service, bob) == [risk]
    assert fact not in await caught(service, bob)


async def test_project_filter_delivers_only_that_project(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "the postgres connection pool size is twenty"
    await beacon(service, bob, TOPIC, threshold=0.3, project="web")
    await store(service, alice, text, project="api")
    await store(service, alice, text)  # tenant-wide: not "web"
    web = await store(service, alice, text, project="web")
    assert await caught(service, bob) == [web]


async def test_min_salience_filter(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "the postgres connection pool size is twenty"
    await beacon(service, bob, TOPIC, threshold=0.3, min_salience=0.7)
    await store(service, alice, text, salience=0.69)
    exact = await store(service, alice, text, salience=0.7)  # the bound itself passes
    assert await caught(service, bob) == [exact]


async def test_ttl_expiry(service, make_agent, clock):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "the postgres connection pool size is twenty"
    await beacon(service, bob, TOPIC, threshold=0.3, ttl_seconds=60)
    clock.advance(30_000)
    early = await store(service, alice, text)
    clock.advance(31_000)  # 61 s after placing it
    await store(service, alice, text)
    assert await caught(service, bob) == [early]


async def test_energy_slack_widens_the_match_for_energetic_cells(service, make_agent):
    """τ − slack × E0: a Decision at salience 1.0 (E0 1.0) gets 0.05 of slack, at 0.2 only 0.01."""
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    text = "the postgres connection pool size is twenty"
    similarity = cos(service, TOPIC, text)
    assert 0.2 < similarity < 0.9
    slack = service.energy.match_slack
    assert slack == 0.05
    await beacon(service, bob, TOPIC, threshold=similarity + 0.03)  # 0.03 above the cell's cosine

    quiet = await store(service, alice, text, "Decision", salience=0.2)  # needs cos ≥ τ − 0.01: no
    loud = await store(service, alice, text, "Decision", salience=1.0)  # needs cos ≥ τ − 0.05: yes
    assert await caught(service, bob) == [loud]
    assert quiet not in await caught(service, bob)

    # Below τ − slack × E0 even the most energetic cell stays out.
    carol, _ = await make_agent()
    await beacon(service, carol, TOPIC, threshold=similarity + 0.06)
    await store(service, alice, text, "Decision", salience=1.0)
    assert await caught(service, carol) == []


async def test_a_project_restricted_owner_never_receives_other_projects(service, make_agent):
    alice, _ = await make_agent()
    bob, _ = await make_agent(projects=["alpha"])
    text = "the postgres connection pool size is twenty"
    await beacon(service, bob, TOPIC, threshold=0.3)  # no project filter on the beacon itself
    in_alpha = await store(service, alice, text, project="alpha")
    await store(service, alice, text, project="beta")
    wide = await store(service, alice, text)
    assert await caught(service, bob) == [in_alpha, wide]


async def test_a_revoked_agents_beacons_stop_delivering(service, make_agent):
    alice, _ = await make_agent("alice")
    bob, _ = await make_agent("bob")
    carol, _ = await make_agent("carol")
    await beacon(service, bob, TOPIC, threshold=0.3)
    await beacon(service, carol, TOPIC, threshold=0.3)
    before = await store(service, alice, "the postgres connection pool size is twenty")
    with trio.fail_after(10):
        await service.revoke_agent("bob")
    after = await store(service, alice, "the postgres connection pool size is forty")
    assert await caught(service, carol) == [before, after]  # carol is unaffected
    rows = service.db.query("SELECT c.node_id FROM inbox i JOIN cells c ON c.rowid = i.cell_rowid WHERE i.agent_id = ?",
                            (bob.agent_id,))
    assert [r[0] for r in rows] == [before]


async def test_beacons_survive_a_restart_but_removed_and_revoked_ones_do_not(home, clock):
    """Beacons live in SQLite; the in-memory book is rebuilt from it on open."""
    text = "the postgres connection pool size is twenty"
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            alice, _ = await service.add_agent("alice")
            bob, bob_key = await service.add_agent("bob")
            carol, _ = await service.add_agent("carol")
            dave, _ = await service.add_agent("dave")
            kept = await beacon(service, bob, TOPIC, threshold=0.3)
            gone = await beacon(service, carol, TOPIC, threshold=0.3)
            await service.remove_beacon(carol, beacon_id=gone)
            await beacon(service, dave, TOPIC, threshold=0.3)
            await service.revoke_agent("dave")
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            bob = await service.authenticate(bob_key)
            node_id = await store(service, alice, text)
            with trio.fail_after(10):
                (diff,) = (await service.inbox(bob))["diffs"]
            assert (diff["node_id"], diff["beacon_id"]) == (node_id, kept)
            assert await caught(service, carol) == []
            assert await caught(service, dave) == []


# -- inbox(since) and pull_inbox ------------------------------------------------------------------------


async def fill_inbox(service, make_agent, count: int):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    await beacon(service, bob, TOPIC, threshold=0.3)
    stored = [await store(service, alice, f"the postgres connection pool size is {i}") for i in range(count)]
    return alice, bob, stored


async def test_inbox_since_accepts_milliseconds_and_rfc_3339(service, make_agent, clock):
    _, bob, stored = await fill_inbox(service, make_agent, 4)
    with trio.fail_after(10):
        everything = await service.inbox(bob)
    diffs = everything["diffs"]
    assert [d["node_id"] for d in diffs] == stored  # oldest first
    assert everything["next_since"] == diffs[-1]["received_at"]
    with trio.fail_after(10):
        assert (await service.inbox(bob))["diffs"] == diffs  # reading changes nothing

    cut = diffs[1]["received_at"]
    assert await caught(service, bob, since=cut) == stored[2:]  # strictly after
    assert await caught(service, bob, since=rfc3339(cut)) == stored[2:]
    as_offset = datetime.fromtimestamp(cut / 1000, tz=timezone(timedelta(hours=2))).isoformat(timespec="milliseconds")
    assert await caught(service, bob, since=as_offset) == stored[2:]
    assert await caught(service, bob, since=0) == stored

    with trio.fail_after(10):
        tail = await service.inbox(bob, since=diffs[-1]["received_at"])
        assert tail == {"diffs": [], "next_since": diffs[-1]["received_at"]}  # nothing new: since comes back
        page = await service.inbox(bob, limit=2)
    assert [d["node_id"] for d in page["diffs"]] == stored[:2]
    assert await caught(service, bob, since=page["next_since"]) == stored[2:]  # next_since continues the read


async def test_inbox_rejects_bad_since_and_limit(service, make_agent):
    bob, _ = await make_agent()
    for since in ("yesterday", -1, True, 1.5, "2026-01-31", "2026-01-31T09:00:00", "", [], {"ms": 1}):
        await rejected(service.inbox(bob, since=since), "invalid_argument", "since")
    for limit in (0, 501, -3, True, "10"):
        await rejected(service.inbox(bob, limit=limit), "invalid_argument", "limit")
        await rejected(service.pull_inbox(bob, limit=limit), "invalid_argument", "limit")


async def test_received_at_is_strictly_increasing_even_when_the_clock_stands_still(service, make_agent, clock):
    alice, _ = await make_agent()
    bob, _ = await make_agent()
    carol, _ = await make_agent()
    await beacon(service, bob, TOPIC, threshold=0.3)
    await beacon(service, carol, TOPIC, threshold=0.3)
    clock.step = 0
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for i in range(10):
                nursery.start_soon(store, service, alice, f"the postgres connection pool size is {i}")
    with trio.fail_after(10):
        times = [d["received_at"] for p in (bob, carol) for d in (await service.inbox(p))["diffs"]]
    assert len(times) == 20
    assert len(set(times)) == 20  # no two deliveries share a received_at, across agents too
    for principal in (bob, carol):
        with trio.fail_after(10):
            mine = [d["received_at"] for d in (await service.inbox(principal))["diffs"]]
        assert mine == sorted(mine) and len(set(mine)) == 10
        # Paging by since, one at a time, sees every item exactly once.
        seen, since = [], 0
        for _ in range(12):
            with trio.fail_after(10):
                page = await service.inbox(principal, since=since, limit=1)
            if not page["diffs"]:
                break
            seen.append(page["diffs"][0]["node_id"])
            since = page["next_since"]
        assert len(seen) == len(set(seen)) == 10


async def test_pull_inbox_pages_with_a_server_cursor(service, make_agent):
    _, bob, stored = await fill_inbox(service, make_agent, 7)
    pages = []
    with trio.fail_after(10):
        for _ in range(4):
            pages.append(await service.pull_inbox(bob, limit=3))
    assert [len(p["diffs"]) for p in pages] == [3, 3, 1, 0]
    assert [p["remaining"] for p in pages] == [4, 1, 0, 0]
    assert [d["node_id"] for p in pages for d in p["diffs"]] == stored
    cursors = [p["cursor"] for p in pages]
    assert cursors[0] < cursors[1] < cursors[2] == cursors[3]
    # Pulling does not consume the since-based inbox.
    assert await caught(service, bob) == stored


def pin_cosine_judge(home) -> None:
    """Admit on the threshold alone: a test of the inbox's mechanics that stores more cells than the
    calibrated judge needs for a background keeps its thresholds exact (node.judges)."""
    config = home / "config.toml"
    config.write_text(config.read_text().replace("[beacons]\n", '[beacons]\njudge = "cosine"\n', 1))


async def test_concurrent_pulls_never_return_the_same_item_twice(home, clock):
    pin_cosine_judge(home)
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        await concurrent_pulls(service)


async def concurrent_pulls(service) -> None:
    with trio.fail_after(10):
        alice, _ = await service.add_agent("alice")
        bob, _ = await service.add_agent("bob")
    await beacon(service, bob, TOPIC, threshold=0.3)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(store, service, alice, f"the postgres connection pool size is {i}")
    assert len(await caught(service, bob, limit=100)) == 40

    got: list[str] = []

    async def puller() -> None:
        while True:
            page = await service.pull_inbox(bob, limit=3)
            if not page["diffs"]:
                return
            got.extend(d["node_id"] for d in page["diffs"])

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(puller)
    assert len(got) == 40 and len(set(got)) == 40


# -- calibration with the real model --------------------------------------------------------------------

UNRELATED_TEAM_FACTS = [
    "CI runs on GitHub Actions and must be green before merging.",
    "The on-call rotation changes every Monday at 10:00.",
    "The frontend is written in React with TypeScript.",
    "Every pull request needs one approving code review.",
    "Standup is at 09:30 in the blue room.",
    "Vacation requests go through the HR portal two weeks ahead.",
    "Release notes are written by the product manager.",
]


async def test_default_threshold_catches_the_storage_decision_and_not_unrelated_facts(semantic_service):
    service = semantic_service
    with trio.fail_after(10):
        alice, _ = await service.add_agent("alice")
        bob, _ = await service.add_agent("bob")
    beacon_id = await beacon(service, bob, "which database do we use for storage")  # default threshold
    assert (await service.list_beacons(bob))["beacons"][0]["threshold"] == service.config.default_beacon_threshold

    noise = [await store(service, alice, fact, "Fact", salience=0.5) for fact in UNRELATED_TEAM_FACTS]
    decision = await store(service, alice, "Use pgvector for the V1 storage backend.", "Decision", salience=0.5)
    paraphrase = await store(service, alice, "We keep all our data in PostgreSQL with the pgvector extension.", "Fact")
    with trio.fail_after(10):
        diffs = (await service.inbox(bob))["diffs"]
    assert [d["node_id"] for d in diffs] == [decision, paraphrase]
    assert diffs[0]["beacon_id"] == beacon_id
    assert 0.35 < diffs[0]["similarity"] < 0.6
    assert not set(noise) & {d["node_id"] for d in diffs}


async def test_received_at_keeps_increasing_across_a_restart_with_a_clock_set_back(home):
    """A reader paging by next_since must not miss what arrives after the node restarts, even if
    the machine's clock went backwards in between (NTP, a new VM host)."""
    text = "the postgres connection pool size is twenty"
    with trio.fail_after(30):
        async with open_node(home, embedder=HashedEmbedder(), clock=itertools.count(2_000_000_000_000).__next__) as service:
            alice, _ = await service.add_agent("alice")
            bob, _ = await service.add_agent("bob")
            await beacon(service, bob, TOPIC, threshold=0.3)
            await store(service, alice, text)
            since = (await service.inbox(bob))["next_since"]
        async with open_node(home, embedder=HashedEmbedder(), clock=itertools.count(1_000_000_000_000).__next__) as service:
            later = await store(service, alice, text)
            assert await caught(service, bob, since=since) == [later]


async def test_the_admission_judges_background_is_the_cells_held_and_survives_a_restart(home, clock):
    """With enough cells held, a beacon measures each cell against its own everyday (node.judges):
    an ordinary cell on a topic the team writes about all the time stays out, one that stands out
    comes in, and a restart rebuilds the same background from the store."""
    # Everyday writing close to the beacon by cosine (about 0.44 here) but sharing none of its words.
    everyday = [f"postgresql connexion pooling sizing note {i}" for i in range(40)]
    with trio.fail_after(60):
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            alice, _ = await service.add_agent("alice")
            bob, bob_key = await service.add_agent("bob")
            for text in everyday:
                await store(service, alice, text)
            await beacon(service, bob, TOPIC)  # placed after: its inbox starts empty
            assert cos(service, TOPIC, "postgresql connexion pooling sizing note 41") > 0.28 + 0.1
            ordinary = await store(service, alice, "postgresql connexion pooling sizing note 41")
            standout = await store(service, alice, TOPIC + " is twenty")
            before = {d["node_id"]: d for d in (await service.inbox(bob))["diffs"]}
        async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
            bob = await service.authenticate(bob_key)
            again = await store(service, alice, "postgresql connexion pooling sizing note 42")  # the cosine rule admits it
            standout_again = await store(service, alice, TOPIC + " is thirty now")
            after = await caught(service, bob)
    assert ordinary not in before and standout in before
    assert "sd over this beacon's background" in before[standout]["why"]
    assert before[standout]["score"] > 3.0 > before[standout]["similarity"]
    assert again not in after and standout_again in after
