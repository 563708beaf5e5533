"""The nodes a relayed copy says were already sent its diff (partial view).

In a partial view each holder pushes a cell to the interested nodes linked to it, and the
holders of one topic are linked to the same nodes: most such pushes reached a node that
had the cell (6.6 copies per delivery at N=1,000). So a copy names the nodes its sender
pushed it to, then those its sender was told of, up to :data:`MAX_TOLD`; the receiver
pushes to none of them. Outside the signature, like ``hops`` and ``ttl``, since each relay
rewrites it. A name is a :data:`TOLD_ID_BYTES`-byte hash of the node id: a collision
skips a push that repair makes good, ~1 in 4 x 10^5 per name at 10,000 nodes.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable

__all__ = ["TOLD_ID_BYTES", "MAX_TOLD", "told_name", "told_names", "tell"]

TOLD_ID_BYTES = 4
MAX_TOLD = 128  # names per copy: the wire's bound (a relay sends at most MeshConfig.told_limit)


@functools.lru_cache(maxsize=1 << 16)
def told_name(node_id: str) -> bytes:
    """A node's name in a told list."""
    return hashlib.blake2b(node_id.encode(), digest_size=TOLD_ID_BYTES).digest()


def _split(told: bytes) -> list[bytes]:
    """A told list's names, in order."""
    return [told[i : i + TOLD_ID_BYTES] for i in range(0, len(told), TOLD_ID_BYTES)]


@functools.lru_cache(maxsize=1 << 12)
def told_names(told: bytes) -> frozenset[bytes]:
    # A relay's copies all carry one told list, and each receiver reads it more than once.
    return frozenset(_split(told))


def tell(sent_to: Iterable[str], was_told: bytes, limit: int) -> bytes:
    """The told list for the copies of one relay: the nodes it sends to (in the order given),
    then what it was told, each name once, at most ``limit`` names."""
    names: list[bytes] = []
    seen: set[bytes] = set()
    for name in [told_name(n) for n in sent_to] + _split(was_told):
        if len(names) >= limit:
            break
        if name not in seen:
            seen.add(name)
            names.append(name)
    return b"".join(names)
