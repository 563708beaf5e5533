"""A rate limit per API key: one token bucket per principal.

Every authenticated call (REST, MCP over HTTP, and so ``hyphae mcp``, which relays to the
daemon) takes one token from its agent's bucket. A bucket holds at most ``burst`` tokens
and refills at ``rate`` tokens per second; an empty bucket refuses the call with
:class:`RateLimited`, which says how long to wait. The defaults (2,000 calls/s, a burst
of 4,000) are far above what an agent does (a few calls a second) and above what the MCP
benchmark drives through its one key (~470 calls/s on the 2-core test VM, its target is
1,000), so only a runaway loop or a stolen key meets them. ``[api] rate_limit`` and
``rate_burst`` in ``config.toml`` set them; ``rate_limit = 0`` turns the limit off.

The bucket is a function of its inputs: :meth:`RateLimiter.take` gets ``now`` (seconds on
a monotonic clock) from the caller, so tests drive it with a fake clock.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from .errors import HyphaeError

__all__ = ["RateLimited", "RateLimiter", "DEFAULT_RATE", "DEFAULT_BURST"]

DEFAULT_RATE = 2000.0  # calls per second per key
DEFAULT_BURST = 4000  # calls a key may make at once after a quiet spell


class RateLimited(HyphaeError):
    """Too many calls with one key: wait ``retry_after_ms`` and try again."""

    reason = "rate_limited"
    http_status = 429

    @property
    def retry_after_s(self) -> int:
        """Whole seconds for an HTTP ``Retry-After`` header (at least 1)."""
        return max(1, math.ceil(self.details.get("retry_after_ms", 1000) / 1000))


class RateLimiter:
    """Token buckets by key; ``rate <= 0`` means no limit."""

    def __init__(self, rate: float = DEFAULT_RATE, burst: int = DEFAULT_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        if rate > 0 and burst < 1:
            raise ValueError("burst must be at least 1")
        self.rate = float(rate)
        self.burst = float(burst)
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}  # key -> (tokens, at)

    @property
    def enabled(self) -> bool:
        return self.rate > 0

    def take(self, key: str, now: float) -> float:
        """Take one token for ``key`` at ``now``: 0.0 if granted, else seconds to wait."""
        if not self.enabled:
            return 0.0
        tokens, at = self._buckets.get(key, (self.burst, now))
        tokens = min(self.burst, tokens + max(0.0, now - at) * self.rate)
        if tokens >= 1.0 - 1e-9:  # float dust must not refuse a call that is due
            self._buckets[key] = (max(0.0, tokens - 1.0), now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self.rate

    def forget(self, key: str) -> None:
        """Drop ``key``'s bucket (its agent was revoked: the key never calls again)."""
        self._buckets.pop(key, None)

    def check(self, key: str, who: str = "this API key") -> None:
        """Take a token now or raise :class:`RateLimited`."""
        wait = self.take(key, self._clock())
        if wait > 0.0:
            retry_after_ms = max(1, math.ceil(wait * 1000))
            raise RateLimited(
                f"too many calls with {who}: the limit is {self.rate:g} calls/s (burst {self.burst:g}); "
                f"retry in {retry_after_ms} ms",
                retry_after_ms=retry_after_ms,
                limit_per_s=self.rate,
                burst=int(self.burst),
            )

