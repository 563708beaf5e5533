"""Trust no member: a valid signature says who made a diff, not that any node can keep it.

A member (here mallory, with a genuine membership proof) signs cells that break the rules
every local cell obeys, or routing counts past SQLite's 64-bit integers. Each such diff is
refused by the decoder, before the engine logs, relays or hands it to storage: one counted
drop under its reason, nothing logged, and the innocent diffs of the same frame go on.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mesh.errors import Reason, WireError
from mesh.wire import CellPayload, decode_signed, sign_diff

from .test_engine import cell, unit
from .test_security import MALLORY, NOW, bob, deliver, diff_from, frame, stored, team  # noqa: F401 (fixtures)


def poison_cell(**changes) -> CellPayload:
    return dataclasses.replace(cell(unit(1), at=NOW), **changes)


# What a member may sign and no node can store (or should: the rules local input obeys).
POISON = {
    "a cell type that is not one of the nine": (dict(cell_type="Gossip"), Reason.INVALID_CELL),
    "created_at past SQLite's integers": (dict(created_at=2**63), Reason.INVALID_CELL),
    "created_at at 2^64 - 1": (dict(created_at=2**64 - 1), Reason.INVALID_CELL),
    "a negative created_at": (dict(created_at=-1), Reason.INVALID_CELL),
    "bytes in the metadata": (dict(metadata={"blob": b"\x00\x01"}), Reason.INVALID_CELL),
    "bytes deep in the metadata": (dict(metadata={"a": [{"b": b"x"}]}), Reason.INVALID_CELL),
    "NaN in the metadata": (dict(metadata={"x": float("nan")}), Reason.INVALID_CELL),
    "metadata within 16 KiB as msgpack, past it as JSON": (dict(metadata={"k": "\x01" * 3000}), Reason.CONTENT_TOO_LARGE),
    "salience above 1": (dict(salience=1.5), Reason.INVALID_CELL),
    "a negative salience": (dict(salience=-0.1), Reason.INVALID_CELL),
    "salience NaN": (dict(salience=float("nan")), Reason.MALFORMED),
    "an embedding with a NaN": (dict(embedding=np.full(16, np.nan, np.float32)), Reason.MALFORMED),
    "an embedding of 5000 dimensions": (dict(embedding=np.ones(5000, np.float32)), Reason.CONTENT_TOO_LARGE),
    "content of 70 KB": (dict(content="x" * 70_000), Reason.CONTENT_TOO_LARGE),
    "empty content": (dict(content=""), Reason.INVALID_CELL),
    "a source_ref of another shape": (dict(source_ref={"url": "x"}), Reason.INVALID_CELL),
    "a project name of 201 characters": (dict(project="p" * 201), Reason.CONTENT_TOO_LARGE),
}  # fmt: skip


def held(engine, diff) -> bool:
    return engine.store.has(diff.origin, diff.seq)


@pytest.mark.parametrize("changes, reason", POISON.values(), ids=list(POISON))
def test_a_members_poison_cell_is_dropped_counted_and_never_logged(team, bob, changes, reason):
    diff = diff_from(MALLORY, poison_cell(**changes))
    with pytest.raises(WireError) as refused:
        decode_signed(diff.signed, diff.signature, diff.hops, diff.ttl)
    assert refused.value.reason == reason

    logged = len(bob.store)  # its own peer record
    effects = deliver(bob, frame(team, MALLORY, diff))
    assert stored(effects) == []
    assert dict(bob.counters.drops) == {reason: 1}
    assert not held(bob, diff) and len(bob.store) == logged
    assert not bob.counters.diffs_accepted and bob.counters.cells_delivered == 0


@pytest.mark.parametrize("changes, reason", POISON.values(), ids=list(POISON))
def test_the_innocent_diffs_of_a_frame_with_a_poison_cell_go_on(team, bob, changes, reason):
    first, last = diff_from(MALLORY, seq=1), diff_from(MALLORY, cell(unit(3), at=NOW), seq=3)
    poison = diff_from(MALLORY, poison_cell(**changes), seq=2)
    effects = deliver(bob, frame(team, MALLORY, first, poison, last))
    assert [e.seq for e in stored(effects)] == [1, 3]
    assert dict(bob.counters.drops) == {reason: 1}
    assert held(bob, first) and held(bob, last) and not held(bob, poison)


def test_a_diff_that_cannot_be_decoded_at_all_is_one_drop_of_its_own(team, bob):
    good = diff_from(MALLORY, seq=1)
    garbage = dataclasses.replace(good, signed=b"\x93\x01\x02\x03", seq=2)
    effects = deliver(bob, frame(team, MALLORY, garbage, good))
    assert [e.seq for e in stored(effects)] == [1]
    assert dict(bob.counters.drops) == {Reason.MALFORMED: 1}


# -- counts past SQLite's signed 64-bit integers -----------------------------------------------


def with_seq(seq: int):
    return sign_diff(cell(unit(2), at=NOW), origin=MALLORY.node_id, seq=seq, ts=NOW, sign=MALLORY.sign, hops=1)


OUT_OF_RANGE = {
    "seq 2^63": lambda: with_seq(2**63),
    "seq 2^64 - 1": lambda: with_seq(2**64 - 1),
    "hops 2^63": lambda: with_seq(2).routed(hops=2**63, ttl=1),
    "hops 2^64 - 1": lambda: with_seq(2).routed(hops=2**64 - 1, ttl=1),
    "ttl 2^64 - 1": lambda: with_seq(2).routed(hops=1, ttl=2**64 - 1),
}


@pytest.mark.parametrize("make", OUT_OF_RANGE.values(), ids=list(OUT_OF_RANGE))
def test_seq_hops_or_ttl_past_2_63_is_malformed_and_the_rest_of_the_batch_is_stored(team, bob, make):
    bad = make()
    with pytest.raises(WireError) as refused:
        decode_signed(bad.signed, bad.signature, bad.hops, bad.ttl)
    assert refused.value.reason == Reason.MALFORMED

    first, last = diff_from(MALLORY, seq=1), diff_from(MALLORY, cell(unit(3), at=NOW), seq=3)
    effects = deliver(bob, frame(team, MALLORY, first, bad, last))
    assert [e.seq for e in stored(effects)] == [1, 3]
    assert dict(bob.counters.drops) == {Reason.MALFORMED: 1}
    assert held(bob, first) and held(bob, last) and not held(bob, bad)
    assert bob.counters.cells_delivered == 2  # only what storage was handed


def test_the_largest_counts_sqlite_holds_still_decode():
    diff = with_seq(2**63 - 1).routed(hops=2**63 - 1, ttl=2**63 - 1)
    back = decode_signed(diff.signed, diff.signature, diff.hops, diff.ttl)
    assert (back.seq, back.hops, back.ttl) == (2**63 - 1,) * 3
