"""What a repair requester already holds: per origin, a bitmap of seqs from a base.

A repair reply should carry only what its requester lacks. The requester used to name
what it held as a list of 12-byte keys of its latest receipts, capped at 4,096: under
load a backlog holds more than that, and the responder resent everything past the cap
(42,574 diffs resent against 19,591 deliveries in one 60 s run, mesh.md). Seqs are
per-origin and dense within an incarnation (an origin numbers every diff it signs, and
starts a new incarnation at each start: :mod:`mesh.incarnation`), so one bit per seq that
the origin signed in the window names the requester's holdings whatever their number:
a 60 s run at 200 stores/s is about 300 bytes per origin.

A :class:`HaveSet` maps an origin to ``(base, bitmap)``: bit ``i`` (byte ``i // 8``, mask
``1 << (i % 8)``) says ``(origin, base + i)`` is held. It claims nothing outside each
origin's span, so a responder sends what falls outside (a duplicate at worst, never a
gap).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from .incarnation import first_seq, incarnation_of

__all__ = ["HaveSet", "MAX_HAVE_BYTES", "MAX_HAVE_ORIGINS"]

MAX_HAVE_BYTES = 128 * 1024  # all bitmaps of one request: about a million seqs
MAX_HAVE_ORIGINS = 1024  # msgpack decoding allows arrays of 1,024 at most


class HaveSet:
    """Held ``(origin, seq)`` pairs as per-origin bitmaps; see the module docstring."""

    __slots__ = ("spans", "_bits")

    def __init__(self, spans: Mapping[str, tuple[int, bytes]] | None = None) -> None:
        self.spans: dict[str, tuple[int, bytes]] = dict(spans or {})
        self._bits: dict[str, tuple[int, int, bytes]] = {}  # origin -> (base, end, bitmap)
        for origin, (base, bitmap) in self.spans.items():
            self._bits[origin] = (base, base + 8 * len(bitmap), bitmap)

    @classmethod
    def build(
        cls, lows: Mapping[str, int], top: Callable[[str], int], has: Callable[[str, int], bool],
        max_bytes: int = MAX_HAVE_BYTES,
    ) -> "HaveSet":  # fmt: skip
        """For each origin in ``lows``, the seqs from ``lows[origin]`` up to ``top(origin)``
        that ``has`` holds. Within ``max_bytes`` (and ``MAX_HAVE_ORIGINS``): the narrowest
        spans are kept whole, and a span too wide for what is left keeps its newest seqs. A span
        starts no earlier than its top's incarnation (:mod:`mesh.incarnation`): seqs are dense
        within one, and the one before a restart lies billions of seqs back."""
        lows = {o: max(low, first_seq(incarnation_of(top(o)))) for o, low in lows.items()}
        ranges = sorted((top(o) - low + 1, o) for o, low in lows.items() if top(o) >= low)[:MAX_HAVE_ORIGINS]
        spans: dict[str, tuple[int, bytes]] = {}
        budget = 8 * max_bytes  # bits
        for i, (width, origin) in enumerate(ranges):
            fair = budget // (len(ranges) - i)
            if width > fair:
                width = fair - fair % 8  # the newest seqs: a backlog's oldest are the likeliest settled
                if width <= 0:
                    break
            base = top(origin) - width + 1
            bitmap = bytearray((width + 7) // 8)
            for j in range(width):
                if has(origin, base + j):
                    bitmap[j >> 3] |= 1 << (j & 7)
            spans[origin] = (base, bytes(bitmap))
            budget -= 8 * len(bitmap)
        return cls(spans)

    @classmethod
    def of(cls, held: Iterable[tuple[str, int]]) -> "HaveSet":
        """Exactly these pairs (tests, and callers that already hold a list)."""
        seqs: dict[str, list[int]] = {}
        for origin, seq in held:
            seqs.setdefault(origin, []).append(seq)
        spans = {}
        for origin, these in seqs.items():
            base = min(these)
            bitmap = bytearray((max(these) - base) // 8 + 1)
            for seq in these:
                bitmap[(seq - base) >> 3] |= 1 << ((seq - base) & 7)
            spans[origin] = (base, bytes(bitmap))
        return cls(spans)

    def __contains__(self, key: tuple[str, int]) -> bool:
        entry = self._bits.get(key[0])
        if entry is None:
            return False
        base, end, bitmap = entry
        i = key[1] - base
        return 0 <= i < end - base and bool(bitmap[i >> 3] >> (i & 7) & 1)

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, HaveSet) and self.spans == other.spans

    def __repr__(self) -> str:
        return f"HaveSet({len(self.spans)} origins, {self.nbytes} bytes)"

    @property
    def nbytes(self) -> int:
        return sum(len(bitmap) for _, bitmap in self.spans.values())
