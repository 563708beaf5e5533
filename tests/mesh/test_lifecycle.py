"""Supersede and forget on the mesh: where a superseding cell goes, and that order never matters.

First the rule for a cell's ``supersedes`` list; then the orders, one receiving engine fed a
script of diffs in exactly the order a story needs (supersede before original, forget before
supersede, forget before cell, duplicates) and in every order Hypothesis draws; then the same
stories on the virtual network, with loss and duplication, where a slow link forces the order.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mesh.errors import CellRuleError, Reason
from mesh.events import (
    BeaconPlaced,
    CellForgotten,
    CellStored,
    FrameReceived,
    PeerDiscovered,
    SendFrame,
    Started,
)
from mesh.identity import NodeIdentity
from mesh.lifecycle import (
    ACTIVE,
    FORGOTTEN,
    MAX_SUPERSEDES,
    SUPERSEDED,
    check_supersedes,
    statuses,
    supersedes,
)
from mesh.team import AUTH_SIGNED, FrameAuth, Team
from mesh.testing import Host, LinkConditions, VirtualNetwork, make_engine
from mesh.wire import (
    CellPayload,
    Envelope,
    MsgType,
    TombstonePayload,
    encode_envelope,
    sign_diff,
)

from .test_engine import ENERGY, Mesh, beacon, cell, near, unit

NOW = 1_780_000_000_000
TOPIC, ELSEWHERE = unit(301), unit(302)


def superseding(vector, *olds: str, cid: str, at: int = 0, **fields) -> CellPayload:
    made = cell(vector, cid=cid, at=at, **fields)
    return CellPayload(**{**{f: getattr(made, f) for f in made.__dataclass_fields__}, "metadata": {"supersedes": list(olds)}})


# -- the rule -----------------------------------------------------------------------------


def test_a_supersedes_list_is_read_in_order_once_each():
    assert check_supersedes(["a-1", "b_2", "a-1"]) == ("a-1", "b_2")
    assert supersedes({}, "x") == () and supersedes({"other": 1}, "x") == ()
    assert supersedes({"supersedes": ["0b6c4f0e-3c1a-4a8e-9d7e-2f1b5a6c7d8e"]}, "x") == (
        "0b6c4f0e-3c1a-4a8e-9d7e-2f1b5a6c7d8e",
    )


@pytest.mark.parametrize(
    "value, reason",
    [
        ("c1", Reason.INVALID_CELL),
        ([1], Reason.INVALID_CELL),
        (["has space"], Reason.INVALID_CELL),
        (["x" * 65], Reason.INVALID_CELL),
        (["self"], Reason.INVALID_CELL),
        ([f"c{i}" for i in range(MAX_SUPERSEDES + 1)], Reason.CONTENT_TOO_LARGE),
    ],
)
def test_a_list_that_breaks_the_rule_is_refused_strictly_and_ignored_on_the_mesh(value, reason):
    with pytest.raises(CellRuleError) as caught:
        check_supersedes(value, "self")
    assert caught.value.reason == reason and caught.value.field == "metadata.supersedes"
    assert supersedes({"supersedes": value}, "self") is None


def test_statuses_void_the_links_of_a_forgotten_successor():
    cells = {"c1": (), "c2": ("c1",), "c3": ("c2",)}
    assert statuses(cells, []) == {"c1": SUPERSEDED, "c2": SUPERSEDED, "c3": ACTIVE}
    assert statuses(cells, ["c3", "c9"]) == {"c1": SUPERSEDED, "c2": ACTIVE, "c3": FORGOTTEN, "c9": FORGOTTEN}


def test_a_bad_list_leaves_the_cell_valid_and_is_counted():
    mesh = Mesh("alice", "bob")
    mesh.do("bob", BeaconPlaced(beacon(TOPIC)))
    mesh.settle()
    mesh.do("alice", CellStored(superseding(TOPIC, "not an id", cid="bad", at=mesh.net.now)))
    mesh.run(2000)
    assert "bad" in mesh["bob"].cells
    assert mesh["alice"].engine.counters.supersedes_ignored == 1


# -- every order, on one receiving engine -------------------------------------------------

ALICE, CAROL = NodeIdentity.generate(), NodeIdentity.generate()
TEAM = Team.create()


def _script() -> list:
    """Alice stores c1, supersedes it with c2 and forgets c2, supersedes c1 again with c3, stores
    and forgets c4; Carol supersedes c3 with c5."""
    seqs: collections.Counter = collections.Counter()

    def signed(who: NodeIdentity, payload):
        seqs[who.node_id] += 1
        return sign_diff(payload, origin=who.node_id, seq=seqs[who.node_id], ts=NOW, sign=who.sign, hops=1, ttl=3)

    c1 = signed(ALICE, cell(TOPIC, cid="c1", at=NOW))
    c2 = signed(ALICE, superseding(ELSEWHERE, "c1", cid="c2", at=NOW))
    t2 = signed(ALICE, TombstonePayload("c2", "t", NOW, ALICE.node_id, c2.seq))
    c3 = signed(ALICE, superseding(TOPIC, "c1", cid="c3", at=NOW))
    c4 = signed(ALICE, cell(TOPIC, cid="c4", at=NOW))
    t4 = signed(ALICE, TombstonePayload("c4", "t", NOW, ALICE.node_id, c4.seq))
    c5 = signed(CAROL, superseding(ELSEWHERE, "c3", cid="c5", at=NOW, agent="carol"))
    return [c1, c2, t2, c3, c4, t4, c5]


SCRIPT = _script()
CONVERGED = {"c1": SUPERSEDED, "c2": FORGOTTEN, "c3": SUPERSEDED, "c4": FORGOTTEN, "c5": ACTIVE}
KEYS = {who.node_id: (who.public_key, TEAM.membership_proof(who.public_key)) for who in (ALICE, CAROL)}


def receive_in_order(diffs) -> Host:
    """A fresh engine handed each diff in its own data frame, in this order."""
    host = Host("bob", make_engine("bob", TEAM, ENERGY))
    host.engine.handle(Started(), NOW)
    for k, diff in enumerate(diffs, 1):
        env = Envelope(MsgType.DATA, NOW + k, "alice", KEYS, (diff,), batch_id=k)
        frame = TEAM.sealer().seal(ALICE.node_id, encode_envelope(env), FrameAuth(AUTH_SIGNED, ALICE.sign))
        for effect in host.engine.handle(FrameReceived("alice", frame), NOW + 10 * k):
            host.record(effect)
    return host


def by_id(*ids: str) -> list:
    named = {getattr(d.payload, "node_id", None) or f"t:{d.payload.cell_id}": d for d in SCRIPT}
    return [named[i] for i in ids]


def test_in_order():
    assert receive_in_order(SCRIPT).statuses() == CONVERGED


def test_supersede_before_original():
    bob = receive_in_order(by_id("c2", "c3", "c1"))
    assert list(bob.cells) == ["c2", "c3", "c1"]  # the engine delivers both; the link holds either way
    assert bob.statuses() == {"c1": SUPERSEDED, "c2": ACTIVE, "c3": ACTIVE}


def test_forget_before_supersede():
    bob = receive_in_order(by_id("c1", "t:c2", "c2"))
    assert "c2" not in bob.cells and bob.engine.counters.drops[Reason.FORGOTTEN] == 1
    assert bob.statuses() == {"c1": ACTIVE, "c2": FORGOTTEN}  # a forgotten successor supersedes nothing
    assert receive_in_order(by_id("c1", "c2", "t:c2")).statuses() == bob.statuses()


def test_forget_before_cell_keeps_it_out_and_unlogged():
    bob = receive_in_order(by_id("t:c4", "c4", "c4"))
    assert bob.cells == {} and set(bob.tombstones) == {"c4"}
    assert not bob.engine.store.has(ALICE.node_id, by_id("c4")[0].seq)  # not held: its content is nowhere here
    assert bob.engine.counters.drops[Reason.FORGOTTEN] == 2


def test_another_nodes_tombstone_does_not_forget_a_cell():
    forged = sign_diff(TombstonePayload("c1", "t", NOW, CAROL.node_id, 1), origin=CAROL.node_id, seq=9, ts=NOW,
                       sign=CAROL.sign, hops=1)  # fmt: skip
    bob = receive_in_order([forged, *by_id("c1")])
    assert "c1" in bob.cells  # Carol claimed to be c1's origin; Alice signed it, so it is live


def test_duplicates_change_nothing():
    bob = receive_in_order([*SCRIPT, *SCRIPT])
    assert bob.statuses() == CONVERGED and bob.engine.counters.drops[Reason.DUPLICATE] == len(SCRIPT)


@settings(max_examples=80, deadline=None)
@given(order=st.permutations(range(len(SCRIPT))), again=st.lists(st.integers(0, len(SCRIPT) - 1), max_size=4),
       data=st.data())  # fmt: skip
def test_every_order_converges_to_the_same_state(order, again, data):
    diffs = [SCRIPT[i] for i in order]
    for i in again:  # duplicates, anywhere
        diffs.insert(data.draw(st.integers(0, len(diffs))), SCRIPT[i])
    bob = receive_in_order(diffs)
    assert bob.statuses() == CONVERGED
    for gone in ("c2", "c4"):  # handed over only if it came before its tombstone
        first = [getattr(d.payload, "node_id", None) or f"t:{d.payload.cell_id}" for d in diffs]
        assert (gone in bob.cells) == (first.index(gone) < first.index(f"t:{gone}"))


# -- on the virtual network, with loss -----------------------------------------------------

HOSTILE = LinkConditions(latency_ms=(5, 60), loss=0.2, duplicate=0.1)
SLOW = LinkConditions(latency_ms=(3000, 3000))


def team_of_four(seed: int, link: LinkConditions | None = None) -> Mesh:
    """Alice writes; Bob and Carol want TOPIC, Dave wants ELSEWHERE."""
    mesh = Mesh("alice", "bob", "carol", "dave", seed=seed, link=link, repair_interval_ms=10_000)
    for name, topic in (("bob", TOPIC), ("carol", TOPIC), ("dave", ELSEWHERE)):
        mesh.do(name, BeaconPlaced(beacon(topic, agent=f"reader-{name}")))
    mesh.settle(60_000)
    return mesh


def data_diffs_sent(mesh: Mesh, cell_id: str) -> collections.Counter:
    sent: collections.Counter = collections.Counter()

    def watch(host, effect):
        if isinstance(effect, SendFrame):
            for diff in effect.data_diffs:
                if getattr(diff.payload, "node_id", None) == cell_id:
                    sent[host.address] += 1

    mesh.net.on_effect = watch
    return sent


def test_a_superseding_cell_reaches_every_holder_of_the_old_one_once():
    mesh = team_of_four(0)
    mesh.do("alice", CellStored(cell(near(TOPIC, 0.95), cid="d1", at=mesh.net.now)))
    mesh.run(2000)
    assert {n for n in ("bob", "carol", "dave") if "d1" in mesh[n].cells} == {"bob", "carol"}
    sent = data_diffs_sent(mesh, "d2")
    mesh.do("alice", CellStored(superseding(ELSEWHERE, "d1", cid="d2", at=mesh.net.now)))  # only Dave's beacon matches
    mesh.run(2000)
    assert sent == {"alice": 3}  # Dave for its beacon, Bob and Carol for holding d1: one diff each
    for name in ("bob", "carol"):
        assert mesh[name].statuses() == {"d1": SUPERSEDED, "d2": ACTIVE}
    # A holder that supersedes another's cell sends it to the other holders and to the old cell's origin.
    sent = data_diffs_sent(mesh, "d3")
    mesh.do("bob", CellStored(superseding(ELSEWHERE, "d1", cid="d3", at=mesh.net.now, agent="bob")))
    mesh.run(2000)
    assert sent == {"bob": 3} and all("d3" in mesh[n].cells for n in ("alice", "carol", "dave"))


@pytest.mark.parametrize("seed", range(4))
def test_supersede_before_original_with_loss(seed):
    mesh = team_of_four(seed, HOSTILE)
    mesh.net.links[("alice", "carol")] = SLOW  # d1's first copy to Carol takes 3 s
    mesh.do("alice", CellStored(cell(near(TOPIC, 0.95), cid="d1", at=mesh.net.now)))
    mesh.run(20)
    mesh.net.links[("alice", "carol")] = LinkConditions(latency_ms=(5, 10))
    mesh.do("alice", CellStored(superseding(ELSEWHERE, "d1", cid="d2", at=mesh.net.now)))
    mesh.run(60_000)
    assert list(mesh["carol"].cells) == ["d2", "d1"]  # the successor came first
    for name in ("bob", "carol"):
        assert mesh[name].statuses() == {"d1": SUPERSEDED, "d2": ACTIVE}, name


@pytest.mark.parametrize("seed", range(4))
def test_forget_before_cell_and_before_supersede_with_loss(seed):
    mesh = team_of_four(seed, HOSTILE)
    mesh.do("alice", CellStored(cell(near(TOPIC, 0.95), cid="d1", at=mesh.net.now)))
    mesh.run(30_000)
    mesh.net.links[("alice", "carol")] = SLOW  # the cells to Carol are slow, their tombstones not
    mesh.do("alice", CellStored(superseding(near(TOPIC, 0.9), "d1", cid="d2", at=mesh.net.now)))
    mesh.do("alice", CellStored(cell(near(TOPIC, 0.95), cid="d3", at=mesh.net.now)))
    mesh.run(300)  # both have left for Carol (a busy peer's batches are paced)
    mesh.net.links[("alice", "carol")] = LinkConditions(latency_ms=(5, 10))
    mesh.do("alice", CellForgotten("d2", "t"))
    mesh.do("alice", CellForgotten("d3", "t"))
    mesh.run(60_000)
    carol = mesh["carol"]
    assert "d2" not in carol.cells and "d3" not in carol.cells  # the tombstones came first
    assert carol.engine.counters.drops[Reason.FORGOTTEN] >= 2
    for name in ("bob", "carol"):  # the same state, whichever came first
        assert mesh[name].statuses() == {"d1": ACTIVE, "d2": FORGOTTEN, "d3": FORGOTTEN}, name


def test_a_forget_reaches_a_node_that_was_away_by_repair_without_the_cells_vector():
    mesh = team_of_four(1)
    mesh.do("alice", CellStored(cell(near(TOPIC, 0.95), cid="d1", at=mesh.net.now)))
    mesh.run(2000)
    mesh.net.partition(["carol"], ["alice", "bob", "dave"])
    mesh.do("alice", CellForgotten("d1", "t"))
    mesh.run(5000)
    # Every log but Carol's lets the cell's diff go (the node erases content and vector).
    for name in ("alice", "bob"):
        log = mesh[name].engine.store
        log._cells.pop("d1", None)
    mesh.net.heal()
    mesh.run(60_000)
    assert mesh["carol"].statuses() == {"d1": FORGOTTEN}
    assert np.all([mesh[n].statuses().get("d1") in (None, FORGOTTEN) for n in ("alice", "bob", "dave")])


def test_in_the_partial_view_a_superseding_cell_follows_the_old_cells_walk():
    """a - b, and b's two other neighbours c and x, wanting neither cell but each the nearest to one:
    d1 walks a -> b -> c; d2, elsewhere, walks a -> b -> x; b also sends d2 where d1 walked."""
    net = VirtualNetwork(seed=4)
    team = Team.create()
    for name in ("a", "b", "c", "x"):
        net.add(make_engine(name, team, ENERGY, seed=4, view="partial", interest_radius=1, interest_offers=0))
    net.start()
    for name, before in (("b", "a"), ("c", "b"), ("x", "b")):
        net.inject(name, PeerDiscovered(before))
    net.inject("c", BeaconPlaced(beacon(unit(401), agent="reader-c")))
    net.inject("x", BeaconPlaced(beacon(unit(402), agent="reader-x")))
    net.run_for(30_000)
    net.inject("a", CellStored(cell(near(unit(401), 0.5), cid="d1", at=net.now)))  # below c's threshold
    net.run_for(5_000)
    assert {n for n in "bcx" if "d1" in net.hosts[n].cells} == {"b", "c"}  # the walk's path, no interest
    net.inject("a", CellStored(superseding(near(unit(402), 0.5), "d1", cid="d2", at=net.now)))
    net.run_for(5_000)
    assert {n for n in "bcx" if "d2" in net.hosts[n].cells} == {"b", "c", "x"}
    assert net.hosts["c"].statuses() == {"d1": SUPERSEDED, "d2": ACTIVE}
