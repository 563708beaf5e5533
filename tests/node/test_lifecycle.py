"""Knowledge that stays true (node.lifecycle): supersede, possible conflicts, stale sources.

The facade and the write path with the hashed embedder (identical texts have cosine 1, others
near 0), and remote cells handed in as the mesh hands them (``StoreRemoteCell``), in either order.
"""

from __future__ import annotations

import itertools
import uuid

import trio

from app.home import init_home, open_node
from app.mesh_link import MeshLink
from mesh import events as ev
from mesh.identity import NodeIdentity
from mesh.wire import CellPayload
from node.config import DEFAULT_CONFLICT_COS, write_initial_config
from node.embedding import HashedEmbedder
from tests.node.helpers import rejected, second_tenant_key, store

TOPIC = "the postgres connection pool size"
_seqs = itertools.count(1)


async def inbox(service, principal, **options) -> list[dict]:
    with trio.fail_after(10):
        return (await service.inbox(principal, limit=100, **options))["diffs"]


async def recalled(service, principal, query: str, **options) -> list[str]:
    with trio.fail_after(10):
        return [r["node_id"] for r in (await service.recall(principal, query=query, k=10, **options))["results"]]


async def cell(service, principal, node_id: str) -> dict:
    with trio.fail_after(10):
        return await service.get_cell(principal, node_id=node_id)


def remote(service, origin: NodeIdentity, text: str, *, supersedes=None, tenant=None, agent="their-agent",
           node_id=None, project=None) -> ev.StoreRemoteCell:  # fmt: skip
    seq = next(_seqs)
    payload = CellPayload(
        node_id or str(uuid.uuid4()), tenant or service.config.tenant_id, agent, text, "Decision", 0.9,
        1_780_000_000_000 + seq, project=project, metadata={"supersedes": supersedes} if supersedes else {},
        embedding=service.embedder.embed([text])[0], embedding_space=service.embedder.space,
    )  # fmt: skip
    return ev.StoreRemoteCell(payload, origin.node_id, 1, b"\x01" * 64, seq)


async def apply(link: MeshLink, *events: ev.StoreRemoteCell) -> None:
    with trio.fail_after(10):
        await link.apply_many(list(events))


# -- supersede over the facade -----------------------------------------------------------------


async def test_a_superseded_cell_stays_as_history_and_leaves_recall_listings_and_inboxes(service, make_agent):
    author, _ = await make_agent()
    reader, _ = await make_agent()
    with trio.fail_after(10):
        await service.place_beacon(reader, query=TOPIC, threshold=0.5)
    d1 = await store(service, author, TOPIC, "Decision")
    assert [d["node_id"] for d in await inbox(service, reader)] == [d1]

    d2 = await store(service, author, TOPIC + " is 40", "Decision", metadata={"supersedes": [d1]})

    old = await cell(service, author, d1)
    assert (old["status"], old["superseded_by"], old["content"]) == ("superseded", d2, TOPIC)
    new = await cell(service, author, d2)
    assert (new["status"], new["supersedes"], new["superseded_by"]) == ("active", [d1], None)
    assert d1 not in await recalled(service, author, TOPIC)
    assert d1 in await recalled(service, author, TOPIC, include_superseded=True)
    with trio.fail_after(10):
        listed = [c["node_id"] for c in (await service.list_cells(author))["cells"]]
        every = [c["node_id"] for c in (await service.list_cells(author, include_superseded="true"))["cells"]]
        searched = [c["node_id"] for c in (await service.search(author, query=TOPIC))["results"]]
    assert d1 not in listed and d1 in every and d1 not in searched

    # The reader received D1: its successor arrives as news, and D1 leaves the inbox.
    news = await inbox(service, reader)
    assert [(d["node_id"], d["kind"], d["related"]) for d in news] == [(d2, "supersedes", d1)]
    assert news[0]["supersedes"] == [d1]
    assert {d["node_id"] for d in await inbox(service, reader, include_superseded=True)} == {d1, d2}


async def test_who_may_supersede_what(service, make_agent):
    alice, _ = await make_agent(projects=["shop"])
    bob, _ = await make_agent(projects=["shop"])
    carol, _ = await make_agent(projects=["shop", "infra"])
    dave, _ = await make_agent(projects=["infra"])
    shop = await store(service, alice, "use pgvector", "Decision", project="shop")
    infra = await store(service, dave, "use terraform", "Decision", project="infra")
    tenant_wide = await store(service, alice, "tabs not spaces", "Preference")

    # Another agent of the same project may; the author may, anywhere.
    await store(service, bob, "use pgvector 0.8", "Decision", project="shop", metadata={"supersedes": [shop]})
    await store(service, alice, "tabs, width 4", "Preference", metadata={"supersedes": [tenant_wide]})
    # A cell of another project may not replace it, even by a key that reads both projects.
    error = await rejected(
        service.store(carol, content="use pulumi", cell_type="Decision", project="shop",
                      metadata={"supersedes": [infra]}),
        "forbidden", "metadata.supersedes",
    )  # fmt: skip
    assert "only its author, or a cell of the same project" in error.message
    # Outside the key's scope: refused, and the cell is not named as readable.
    error = await rejected(
        service.store(bob, content="x", cell_type="Decision", project="shop", metadata={"supersedes": [infra]}),
        "forbidden", "metadata.supersedes",
    )
    assert "outside this key's scope" in error.message
    await rejected(
        service.store(bob, content="x", cell_type="Fact", metadata={"supersedes": [str(uuid.uuid4())]}),
        "not_found", "metadata.supersedes",
    )
    for bad in ("not-a-list", [], ["nope"], [str(uuid.uuid4())] * 17, [5]):
        await rejected(
            service.store(bob, content="x", cell_type="Fact", metadata={"supersedes": bad}),
            "invalid_argument", "metadata.supersedes",
        )
    assert (await cell(service, carol, infra))["status"] == "active"


async def test_another_tenants_cell_cannot_be_superseded(service, make_agent):
    alice, _ = await make_agent()
    target = await store(service, alice, "use pgvector", "Decision")
    with trio.fail_after(10):
        outsider = await service.authenticate(second_tenant_key(service))
    error = await rejected(
        service.store(outsider, content="use sqlite", cell_type="Decision", metadata={"supersedes": [target]}),
        "not_found", "metadata.supersedes",
    )
    assert target in error.message
    assert (await cell(service, alice, target))["status"] == "active"


async def test_a_superseded_cell_stays_out_of_recall_after_a_restart(home, clock):
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        with trio.fail_after(10):
            _, key = await service.add_agent("author")
            author = await service.authenticate(key)
        d1 = await store(service, author, TOPIC, "Decision")
        d2 = await store(service, author, TOPIC + " is 40", "Decision", metadata={"supersedes": [d1]})
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as service:
        with trio.fail_after(10):
            author = await service.authenticate(key)
        hits = await recalled(service, author, TOPIC)
        assert d1 not in hits and d2 in hits
        assert (await cell(service, author, d1))["superseded_by"] == d2


# -- supersede from the mesh, in any order ---------------------------------------------------------


async def test_a_supersede_that_arrives_before_its_original_is_applied_when_the_original_comes(service, make_agent):
    reader, _ = await make_agent()
    with trio.fail_after(10):
        await service.place_beacon(reader, query=TOPIC, threshold=0.5)
    link, origin = MeshLink(service, lambda event: None), NodeIdentity.generate()
    d1 = remote(service, origin, TOPIC)
    d2 = remote(service, origin, TOPIC + " is 40", supersedes=[d1.cell.node_id])

    await apply(link, d2)  # the successor first: the link waits for D1
    await apply(link, d1)

    old = await cell(service, reader, d1.cell.node_id)
    assert (old["status"], old["superseded_by"]) == ("superseded", d2.cell.node_id)
    assert [d["node_id"] for d in await inbox(service, reader)] == [d2.cell.node_id]
    assert d1.cell.node_id not in await recalled(service, reader, TOPIC)


async def test_every_order_of_a_supersede_chain_ends_in_the_same_state(home, clock, tmp_path):
    origin = NodeIdentity.generate()
    states = set()
    async with open_node(home, embedder=HashedEmbedder(), clock=clock) as first:
        d1 = remote(first, origin, TOPIC)
        d2 = remote(first, origin, TOPIC + " a", supersedes=[d1.cell.node_id])
        d3 = remote(first, origin, TOPIC + " b", supersedes=[d1.cell.node_id, d2.cell.node_id])
    for n, order in enumerate(itertools.permutations([d1, d2, d3])):
        node_home = tmp_path / f"order{n}"
        write_initial_config(node_home, tenant_id=first.config.tenant_id)
        init_home(node_home)
        async with open_node(node_home, embedder=HashedEmbedder(), clock=clock) as service:
            link = MeshLink(service, lambda event: None)
            for event in order:
                await apply(link, event)
            await apply(link, *order)  # duplicates change nothing
            with trio.fail_after(10):
                _, key = await service.add_agent("reader")
                reader = await service.authenticate(key)
            cells = [await cell(service, reader, e.cell.node_id) for e in (d1, d2, d3)]
            states.add(tuple((c["status"], c["superseded_by"]) for c in cells))
    # One state, whatever the order: D1's successor is the greatest id of the cells naming it.
    successor = max(d2.cell.node_id, d3.cell.node_id)
    assert states == {(("superseded", successor), ("superseded", d3.cell.node_id), ("active", None))}


async def test_a_remote_supersede_across_tenants_or_projects_is_not_applied(service, make_agent):
    reader, _ = await make_agent()
    link, origin = MeshLink(service, lambda event: None), NodeIdentity.generate()
    original = remote(service, origin, TOPIC, project="shop")
    await apply(link, original)
    other_tenant = remote(service, origin, "x", supersedes=[original.cell.node_id], tenant=str(uuid.uuid4()))
    other_project = remote(service, origin, "y", supersedes=[original.cell.node_id], agent="someone", project="infra")
    await apply(link, other_tenant, other_project)
    assert (await cell(service, reader, original.cell.node_id))["status"] == "active"
    assert service.writes.lifecycle.refused == 1  # the other tenant's cell is not stored at all


# -- possible conflicts --------------------------------------------------------------------------------


async def test_two_agents_close_rulings_in_one_project_tell_both_authors(service, make_agent):
    alice, _ = await make_agent(projects=["shop"])
    bob, _ = await make_agent(projects=["shop"])
    a = await store(service, alice, "the orders table is sharded by customer id", "Decision", project="shop")
    await store(service, bob, "unrelated words entirely about lunch", "Decision", project="shop")
    assert await inbox(service, alice) == []
    b = await store(service, bob, "the orders table is sharded by customer id", "Constraint", project="shop")

    told_alice = [(d["node_id"], d["kind"], d["related"]) for d in await inbox(service, alice)]
    told_bob = [(d["node_id"], d["kind"], d["related"]) for d in await inbox(service, bob)]
    assert told_alice == [(b, "possible_conflict", a)]
    assert told_bob == [(a, "possible_conflict", b)]
    # The successor of Bob's cell still contradicts Alice's: she hears of it, once, as a conflict.
    b2 = await store(service, bob, "the orders table is sharded by customer id", "Decision", project="shop",
                     metadata={"supersedes": [b]})  # fmt: skip
    assert [(d["node_id"], d["kind"], d["related"]) for d in await inbox(service, alice)] == [(b2, "possible_conflict", a)]
    # Another project, a Fact, and Alice's own cells are no conflict.
    dave, _ = await make_agent(projects=["infra"])
    await store(service, dave, "the orders table is sharded by customer id", "Decision", project="infra")
    await store(service, bob, "the orders table is sharded by customer id", "Fact", project="shop")
    await store(service, alice, "the orders table is sharded by customer id", "Decision", project="shop")
    assert len(await inbox(service, alice)) == 1


SMALL_PAYOUTS = "Payouts below EUR {} are rolled into the next day's payout instead of being sent, to avoid bank fees."


async def test_at_the_default_threshold_a_changed_value_is_told_and_a_neighbour_or_restatement_is_not(
    semantic_service,
):
    """The default chosen on benchmarks/data/conflicts.json, with the built-in model: the same
    ruling with one value changed warns both authors; a ruling of the same area that can stand
    beside it, and the ruling restated in other words, warn nobody."""
    node = semantic_service
    assert node.config.conflict_cos == DEFAULT_CONFLICT_COS
    sam, _ = await node.add_agent("sam", ["payouts"])
    ines, _ = await node.add_agent("ines", ["payouts"])
    lin, _ = await node.add_agent("lin", ["payouts"])
    one_euro = await store(node, sam, SMALL_PAYOUTS.format("1.00"), "Decision", project="payouts")
    await store(
        node, ines, "A merchant's payout is held while their negative-balance reserve is below the required "
        "minimum; payout-scheduler retries the next business day.", "Decision", project="payouts",
    )  # fmt: skip
    await store(
        node, lin, "We don't send payouts smaller than one euro; they roll into tomorrow's batch so fees never "
        "exceed the amount.", "Constraint", project="payouts",
    )  # fmt: skip
    assert await inbox(node, sam) == [] and await inbox(node, ines) == [] and await inbox(node, lin) == []

    five_euros = await store(node, ines, SMALL_PAYOUTS.format("5.00"), "Decision", project="payouts")
    assert [(d["node_id"], d["kind"], d["related"]) for d in await inbox(node, sam)] == [
        (five_euros, "possible_conflict", one_euro)
    ]
    assert [(d["node_id"], d["kind"], d["related"]) for d in await inbox(node, ines)] == [
        (one_euro, "possible_conflict", five_euros)
    ]
    assert await inbox(node, lin) == []


# -- stale sources ---------------------------------------------------------------------------------------


async def test_validate_marks_cells_whose_file_changed_or_vanished_stale(service, make_agent, tmp_path):
    author, _ = await make_agent()
    source = tmp_path / "pool.py"
    source.write_text("POOL_SIZE = 20\n")
    kept = await store(service, author, "the pool size is 20", "Fact",
                       source_ref={"kind": "file", "locator": f"{source}:1"})  # fmt: skip
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    gone = await store(service, author, "other holds x", "Fact", source_ref={"kind": "file", "locator": str(other)})
    unhashed = await store(service, author, "no such file", "Fact",
                           source_ref={"kind": "file", "locator": str(tmp_path / "missing.py")})  # fmt: skip
    await store(service, author, "a url", "Fact", source_ref={"kind": "url", "locator": "https://example.com"})

    with trio.fail_after(10):
        first = await service.validate_sources()
    assert (first["checked"], first["stale"], first["not_hashed"]) == (2, [], 1)

    source.write_text("POOL_SIZE = 40\n")
    other.unlink()
    with trio.fail_after(10):
        second = await service.validate_sources()
    assert {(s["node_id"], s["reason"]) for s in second["stale"]} == {(kept, "file changed"), (gone, "file vanished")}
    stale = await cell(service, author, kept)
    assert (stale["status"], stale["stale_reason"]) == ("stale", "file changed")
    assert kept in await recalled(service, author, "the pool size is 20")  # stale is shown, not hidden
    assert (await cell(service, author, unhashed))["status"] == "active"

    source.write_text("POOL_SIZE = 20\n")
    with trio.fail_after(10):
        third = await service.validate_sources()
    assert third["fresh_again"] == [kept]
    assert (await cell(service, author, kept))["status"] == "active"


# -- export and import --------------------------------------------------------------------------------


async def test_an_export_round_trips_supersede_links_and_stale_marks(service, make_agent, tmp_path, clock):
    from node.transfer import export_file, import_file  # noqa: PLC0415

    author, _ = await make_agent()
    source = tmp_path / "pool.py"
    source.write_text("POOL_SIZE = 20\n")
    d1 = await store(service, author, TOPIC, "Decision", source_ref={"kind": "file", "locator": str(source)})
    d2 = await store(service, author, TOPIC + " is 40", "Decision", metadata={"supersedes": [d1]})
    source.write_text("POOL_SIZE = 40\n")
    with trio.fail_after(10):
        await service.validate_sources()
        await export_file(service, tmp_path / "out.jsonl")

    other = tmp_path / "other-home"
    write_initial_config(other, tenant_id=service.config.tenant_id)
    init_home(other)
    async with open_node(other, embedder=HashedEmbedder(), clock=clock) as copy:
        with trio.fail_after(10):
            await import_file(copy, tmp_path / "out.jsonl")
            _, key = await copy.add_agent("reader")
            reader = await copy.authenticate(key)
        old = await cell(copy, reader, d1)
        assert (old["status"], old["superseded_by"], old["stale_reason"]) == ("superseded", d2, "file changed")
        assert d1 not in await recalled(copy, reader, TOPIC)
        source.write_text("POOL_SIZE = 20\n")  # the hash came along: the file as it was is fresh again
        with trio.fail_after(10):
            assert (await copy.validate_sources())["checked"] == 0  # stored by another node: not this one's files


async def test_a_forgotten_successor_takes_its_link_with_it(service, make_agent):
    """The mesh's rule (mesh.lifecycle.statuses): a node that got the tombstone before the
    successor never learns the link, so one that did lets it go, and both end alike."""
    author, _ = await make_agent()
    d1 = await store(service, author, TOPIC, "Decision")
    d2 = await store(service, author, TOPIC + " is 40", "Decision", metadata={"supersedes": [d1]})
    d3 = await store(service, author, TOPIC + " is 60", "Decision", metadata={"supersedes": [d1]})
    assert (await cell(service, author, d1))["superseded_by"] == max(d2, d3)
    with trio.fail_after(10):
        await service.forget(author, node_id=max(d2, d3))
    assert (await cell(service, author, d1))["superseded_by"] == min(d2, d3)
    with trio.fail_after(10):
        await service.forget(author, node_id=min(d2, d3))
    current = await cell(service, author, d1)
    assert (current["status"], current["superseded_by"]) == ("active", None)
    assert d1 in await recalled(service, author, TOPIC)
