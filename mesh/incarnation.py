"""Incarnations: each run of a node signs in a part of the seq space no earlier run used.

Theory of operation
-------------------
Peers know a diff by ``(origin, seq)`` and drop one they already hold as a duplicate, for
good. A node used to number its diffs on from the highest seq in its own log, so a log that
went back in time (an older backup put back, an empty database beside the node key) made it
sign pairs its peers held, with other content: each cell it stored next was dropped
everywhere, and no repair could bring it (every holder "has" it).

So a seq is ``incarnation << 22 | counter``. The incarnation is chosen once per engine, from
the clock reading it is handed at its first ``Started`` (or first signature): the
milliseconds since 2024-01-01, and in any case above the incarnation of the highest seq of
ours its log holds. A run's incarnation is thus the moment it started (two starts within one
millisecond aside), and a restart signs above everything any earlier run signed, whatever
its log remembers, as long as the wall clock did not go back past the lost run's start.
Should it have, the peers still hold the lost run's diffs: one reaching us is signed with our
key yet not by this run, and :mod:`mesh.identity_guard` moves us above it and says so.

Within an incarnation seqs are dense, one per diff. A run that signs 2^22 (4 million) diffs
carries on into the next incarnation: to reach one that a later start could be given, it
would have to sign that many per millisecond. Seconds would not do: a run started in the
same second as the one before it takes the next second's incarnation, which the start after a
restore, a second later, would take again.

Why not a floor learned from the peers instead (hold our diffs at a start until a peer says
the highest seq of ours it holds)? A peer holds only what interested it, the ones holding
our newest diffs may be away at the restart, every start would wait for an answer, and the
question needs a field on the wire. The incarnation needs no peer, no wait and no new field.
Nor a counter of starts kept in the data dir: the backup put back holds an old one.

What leaned on dense seqs per origin, and what it does now:

* have-sets (:mod:`mesh.haves`) name held seqs as a bitmap from a base: a span never
  reaches back past the start of its top's incarnation (across a restart it would be
  billions of seqs wide); a held seq outside every span is at worst sent again, as before.
* :func:`mesh.diffs.diff_key` kept the low 32 bits of a seq: it now mixes the bits above in.
* control versions (the highest seq held per origin, :mod:`mesh.control`) only need seqs to
  grow across runs, which they now do.

The price: a seq takes 9 bytes in msgpack where a young counter took 1 to 3, in each diff
and in each entry of a gossip digest.
"""

from __future__ import annotations

__all__ = [
    "COUNTER_BITS", "EPOCH_MS", "incarnation_of", "incarnation_at", "first_seq", "resume_after", "after_incarnation_of",
]  # fmt: skip

COUNTER_BITS = 22
EPOCH_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
_MAX_INCARNATION = (1 << (63 - COUNTER_BITS)) - 1  # seqs stay below 2^63, the largest SQLite integer (year 2093)


def incarnation_of(seq: int) -> int:
    return seq >> COUNTER_BITS


def first_seq(incarnation: int) -> int:
    """The lowest seq of an incarnation (its counter at 0: never signed, a run starts above it)."""
    return incarnation << COUNTER_BITS


def after_incarnation_of(seq: int) -> int:
    """The incarnation after ``seq``'s (where a node goes on to stay clear of another's seqs)."""
    return min(_MAX_INCARNATION, incarnation_of(seq) + 1)


def incarnation_at(now_ms: int) -> int:
    """The incarnation the clock gives a run starting at ``now_ms``: milliseconds since 2024."""
    return min(_MAX_INCARNATION, max(0, now_ms - EPOCH_MS))


def resume_after(now_ms: int, held_max: int) -> int:
    """Where a run starting at ``now_ms`` counts on from (it signs ``+1`` first), when its log's
    highest seq of ours is ``held_max`` (0: none): a new incarnation, the clock's or, if the
    log holds one as late, the one after it."""
    incarnation = incarnation_at(now_ms)
    if held_max:
        incarnation = max(incarnation, after_incarnation_of(held_max))
    return first_seq(incarnation)
