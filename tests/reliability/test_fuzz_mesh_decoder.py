"""Fuzz the mesh's way in: frames fed to a running engine (``FrameReceived``).

``tests/mesh/test_wire.py`` already throws bytes at ``decode_envelope`` alone; here the
whole admission path of the engine takes them, as the mesh port hands them over:
arbitrary bytes, frames sealed under the team key around arbitrary msgpack (wrong types,
wrong shapes), members' valid frames mutated before sealing or truncated after, diffs
with flipped signatures, and frames past the size limit. For every frame:

* ``handle`` returns (never raises) and the frame is counted as received;
* a frame that does not open or decode is a counted drop under the reason the decoder
  gives (``decrypt_failed``, ``malformed``, ``oversized``, ...), and stores nothing;
* a diff whose signature does not verify is a counted ``bad_signature`` drop.

After each run a member's fresh valid frame is still accepted: the node keeps serving.
"""

from __future__ import annotations

import itertools

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mesh.errors import MeshError, Reason
from mesh.events import Started
from mesh.identity import NodeIdentity
from mesh.team import AUTH_SIGNED, FRAME_VERSION, FrameAuth, Team
from mesh.testing import make_engine
from mesh.wire import WireLimits, decode_envelope
from tests.mesh.test_engine import ENERGY
from tests.mesh.test_security import NOW, deliver, diff_from, frame, stored

from .fuzz import count, fuzz_report, fuzz_settings, json_values  # noqa: F401 (fixture)

pytestmark = pytest.mark.usefixtures("fuzz_report")

TEAM = Team.create()
VERSION = bytes([FRAME_VERSION])
MEMBER = NodeIdentity.generate()
WILD = NodeIdentity.generate()  # a second member, whose frames the fuzzer mutates


def fresh_engine():
    engine = make_engine("bob", TEAM, ENERGY)
    engine.handle(Started(), NOW)
    return engine


def expected_failure(data: bytes, limits) -> str | None:
    """What the admission path must say about ``data``: a drop reason, or None if it opens."""
    try:
        _, _, plaintext = TEAM.sealer().open(data)
        decode_envelope(plaintext, limits)
    except MeshError as exc:
        return exc.reason
    return None


def check_admission(engine, data: bytes) -> None:
    before_frames = engine.counters.frames_received
    before = dict(engine.counters.drops)
    effects = deliver(engine, data)  # must not raise
    assert engine.counters.frames_received == before_frames + 1
    reason = expected_failure(data, engine.config.limits)
    if reason is not None:
        assert engine.counters.drops[reason] == before.get(reason, 0) + 1, (reason, dict(engine.counters.drops))
        assert stored(effects) == []


def still_serving(engine, seqs) -> None:
    effects = deliver(engine, frame(TEAM, MEMBER, diff_from(MEMBER, seq=next(seqs))))
    assert len(stored(effects)) == 1, engine.counters.drops


msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20)
    | st.binary(max_size=40),
    lambda inner: st.lists(inner, max_size=8) | st.dictionaries(st.text(max_size=6) | st.integers(0, 20), inner, max_size=5),
    max_leaves=20,
)  # fmt: skip


@fuzz_settings(200)
@given(st.data())
def test_any_frame_is_admitted_or_dropped_and_counted(data) -> None:
    engine = fresh_engine()
    seqs = itertools.count(1000)
    sender = NodeIdentity.generate().node_id
    kind = data.draw(st.sampled_from(["bytes", "sealed msgpack", "mutated", "truncated", "bad signature"]))
    count(f"mesh FrameReceived {kind}")
    count("mesh FrameReceived")
    if kind == "bytes":
        raw = data.draw(st.binary(max_size=600) | st.binary(min_size=1, max_size=40).map(lambda b: VERSION + b * 20))
    elif kind == "sealed msgpack":
        raw = TEAM.sealer().seal(sender, msgpack.packb(data.draw(msgpack_values), use_bin_type=True))
    else:
        diff = diff_from(MEMBER, seq=data.draw(st.integers(1, 10**6)))
        if kind == "bad signature":
            position = data.draw(st.integers(0, len(diff.signature) - 1))
            signature = bytearray(diff.signature)
            signature[position] ^= data.draw(st.integers(1, 255))
            diff = type(diff)(diff.kind, diff.origin, diff.seq, diff.ts, diff.payload, diff.signed, bytes(signature),
                              diff.hops, diff.ttl)  # fmt: skip
            before = engine.counters.drops[Reason.BAD_SIGNATURE]
            assert stored(deliver(engine, frame(TEAM, MEMBER, diff))) == []
            assert engine.counters.drops[Reason.BAD_SIGNATURE] == before + 1
            still_serving(engine, seqs)
            return
        raw = frame(TEAM, MEMBER, diff)
        if kind == "mutated":  # mutate the plaintext, then seal it properly: the decoder must cope
            # Sealed by another member than the one still_serving() hears from: a mutated sent_at
            # is that sender's own clock, and a member's first frame sets the estimate of its
            # clock (RELIABILITY.md, "The insider model"); what is checked here is the decoder.
            raw = frame(TEAM, WILD, diff)
            _, _, plaintext = TEAM.sealer().open(raw)
            plain = bytearray(plaintext)
            for position, value in data.draw(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)),
                                                      min_size=1, max_size=5)):  # fmt: skip
                plain[position % len(plain)] = value
            raw = TEAM.sealer().seal(WILD.node_id, bytes(plain), FrameAuth(AUTH_SIGNED, WILD.sign))
        else:
            keep = data.draw(st.floats(0, 1, exclude_max=True))  # a share: frames differ in length by a byte
            raw = raw[: int(keep * len(raw))]
    check_admission(engine, raw)
    still_serving(engine, seqs)


def test_frames_past_the_size_limit_are_dropped_as_oversized() -> None:
    engine = fresh_engine()
    limits: WireLimits = engine.config.limits
    huge = msgpack.packb([1] * 8 + [b"x" * (limits.max_frame_bytes + 1)], use_bin_type=True)
    sealed = TEAM.sealer().seal(MEMBER.node_id, huge)
    assert expected_failure(sealed, limits) == Reason.OVERSIZED
    check_admission(engine, sealed)
    check_admission(engine, VERSION + bytes(limits.max_frame_bytes + 64))  # does not open either
    count("mesh FrameReceived oversized")
    still_serving(engine, itertools.count(1))
