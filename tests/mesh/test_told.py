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
