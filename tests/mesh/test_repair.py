"""Repair, piece by piece: the responder's answer, the requester's marks, the origin's debts.

``answer_repair`` is a function of a log, the requester's beacons and ``now``, so each of its
rules is pinned here on a small hand-made log: where a reply cut short resumes, what the
byte budget lets through, what is still settling, what the requester holds or sent itself,
which beacons count (space and size, filters, expiry, the placement grace), and that a
tombstone travels on its cell's interest. The stories over the virtual network are in
``test_engine.py`` and ``test_reconnect.py``; one here: a forget done while a holder was away.
"""

from __future__ import annotations

import pytest

from mesh.events import BeaconPlaced, CellForgotten, CellStored
from mesh.haves import HaveSet
from mesh.identity import NodeIdentity
from mesh.memory import MemoryDiffLog
from mesh.repair import Owed, RepairClient, answer_repair
from mesh.routing import IndexedBeacon
from mesh.wire import TombstonePayload, sign_diff

from .test_engine import ENERGY, Mesh, beacon, cell, unit

NOW = 1_780_000_000_000
SETTLE_MS = 4_000
GRACE_MS = 60_000
ORIGIN, OTHER = NodeIdentity.generate(), NodeIdentity.generate()
REQUESTER = NodeIdentity.generate().node_id
TOPIC = unit(21)


class Log:
    """A responder's log, filled in order; each entry received ``age_ms`` before NOW."""

    def __init__(self) -> None:
        self.store = MemoryDiffLog()
        self.seqs: dict[str, int] = {}
        self.diffs: list = []

    def add(self, payload, *, who: NodeIdentity = ORIGIN, age_ms: int = 10_000):
        seq = self.seqs[who.node_id] = self.seqs.get(who.node_id, 0) + 1
        diff = sign_diff(payload, origin=who.node_id, seq=seq, ts=NOW - age_ms, sign=who.sign, hops=1)
        self.store.put(diff, NOW - age_ms)
        self.diffs.append(diff)
        return diff

    def cells(self, count: int, **fields) -> list:
        return [self.add(cell(TOPIC, cid=f"c{len(self.diffs)}", at=NOW - 20_000, **fields)) for _ in range(count)]


def wanting(*, placed_at: int = NOW - 30_000, **filters) -> list[IndexedBeacon]:
    return [IndexedBeacon(beacon(TOPIC, **filters), REQUESTER, placed_at)]


def answer(log: Log, beacons=None, *, since: int = 0, max_diffs: int = 256, max_bytes: int = 1 << 20,
           haves: HaveSet | None = None, scan_limit: int = 4096, requester: str = REQUESTER):  # fmt: skip
    return answer_repair(
        log.store, wanting() if beacons is None else beacons, requester=requester, since=since,
        scan_limit=scan_limit, max_diffs=max_diffs, max_bytes=max_bytes, grace_ms=GRACE_MS, settle_ms=SETTLE_MS,
        energy=ENERGY, now=NOW, haves=haves,
    )  # fmt: skip


def ids(reply) -> list[str]:
    return [getattr(d.payload, "node_id", None) or d.payload.cell_id for d in reply.diffs]


# -- the responder's answer -------------------------------------------------------------------


def test_a_reply_cut_short_by_max_diffs_resumes_after_the_last_diff_it_carried():
    log = Log()
    sent = log.cells(5)
    first = answer(log, max_diffs=2)
    assert (ids(first), first.upto, first.more) == (["c0", "c1"], 2, True)
    second = answer(log, since=first.upto, max_diffs=2)
    assert (ids(second), second.upto, second.more) == (["c2", "c3"], 4, True)
    last = answer(log, since=second.upto, max_diffs=2)
    assert (ids(last), last.upto, last.more) == (["c4"], 5, False)
    assert [d.ttl for d in first.diffs] == [0, 0] and [d.hops for d in first.diffs] == [2, 2]  # one hop more, no relay
    assert first.diffs[0].signed == sent[0].signed


def test_a_reply_stops_before_the_diff_that_would_pass_the_byte_budget():
    log = Log()
    log.cells(3)
    size = log.diffs[0].size
    assert {d.size for d in log.diffs} == {size}
    exact = answer(log, max_bytes=2 * size)  # two fit exactly
    assert (ids(exact), exact.upto, exact.more) == (["c0", "c1"], 2, True)
    short = answer(log, max_bytes=2 * size - 1)
    assert (ids(short), short.upto, short.more) == (["c0"], 1, True)


def test_entries_still_settling_are_left_for_the_next_request():
    log = Log()
    log.add(cell(TOPIC, cid="settled", at=NOW - 20_000), age_ms=SETTLE_MS)  # exactly settled
    log.add(cell(TOPIC, cid="in flight", at=NOW - 20_000), age_ms=SETTLE_MS - 1)
    reply = answer(log)
    assert (ids(reply), reply.upto, reply.more) == (["settled"], 1, False)


def test_held_diffs_are_skipped_and_the_scan_goes_on_past_them():
    log = Log()
    log.cells(3)
    reply = answer(log, haves=HaveSet.of({(ORIGIN.node_id, 1), (ORIGIN.node_id, 2)}))
    assert (ids(reply), reply.upto, reply.more) == (["c2"], 3, False)
    nothing = answer(log, haves=HaveSet.of({(ORIGIN.node_id, s) for s in (1, 2, 3)}))
    assert (nothing.diffs, nothing.upto, nothing.more) == ([], 3, False)


def test_the_requesters_own_diffs_are_never_sent_back():
    log = Log()
    own = NodeIdentity.generate()
    log.add(cell(TOPIC, cid="its own", at=NOW - 20_000), who=own)
    log.add(cell(TOPIC, cid="another's", at=NOW - 20_000))
    reply = answer(log, requester=own.node_id)
    assert (ids(reply), reply.upto) == (["another's"], 2)


def test_a_tombstone_travels_to_every_requester_since_its_cells_vector_is_erased():
    log = Log()
    (held,) = log.cells(1)
    log.add(TombstonePayload("c0", "t", NOW - 15_000, ORIGIN.node_id, held.seq))
    log.add(TombstonePayload("never-held", "t", NOW - 15_000, ORIGIN.node_id, 99))
    reply = answer(log)
    assert [(type(d.payload).__name__, d.payload.cell_id) for d in reply.diffs] == [
        ("TombstonePayload", "c0"), ("TombstonePayload", "never-held"),
    ]  # the forgotten cell c0 itself is not sent: the log erased it
    assert reply.upto == 3
    assert answer(log, haves=HaveSet.of({(ORIGIN.node_id, 2)})).diffs[0].payload.cell_id == "never-held"


def test_only_beacons_of_the_cells_space_and_size_count():
    log = Log()
    stranger = cell(TOPIC, cid="other space", at=NOW - 20_000)
    log.add(type(stranger)(**{**_fields(stranger), "embedding_space": "other"}))  # first, and nobody's interest
    log.cells(1)
    other_space = [IndexedBeacon(_in_space(beacon(TOPIC), "other"), REQUESTER, NOW - 30_000)]
    assert ids(answer(log)) == ["c1"]  # the group of another space before it does not end the search
    assert ids(answer(log, other_space)) == ["other space"]


def test_cells_older_than_the_beacon_by_more_than_the_grace_are_not_repaired():
    placed_at = NOW - 30_000
    log = Log()
    log.add(cell(TOPIC, cid="too old", at=placed_at - GRACE_MS - 1))
    log.add(cell(TOPIC, cid="just in", at=placed_at - GRACE_MS))
    log.add(cell(TOPIC, cid="new", at=NOW - 20_000))
    assert ids(answer(log, wanting(placed_at=placed_at))) == ["just in", "new"]


@pytest.mark.parametrize("filters, served", [
    ({}, True),
    ({"cell_types": ("Risk",)}, False),
    ({"cell_types": ("Risk", "Decision")}, True),
    ({"expires_at": NOW + 60_000}, True),
    ({"expires_at": NOW}, False),
    ({"min_salience": 0.95}, False),
    ({"agent": "writer"}, False),  # never back to the beacon's own agent
])  # fmt: skip
def test_the_beacons_filters_and_expiry_hold_in_repair(filters, served):
    log = Log()
    log.cells(1)
    assert ids(answer(log, wanting(**filters))) == (["c0"] if served else [])


def _fields(payload) -> dict:
    return {name: getattr(payload, name) for name in payload.__dataclass_fields__}


def _in_space(b, space: str):
    return type(b)(**{**_fields(b), "embedding_space": space})


# -- the requester's marks --------------------------------------------------------------------


def test_the_requester_keeps_one_request_in_flight_per_peer_and_a_mark_that_only_grows():
    client = RepairClient(timeout_ms=5_000)
    first = client.start("p", NOW)
    assert first is not None and first[1] == 0  # a first request asks from the start of the log
    assert client.start("p", NOW + 4_999) is None  # one in flight, not timed out
    assert client.sent_at("p") == NOW and client.in_flight(NOW + 4_999) and not client.in_flight(NOW + 5_000)
    assert client.start("q", NOW) is not None  # another peer is asked independently

    assert client.finish("p", first[0] + 100, upto=7, ready=True) is False  # answers nothing of ours
    assert client.marks == {} and client.sent_at("p") == NOW
    assert client.finish("p", first[0], upto=7, ready=True) is True
    assert client.sent_at("p") is None and client.marks == {"p": 7}
    again = client.start("p", NOW + 1)
    assert again[1] == 7
    assert client.finish("p", again[0], upto=3, ready=True) and client.marks["p"] == 7  # never back
    not_ready = client.start("p", NOW + 2)
    assert client.finish("p", not_ready[0], upto=50, ready=False) and client.marks["p"] == 7

    timed_out = client.start("p", NOW + 3)
    assert client.start("p", NOW + 3 + 5_000) is not None  # unanswered past the timeout: asked again
    assert client.finish("p", timed_out[0], upto=9, ready=True) is False  # the old reply answers nothing now


def test_an_empty_first_reply_leaves_the_mark_at_the_start():
    client = RepairClient(timeout_ms=5_000)
    request_id, since = client.start("p", NOW)
    assert client.finish("p", request_id, upto=0, ready=True)
    assert client.start("p", NOW + 1)[1] == 0


def test_a_forgotten_peer_can_be_asked_again_at_once():
    client = RepairClient(timeout_ms=5_000)
    client.start("p", NOW)
    client.start("q", NOW)
    client.forget("p")
    assert client.start("p", NOW + 1) is not None and client.start("q", NOW + 1) is None


# -- what an origin owes -----------------------------------------------------------------------


def test_what_is_owed_keeps_the_highest_energy_within_its_bound_and_comes_back_highest_first():
    log = Log()
    a, b, c, d = log.cells(4)
    owed = Owed(limit=2)
    assert owed.add("p", a, 0.5) == 0
    assert owed.add("p", b, 0.9) == 0  # at the bound: nothing pushed out
    assert owed.count("p") == 2
    assert owed.add("p", c, 0.7) == 1  # over it: the lowest (a) goes
    assert owed.add("p", d, 0.1) == 1  # over it again: d itself is the lowest
    assert owed.add("q", a, 0.2) == 0  # another peer's debts are its own
    assert [(e, diff.seq) for e, diff in owed.take("p")] == [(0.9, b.seq), (0.7, c.seq)]
    assert owed.take("p") == [] and owed.count("q") == 1


# -- a story: a forget while a holder was away -------------------------------------------------


def test_a_holder_away_during_a_forget_gets_the_tombstone_by_repair():
    mesh = Mesh("alice", "bob", "carol", repair_interval_ms=600_000)
    mesh.do("bob", BeaconPlaced(beacon(TOPIC)))
    mesh.do("carol", BeaconPlaced(beacon(TOPIC, agent="reader2")))
    mesh.settle()
    secret = cell(TOPIC, at=mesh.net.now)
    mesh.do("alice", CellStored(secret))
    assert mesh.net.run_until(mesh.net.now + 5_000, lambda: secret.node_id in mesh["carol"].cells)
    mesh.net.partition(["alice", "bob"], ["carol"])
    mesh.do("alice", CellForgotten(secret.node_id, "t"))
    assert mesh.net.run_until(mesh.net.now + 5_000, lambda: secret.node_id in mesh["bob"].tombstones)
    mesh.run(30_000)  # alice gives up on carol, and carol on everyone
    assert secret.node_id not in mesh["carol"].tombstones
    mesh.net.partition(["alice"], ["bob", "carol"])  # the origin is gone when carol is back
    assert mesh.net.run_until(mesh.net.now + 30_000, lambda: secret.node_id in mesh["carol"].tombstones)
    assert mesh["carol"].tombstones[secret.node_id].origin_node == mesh["alice"].node_id
