"""The one error hierarchy of the mesh package, with stable reason codes.

Errors say whose fault they are. Remote errors come from bytes a peer sent; the
engine turns each one into a counted drop (``engine.counters.drops[reason]``) and
never lets it escape ``handle``. Local errors are the operator's or the caller's::

    MeshError                      whose fault
    ├── LocalError                 local: bad configuration, bad join token, bad call
    │   └── JoinTokenError         local: a join token that is not one of ours
    ├── RemoteError                remote: bytes from the network
    │   ├── SealError              a frame that does not open (wrong team key, tampering)
    │   └── WireError              a frame that opens but is malformed or too large
    └── CellRuleError              the cell's maker: a field breaks the cell rules (mesh.cell_rules);
                                   the decoder makes it a WireError, the node's facade its caller's error

Every error carries ``reason``: one of the codes in :class:`Reason`.
"""

from __future__ import annotations

__all__ = [
    "Reason", "MeshError", "LocalError", "JoinTokenError", "RemoteError", "SealError", "WireError", "CellRuleError",
]  # fmt: skip


class Reason:
    """Stable reason codes: error reasons and drop counters share this vocabulary."""

    # frames
    DECRYPT_FAILED = "decrypt_failed"  # AEAD did not open: wrong team key or tampered bytes
    MALFORMED = "malformed"  # not the shape the wire format requires
    BAD_VERSION = "bad_version"  # a wire version we do not speak
    OLD_VERSION = "old_version"  # a frame of an older protocol (its sender needs upgrading)
    OVERSIZED = "oversized"  # frame larger than max_frame_bytes
    TOO_MANY_DIFFS = "too_many_diffs"  # batch beyond max_diffs
    CONTENT_TOO_LARGE = "content_too_large"  # content, metadata or vector beyond its limit
    INVALID_CELL = "invalid_cell"  # a signed cell that breaks the cell rules (mesh.cell_rules): no node could store it
    REPLAY = "replay"  # a sealed frame seen before, or older than the replay window
    FUTURE = "future"  # a frame or diff stamped too far in the future
    # a frame its sender's own key does not vouch for: no sender tag, or one that does not check
    # out (a member sealing in another's name; a frame sent to whoever held the address before)
    BAD_FRAME_AUTH = "bad_frame_auth"
    # diffs
    NOT_MEMBER = "not_member"  # origin without a valid membership proof, or id != hash(key)
    UNKNOWN_ORIGIN = "unknown_origin"  # no public key known for the origin
    BAD_SIGNATURE = "bad_signature"  # signature does not verify
    DUPLICATE = "duplicate"  # (origin, seq) already held
    NOT_ORIGIN = "not_origin"  # a tombstone signed by another node than its cell's origin
    FORGOTTEN = "forgotten"  # a cell whose origin's tombstone we hold: not kept, handed over or relayed
    STALE = "stale"  # control diff older than the version we hold
    NOT_OWNER = "not_owner"  # a beacon removal from a node that does not hold that beacon id (another does)
    QUOTA = "quota"  # a control diff that would take its origin past its share (MeshConfig.max_*_per_origin)
    FORK = "fork"  # a second, different diff signed as one (origin, seq): the first is kept (mesh.identity_guard)
    OWN_ID = "own_id"  # a frame or diff under our own node id that this node did not send or sign
    IDENTITY_CONFLICT = "identity_conflict"  # refused: our id is in use elsewhere and we stopped (the newcomer)
    # sending
    QUEUE_FULL = "queue_full"  # bounded send queue overflowed: lowest energy dropped
    PEER_DEAD = "peer_dead"  # queued for a peer that was declared dead
    GAVE_UP = "gave_up"  # retransmissions exhausted
    # tokens
    TOKEN_PREFIX = "token_prefix"
    TOKEN_ENCODING = "token_encoding"
    TOKEN_FORMAT = "token_format"


class MeshError(Exception):
    """Base of every error the mesh raises on purpose."""

    def __init__(self, reason: str, message: str | None = None) -> None:
        super().__init__(message or reason)
        self.reason = reason
        self.message = message or reason


class LocalError(MeshError):
    """The local side is at fault: configuration or a call that makes no sense."""


class JoinTokenError(LocalError):
    """A join token that cannot be decoded."""


class RemoteError(MeshError):
    """A peer sent something unusable; the engine counts it and drops it."""


class SealError(RemoteError):
    """A sealed frame that does not open under our team key."""


class WireError(RemoteError):
    """A frame whose plaintext is malformed or exceeds a limit."""


class CellRuleError(MeshError):
    """A cell field that breaks the cell rules (:mod:`mesh.cell_rules`). ``field`` names it;
    ``reason`` is ``content_too_large`` for a limit passed (``limit``, when there is one), else
    ``invalid_cell``. Whose fault it is depends on who made the cell, so each boundary
    translates it: the wire decoder into a :class:`WireError`, the node into its caller's error."""

    def __init__(self, reason: str, message: str, *, field: str, limit: int | None = None) -> None:
        super().__init__(reason, message)
        self.field = field
        self.limit = limit
