"""Partial view: the other end of each gossip link, so a relay can push along it both ways.

A partial-view node picks its own neighbours (random ones, and ones chosen for their
interest); the nodes that picked *it* show themselves only by gossiping with it, one of
their neighbours per round. A node that has not opened a round with us for
``timeout_ms`` has let us go. The control plane's "one hop away" is no substitute: it
only ever shrinks, so it keeps every node that gossiped with us once, and the interest
choice changes its mind many times while the overlay settles (at N=1,000, 8.6 of a node's
22 one-hop nodes were no longer linked to it either way).

The in-degree is bounded: of the nodes that hold us but are not our own neighbours (``mine``),
only the ``cap`` nearest in interest (``score``, higher is nearer) count as linked. A node near the centre of a popular topic is
chosen by many; pushing a cell to every one of them made it the busiest node by far, and
they have nearer links of their own.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["InboundLinks"]


class InboundLinks:
    """Nodes that hold us as a gossip neighbour, as far as their gossip tells."""

    def __init__(
        self, timeout_ms: int, cap: int | None = None, score: Callable[[str], float] | None = None,
        mine: Callable[[str], bool] | None = None,
    ) -> None:  # fmt: skip
        self.timeout_ms = timeout_ms
        self.cap = cap
        self.score = score
        self.mine = mine
        self._heard: dict[str, int] = {}  # node -> when it last opened a gossip round with us
        self._accepted: tuple[int, frozenset[str]] | None = None  # (now, the linked ones) cached

    def __len__(self) -> int:
        return len(self._heard)

    def heard(self, node_id: str, now: int) -> None:
        """``node_id`` opened a gossip round with us at ``now``."""
        if node_id not in self._heard:
            self._accepted = None
        self._heard[node_id] = now

    def holding(self, now: int) -> frozenset[str]:
        """The nodes that hold us, are not ours, and count as linked at ``now`` (at most ``cap``)."""
        cached = self._accepted
        if cached is not None and cached[0] == now:
            return cached[1]
        since = now - self.timeout_ms
        for node_id in [n for n, at in self._heard.items() if at < since]:
            del self._heard[node_id]  # it let us go (or went)
        mine = self.mine
        live = sorted(n for n in self._heard if mine is None or not mine(n))
        if self.cap is not None and len(live) > self.cap:
            score = self.score or (lambda _: 0.0)
            live = sorted(live, key=lambda n: (-score(n), n))[: self.cap]
        accepted = frozenset(live)
        self._accepted = (now, accepted)
        return accepted
