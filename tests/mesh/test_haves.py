"""A repair requester's have-set: per-origin bitmaps that claim exactly what is held."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from mesh.haves import HaveSet

A, B = "a" * 32, "b" * 32


@given(st.sets(st.tuples(st.sampled_from([A, B]), st.integers(1, 3000))))
def test_a_built_set_claims_exactly_what_is_held_in_its_spans(held):
    lows = {}
    for origin, seq in held:
        lows[origin] = min(lows.get(origin, seq), seq)
    tops = {o: max(s for oo, s in held if oo == o) for o in lows}
    haves = HaveSet.build(lows, tops.__getitem__, lambda o, s: (o, s) in held)
    for origin in (A, B):
        for seq in range(0, 3002):
            assert ((origin, seq) in haves) == ((origin, seq) in held)
    assert HaveSet.of(held) == haves or not held


def test_a_wide_span_keeps_its_newest_seqs_within_the_budget():
    rng = random.Random(1)
    held = {(A, s) for s in range(1, 100_001) if rng.random() < 0.5} | {(B, 7), (B, 9)}
    haves = HaveSet.build({A: 1, B: 7}, {A: 100_000, B: 9}.__getitem__, lambda o, s: (o, s) in held, max_bytes=1024)
    assert haves.nbytes <= 1024
    assert (B, 7) in haves and (B, 9) in haves and (B, 8) not in haves  # the narrow span is whole
    base = haves.spans[A][0]
    assert 100_000 - base < 8 * 1024 and base > 90_000
    assert all(((A, s) in haves) == ((A, s) in held) for s in range(base, 100_001))
    assert not any((A, s) in haves for s in range(1, base))  # below its span nothing is claimed
