"""Copies that name the nodes already sent them (partial view, mesh.told).

On the wire: an optional fifth routing field, outside the signature; a diff without it
encodes as before, so a frame from a node that never sets it decodes unchanged. In the
engine: a relay pushes to none of the nodes its copy names.
"""

from __future__ import annotations

import msgpack
import pytest

from mesh.errors import WireError
from mesh.identity import NodeIdentity
from mesh.told import MAX_TOLD, TOLD_ID_BYTES, tell, told_name, told_names
from mesh.wire import Envelope, MsgType, decode_envelope, encode_envelope

from .test_partial_gradient import spread
from .test_routing_partial import LINE
from .test_engine import unit
from .test_wire import ME, cell, signed


def data_frame(*diffs) -> bytes:
    return encode_envelope(Envelope(MsgType.DATA, 5, "me", {ME.node_id: (ME.public_key, bytes(32))}, diffs, batch_id=1))


def test_the_told_list_rides_outside_the_signature_and_round_trips():
    diff = signed(cell(), hops=1, ttl=5)
    told = tell(["n1", "n2"], b"", 8)
    moved = diff.routed(hops=2, ttl=4, told=told)
    assert moved.signed == diff.signed and moved.signature == diff.signature
    (got,) = decode_envelope(data_frame(moved)).diffs
    assert got.told == told and told_names(got.told) == {told_name("n1"), told_name("n2")}
    assert NodeIdentity.verify(ME.public_key, got.signature, got.signed)


def test_a_diff_without_a_told_list_keeps_the_old_four_field_form():
    diff = signed(cell(), hops=1, ttl=5)
    raw = msgpack.unpackb(data_frame(diff), raw=False, strict_map_key=False)
    assert len(raw[5][0]) == 4  # what a node without told lists sends, byte for byte
    (got,) = decode_envelope(data_frame(diff)).diffs
    assert got.told == b"" and (got.hops, got.ttl) == (1, 5)


@pytest.mark.parametrize("bad", [b"abc", bytes(TOLD_ID_BYTES * (MAX_TOLD + 1)), "text", 7, None])
def test_a_malformed_told_list_is_a_wire_error(bad):
    diff = signed(cell(), hops=1, ttl=5)
    top = msgpack.unpackb(data_frame(diff), raw=False, strict_map_key=False)
    top[5][0].append(bad)
    with pytest.raises(WireError):
        decode_envelope(msgpack.packb(top, use_bin_type=True))


def test_a_told_list_names_the_relays_targets_first_then_what_it_was_told_each_once_and_bounded():
    was_told = tell(["x", "y"], b"", 8)
    assert tell(["a", "x"], was_told, 8) == told_name("a") + told_name("x") + told_name("y")
    assert tell(["a", "b", "c"], was_told, 2) == told_name("a") + told_name("b")
    assert tell([], b"", 8) == b""


def test_a_relay_pushes_to_none_of_the_nodes_its_copy_names():
    """Radius 2 and relay radius 2 on the hand-drawn line, all but ``a`` interested: every
    holder knows two interested nodes each way, so without told lists each is pushed the
    cell by up to four holders. Named in the copies, the same nodes are reached with fewer."""
    outcome = {
        limit: spread(unit(41), LINE[1:], relay_radius=2, widen_leaves=False, told_limit=limit) for limit in (0, 32)
    }
    (reached_off, copies_off), (reached_on, copies_on) = outcome[0], outcome[32]
    assert reached_on == reached_off == {"b", "c", "d", "e"}
    assert copies_off >= 9 and copies_on < copies_off


def test_with_the_default_routing_each_interested_node_on_the_line_is_sent_the_cell_once():
    """The defaults (relay radius 1, leaves widen, told lists on): ``a`` pushes to ``b`` and
    ``c``, naming both; ``b``'s only interested link is ``c``, named, so it sends nothing;
    ``c`` sends to ``d``, ``d`` to ``e``. Without told lists ``b`` and ``c`` push to each other."""
    assert spread(unit(41), LINE[1:]) == ({"b", "c", "d", "e"}, 4)
    reached, copies = spread(unit(41), LINE[1:], told_limit=0)
    assert reached == {"b", "c", "d", "e"} and copies > 4


def test_a_relay_hold_lets_other_holders_copies_withdraw_its_own_and_reaches_the_same_nodes():
    """36 nodes in three interest communities, a low threshold (each cell wanted by a whole
    community) and short told lists (4 names), so relays in a community push to nodes another
    holder already sent the cell. Held for 40 ms, a relay's copies meet the copies of the
    others first, whose told lists withdraw some of them: fewer copies, the same nodes reached."""
    from mesh.events import CellStored

    from .test_engine import cell, near
    from .test_interest_neighbours import TOPICS, community_mesh

    outcome = {}
    for hold in (0, 40):
        net, vectors = community_mesh(threshold=0.5, relay_hold_ms=hold, told_limit=4, repair_interval_ms=600_000)
        net.run_for(30_000)
        before = sum(h.engine.counters.data_diffs_sent for h in net.hosts.values())
        stored = []
        for k in range(3):
            stored.append(cell(near(TOPICS[k], 0.97, seed=100 + k), salience=1.0, at=net.now, cid=f"c{k}"))
            net.inject(f"n{k}", CellStored(stored[-1]))
            net.run_for(200)
        net.run_for(5_000)
        reached = {(c.node_id, a) for c in stored for a, h in net.hosts.items() if c.node_id in h.cells}
        copies = sum(h.engine.counters.data_diffs_sent for h in net.hosts.values()) - before
        withdrawn = sum(h.engine.counters.data_diffs_withdrawn for h in net.hosts.values())
        outcome[hold] = reached, copies, withdrawn
        wanted = {(c.node_id, a) for k, c in enumerate(stored) for a, v in vectors.items()
                  if a != f"n{k}" and float(v @ c.embedding) >= 0.5}  # fmt: skip
        assert reached == wanted
    (reached_now, copies_now, _), (reached_held, copies_held, withdrawn_held) = outcome[0], outcome[40]
    assert reached_held == reached_now
    assert copies_held < copies_now and withdrawn_held > outcome[0][2]
