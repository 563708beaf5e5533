"""Hybrid recall: BM25 over an FTS5 index of the cells, fused with the dense ranking.

The lexical index is kept in step with the cells (filled by the v5 migration, written on
the one insert path, emptied of a cell when it is forgotten), its query is built from
untrusted text without ever letting FTS5 syntax through, and what BM25 finds is bound by
exactly the read scope and filters the dense side is.
"""

from __future__ import annotations

import dataclasses
import re
import sqlite3
import uuid

import numpy as np
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from node.cells import Cell
from node.config import load_config
from node.errors import ConfigError
from node.retrieval import fuse
from node.store.lexical import MAX_TERMS, match_expression
from node.store.schema import MIGRATIONS, SCHEMA_VERSION, migrate
from tests.node.helpers import second_tenant_key, store

TICKET = "PAY-1432: the refund webhook retried forever; fixed by capping retries at five."
NEIGHBOURS = [
    "PAY-1423: the refund webhook timed out under load; the timeout is now 30 s.",
    "PAY-1342: refund webhooks are signed; verify the signature before parsing.",
    "PAY-4132: the refund webhook queue is drained by the payments worker.",
    "PAY-1243: refunds over 10k need a second approval in the webhook handler.",
]


async def recall_ids(service, principal, text: str, **arguments) -> list[str]:
    with trio.fail_after(10):
        result = await service.recall(principal, query=text, **arguments)
    return [hit["node_id"] for hit in result["results"]]


def hybrid(service, on: bool) -> None:
    service.config = dataclasses.replace(service.config, hybrid_recall=on)


def fts_rows(service, text: str) -> list[int]:
    """What the lexical index answers for ``text`` alone (no scope: the index itself)."""
    return [r for (r,) in service.db.reader().execute(
        "SELECT rowid FROM cells_fts WHERE cells_fts MATCH ?", (match_expression(text),)
    ).fetchall()]  # fmt: skip


# -- the schema --------------------------------------------------------------------------------------


def test_migrating_v4_to_v5_indexes_the_live_cells_and_not_the_tombstones(tmp_path):
    conn = sqlite3.connect(tmp_path / "v4.db", isolation_level=None)
    for statements in MIGRATIONS[:4]:
        for statement in statements:
            conn.execute(statement)
    conn.execute("PRAGMA user_version = 4")
    row = (
        "INSERT INTO cells (node_id, tenant_id, source_agent, origin_node, content, cell_type, salience, energy0, "
        "created_at, stored_at, layer, embedding, embedding_space, source_ref, forgotten_at) "
        "VALUES (?, 't', 'a', 'n', ?, 'Fact', 0.5, 0.3, 1, 1, 'L0', x'', 's', ?, ?)"
    )
    conn.execute(row, (str(uuid.uuid4()), "the ledger moved to PAY-1432", None, None))
    conn.execute(row, (str(uuid.uuid4()), "see the runbook", '{"kind":"file","locator":"ops/runbook_v2.md"}', None))
    conn.execute(row, (str(uuid.uuid4()), "", None, 5))  # a tombstone
    assert migrate(conn) == 4
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION  # through v5 and on
    match = "SELECT rowid FROM cells_fts WHERE cells_fts MATCH ?"
    assert conn.execute(match, (match_expression("pay-1432"),)).fetchall() == [(1,)]
    assert conn.execute(match, (match_expression("runbook_v2.md"),)).fetchall() == [(2,)]  # the source_ref too
    assert conn.execute("SELECT COUNT(*) FROM cells_fts_docsize").fetchone() == (2,)
    conn.close()


# -- the query expression -------------------------------------------------------------------------

_PHRASE = r'"(?:[^"]|"")*"'


@settings(max_examples=400, deadline=None)
@given(st.text(), st.booleans())
def test_any_text_makes_a_safe_expression_that_fts5_accepts(text, stopwords):
    expression = match_expression(text, stopwords=stopwords)
    if expression is None:
        return
    # Nothing but quoted phrases joined by OR: no operator, column filter, prefix or NEAR outside quotes.
    assert re.fullmatch(f"{_PHRASE}(?: OR {_PHRASE})*", expression), expression
    assert expression.count(" OR ") < MAX_TERMS
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE VIRTUAL TABLE f USING fts5(content, source_ref, tokenize = 'unicode61 remove_diacritics 2')")
    conn.execute("INSERT INTO f VALUES ('content NEAR secret', 'kind:file')")
    conn.execute("SELECT rowid, bm25(f) FROM f WHERE f MATCH ?", (expression,)).fetchall()  # never raises
    conn.close()


def test_hostile_query_strings_are_words_not_syntax():
    assert match_expression('content:secret') == '"content:secret"'
    assert match_expression('NEAR(a b)') == '"near(a" OR "b"'
    assert match_expression('pay* AND NOT "x', stopwords=False) == '"pay*" OR "and" OR "not" OR "x"'
    assert match_expression('pay* AND NOT "x') == '"pay*" OR "x"'  # function words: weighed, not matched
    assert match_expression('say ""hi"" ') == '"say" OR "hi"'
    assert match_expression('a"b') == '"a""b"'
    assert match_expression("nul\x00byte") == '"nulbyte"'
    for empty in ("", "   ", "?!", '"" ""', "* ^ : ( )", "what is it?"):
        assert match_expression(empty) is None


async def test_hostile_queries_recall_without_error(service, make_agent):
    alice, _ = await make_agent()
    kept = await store(service, alice, "content NEAR secret with a column:filter")
    for hostile in ('content:secret', 'NEAR(content secret)', '"', '*', 'secret*', '-secret', 'a OR', '(((', "^x"):
        hits = await recall_ids(service, alice, hostile)
        assert hits == [kept]  # the one cell, found or not by words, and never an error


# -- what BM25 adds --------------------------------------------------------------------------------


async def test_a_ticket_id_the_dense_model_blurs_is_found_by_its_words(semantic_service):
    alice, _ = await semantic_service.add_agent("alice")
    target = await store(semantic_service, alice, TICKET)
    for text in NEIGHBOURS:
        await store(semantic_service, alice, text)
    hybrid(semantic_service, False)
    assert (await recall_ids(semantic_service, alice, "PAY-1432", k=5))[0] != target  # MiniLM blurs the digits
    hybrid(semantic_service, True)
    assert (await recall_ids(semantic_service, alice, "PAY-1432", k=5))[0] == target
    with trio.fail_after(10):
        result = await semantic_service.recall(alice, query="PAY-1432", k=5)
    for hit in result["results"]:  # seed 000's shape, and the distance is still the dense one
        assert set(hit) == {"node_id", "distance"}
    vector = semantic_service.embedder.embed(["PAY-1432"])[0]
    stored = semantic_service.storage.cells.vectors([semantic_service.storage.cells.by_node_id(target).rowid])
    (target_vector,) = stored.values()
    assert result["results"][0]["distance"] == pytest.approx(1.0 - float(target_vector @ vector), abs=1e-5)


async def test_a_lexical_only_hit_gets_its_dense_distance_from_its_vector(service, make_agent):
    alice, _ = await make_agent()
    for i in range(60):  # more than the candidate depth: the word's cell may be outside the dense list
        await store(service, alice, f"routine note number {i} about the weekly sync")
    target = await store(service, alice, "zq_flag_77 turns the experimental planner on")
    with trio.fail_after(10):
        result = await service.recall(alice, query="zq_flag_77", k=3)
    hits = {hit["node_id"]: hit["distance"] for hit in result["results"]}
    assert target in hits and 0.0 <= hits[target] <= 2.0


def test_fusion_without_lexical_hits_is_the_dense_list():
    dense = [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert fuse(dense, [], 2, lambda rowids: {}, lexical_weight=0.4) == [(1, 0.1), (2, 0.2)]


def test_fusion_keeps_dense_distances_and_drops_what_has_no_vector():
    dense = [(1, 0.30), (2, 0.32)]
    lexical = [(9, 1.0), (2, 0.25), (8, 1.0)]  # 8: forgotten meanwhile, no vector
    fused = fuse(dense, lexical, 3, lambda rowids: {9: 0.40} if 9 in rowids else {}, lexical_weight=0.4)
    assert dict(fused) == {1: 0.30, 2: 0.32, 9: 0.40}
    assert [rowid for rowid, _ in fused] == [9, 2, 1]  # 0.60 + 0.4, 0.68 + 0.1, 0.70


# -- scope and filters ---------------------------------------------------------------------------


async def test_bm25_never_reaches_outside_the_keys_projects_or_tenant(service, make_agent):
    writer, _ = await make_agent()
    alpha, _ = await make_agent(projects=["alpha"])
    inside = await store(service, writer, "QX-9001 rollout plan for alpha", project="alpha")
    beta = await store(service, writer, "QX-9001 rollout plan for beta", project="beta")
    outsider = await service.authenticate(second_tenant_key(service))
    other_tenant = await store(service, outsider, "QX-9001 rollout plan elsewhere")
    assert set(fts_rows(service, "QX-9001")) >= {service.storage.cells.by_node_id(n).rowid for n in (inside, beta)}
    assert await recall_ids(service, alpha, "QX-9001") == [inside]
    assert set(await recall_ids(service, writer, "QX-9001")) == {inside, beta}
    assert await recall_ids(service, outsider, "QX-9001") == [other_tenant]
    assert await recall_ids(service, writer, "QX-9001", project="beta") == [beta]


async def test_bm25_honours_cell_types_and_layers(service, make_agent):
    alice, _ = await make_agent()
    risk = await store(service, alice, "ZX-42 may lose writes on failover", "Risk", salience=0.2)
    fact = await store(service, alice, "ZX-42 runs on three replicas", "Fact", salience=0.2)
    assert await recall_ids(service, alice, "ZX-42", cell_types=["Risk"]) == [risk]
    assert set(await recall_ids(service, alice, "ZX-42")) == {risk, fact}
    with trio.fail_after(10):
        durable = await service.query(alice, query="ZX-42", layer="L1")
    assert durable["results"] == []  # neither was promoted: BM25 does not bring L0 cells into L1


# -- forgetting ------------------------------------------------------------------------------------


async def test_a_forgotten_cell_leaves_the_lexical_index(service, make_agent):
    alice, _ = await make_agent()
    gone = await store(service, alice, "KX-7 the launch code is hunter2")
    kept = await store(service, alice, "KX-7 the launch is on Friday")
    before = service.storage.lexical.count()
    with trio.fail_after(10):
        await service.forget(alice, node_id=gone)
    assert service.storage.lexical.count() == before - 1
    assert fts_rows(service, "hunter2") == []
    assert service.storage.lexical.rows() == service.storage.lexical.count()  # FTS5's own N, read from its record
    assert await recall_ids(service, alice, "KX-7 hunter2") == [kept]
    with trio.fail_after(10):
        await service.forget(alice, node_id=gone)  # again: nothing more to remove, no error
    assert service.storage.lexical.count() == before - 1


async def test_a_tombstone_from_the_mesh_or_an_import_leaves_no_words(service, make_agent):
    alice, _ = await make_agent()
    remote = Cell(
        node_id=str(uuid.uuid4()), tenant_id=alice.tenant_id, source_agent="bob", origin_node="peer-node",
        content="JX-5 the staging password rotates monthly", cell_type="Fact", salience=0.5, created_at=1,
        layer="L0", embedding=service.embedder.embed(["JX-5"])[0], embedding_space=service.embedder.space,
    )  # fmt: skip
    with trio.fail_after(10):
        assert await service.ingest_remote(remote, re_embed=False) == remote.node_id
    assert fts_rows(service, "JX-5")
    with trio.fail_after(10):
        assert await service.apply_tombstone(remote.node_id, "peer-node", 2)
    assert fts_rows(service, "JX-5") == []
    buried = dataclasses.replace(remote, node_id=str(uuid.uuid4()), content="", forgotten_at=3)
    with trio.fail_after(10):
        await service.import_cells([buried])
    assert fts_rows(service, "JX-5") == [] and fts_rows(service, "staging") == []


# -- the switch ------------------------------------------------------------------------------------


def test_the_recall_section_of_the_config(home):
    config = load_config(home)
    assert config.hybrid_recall is True and config.lexical_weight == 0.4
    path = home / "config.toml"
    text = path.read_text(encoding="utf-8")
    path.write_text(text.replace("hybrid = true", "hybrid = false\nlexical_weight = 0.1"), encoding="utf-8")
    config = load_config(home)
    assert config.hybrid_recall is False and config.lexical_weight == 0.1
    for bad in ('hybrid = "yes"', "lexical_weight = 2", "lexical_weight = true", "fusion = 1"):
        path.write_text(text.replace("hybrid = true", bad), encoding="utf-8")
        with pytest.raises(ConfigError, match=r"\[recall\]"):
            load_config(home)


async def test_switched_off_recall_is_dense_only(service, make_agent):
    alice, _ = await make_agent()
    for i in range(5):
        await store(service, alice, f"a note on the weekly sync number {i}")
    hybrid(service, False)
    with trio.fail_after(10):
        result = await service.recall(alice, query="weekly sync", k=5)
    distances = [hit["distance"] for hit in result["results"]]
    assert distances == sorted(distances)  # nearest first: the order of meaning alone
    vector = service.embedder.embed(["weekly sync"])[0]
    assert len(distances) == 5 and np.isfinite(vector).all()


async def test_a_narrow_scope_is_ranked_within_itself_not_crowded_out(service, make_agent):
    writer, _ = await make_agent()
    for i in range(12):  # the best BM25 matches, all outside the scope asked for below
        await store(service, writer, f"QQ-5 QQ-5 QQ-5 beta {i}", project="beta")
    wanted = {await store(service, writer, f"QQ-5 is mentioned once in this longer alpha note number {i}", project="alpha")
              for i in range(2)}  # fmt: skip
    lexical = service.storage.lexical
    hits = lexical.search(
        match_expression("QQ-5"), tenant_id=writer.tenant_id, layer="L0", space=service.embedder.space,
        projects=("alpha",), cell_types=None, only_project=None, limit=2,
    )  # fmt: skip
    assert {service.layers.catalog.node_id(rowid) for rowid, _ in hits} == wanted
    assert all(0.0 < coverage <= 1.0 for _, coverage in hits)
