"""One story for every :class:`mesh.memory.DiffLog`: what each method promises, told once and
run over the in-memory log and the node's SQLite log alike.

The engine calls every method of the protocol (none is optional), so a log that keeps only
some of the promises fails here rather than in a restarted node. The SQLite log reads its
table for ``scan``, ``control_diffs`` and ``keys``, which see a ``put`` once its write has
landed: ``settle`` waits for that (nothing, for the in-memory log).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from mesh.identity import NodeIdentity
from mesh.memory import DiffLog, MemoryDiffLog
from mesh.wire import (
    DATA_KINDS, BeaconPayload, CellPayload, Diff, PeerPayload, ScenePayload, TombstonePayload, UnbeaconPayload,
    sign_diff,
)  # fmt: skip

ALICE = NodeIdentity.generate()
BOB = NodeIdentity.generate()
VECTOR = (lambda v: v / np.linalg.norm(v))(np.linspace(-1, 1, 8)).astype(np.float32)


@dataclasses.dataclass
class Log:
    """A log under test, a way to let its writes land, and a way to open it again (None: it
    keeps nothing past its own life)."""

    log: DiffLog
    settle: Callable[[], None]
    reopen: Callable[[], DiffLog] | None


@pytest.fixture(params=["memory", "sqlite"])
def subject(request, tmp_path) -> Iterator[Log]:
    if request.param == "memory":
        yield Log(MemoryDiffLog(), lambda: None, None)
        return
    from node.store.database import Database
    from node.store.diff_log import SqliteDiffLog

    db = Database(tmp_path / "hyphae.db")
    try:
        yield Log(SqliteDiffLog(db), lambda: db.write_sync(lambda tx: None), lambda: SqliteDiffLog(db))
    finally:
        db.close()


def signed(payload, who: NodeIdentity = ALICE, seq: int = 1, *, ts: int = 1000, hops: int = 0, ttl: int = 0) -> Diff:
    return sign_diff(payload, origin=who.node_id, seq=seq, ts=ts, sign=who.sign, hops=hops, ttl=ttl)


def cell(cell_id: str, content: str = "content") -> CellPayload:
    return CellPayload(cell_id, "t", "writer", content, "Decision", 0.5, 1000, embedding=VECTOR, embedding_space="s")


def beacon(beacon_id: str, query: str = "query") -> BeaconPayload:
    return BeaconPayload(beacon_id, "t", "reader", query, 0.8, embedding=VECTOR, embedding_space="s")


def same(a: Diff, b: Diff) -> bool:
    """The same diff as put, routing fields included (``told`` is not the log's to keep)."""
    return (a.kind, a.origin, a.seq, a.ts, a.payload, a.signed, a.signature, a.hops, a.ttl) == (
        b.kind, b.origin, b.seq, b.ts, b.payload, b.signed, b.signature, b.hops, b.ttl
    )  # fmt: skip


def test_a_held_diff_gives_its_signature_to_tell_a_fork_from_it(subject):
    log = subject.log
    diff = signed(cell("c9"), seq=4)
    assert log.signature(ALICE.node_id, 4) is None
    log.put(diff, 10)
    assert log.signature(ALICE.node_id, 4) == diff.signature  # before its write lands, as ``has``
    subject.settle()
    assert log.signature(ALICE.node_id, 4) == diff.signature
    assert log.signature(BOB.node_id, 4) is None and log.signature(ALICE.node_id, 5) is None
    if subject.reopen is not None:
        assert subject.reopen().signature(ALICE.node_id, 4) == diff.signature


def test_a_diff_put_is_held_at_once_and_only_once(subject):
    log = subject.log
    diff = signed(cell("c1"), seq=3)
    assert not log.has(ALICE.node_id, 3)
    assert log.put(diff, 50) is True
    assert log.has(ALICE.node_id, 3)  # before any write has landed: the engine asks right away
    assert not log.has(ALICE.node_id, 2) and not log.has(BOB.node_id, 3)
    assert log.put(diff, 60) is False
    assert log.put(dataclasses.replace(diff, hops=4), 70) is False  # by (origin, seq), whatever the routing
    subject.settle()
    assert [lsn_diff[2].seq for lsn_diff in log.scan(0, 10)] == [3]


def test_max_seq_is_the_highest_seq_held_per_origin_of_any_kind(subject):
    log = subject.log
    assert log.max_seq(ALICE.node_id) == 0
    log.put(signed(cell("c1"), seq=2), 1)
    log.put(signed(PeerPayload("a:1"), seq=7), 2)  # a control diff counts too: our own seq is one counter
    log.put(signed(cell("c2"), seq=5), 3)  # an older one arriving late does not lower it
    log.put(signed(cell("c3"), BOB, seq=1), 4)
    assert (log.max_seq(ALICE.node_id), log.max_seq(BOB.node_id)) == (7, 1)
    if subject.reopen is not None:  # a restart continues above it
        subject.settle()
        again = subject.reopen()
        assert (again.max_seq(ALICE.node_id), again.max_seq(BOB.node_id)) == (7, 1)


def test_scan_pages_through_the_data_diffs_in_log_order(subject):
    log = subject.log
    puts = [
        signed(cell("c1"), seq=1, hops=2, ttl=3),
        signed(PeerPayload("a:1"), seq=2),  # control diffs are no part of a scan
        signed(cell("c2"), BOB, seq=1),
        signed(TombstonePayload("c1", "t", 2000, ALICE.node_id, 1), seq=3),
        signed(beacon("b1"), seq=4),
        signed(cell("c3"), seq=5),
    ]
    for at, diff in enumerate(puts, start=100):
        log.put(diff, at)
    subject.settle()
    # c1 is left out: its origin's tombstone erased it (still held, never sent again)
    data = [(at, d) for at, d in enumerate(puts, start=100) if d.kind in DATA_KINDS][1:]
    everything = log.scan(0, 100)
    assert [(at, d.origin, d.seq) for _, at, d in everything] == [(at, d.origin, d.seq) for at, d in data]
    assert all(same(got, want) for (_, _, got), (_, want) in zip(everything, data))
    lsns = [lsn for lsn, _, _ in everything]
    assert lsns == sorted(set(lsns)) and lsns[0] > 0
    first, rest = log.scan(0, 2), log.scan(lsns[1], 100)  # after a position: the rest, none again
    assert [e[0] for e in first + rest] == lsns
    assert log.scan(lsns[-1], 100) == [] and log.scan(0, 0) == []


def test_positions_only_grow(subject):
    log = subject.log
    log.put(signed(cell("c1"), seq=1), 1)
    subject.settle()
    (last, _, _), = log.scan(0, 10)
    log.put(signed(cell("c2"), BOB, seq=9), 2)
    log.put(signed(cell("c3"), seq=2), 3)
    subject.settle()
    later = log.scan(last, 10)
    assert [(d.origin, d.seq) for _, _, d in later] == [(BOB.node_id, 9), (ALICE.node_id, 2)]
    assert all(lsn > last for lsn, _, _ in later)


def test_a_cell_is_found_by_its_id_before_and_after_its_write_lands(subject):
    log = subject.log
    carried = signed(cell("c1", "the decision"), seq=4, hops=1, ttl=2)
    log.put(carried, 1)
    log.put(signed(TombstonePayload("c1", "t", 2000, ALICE.node_id, 4), seq=5), 2)  # not the cell's carrier
    assert same(log.cell("c1"), carried)  # a tombstone for it looks it up at once
    subject.settle()
    assert same(log.cell("c1"), carried)
    assert log.cell("c2") is None and log.cell("b1") is None
    log.put(signed(beacon("b1"), seq=6), 3)
    subject.settle()
    assert log.cell("b1") is None  # only cells are looked up by id


def test_control_diffs_keep_at_least_the_newest_of_each_key_in_log_order(subject):
    log = subject.log
    puts = [
        signed(PeerPayload("a:1"), seq=1),
        signed(beacon("b1", "first"), seq=2),
        signed(cell("c1"), seq=3),  # data: never among them
        signed(PeerPayload("b:1"), BOB, seq=1),
        signed(ScenePayload("s1", "t", {"scene_id": "s1", "name": "x"}), seq=4),
        signed(beacon("b1", "second"), seq=5),  # supersedes seq 2
        signed(PeerPayload("a:2"), seq=6),  # supersedes seq 1
        signed(UnbeaconPayload("b2", "t"), BOB, seq=2),
    ]
    for at, diff in enumerate(puts):
        log.put(diff, at)
    subject.settle()
    held = log.control_diffs()
    assert all(d.kind not in DATA_KINDS for d in held)
    order = [(d.origin, d.seq) for d in puts]
    assert [order.index((d.origin, d.seq)) for d in held] == sorted(order.index((d.origin, d.seq)) for d in held)
    newest = [puts[i] for i in (3, 4, 5, 6, 7)]
    for want in newest:
        assert any(same(got, want) for got in held), want.payload
    superseded = {(d.origin, d.seq) for d in (puts[0], puts[1])}
    assert {(d.origin, d.seq) for d in held} <= {(d.origin, d.seq) for d in newest} | superseded
    if subject.reopen is not None:  # what a restart puts back
        assert [(d.origin, d.seq) for d in subject.reopen().control_diffs()] == [(d.origin, d.seq) for d in held]


def test_keys_are_the_newest_per_origin(subject):
    log = subject.log
    assert log.keys() == []
    log.put_key(ALICE.node_id, ALICE.public_key, b"proof 1")
    log.put_key(BOB.node_id, BOB.public_key, b"proof b")
    log.put_key(ALICE.node_id, ALICE.public_key, b"proof 2")  # a rotated team's proof replaces the old
    subject.settle()
    assert sorted(log.keys()) == sorted([
        (ALICE.node_id, ALICE.public_key, b"proof 2"), (BOB.node_id, BOB.public_key, b"proof b"),
    ])  # fmt: skip
    assert all(type(key) is bytes and type(proof) is bytes for _, key, proof in log.keys())
    if subject.reopen is not None:
        assert sorted(subject.reopen().keys()) == sorted(log.keys())


def test_a_tombstone_is_known_by_cell_and_signer_at_once_and_after_reopening(subject):
    log = subject.log
    assert not log.forgotten("c1", ALICE.node_id)
    log.put(signed(TombstonePayload("c1", "t", 1000, ALICE.node_id, 7), seq=1), 1000)  # before its cell
    assert log.forgotten("c1", ALICE.node_id) and not log.forgotten("c1", BOB.node_id)
    assert not log.forgotten("c2", ALICE.node_id)
    subject.settle()
    if subject.reopen is not None:
        assert subject.reopen().forgotten("c1", ALICE.node_id)
