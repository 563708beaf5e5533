"""What the lean server (:mod:`.server`) allows, and who gets one of its connection slots.

Slots are the scarce thing a stranger can take without a key: every connection holds one
until it closes. Deadlines (:class:`HttpLimits`, enforced by the server's reaper) bound how
long a connection may wait on its client; :class:`Admission` bounds how many slots one
client address, and all strangers together, may hold:

    at accept, the address has...                                  unpreferred   preferred
    max_connections_per_address connections already                 refused       admitted
    only reserved slots left (max_connections - reserved_slots used) refused       admitted
    otherwise                                                       admitted      admitted
    (no slot at all: the server does not accept; the kernel's backlog holds the client)

"Preferred" is the caller's predicate over the client's host (the mesh port: addresses of
known team members). It is asked only when its answer decides, so it costs nothing while
the server has room. No I/O and no clock here: the server feeds addresses in.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass

__all__ = ["HttpLimits", "Admission", "host_key", "PER_ADDRESS", "NO_SLOT"]

log = logging.getLogger("web.server")

PER_ADDRESS, NO_SLOT = "per_address", "no_slot"  # why a connection was refused: http_refused_<reason>


@dataclass(frozen=True)
class HttpLimits:
    """What one server allows; durations in seconds, None for no limit."""

    first_byte_timeout: float = 5.0  # a new connection that sends nothing: a stranger holding a slot
    keep_alive_timeout: float = 75.0  # between requests; longer than the clients' own keep-alive expiry
    header_timeout: float = 10.0  # a request head, in all, from its first byte
    read_timeout: float = 30.0  # one read of a request body
    body_timeout: float = 60.0  # a request body, in all, from its first read (a dribble cannot renew it)
    write_timeout: float = 30.0
    graceful_timeout: float = 5.0
    linger_timeout: float = 2.0
    reap_interval: float = 1.0
    max_connections: int = 512
    max_connections_per_address: int | None = 32
    reserved_slots: int = 0  # of max_connections, for addresses the server's is_preferred() names
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 16 * 1024 * 1024  # our apps cap their own bodies lower; this is the backstop
    backlog: int = 1024

    def __post_init__(self) -> None:
        if not 0 <= self.reserved_slots < self.max_connections:
            raise ValueError("reserved_slots must leave at least one of max_connections to anyone")


class Admission:
    """Connections held, per client host; decides who gets a slot (module docstring).

    ``counters`` (any ``MutableMapping[str, int]`` with zero defaults, e.g. a
    ``collections.Counter``) gets ``http_refused_<reason>`` for each refusal."""

    def __init__(
        self, limits: HttpLimits, is_preferred: Callable[[str], bool] | None = None,
        counters: MutableMapping[str, int] | None = None,
    ) -> None:  # fmt: skip
        self.limits = limits
        self.is_preferred = is_preferred
        self.counters = counters if counters is not None else collections.Counter()
        self.held = 0
        self.by_host: collections.Counter[str] = collections.Counter()

    def admit(self, host: str) -> str | None:
        """Take a slot for a connection from ``host``; None, or why it is refused (it holds none then)."""
        limits = self.limits
        per_address = limits.max_connections_per_address
        refusal = None
        if per_address is not None and self.by_host[host] >= per_address:
            refusal = PER_ADDRESS
        elif self.held >= limits.max_connections - limits.reserved_slots:
            refusal = NO_SLOT
        if refusal is not None and not self._preferred(host):
            self.counters[f"http_refused_{refusal}"] += 1
            log.debug("refused a connection from %s: %s", host, refusal)
            return refusal
        self.held += 1
        self.by_host[host] += 1
        return None

    def release(self, host: str) -> None:
        self.held -= 1
        self.by_host[host] -= 1
        if not self.by_host[host]:
            del self.by_host[host]

    def _preferred(self, host: str) -> bool:
        if self.is_preferred is None:
            return False
        try:
            return bool(self.is_preferred(host))
        except Exception:  # the caller's bug must not stop the accept loop
            log.exception("is_preferred(%r) failed", host)
            return False


def host_key(host: str) -> str:
    """The client address a limit counts by: an IPv4 client of a dual-stack socket as IPv4."""
    return host[7:] if host.startswith("::ffff:") and "." in host else host
